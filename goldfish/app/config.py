"""The run configuration: one dataclass per option group, holding the one set of defaults.

    DataSpec          which documents, how many, how long (--data, --n-train, --seq-len, ...)
    MaskSpec          the goldfish mask (--strategy, --k, --h, --mask-seed; compare's --masks STRATEGY:K:H)
    TrainConfig       optimisation (engine.training.config; --epochs, --lr, ...), defaults per command in TrainSpec
                      and CompareSpec
    Instruments       the memorization instruments besides greedy extraction (--beams, --samples, ...)
    ExtractionConfig  prefix/suffix protocol (eval.config; --suffix-len, --prefix-len, --eval-batch-size)
    Runtime           where and how a command runs (--device, --threads, --grid, --nproc, --no-progress)
    LoraSpec          LoRA adapters through peft (goldfish.app.lora; --lora-rank, --lora-alpha, --lora-targets)
    TrainSpec / CompareSpec / EvalSpec  a whole `goldfish train` / `compare` / `eval` run

goldfish.app.options maps each command-line flag to exactly one field here; the resolved specs are saved with the
outputs (the run record, summary.json). Presets of `goldfish compare` and `goldfish plan` are in goldfish.app.presets.

Torch-free: building and validating these (every settings error of the command line) imports only the plain-Python
settings of the lower floors (data, engine.spec, engine.training.config, eval.config, goldfish.strategies), so
`--help` and a bad option answer at once; torch loads where work starts.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal, Sequence

import data
import data.dedup
from data.dedup import DedupMode, DuplicatePolicy
from engine import GridShape, TrainConfig, data_ranks_per_node, parse_grid_sizes
from eval.config import ExtractionConfig, SamplingConfig
from goldfish.app.lora import LoraSpec
from goldfish.app.lora import check_zero as check_lora_zero
from goldfish.app.tracking import ReportTo
from goldfish.strategies import STRATEGIES, WINDOW_STRATEGIES, Strategy, default_k_h

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class DataSpec:
    """Which documents, how many, how long. The same spec and seed always select the same documents."""

    source: str = data.DEFAULT_CORPUS
    text_field: str = "text"
    id_field: str | None = None
    split: str = "train"
    n_train: int = 32
    n_heldout: int = 32
    seq_len: int = 128
    seed: int = 0
    tokenizer: str | None = None  # HF name/folder; None: the model's own, or a BPE trained on the corpus
    vocab_size: int = 2048  # for the BPE trained for tiny models
    # Conversations (data.chat): a Jinja chat template file replacing the tokenizer's (None: the tokenizer's own; the
    # tiny models' trained BPE gets data.chat.TINY_CHAT_TEMPLATE)
    chat_template: str | None = None
    # Repetition buckets: times each training document occurs per epoch (with --background: copies inserted). The
    # training documents are assigned to the non-zero buckets at random from `seed`, as evenly as possible
    # (data.assign_buckets); 0 names the held-out documents, the never-trained bucket drawn from the same pool.
    repeats: tuple[int, ...] = (1,)
    # Duplicates before the split (data.dedup): "off", "exact" (same text / same token window) or "near" (those and
    # near-duplicate windows, data.dedup.is_near_duplicate at dedup_threshold); extra copies of a training document
    # are dropped or kept as counted repeats ("repeat"). Copies never straddle the train / held-out split.
    dedup: DedupMode = "near"
    dedup_threshold: float = data.dedup.DEFAULT_THRESHOLD
    duplicates: DuplicatePolicy = "drop"
    # Whole documents (data.rows): every token of every training document is trained, documents packed
    # into rows of seq_len tokens; documents need min_doc_tokens tokens, extraction reads their first extract_len
    # (at most seq_len, the context the model is trained on).
    pack: bool = False
    extract_len: int = 2048
    min_doc_tokens: int = 100
    max_doc_tokens: int = 0  # pack: longer documents are skipped (0: no limit)
    # A background corpus (data.background): trained on, not measured; the training documents become targets
    # inserted into it `repeats` times each. Implies pack. val_tokens: tokens of held-out background text (the
    # validation set).
    background: str | None = None
    # Insert only each target's extraction window (its first extraction_window tokens) rather than the document.
    insert_window: bool = False
    background_text_field: str = "text"
    # Read the background as a stream (a hub dataset is never downloaded whole): only the tokens a --max-steps run
    # trains and validates on are read and tokenized (data.background.stream_budget).
    background_streaming: bool = False
    val_tokens: int = 16384
    tokenize_workers: int = 1
    # goldfish's cache folder (tokenized datasets in its datasets/); None: $GOLDFISH_CACHE_DIR, else ~/.cache/goldfish
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        if self.background_streaming and self.background is None:
            raise ValueError(
                "--background-streaming streams the background corpus, and there is none: add --background SOURCE"
            )
        if self.insert_window and self.background is None:
            raise ValueError(
                "--insert-window inserts the targets' extraction windows into a background corpus, and there is "
                "none: add --background SOURCE"
            )
        if self.background is not None:
            object.__setattr__(self, "pack", True)  # frozen: set while it is built
        for name, least in (
            ("extract_len", 2),
            ("min_doc_tokens", 2),
            ("max_doc_tokens", 0),
            ("val_tokens", 0),
            ("tokenize_workers", 1),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"--{name.replace('_', '-')} must be an integer >= {least}, got {value!r}")
        self.dedup_config()  # validates the three dedup fields (a DataError names the flag to fix)
        if self.chat_template is not None and not os.path.isfile(os.path.expanduser(self.chat_template)):
            raise ValueError(
                f"--chat-template {self.chat_template}: no such file. Fix: give the path of a Jinja chat template file"
            )
        if self.vocab_size < 300:
            raise ValueError(
                f"vocab_size must be >= 300 (256 bytes plus merges and special tokens), got {self.vocab_size}"
            )
        object.__setattr__(self, "repeats", tuple(self.repeats))
        if (
            not self.repeats
            or any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in self.repeats)
            or not self.train_buckets
        ):
            raise ValueError(
                "--repeats must be integers >= 0 with at least one >= 1 (times a training document occurs per "
                f"epoch; 0 = the held-out documents), got {','.join(map(str, self.repeats))}"
            )
        if 0 in self.repeats and self.n_heldout == 0:
            raise ValueError(
                "--repeats has bucket 0 (the held-out documents, never trained on) but --n-heldout is 0. Fix: give "
                "--n-heldout the number of bucket-0 documents, or leave 0 out of --repeats"
            )

    @property
    def extraction_window(self) -> int:
        """Tokens of a whole document that extraction reads (pack): --extract-len, at most --seq-len."""
        return min(self.extract_len, self.seq_len)

    @property
    def train_buckets(self) -> tuple[int, ...]:
        """The repetition buckets of training documents: --repeats without 0 (the held-out bucket)."""
        return tuple(r for r in self.repeats if r > 0)

    def repeats_by_id(self, documents: Sequence[data.TokenizedDocument]) -> dict[str, int]:
        """{document id: times it occurs per training epoch}: `documents` assigned to the non-zero buckets at
        random from the data seed, as evenly as possible (data.assign_buckets)."""
        buckets = data.assign_buckets(len(documents), self.train_buckets, self.seed)
        return {str(doc.id): bucket for doc, bucket in zip(documents, buckets)}

    def dedup_config(self) -> data.DedupConfig:
        return data.DedupConfig(mode=self.dedup, threshold=self.dedup_threshold, duplicates=self.duplicates)

    def example_repeats(self, split: data.DocumentSplit) -> dict[str, int]:
        """{id: sequences per epoch} of every document training runs over (`split.training_documents`): the
        --repeats count of each training document, and for a kept duplicate copy (--duplicates repeat) its twin's."""
        counts = self.repeats_by_id(split.train)
        return counts | {str(d.id): counts[str(d.repeat_of)] for d in split.repeats}

    def times_seen(self, split: data.DocumentSplit) -> dict[str, int]:
        """{training document id: times its text is trained on per epoch}, its kept duplicate copies included (the
        grouping of the repeats breakdown)."""
        counts = self.repeats_by_id(split.train)
        seen = dict(counts)
        for copy in split.repeats:
            seen[str(copy.repeat_of)] += counts[str(copy.repeat_of)]
        return seen

    def has_repeats(self, split: data.DocumentSplit) -> bool:
        """Whether training sees some document more than once per epoch (--repeats, or kept duplicates)."""
        return self.train_buckets != (1,) or bool(split.repeats)


