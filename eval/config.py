"""The settings of an evaluation, importable without torch: the command line builds and validates them before any
model is loaded (eval.extraction and eval.adaptive, which use them, re-export them).

    ExtractionConfig  how a document is split into a prompt and the suffix to reproduce (greedy extraction)
    SamplingConfig    temperature, nucleus and samples of the sampling attack (eval.adaptive)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

DEFAULT_RESAMPLES = 1000  # bootstrap resamples of an interval (eval.intervals)


@dataclass(frozen=True)
class ExtractionConfig:
    """How each document is split into a prompt and a suffix to reproduce (frozen: vary it with dataclasses.replace).

    suffix_len: S, the number of tokens generated and compared with the true suffix.
    prefix_len: None -> prefix = everything before the last S tokens (goldfish protocol; needs > S tokens);
        an int P -> prefix = the first P tokens, suffix = the next S (Pythia protocol; needs >= P + S tokens).
    batch_size: documents decoded (and teacher-forced) together.
    bootstrap: resamples of the 95% percentile bootstrap intervals over documents of the summary's exact match and
        RougeL (and of membership AUCs); 0 leaves the intervals out.
    """

    suffix_len: int = 50
    prefix_len: int | None = None
    batch_size: int = 32
    bootstrap: int = DEFAULT_RESAMPLES

    def __post_init__(self) -> None:
        b = self.bootstrap
        if isinstance(b, bool) or not isinstance(b, int) or b < 0:
            raise ValueError(
                f"ExtractionConfig.bootstrap must be a number of resamples >= 0 (e.g. --bootstrap 1000; "
                f"0: no intervals), got {b!r}"
            )
        for name in ("suffix_len", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ExtractionConfig.{name} must be a positive int, got {value!r}")
        p = self.prefix_len
        if p is not None and (isinstance(p, bool) or not isinstance(p, int) or p < 1):
            raise ValueError(
                f"ExtractionConfig.prefix_len must be None (prefix = all but the suffix) or a positive int, got {p!r}"
            )

    def min_tokens(self) -> int:
        """Shortest document this split can evaluate."""
        return self.suffix_len + 1 if self.prefix_len is None else self.prefix_len + self.suffix_len

    def requirement(self) -> str:
        """The protocol's need in the options' words, for errors: '--suffix-len 50 needs documents of at least 51
        tokens (...)'."""
        if self.prefix_len is None:
            return (
                f"--suffix-len {self.suffix_len} needs documents of at least {self.min_tokens()} tokens (a prefix of "
                "one token or more before the suffix)"
            )
        return (
            f"--prefix-len {self.prefix_len} with --suffix-len {self.suffix_len} needs documents of at least "
            f"{self.min_tokens()} tokens"
        )

    def split(self, token_ids: Sequence[int]) -> tuple[list[int], list[int]] | None:
        """(prefix, suffix) of a document, or None when it is too short for this split."""
        if len(token_ids) < self.min_tokens():
            return None
        ids = [int(t) for t in token_ids]
        if self.prefix_len is None:
            return ids[: -self.suffix_len], ids[-self.suffix_len :]
        p = self.prefix_len
        return ids[:p], ids[p : p + self.suffix_len]


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling settings: temperature > 0, nucleus top_p in (0, 1] (1 = no cut), n_samples per document, seed."""

    temperature: float = 1.0
    top_p: float = 1.0
    n_samples: int = 10
    seed: int = 0

    def __post_init__(self) -> None:
        if not (
            isinstance(self.temperature, (int, float)) and self.temperature > 0 and math.isfinite(self.temperature)
        ):
            raise ValueError(
                f"temperature must be a finite number > 0, got {self.temperature!r} "
                "(for temperature -> 0 use greedy extraction)"
            )
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1] (1 disables the nucleus cut), got {self.top_p!r}")
        if isinstance(self.n_samples, bool) or not isinstance(self.n_samples, int) or self.n_samples < 1:
            raise ValueError(f"n_samples must be a positive int, got {self.n_samples!r}")
