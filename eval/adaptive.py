"""Adaptive extraction: beam search, sampling, and the exact probability that sampling emits the true suffix.

Greedy decoding (eval/extraction.py) asks whether the single most likely continuation is the true suffix. An
attacker can do more:
  * beam search keeps the ``num_beams`` most likely partial continuations and returns the most likely complete one
    (the goldfish paper's adaptive attack uses about 30 beams);
  * sampling draws ``n_samples`` continuations at a temperature, optionally from the top-p nucleus, and succeeds if
    any one of them is the true suffix;
  * probabilistic extraction (Hayes et al. 2024, "Measuring memorization through probabilistic discoverable
    extraction") computes q, the exact probability that ONE sampled continuation equals the true suffix, from a
    single teacher-forced pass, and from it the number of samples n = ceil(log(1 - p) / log(1 - q)) an attacker
    needs to emit the suffix at least once with probability p.

Decoding here never stops at an end-of-sequence token: exactly ``suffix_len`` tokens are generated, as in greedy
extraction, where an early EOS is just a wrong token.

Sampling distribution (used by both ``sample_decode`` and the exact probability, so they agree): at each step the
logits are divided by the temperature, turned into probabilities with a softmax, and, when top_p < 1, restricted to
the nucleus: tokens sorted by decreasing probability (ties in increasing token id) are kept while the probability
mass of the tokens before them is < top_p, so the smallest set whose mass reaches top_p is kept, and the most
likely token always is; the kept probabilities are renormalised. No top-k cut is applied (Hugging Face's default
top_k=50 is switched off explicitly). This is Hugging Face's ``TopPLogitsWarper`` rule; the two can differ only
for tokens of exactly equal probability at the nucleus boundary (its sort order among ties is unspecified) or
when the mass before a token is within float rounding of top_p.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict
from typing import Any, Callable, Sequence

import torch
from transformers import GenerationConfig

from eval.batching import decode_longest_first, evaluating, left_pad, model_device
from eval.config import SamplingConfig  # noqa: F401 - re-exported: defined torch-free for the command line
from eval.extraction import ExtractionConfig, split_documents
from eval.logprobs import iter_next_token_logits
from eval.metrics import (
    ANY_EXACT,
    EXACT_MATCH,
    LONGEST_CORRECT_PREFIX,
    MATCH_FRACTION,
    exact_match,
    longest_correct_prefix,
    match_fraction,
    mean_of_present,
    rouge_scores,
)

DEFAULT_CONFIDENCES = (0.5, 0.9, 0.99)
DEFAULT_BUDGETS = (1, 10, 100, 1000)


def _check_prefixes(prefixes: Sequence[Sequence[int]], max_new_tokens: int) -> None:
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    for i, p in enumerate(prefixes):
        if len(p) == 0:
            raise ValueError(f"prefix {i} is empty; decoding needs at least one prompt token")


def _generation_config(max_new_tokens: int, pad_token_id: int, **settings: Any) -> GenerationConfig:
    # eos_token_id=[] (not None: None is replaced by the model's own EOS) disables stopping at EOS, so every
    # continuation has exactly max_new_tokens ids. top_k=0 (not None, for the same reason) disables top-k when
    # sampling; without sampling it is left out (generate warns about sampling flags in a search).
    if settings.get("do_sample"):
        settings = {"top_k": 0, **settings}
    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        min_new_tokens=0,
        eos_token_id=[],
        pad_token_id=pad_token_id,
        use_cache=True,
        **settings,
    )


def beam_search_decode(
    model: torch.nn.Module,
    prefixes: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    num_beams: int,
    pad_token_id: int,
    batch_size: int = 8,
) -> list[list[int]]:
    """Most likely continuation of each prefix found by beam search with ``num_beams`` beams (HF ``generate``).

    Returns exactly ``max_new_tokens`` ids per prefix, in the input order. All beams have the same length (no EOS
    stop), so the length penalty plays no role: the result is the beam with the highest total log-probability.
    ``num_beams=1`` is greedy decoding. Memory grows with batch_size * num_beams sequences.
    """
    if num_beams < 1:
        raise ValueError(f"num_beams must be >= 1, got {num_beams}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    _check_prefixes(prefixes, max_new_tokens)
    device = model_device(model)
    # transformers' beam search reads `pad_token_id or eos_token_id[0]`, which fails for pad id 0 with no EOS. The
    # pad id only fills masked-out positions (attention mask 0) and is never generated here, so any other id gives
    # the same beams.
    pad_token_id = pad_token_id if pad_token_id != 0 else 1
    config = _generation_config(
        max_new_tokens, pad_token_id, do_sample=False, num_beams=num_beams, num_return_sequences=1, early_stopping=True
    )

    def search(rows: list[list[int]]) -> list[list[int]]:
        input_ids, mask, _ = left_pad(rows, pad_token_id, device)
        out = model.generate(input_ids=input_ids, attention_mask=mask, generation_config=config)
        return out[:, input_ids.shape[1] :].tolist()

    with evaluating(model):
        return decode_longest_first(prefixes, batch_size, search)


def document_seed(seed: int, document_id: str) -> int:
    """A per-document seed from the run seed and the document id: samples do not depend on document order."""
    digest = hashlib.sha256(f"{seed}:{document_id}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def sample_decode(
    model: torch.nn.Module,
    prefix: Sequence[int],
    max_new_tokens: int,
    sampling: SamplingConfig,
    *,
    pad_token_id: int,
    seed: int | None = None,
) -> list[list[int]]:
    """``sampling.n_samples`` independent sampled continuations of one prefix, ``max_new_tokens`` ids each.

    Uses HF ``generate(do_sample=True)`` with the distribution described in the module docs. The random stream
    is seeded with ``seed`` (default ``sampling.seed``) inside a forked RNG state, so the caller's global RNG is
    untouched and the same seed gives the same samples on the same device and library versions.
    """
    _check_prefixes([prefix], max_new_tokens)
    device = model_device(model)
    config = _generation_config(
        max_new_tokens,
        pad_token_id,
        do_sample=True,
        num_beams=1,
        num_return_sequences=sampling.n_samples,
        temperature=float(sampling.temperature),
        top_p=float(sampling.top_p),
    )
    input_ids = torch.tensor([[int(t) for t in prefix]], dtype=torch.long, device=device)
    mask = torch.ones_like(input_ids)
    devices = (
        [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    )
    with evaluating(model), torch.random.fork_rng(devices=devices):
        torch.manual_seed(sampling.seed if seed is None else seed)
        out = model.generate(input_ids=input_ids, attention_mask=mask, generation_config=config)
    return out[:, input_ids.shape[1] :].tolist()


def nucleus_log_probs(logits: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0) -> torch.Tensor:
    """Log-probabilities of the sampling distribution of the module docs, float64, -inf outside the nucleus.

    logits: (..., V). Returns (..., V); each row's exp sums to 1.
    """
    SamplingConfig(temperature=temperature, top_p=top_p)  # validates both
    log_probs = torch.log_softmax(logits.double() / temperature, dim=-1)
    if top_p >= 1:
        return log_probs
    probs = log_probs.exp()
    # Stable sort of -p: decreasing probability, ties in increasing token id.
    order = torch.sort(-probs, dim=-1, stable=True).indices
    sorted_probs = probs.gather(-1, order)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    keep_sorted = mass_before < top_p
    keep_sorted[..., 0] = True  # the most likely token is always kept
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    kept = log_probs.masked_fill(~keep, float("-inf"))
    return kept - torch.logsumexp(kept, dim=-1, keepdim=True)


def suffix_log_probability(
    logits: torch.Tensor, suffix: Sequence[int], temperature: float = 1.0, top_p: float = 1.0
) -> float:
    """log q: natural log of the probability that sampling emits exactly ``suffix`` (-inf if impossible).

    logits: (S, V) teacher-forced logits, row i predicting suffix[i] given the prefix and suffix[:i]. q is the
    product over i of the sampling probability of suffix[i] (chain rule), computed as a sum of logs in float64.
    """
    if logits.dim() != 2 or logits.shape[0] != len(suffix):
        raise ValueError(f"logits must be (S, V) with S = len(suffix) = {len(suffix)}, got {tuple(logits.shape)}")
    log_probs = nucleus_log_probs(logits, temperature, top_p)  # (S, V)
    ids = torch.tensor([int(t) for t in suffix], dtype=torch.long)[:, None]
    return float(log_probs.gather(1, ids).sum())


def _log1mexp(log_q: float) -> float:
    """log(1 - q) from log q < 0, accurate at both ends (log1p for small q, expm1 for q near 1)."""
    return math.log1p(-math.exp(log_q)) if log_q < -math.log(2) else math.log(-math.expm1(log_q))


def _log_neg_log1mexp(log_q: float) -> float:
    """log(-log(1 - q)) from log q < 0. For q < e^-30, -log(1 - q) = q (1 + q/2 + ...) = q to 1e-13 relative."""
    return log_q if log_q < -30 else math.log(-_log1mexp(log_q))


def samples_needed(log_q: float, confidence: float) -> float:
    """Samples needed to emit the suffix at least once with probability ``confidence``: ceil(log(1-p) / log(1-q)).

    Takes log q (natural log) so that tiny q stay representable. Returns a whole number as a float, at least 1;
    math.inf when q = 0 or when the count exceeds the float range (see ``log10_samples_needed`` for those).
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence p must be in (0, 1), got {confidence}")
    if log_q > 0 or math.isnan(log_q):
        raise ValueError(f"log q must be <= 0, got {log_q}")
    if log_q == 0:  # q = 1: the first sample is the suffix
        return 1.0
    if log_q == float("-inf"):
        return math.inf
    log_one_minus_q = _log1mexp(log_q)
    if log_one_minus_q == 0.0:  # q underflowed (q < 1e-308): n ~ -log(1-p) / q is beyond the float range
        return math.inf
    n = math.log1p(-confidence) / log_one_minus_q
    return max(1.0, float(math.ceil(n))) if math.isfinite(n) else math.inf