def parse_finite_float(text: str) -> float:
    """A float option's value: inf and nan are refused (an infinite learning rate or a NaN weight decay would train
    to an all-NaN model)."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {text!r}")
    return value


def parse_repeats(text: str) -> tuple[int, ...]:
    """Parse '0,1,4,16' into (0, 1, 4, 16) (0: the held-out bucket)."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(
            f"cannot parse repeats {text!r}: use comma-separated integers >= 0, e.g. 0,1,4,16 (0 = held out)"
        ) from None
    if any(v < 0 for v in values) or not any(v > 0 for v in values):
        raise ValueError(f"repeats {text!r} must all be >= 0, at least one >= 1 (0 = the held-out documents)")
    return values


@dataclass(frozen=True)
class MaskSpec:
    """A goldfish mask; strategy None is the standard (unmasked) loss.

    k or h None (the default) takes the strategy's own (goldfish.strategies.default_k_h: 50 and 50 for apertus and
    megatron-2026, 4 and 13 for the others), resolved when the spec is built, so a built MaskSpec holds integers.
    """

    strategy: Strategy | None = "hashed"  # None: the standard loss
    k: int | None = None
    h: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.strategy is not None and self.strategy not in STRATEGIES:
            raise ValueError(f"unknown mask strategy {self.strategy!r}; choose one of {list(STRATEGIES)}")
        default_k, default_h = default_k_h(self.strategy)
        if self.k is None:
            object.__setattr__(self, "k", default_k)
        if self.h is None:
            object.__setattr__(self, "h", default_h)
        if self.strategy is not None and (not isinstance(self.k, int) or self.k < 2):
            raise ValueError(f"k must be an integer >= 2 (drop 1 in k tokens), got {self.k!r}")
        if not isinstance(self.h, int) or self.h < 1:
            raise ValueError(f"h (hash context width) must be an integer >= 1, got {self.h!r}")

    @property
    def label(self) -> str:
        if self.strategy is None:
            return "standard"
        window = f"-h{self.h}" if self.strategy in WINDOW_STRATEGIES else ""
        return f"goldfish-{self.strategy}-k{self.k}{window}"

    def dropped(self, targets: torch.Tensor, special_token_ids: Sequence[int]) -> torch.Tensor:
        """(B, T) targets -> (B, T) bool, True where the target is dropped from the loss."""
        import torch

        from goldfish.masks import drop_mask

        if self.strategy is None:
            return torch.zeros_like(targets, dtype=torch.bool)
        return drop_mask(targets, self.strategy, self.k, self.h, special_token_ids=special_token_ids, seed=self.seed)


# How users may name a mask besides the strategy names: "paper" is the goldfish paper's hash-table mask.
MASK_ALIASES = {"paper": "hashed-reference"}


def mask_spec(strategy: str | None, k: int | None = None, h: int | None = None, seed: int = 0) -> MaskSpec:
    """The MaskSpec of a strategy name as users write it: "standard" (or None) is the unmasked loss, "paper" the
    goldfish paper's hash-table mask (hashed-reference); k or h None takes the strategy's default (50 and 50 for
    apertus and megatron-2026, else 4 and 13)."""
    strategy = MASK_ALIASES.get(strategy or "", strategy)
    return MaskSpec(strategy=None if strategy in (None, "standard") else strategy, k=k, h=h, seed=seed)


def parse_mask(text: str) -> MaskSpec:
    """Parse 'standard', 'hashed:4', 'hashed:4:13', 'static:3', 'random:4', 'apertus', 'megatron-2026:50:50' or
    'paper:4:13' (= hashed-reference:4:13) into a MaskSpec; a missing K or H is the strategy's default."""
    if text == "standard":
        return mask_spec("standard")
    parts = text.split(":")
    try:
        strategy = parts[0]
        k = int(parts[1]) if len(parts) > 1 else None
        h = int(parts[2]) if len(parts) > 2 else None
    except ValueError:
        raise ValueError(f"cannot parse mask {text!r}: use STRATEGY[:K[:H]], e.g. hashed:4:13 or static:3") from None
    if len(parts) > 3:
        raise ValueError(f"cannot parse mask {text!r}: use STRATEGY[:K[:H]], e.g. hashed:4:13")
    return mask_spec(strategy, k, h)


def parse_grid(text: str) -> dict[str, int]:
    """Parse 'data=2,x=2,y=1,z=1' (any subset of the axes; missing axes are 1) into {axis: size}."""
    return parse_grid_sizes(text)