def log10_samples_needed(log_q: float, confidence: float) -> float:
    """log10 of the real-valued n = log(1-p) / log(1-q) (before rounding up), finite for every q > 0; for reporting
    suffixes far too unlikely for ``samples_needed`` to represent. 0 when q = 1, inf when q = 0."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence p must be in (0, 1), got {confidence}")
    if log_q > 0 or math.isnan(log_q):
        raise ValueError(f"log q must be <= 0, got {log_q}")
    if log_q == 0:
        return 0.0
    if log_q == float("-inf"):
        return math.inf
    return (math.log(-math.log1p(-confidence)) - _log_neg_log1mexp(log_q)) / math.log(10)


def extraction_probability(log_q: float, n_samples: int) -> float:
    """Probability that at least one of ``n_samples`` independent samples is the suffix: 1 - (1 - q)^n."""
    if n_samples < 0:
        raise ValueError(f"n_samples must be >= 0, got {n_samples}")
    if log_q == float("-inf"):
        return 0.0
    return -math.expm1(n_samples * _log1mexp(log_q)) if log_q < 0 else 1.0


_split_documents = split_documents  # the same split as greedy extraction


def _decoded_metrics(
    generated: list[int], suffix: list[int], decode: Callable[[list[int]], str] | None
) -> dict[str, Any]:
    row: dict[str, Any] = {
        EXACT_MATCH: exact_match(generated, suffix),
        MATCH_FRACTION: match_fraction(generated, suffix),
        LONGEST_CORRECT_PREFIX: longest_correct_prefix(generated, suffix),
    }
    if decode is not None:
        row.update(rouge_scores(decode(generated), decode(suffix)))
    return row


def beam_extract(
    model: torch.nn.Module,
    documents: Sequence[Any],
    config: ExtractionConfig,
    *,
    num_beams: int = 30,
    pad_token_id: int,
    decode: Callable[[list[int]], str] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Beam-search extraction: per document (``.id``, ``.token_ids``), the metrics of greedy extraction on the
    best beam (exact match, match fraction, longest correct prefix, and ROUGE when ``decode`` is given).

    Returns (rows, summary) with summary = means over documents plus counts; documents too short for ``config``
    are skipped and listed. ``config.batch_size`` documents are searched together.
    """
    kept, skipped = _split_documents(documents, config)
    generated = beam_search_decode(
        model,
        [prefix for _, prefix, _ in kept],
        config.suffix_len,
        num_beams=num_beams,
        pad_token_id=pad_token_id,
        batch_size=config.batch_size,
    )
    rows = []
    for (doc, prefix, suffix), gen in zip(kept, generated):
        rows.append(
            {
                "id": str(doc.id),
                "n_prefix_tokens": len(prefix),
                "num_beams": num_beams,
                **_decoded_metrics(gen, suffix, decode),
                "generated_ids": gen,
            }
        )
    return rows, summarize_beam(rows, skipped, config, num_beams)