@dataclass(frozen=True)
class Instruments:
    """The memorization instruments run besides greedy extraction (research.md section 2).

    divergence: where greedy decoding first leaves the true suffix, and whether that position is a dropped one.
    probabilistic: exact probability that sampling at temperature 1 emits the true suffix (one teacher-forced pass).
    beams: beam-search extraction with this many beams (0 = off; the goldfish paper's attack uses 30).
    samples: sampling extraction with this many samples per document (0 = off), at `temperature` and `top_p`.
    prefix_lengths: greedy extraction again with each of these fixed prefix lengths (empty = off).
    """

    divergence: bool = True
    probabilistic: bool = True
    beams: int = 0
    samples: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    sample_seed: int = 0
    prefix_lengths: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefix_lengths", tuple(int(p) for p in self.prefix_lengths))
        if self.beams < 0 or self.beams == 1:
            raise ValueError(f"beams must be 0 (off) or >= 2, got {self.beams} (1 beam is greedy extraction)")
        if self.samples < 0:
            raise ValueError(f"samples must be >= 0 (0 = off), got {self.samples}")
        if any(p < 1 for p in self.prefix_lengths):
            raise ValueError(f"prefix lengths must be >= 1, got {self.prefix_lengths}")
        self.sampling()  # validates temperature and top_p

    def sampling(self) -> SamplingConfig:
        return SamplingConfig(
            temperature=self.temperature, top_p=self.top_p, n_samples=max(self.samples, 1), seed=self.sample_seed
        )


@dataclass(frozen=True)
class TrainSpec:
    """A `goldfish train` run: model and its init seed, documents, mask, optimisation, LoRA (rank 0: every weight)."""

    model: str = "tiny-llama"
    data: DataSpec = field(default_factory=DataSpec)
    mask: MaskSpec = field(default_factory=MaskSpec)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(epochs=20))
    init_seed: int = 0
    lora: LoraSpec = field(default_factory=LoraSpec)

    def __post_init__(self) -> None:
        if self.lora.enabled:
            check_lora_zero(self.train.zero)
        check_streaming_bound(self.data, self.train)
        check_mask_window(self.mask, self.data)


def check_extraction_window(data: DataSpec, extraction: ExtractionConfig, prefix_lengths: Sequence[int] = ()) -> None:
    """Refuse (ValueError) an extraction protocol longer than every document can be: rows of --seq-len tokens (with
    --pack or --background, extraction windows of --extract-len, at most --seq-len) hold no prefix and suffix of
    --prefix-len + --suffix-len tokens, so nothing could be measured; the same for each of --prefix-lengths."""
    whole = data.pack or data.background is not None
    window = data.extraction_window if whole else data.seq_len
    cut = "--extract-len/--seq-len" if whole else "--seq-len"
    if extraction.min_tokens() > window:
        raise ValueError(
            f"{extraction.requirement()}, and every document is cut to {window} tokens ({cut}). Fix: lower "
            f"--suffix-len (and --prefix-len) or raise {cut}"
        )
    too_long = [p for p in prefix_lengths if p + extraction.suffix_len > window]
    if too_long:
        raise ValueError(
            f"--prefix-lengths {','.join(map(str, too_long))}: with --suffix-len {extraction.suffix_len} a document "
            f"needs {too_long[0] + extraction.suffix_len} tokens, and every document is cut to {window} ({cut}), so "
            f"every document would be skipped. Fix: prefix lengths of at most {window - extraction.suffix_len}, or "
            f"raise {cut}"
        )


def check_mask_window(mask: MaskSpec, data: DataSpec) -> None:
    """Refuse a hashed mask that can never drop a target (ValueError): rows of --seq-len tokens hold seq_len - 1
    targets, and a hashed mask decides only where h targets end, so h >= seq_len drops nothing while the run is
    labelled goldfish. (Whole documents (--pack) are masked over the document, which may be longer: the run checks
    the mask it built, goldfish.app.training_rows.check_mask_drops.)"""
    if mask.strategy is not None and mask.strategy in WINDOW_STRATEGIES and not data.pack and mask.h >= data.seq_len:
        raise ValueError(
            f"--h {mask.h} with --seq-len {data.seq_len}: the hashed mask decides only where {mask.h} targets end, "
            f"and a row has {data.seq_len - 1}, so it would drop nothing. Fix: --h at most {data.seq_len - 1} "
            "(13 is usual), or a longer --seq-len"
        )


def check_streaming_bound(data: DataSpec, train: TrainConfig) -> None:
    """A streamed background has no end to train to: the run needs --max-steps (ValueError otherwise)."""
    if data.background_streaming and not train.max_steps:
        raise ValueError(
            "--background-streaming reads only what the run trains on, and an endless stream has no epoch to "
            "end: add --max-steps N (e.g. --max-steps 1000)"
        )


@dataclass(frozen=True)
class CompareSpec:
    """A standard-vs-goldfish comparison. curve_every: measure greedy extraction of the training documents every N
    epochs during training (0 = off; the last epoch is always measured when on; None only while the command line is
    resolved: no layer chose it, and it becomes epochs/10, goldfish.app.commands.compare.compare_spec). lora: train
    every model with LoRA adapters (rank 0: every weight); with_full: with LoRA, also train each model with every
    weight (full vs LoRA)."""

    model: str = "tiny-llama"
    data: DataSpec = field(default_factory=DataSpec)
    masks: list[MaskSpec] = field(default_factory=lambda: [MaskSpec("hashed", 4, 13)])
    # Measured on a 2-core CPU: the standard loss memorizes all 32 default documents in 60 epochs (README).
    train: TrainConfig = field(
        default_factory=lambda: TrainConfig(epochs=60, batch_size=8, lr=3e-3, warmup_steps=20, schedule="cosine")
    )
    extraction: ExtractionConfig = field(default_factory=ExtractionConfig)
    init_seed: int = 0
    instruments: Instruments = field(default_factory=Instruments)
    curve_every: int | None = 0
    lora: LoraSpec = field(default_factory=LoraSpec)
    with_full: bool = False
    # Several seeds: every model trained once per seed (init_seed and train.seed both set to it), results combined.
    seeds: tuple[int, ...] = ()
    # Seeds that played a part in choosing the settings (exploratory): the combined report flags any of them it ran.
    tuning_seeds: tuple[int, ...] = ()
    # The loss-, exposure- and compute-matched controls of a background comparison (goldfish.app.matched).
    matched_controls: bool = False
    # --resume of a --seeds run: seeds that finished are read back, not trained again (goldfish.app.finished_seeds).
    # How the run proceeds, not what it measures: not part of the config a finished seed is checked against.
    resume: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "seeds", tuple(self.seeds))
        object.__setattr__(self, "tuning_seeds", tuple(self.tuning_seeds))
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"--seeds lists a seed twice: {','.join(map(str, self.seeds))}")
        if self.matched_controls:
            self._check_matched_controls()
        if self.resume and not self.seeds:
            raise ValueError(
                "compare --resume continues a --seeds run (the seeds that finished are read back); give the run's "
                "--seeds, or leave out --resume"
            )
        if self.curve_every is not None and self.curve_every < 0:
            raise ValueError(f"curve_every must be >= 0 (0 = no curve), got {self.curve_every}")
        if self.with_full and not self.lora.enabled:
            raise ValueError("--with-full compares full fine-tuning with LoRA: give --lora-rank too")
        if self.lora.enabled:
            check_lora_zero(self.train.zero)
        check_streaming_bound(self.data, self.train)
        for mask in self.masks:
            check_mask_window(mask, self.data)

    def _check_matched_controls(self) -> None:
        if self.data.background is None:
            raise ValueError(
                "--matched-controls compares checkpoints by their validation loss on a background corpus: "
                "add --background SOURCE"
            )
        if not any(m.strategy in ("hashed", "static") for m in self.masks):
            raise ValueError("--matched-controls needs a hashed or static goldfish mask in --masks, e.g. hashed:4:13")
        if not self.train.eval_every or not self.train.max_steps:
            raise ValueError(
                "--matched-controls finds the loss-matched step among the validation steps: give --max-steps and "
                "--eval-every N (e.g. a quarter of --max-steps or less)"
            )
        if self.lora.enabled:
            raise ValueError("--matched-controls trains every weight: leave out --lora-rank")


def background_train_config(train: TrainConfig) -> TrainConfig:
    """A background run reads its rows in stream order (the stream is shuffled already, and exposures depend on it)."""
    return replace(train, shuffle=False)


RUN_FILE = "goldfish_run.json"  # the run record a goldfish train checkpoint folder keeps beside its weights
EvalPart = Literal["train", "heldout", "both"]  # which documents goldfish eval measures (both: membership too)
EVAL_PARTS: tuple[EvalPart, ...] = ("train", "heldout", "both")