def summarize_beam(
    rows: Sequence[dict[str, Any]], skipped_ids: Sequence[str], config: ExtractionConfig, num_beams: int
) -> dict[str, Any]:
    """The summary ``beam_extract`` returns, from its rows and the ids it skipped as too short: counts, settings
    and the mean of every per-document metric the rows carry (ROUGE only when the rows have it)."""
    metric_names = [
        k for k in (rows[0] if rows else {}) if k not in ("id", "n_prefix_tokens", "num_beams", "generated_ids")
    ]
    summary: dict[str, Any] = {
        "n_docs": len(rows),
        "n_skipped_too_short": len(skipped_ids),
        "skipped_ids": [str(i) for i in skipped_ids],
        "num_beams": num_beams,
        "config": asdict(config),
    }
    for name in metric_names:
        summary[name] = mean_of_present([float(r[name]) for r in rows])
    return summary


def sampling_extract(
    model: torch.nn.Module,
    documents: Sequence[Any],
    config: ExtractionConfig,
    sampling: SamplingConfig,
    *,
    pad_token_id: int,
    keep_samples: bool = False,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Sampling extraction: ``sampling.n_samples`` continuations per document, seeded per document by
    ``document_seed(sampling.seed, id)``.

    Row per document: ``n_exact`` (samples equal to the true suffix), ``any_exact`` (at least one),
    ``best_match_fraction``, ``best_longest_correct_prefix``, ``mean_match_fraction``, and the samples' ids when
    ``keep_samples``. Summary: fraction of documents with ``any_exact`` and means.
    """
    kept, skipped = _split_documents(documents, config)
    rows = []
    for doc, prefix, suffix in kept:
        samples = sample_decode(
            model,
            prefix,
            config.suffix_len,
            sampling,
            pad_token_id=pad_token_id,
            seed=document_seed(sampling.seed, str(doc.id)),
        )
        fractions = [match_fraction(s, suffix) for s in samples]
        n_exact = sum(exact_match(s, suffix) for s in samples)
        row: dict[str, Any] = {
            "id": str(doc.id),
            "n_prefix_tokens": len(prefix),
            "n_samples": len(samples),
            "n_exact": n_exact,
            ANY_EXACT: n_exact > 0,
            "best_match_fraction": max(fractions),
            "best_longest_correct_prefix": max(longest_correct_prefix(s, suffix) for s in samples),
            "mean_match_fraction": sum(fractions) / len(fractions),
        }
        if keep_samples:
            row["samples"] = samples
        rows.append(row)
    return rows, summarize_sampling(rows, skipped, config, sampling)


def summarize_sampling(
    rows: Sequence[dict[str, Any]], skipped_ids: Sequence[str], config: ExtractionConfig, sampling: SamplingConfig
) -> dict[str, Any]:
    """The summary ``sampling_extract`` returns, from its rows and the ids it skipped as too short: counts,
    settings, the fraction of documents with ``any_exact``, means, and the share of all samples that are exact."""
    summary: dict[str, Any] = {
        "n_docs": len(rows),
        "n_skipped_too_short": len(skipped_ids),
        "skipped_ids": [str(i) for i in skipped_ids],
        "sampling": asdict(sampling),
        "config": asdict(config),
    }
    for name in (ANY_EXACT, "best_match_fraction", "best_longest_correct_prefix", "mean_match_fraction"):
        summary[name] = mean_of_present([float(r[name]) for r in rows])
    summary["sample_exact_rate"] = sum(r["n_exact"] for r in rows) / sum(r["n_samples"] for r in rows) if rows else None
    return summary


def probabilistic_extract(
    model: torch.nn.Module,
    documents: Sequence[Any],
    config: ExtractionConfig,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    pad_token_id: int,
    confidences: Sequence[float] = DEFAULT_CONFIDENCES,
    budgets: Sequence[int] = DEFAULT_BUDGETS,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Exact probability q that sampling (temperature, top_p) emits each document's true suffix after its prefix.

    One teacher-forced pass over prefix + suffix per document. Row per document: ``log_q`` (natural log, -inf when
    a suffix token falls outside the nucleus), ``log10_q``, ``samples_needed`` and ``log10_samples_needed`` per
    confidence p (keys like "0.9"), and ``extraction_probability`` 1 - (1 - q)^n per sample budget n.
    Summary: per budget the expected fraction of documents extracted (mean of those probabilities), per confidence
    the median samples needed, and the fraction of documents with q >= 0.5 (sampling more likely than not emits
    them).
    """
    SamplingConfig(temperature=temperature, top_p=top_p)  # validates
    kept, skipped = _split_documents(documents, config)
    sequences = [prefix + suffix for _, prefix, suffix in kept]
    rows = []
    logits_iter = iter_next_token_logits(model, sequences, pad_token_id=pad_token_id, batch_size=config.batch_size)
    for (doc, prefix, suffix), logits in zip(kept, logits_iter):
        # logits row j predicts token j + 1: the suffix tokens sit at len(prefix) .. len(prefix) + S - 1.
        suffix_logits = logits[len(prefix) - 1 : len(prefix) - 1 + len(suffix)]
        log_q = suffix_log_probability(suffix_logits, suffix, temperature, top_p)
        rows.append(
            {
                "id": str(doc.id),
                "n_prefix_tokens": len(prefix),
                "log_q": log_q,
                "log10_q": log_q / math.log(10),
                "samples_needed": {f"{p:g}": samples_needed(log_q, p) for p in confidences},
                "log10_samples_needed": {f"{p:g}": log10_samples_needed(log_q, p) for p in confidences},
                "extraction_probability": {str(n): extraction_probability(log_q, n) for n in budgets},
            }
        )
    return rows, summarize_probabilistic(rows, skipped, config, temperature, top_p, confidences, budgets)


def summarize_probabilistic(
    rows: Sequence[dict[str, Any]],
    skipped_ids: Sequence[str],
    config: ExtractionConfig,
    temperature: float = 1.0,
    top_p: float = 1.0,
    confidences: Sequence[float] = DEFAULT_CONFIDENCES,
    budgets: Sequence[int] = DEFAULT_BUDGETS,
) -> dict[str, Any]:
    """The summary ``probabilistic_extract`` returns, from its rows (made with the same ``confidences`` and
    ``budgets``) and the ids it skipped as too short: per budget the expected fraction of documents extracted, per
    confidence the median samples needed, the fraction of documents with q >= 0.5 and the mean finite log10 q."""
    summary: dict[str, Any] = {
        "n_docs": len(rows),
        "n_skipped_too_short": len(skipped_ids),
        "skipped_ids": [str(i) for i in skipped_ids],
        "temperature": temperature,
        "top_p": top_p,
        "config": asdict(config),
        "expected_fraction_extracted": {
            str(n): mean_of_present([r["extraction_probability"][str(n)] for r in rows]) for n in budgets
        },
        "median_samples_needed": {
            f"{p:g}": _median([r["samples_needed"][f"{p:g}"] for r in rows]) for p in confidences
        },
        "fraction_q_at_least_half": mean_of_present([float(r["log_q"] >= math.log(0.5)) for r in rows]),
        "mean_log10_q": mean_of_present([r["log10_q"] for r in rows if math.isfinite(r["log10_q"])]),
    }
    return summary


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