@dataclass(frozen=True)
class EvalSpec:
    """A `goldfish eval` run: the model (a goldfish train checkpoint, HF folder/name, GGUF file or tiny model) and what
    to measure on it. data None: the documents of the model's run record; mask_from_record: score kept/dropped
    accuracy with the record's mask, else with `mask` (None: none). reference: the reference-ratio attack's
    reference ("auto", "none" or a model). part: "train", "heldout" or "both" (both also runs membership)."""

    model: str
    data: DataSpec | None = None
    mask: MaskSpec | None = None
    mask_from_record: bool = True
    init_seed: int = 0
    reference: str = "auto"
    part: EvalPart = "both"
    extraction: ExtractionConfig = field(default_factory=ExtractionConfig)
    instruments: Instruments = field(default_factory=Instruments)

    def __post_init__(self) -> None:
        if self.part not in EVAL_PARTS:
            raise ValueError(f"--part must be one of {', '.join(EVAL_PARTS)}, got {self.part!r}")


# The commands whose settings a resolved run file carries to --nproc workers (goldfish.app.runfile), and their specs.
Command = Literal["train", "compare", "eval"]
RunSpec = TrainSpec | CompareSpec | EvalSpec


@dataclass(frozen=True)
class Runtime:
    """Where and how a command runs; not part of what a run computes (a run's results do not depend on it, except
    for float rounding across devices and grids)."""

    device: str | None = None  # cpu, cuda, cuda:1 ...; None: cuda if available
    threads: int | None = None  # torch CPU threads; None: torch's choice
    progress: bool = True
    grid: str | None = None  # under torchrun: AXIS=SIZE pairs, e.g. data=2,x=2
    nproc: int | None = None  # launch this many local processes with torchrun
    report_to: ReportTo = "none"  # "tensorboard": the training scalars as event files too (goldfish.app.tracking)
    verify: bool = True  # on a tensor-parallel grid, check the sharding on a miniature first (engine.training.verify)

    def __post_init__(self) -> None:
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {self.threads}")
        if self.nproc is not None and self.nproc < 1:
            raise ValueError(f"--nproc must be >= 1, got {self.nproc}")
        if self.grid is not None:
            parse_grid(self.grid)  # fail before any process starts
        from goldfish.app.tracking import check_report_to

        check_report_to(self.report_to)

    def torch_device(self) -> torch.device:
        import torch

        if self.device:
            return torch.device(self.device)
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def parse_int_list(text: str, what: str) -> tuple[int, ...]:
    """Parse '16,32,64' into (16, 32, 64); `what` names the option in the error."""
    try:
        return tuple(int(part) for part in str(text).split(","))
    except ValueError:
        raise ValueError(f"cannot parse {what} {text!r}: use comma-separated integers, e.g. 16,32,64") from None


NODE = "node"  # --zero-hierarchy node: data ranks per node from the launcher, resolved once the grid exists


def parse_node_size(text: str) -> str | tuple[int, ...]:
    """--zero-hierarchy: "node" (resolved by `resolve_node_size`), "off" (no hierarchy: (1,)), a number of data ranks
    per node ((n,)), or level sizes innermost first ending with the node ((2, 8): GCD pairs in nodes of 8)."""
    if text == NODE:
        return NODE
    if text == "off":
        return (1,)
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(
            f"--zero-hierarchy takes 'node', 'off', a number of data ranks per node or level sizes such as 2,8, "
            f"got {text!r}"
        ) from None
    if any(size < 1 for size in sizes):
        raise ValueError(f"--zero-hierarchy sizes must be >= 1 data ranks, got {text!r}")
    return sizes


def hierarchy_fields(
    value: int | str | tuple[int, ...], inner_default: tuple[int, ...], shape: GridShape | None
) -> tuple[int, tuple[int, ...]]:
    """(zero_node_size, zero_inner_levels) of a parsed --zero-hierarchy value: a typed value sets both (levels
    before the last are the inner ones); the untyped default (the config's own int node size) keeps the config's
    inner levels."""
    if isinstance(value, tuple):
        return value[-1], tuple(value[:-1])
    if value == NODE:
        return resolve_node_size(value, shape), ()
    return int(value), tuple(inner_default)


def resolve_node_size(value: int | str, shape: GridShape | None) -> int:
    """The data ranks per node of --zero-hierarchy: "node" asks the launcher (LOCAL_WORLD_SIZE, the processes per
    node torchrun and SLURM's srun set) how many ranks share this node and counts the data indices among them.
    shape: the grid's sizes (None: a single process)."""
    if value != NODE:
        return int(value)
    if shape is None:
        raise ValueError("--zero-hierarchy node needs a parallel run (--nproc or torchrun with --grid data>=2)")
    local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("SLURM_NTASKS_PER_NODE", shape.world_size)))
    return data_ranks_per_node(local, shape)
