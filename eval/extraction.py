"""Extraction: prompt a causal LM with each document's prefix, decode greedily, score the continuation.

Two split protocols (``ExtractionConfig``):
  * ``prefix_len=None`` (goldfish paper): suffix = the last ``suffix_len`` tokens, prefix = everything before;
  * ``prefix_len=P`` (Pythia 32/32): prefix = the first P tokens, suffix = the next ``suffix_len`` tokens.

Decoding is batched greedy search with a KV cache and left padding; explicit position ids make every padded
row see exactly the positions an unpadded run sees, so results equal batch-size-1 decoding.
"""

from __future__ import annotations

import importlib.metadata
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, StaticCache

from data.atomic import write_json_atomic, write_jsonl_atomic
from eval.batching import decode_longest_first, evaluating, left_pad, model_device
from eval.intervals import DEFAULT_RESAMPLES, mean_interval
from eval.metrics import (
    DEFAULT_TOKENIZER_MIN_KEPT,
    IGNORE_INDEX,
    default_tokenizer_kept_fraction,
    exact_match,
    longest_correct_prefix,
    match_fraction,
    mean_of_present,
    rouge_scores,
    teacher_forced_accuracy,
)

log = logging.getLogger(__name__)

# Per-document metrics averaged into the summary (exact_match's mean is the fraction of documents).
_SUMMARY_METRICS = (
    "exact_match",
    "match_fraction",
    "longest_correct_prefix",
    "rouge_l",
    "rouge_l_recall",
    "rouge_1",
    "rouge_2",
    "rouge_l_unicode",
    "tf_accuracy",
    "tf_kept_accuracy",
    "tf_dropped_accuracy",
)
# Summary means that also get a bootstrap interval (`<name>_ci`): the headline figures of a part.
INTERVAL_METRICS = ("exact_match", "rouge_l")


@dataclass
class ExtractionConfig:
    """How each document is split into a prompt and a suffix to reproduce.

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

    def split(self, token_ids: Sequence[int]) -> tuple[list[int], list[int]] | None:
        """(prefix, suffix) of a document, or None when it is too short for this split."""
        if len(token_ids) < self.min_tokens():
            return None
        ids = [int(t) for t in token_ids]
        if self.prefix_len is None:
            return ids[: -self.suffix_len], ids[-self.suffix_len :]
        p = self.prefix_len
        return ids[:p], ids[p : p + self.suffix_len]


def split_documents(
    documents: Sequence[Any], config: ExtractionConfig
) -> tuple[list[tuple[Any, list[int], list[int]]], list[str]]:
    """(kept, skipped_ids): (document, prefix, suffix) for every document long enough for ``config``, in input
    order, and the ids (as str) of the documents too short for it. Documents have ``.id`` and ``.token_ids``."""
    kept: list[tuple[Any, list[int], list[int]]] = []
    skipped: list[str] = []
    for doc in documents:
        parts = config.split(doc.token_ids)
        if parts is None:
            skipped.append(str(doc.id))
        else:
            kept.append((doc, parts[0], parts[1]))
    return kept, skipped


def check_fits_context(model: torch.nn.Module, documents: Sequence[Any]) -> None:
    """Raise ValueError when a document (``.id``, ``.token_ids``) is longer than the model's context
    (``model.config.max_position_embeddings``; no check when the model does not say)."""
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    too_long = [str(doc.id) for doc in documents if context is not None and len(doc.token_ids) > context]
    if too_long:
        raise ValueError(
            f"{len(too_long)} document(s) (first: {too_long[0]!r}) are longer than the model's context of "
            f"{context} tokens; truncate documents to at most {context} tokens before extraction"
        )


@dataclass(frozen=True)
class GreedyPath:
    """One greedy continuation and how close it came to a tie.

    ids: the generated ids. min_margin: the smallest top-1 minus top-2 logit (in the model's logit units,
    computed in float32) over the generated positions; None when the vocabulary has a single entry.
    min_margin_position: the 0-based generated position where it occurs (the first, on equal margins).
    A greedy id whose margin is within float rounding of 0 can flip between batch sizes, devices or
    kernels without any real difference in the model.
    """

    ids: list[int]
    min_margin: float | None
    min_margin_position: int | None


def _static_cache_fits(model: torch.nn.Module) -> bool:
    """Whether greedy decoding may give `model` a preallocated (static) KV cache: a plain Hugging Face model. A model
    whose decoder the engine parallelized (its layers hold a slice of the heads, modules marked with
    ``_engine_stack_grid``) or a wrapper around one keeps the dynamic cache it creates itself."""
    if not isinstance(model, PreTrainedModel) or not getattr(model, "_supports_static_cache", True):
        return False
    return not any(getattr(m, "_engine_stack_grid", None) is not None for m in model.modules())


def _paths(generated: torch.Tensor, margins: torch.Tensor, vocab: int) -> list[GreedyPath]:
    """One GreedyPath per row of generated ids (B, N) and their top-2 margins (B, N); no margin record for a
    vocabulary of one entry."""
    if vocab < 2:
        return [GreedyPath(ids, None, None) for ids in generated.tolist()]
    smallest, where = margins.min(dim=-1)  # (B,), first position on ties
    return [
        GreedyPath(ids, float(m), int(p)) for ids, m, p in zip(generated.tolist(), smallest.tolist(), where.tolist())
    ]


def _greedy_batch(
    model: torch.nn.Module, rows: list[list[int]], max_new_tokens: int, pad_token_id: int, device: torch.device
) -> list[GreedyPath]:
    """Greedy continuation of one batch of prompts: one GreedyPath per row (max_new_tokens ids each).

    A plain HF model gets a static KV cache of the prompt's length + max_new_tokens, allocated once: a dynamic cache
    concatenates every layer's keys and values at every step (copying the whole cache, B x heads x L x head_dim per
    layer and step). Masked cache slots get zero attention weight, so the ids equal the dynamic cache's (checked
    against HF generate by tests/test_extraction.py and bench/extraction.py). Other models create their own cache.
    """
    input_ids, mask, position_ids = left_pad(rows, pad_token_id, device)
    n_rows, prompt_len = input_ids.shape
    generated = torch.empty((n_rows, max_new_tokens), dtype=torch.long, device=device)
    margins = torch.empty((n_rows, max_new_tokens), dtype=torch.float32, device=device)
    # The attention mask of every step is a prefix of one (B, L + new) mask built once.
    full_mask = torch.cat([mask, mask.new_ones((n_rows, max_new_tokens))], dim=1)
    static = {}
    if _static_cache_fits(model):
        static = {
            "past_key_values": StaticCache(config=model.config, max_cache_len=prompt_len + max_new_tokens),
            "cache_position": torch.arange(prompt_len, device=device),
        }
    # logits_to_keep=1 avoids materialising (B, L, V) logits for the whole prompt.
    out = model(
        input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=True, logits_to_keep=1, **static
    )
    for step in range(max_new_tokens):
        logits = out.logits[:, -1, :]  # (B, V)
        next_ids = logits.argmax(dim=-1)  # (B,)
        generated[:, step] = next_ids
        margins[:, step] = _top2_margins(logits)
        if step == max_new_tokens - 1:
            break
        position_ids = position_ids[:, -1:] + 1
        if static:
            static["cache_position"] = static["cache_position"][-1:] + 1
        out = model(
            input_ids=next_ids[:, None],
            attention_mask=full_mask[:, : prompt_len + step + 1],
            position_ids=position_ids,
            past_key_values=static.get("past_key_values", out.past_key_values),
            use_cache=True,
            logits_to_keep=1,
            **({"cache_position": static["cache_position"]} if static else {}),
        )
    return _paths(generated, margins, out.logits.shape[-1])


def greedy_paths(
    model: torch.nn.Module,
    prefixes: list[list[int]],
    max_new_tokens: int,
    *,
    pad_token_id: int,
    batch_size: int = 32,
    device: torch.device | str | None = None,
) -> list[GreedyPath]:
    """`greedy_decode`, with each continuation's near-tie record (`GreedyPath`), in the input order."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    for i, p in enumerate(prefixes):
        if len(p) == 0:
            raise ValueError(f"prefix {i} is empty; greedy decoding needs at least one prompt token")
    device = torch.device(device) if device is not None else model_device(model)

    with evaluating(model):
        return decode_longest_first(
            prefixes, batch_size, lambda rows: _greedy_batch(model, rows, max_new_tokens, pad_token_id, device)
        )


def greedy_decode(
    model: torch.nn.Module,
    prefixes: list[list[int]],
    max_new_tokens: int,
    *,
    pad_token_id: int,
    batch_size: int = 32,
    device: torch.device | str | None = None,
) -> list[list[int]]:
    """Greedy continuations of ``prefixes``, exactly ``max_new_tokens`` ids each, in the input order.

    Batched with a KV cache and left padding; on CPU equal to batch-size-1 decoding and to HF
    ``generate(do_sample=False)`` without an EOS stop (an early EOS is just another generated id). On GPUs,
    float rounding depends on the batch's shape, so an id whose top-2 logits are within rounding can differ
    (`greedy_paths` records each continuation's smallest margin). Prefixes are decoded longest first so
    similar lengths share a batch (less padding) and the biggest batch runs first (an out-of-memory error
    shows up at once). ``device`` defaults to the model's.
    """
    return [
        path.ids
        for path in greedy_paths(
            model, prefixes, max_new_tokens, pad_token_id=pad_token_id, batch_size=batch_size, device=device
        )
    ]


def _document_accuracy(
    logits: torch.Tensor,
    doc: list[int],
    drop_mask_fn: Callable[[torch.Tensor], torch.Tensor] | None,
) -> dict[str, float | int | None]:
    """Teacher-forced accuracy of one document from its (1, T, V) logits (position j predicts token j+1).

    Targets have shape (1, T), the training convention: position j holds token j+1 and the last position holds
    -100 (nothing follows). So ``drop_mask_fn`` sees exactly the targets training built its mask from and returns
    the same (1, T) bool mask.
    """
    targets = torch.full((1, len(doc)), IGNORE_INDEX, dtype=torch.long, device=logits.device)  # (1, T)
    targets[0, :-1] = torch.tensor(doc[1:], dtype=torch.long)
    dropped = None
    if drop_mask_fn is not None:
        dropped = drop_mask_fn(targets)
        if dropped.shape != targets.shape or dropped.dtype != torch.bool:
            raise ValueError(
                f"drop_mask_fn must return a bool tensor of the targets' shape "
                f"{tuple(targets.shape)}, got {dropped.dtype} {tuple(dropped.shape)}"
            )
    return teacher_forced_accuracy(logits, targets, dropped)


def _top2_margins(logits: torch.Tensor) -> torch.Tensor:
    """Top-1 minus top-2 logit along the last axis, in float32: (..., V) -> (...); zeros for a 1-entry vocabulary."""
    if logits.shape[-1] < 2:
        return logits.new_zeros(logits.shape[:-1], dtype=torch.float32)
    top2 = logits.float().topk(2, dim=-1).values
    return top2[..., 0] - top2[..., 1]


def _forced_then_greedy(
    model: torch.nn.Module,
    docs: list[list[int]],
    prefix_lens: list[int],
    suffix_len: int,
    pad_token_id: int,
    drop_mask_fn: Callable[[torch.Tensor], torch.Tensor] | None,
    device: torch.device,
) -> tuple[list[GreedyPath], list[dict[str, float | int | None]]]:
    """Greedy continuation of each document's prefix AND its teacher-forced accuracy, from one shared pass.

    One forward over the whole documents (B, W) gives the teacher-forced logits every metric needs, and with them
    the greedy path as far as it follows the true suffix: while the greedy id equals the true next token, the
    greedy context IS the document, so the id at step j is argmax of the teacher-forced logits at the prefix's end
    + j. Row i's path is read off up to and including its first mismatch m_i; only the steps after the smallest m_i
    of the batch are decoded, one token at a time, on the KV cache of that same pass (its columns past the smallest
    m_i masked out; a memorized batch decodes nothing). Rows decode in lockstep; a row whose id at a step is already
    known from the forced pass keeps it. So the ids equal greedy decoding from the prefix (`greedy_paths`), up to
    float rounding on a near-tie (the margins record it), and the prompt tokens go through the model once instead
    of twice (decode, then teacher forcing).

    Layout: rows are left-padded so every prefix ends at column Lp (prefix_lens[i] = P_i, the suffix is
    docs[i][P_i : P_i + suffix_len]); tokens after the suffix (Pythia split) follow, right-padded.
    """
    n_rows, s = len(docs), suffix_len
    lp = max(prefix_lens)
    width = lp + max(len(d) - p for d, p in zip(docs, prefix_lens))
    input_ids = torch.full((n_rows, width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((n_rows, width), dtype=torch.long)
    starts = [lp - p for p in prefix_lens]
    for i, (d, start) in enumerate(zip(docs, starts)):
        input_ids[i, start : start + len(d)] = torch.tensor(d, dtype=torch.long)
        mask[i, start : start + len(d)] = 1
    input_ids, mask = input_ids.to(device), mask.to(device)
    position_ids = (mask.cumsum(dim=-1) - 1).clamp(min=0)  # (B, W): 0 at each row's first real token
    suffix = input_ids[:, lp : lp + s]  # (B, S)

    static = _static_cache_fits(model)
    # Room for the document and the at most S - 1 decoded tokens appended after it.
    cache = StaticCache(config=model.config, max_cache_len=width + s - 1) if static else None
    out = model(
        input_ids=input_ids,
        attention_mask=mask,
        position_ids=position_ids,
        use_cache=True,
        **({"past_key_values": cache, "cache_position": torch.arange(width, device=device)} if static else {}),
    )
    logits = out.logits  # (B, W, V)
    accuracies = [
        _document_accuracy(logits[i : i + 1, start : start + len(d)], d, drop_mask_fn)
        for i, (d, start) in enumerate(zip(docs, starts))
    ]

    forced = logits[:, lp - 1 : lp - 1 + s]  # (B, S, V): step j's logits given the true prefix + suffix[:j]
    generated = forced.argmax(dim=-1)  # (B, S)
    margins = _top2_margins(forced)  # (B, S)
    mismatch = generated != suffix
    first_miss = torch.where(mismatch.any(dim=1), mismatch.int().argmax(dim=1), s)  # (B,): m_i, s when none
    steps = torch.arange(s, device=device)
    generated = torch.where(steps[None, :] < first_miss[:, None], suffix, generated)  # true ids before m_i
    start_step = int(first_miss.min()) + 1  # the first step some row still has to decode
    vocab = logits.shape[-1]
    cache = cache if static else out.past_key_values
    del out, logits, forced  # the (B, W, V) logits are not needed while decoding

    if start_step < s:
        # Decoded tokens are appended after the document's W columns. The cache's columns from the first
        # mismatching suffix token on (lp + start_step - 1 .. W - 1) hold tokens that are not on every row's greedy
        # path: the attention mask hides them (no cache surgery, which HF caches do not offer alike across
        # versions), and explicit position ids give each token the position it has in the greedy sequence.
        n_decode = s - start_step
        decode_mask = torch.cat([mask, mask.new_ones((n_rows, n_decode))], dim=1)  # (B, W + n_decode)
        decode_mask[:, lp + start_step - 1 : width] = 0
        next_position = position_ids[:, lp - 1 : lp] + 1  # (B, 1): the position of suffix step 0
        for k, step in enumerate(range(start_step, s)):
            column = width + k
            out = model(
                input_ids=generated[:, step - 1 : step],
                attention_mask=decode_mask[:, : column + 1],
                position_ids=next_position + step - 1,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
                **({"cache_position": torch.tensor([column], device=device)} if static else {}),
            )
            cache = cache if static else out.past_key_values
            step_logits = out.logits[:, -1, :]  # (B, V)
            fresh = first_miss < step  # rows whose id at this step the forced pass does not know
            generated[:, step] = torch.where(fresh, step_logits.argmax(dim=-1), generated[:, step])
            margins[:, step] = torch.where(fresh, _top2_margins(step_logits), margins[:, step])

    return _paths(generated, margins, vocab), accuracies


def _rouge_version() -> str:
    try:
        return importlib.metadata.version("rouge-score")
    except importlib.metadata.PackageNotFoundError:
        return importlib.metadata.version("rouge_score")


def extract(
    model: torch.nn.Module,
    documents: Sequence[Any],
    config: ExtractionConfig,
    *,
    decode: Callable[[list[int]], str],
    pad_token_id: int,
    drop_mask_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
    progress: bool = True,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run extraction on ``documents`` (objects with ``.id: str`` and ``.token_ids: list[int]``).

    Each document's prefix is continued greedily for ``config.suffix_len`` tokens on the model's device;
    documents shorter than ``config.min_tokens()`` are skipped, counted and listed in the summary.

    Returns (rows, summary).
      rows, one per evaluated document, in input order: id, n_tokens, n_prefix_tokens, exact_match,
        match_fraction, longest_correct_prefix (token ids); rouge_l, rouge_l_recall, rouge_1, rouge_2,
        rouge_l_unicode (``decode(generated)`` vs ``decode(true suffix)``), rouge_default_kept_chars (the
        fraction of the reference's word characters rouge-score's default tokenizer keeps); tf_accuracy,
        tf_kept_accuracy, tf_dropped_accuracy (teacher-forced over the whole document; kept/dropped are None without
        ``drop_mask_fn``, or when no target falls in the group); min_logit_margin, min_margin_position
        (the near-tie record of the greedy path, `GreedyPath`); generated_ids, generated_text, reference_text.
      summary: see `summarize_extraction`.
    ``drop_mask_fn`` maps a document's (1, T) targets (token j+1 at j, -100 last) to its (1, T) bool
    goldfish mask, True = dropped from the training loss.
    """
    device = model_device(model)
    kept, skipped = split_documents(documents, config)
    check_fits_context(model, [doc for doc, _, _ in kept])
    if skipped:
        log.warning("extraction skipped %d document(s) shorter than %d tokens", len(skipped), config.min_tokens())

    rows: list[dict[str, Any]] = []
    bar = tqdm(total=len(kept), desc="extract", unit="doc", disable=not progress)
    try:
        # Longest documents first: similar lengths share a batch (less padding) and the biggest batch runs first
        # (an out-of-memory error shows up at once); rows are put back in input order below.
        order = sorted(range(len(kept)), key=lambda i: len(kept[i][0].token_ids), reverse=True)
        results: list[tuple[GreedyPath, dict[str, float | int | None]]] = [None] * len(kept)  # type: ignore[list-item]
        with evaluating(model):
            for start in range(0, len(order), config.batch_size):
                batch = order[start : start + config.batch_size]
                paths, accuracies = _forced_then_greedy(
                    model,
                    [[int(t) for t in kept[i][0].token_ids] for i in batch],
                    [len(kept[i][1]) for i in batch],
                    config.suffix_len,
                    pad_token_id,
                    drop_mask_fn,
                    device,
                )
                for i, path, acc in zip(batch, paths, accuracies):
                    results[i] = (path, acc)
                bar.update(len(batch))
        for (doc, prefix, suffix), (path, acc) in zip(kept, results):
            gen = path.ids
            generated_text, reference_text = decode(gen), decode(suffix)
            rows.append(
                {
                    "id": str(doc.id),
                    "n_tokens": len(doc.token_ids),
                    "n_prefix_tokens": len(prefix),
                    "exact_match": exact_match(gen, suffix),
                    "match_fraction": match_fraction(gen, suffix),
                    "longest_correct_prefix": longest_correct_prefix(gen, suffix),
                    **rouge_scores(generated_text, reference_text),
                    "rouge_default_kept_chars": default_tokenizer_kept_fraction(reference_text),
                    "tf_accuracy": acc["accuracy"],
                    "tf_kept_accuracy": acc.get("kept_accuracy"),
                    "tf_dropped_accuracy": acc.get("dropped_accuracy"),
                    "min_logit_margin": path.min_margin,
                    "min_margin_position": path.min_margin_position,
                    "generated_ids": gen,
                    "generated_text": generated_text,
                    "reference_text": reference_text,
                }
            )
    finally:
        bar.close()

    return rows, summarize_extraction(rows, skipped, config)


def summarize_extraction(
    rows: Sequence[dict[str, Any]], skipped_ids: Sequence[str], config: ExtractionConfig
) -> dict[str, Any]:
    """The summary ``extract`` returns, from its per-document ``rows`` and the ids of the documents it skipped as
    too short: lets a summary be recomputed from rows gathered from several processes (or filtered afterwards).

    n_docs, n_skipped_too_short, skipped_ids, min_tokens, the mean of every per-document metric (None when no row
    has a value; exact_match's mean is the fraction of documents), config, the ROUGE settings, with
    rouge["default_tokenizer_discards_most"]: the documents whose reference text rouge-score's default tokenizer
    mostly discards (their rouge_l/rouge_1/rouge_2 mean little; read rouge_l_unicode), and near_tie: the smallest
    top-1 vs top-2 logit margin of any greedy step, with its document and position.
    """
    summary: dict[str, Any] = {
        "n_docs": len(rows),
        "n_skipped_too_short": len(skipped_ids),
        "skipped_ids": [str(i) for i in skipped_ids],
        "min_tokens": config.min_tokens(),
    }
    for name in _SUMMARY_METRICS:
        summary[name] = mean_of_present([row.get(name) for row in rows])
    for name in INTERVAL_METRICS:  # 95% percentile bootstrap over documents (eval.intervals)
        values = [row[name] for row in rows if row.get(name) is not None]
        summary[f"{name}_ci"] = (
            mean_interval(values, n_resamples=config.bootstrap) if config.bootstrap and values else None
        )
    summary["config"] = asdict(config)
    discarded = [
        str(row["id"]) for row in rows if row.get("rouge_default_kept_chars", 1.0) < DEFAULT_TOKENIZER_MIN_KEPT
    ]
    if discarded:
        log.warning(
            "rouge-score's default tokenizer (the paper's setting, [a-z0-9] only) discards most characters "
            "of %d of %d reference texts (first: %r); their rouge_l is not meaningful, read rouge_l_unicode",
            len(discarded),
            len(rows),
            discarded[0],
        )
    summary["rouge"] = {
        "package": "rouge-score",
        "version": _rouge_version(),
        "stemmer": False,
        "tokenizer": "default word tokenizer",
        "unicode_tokenizer": "rouge_l_unicode: eval.metrics.unicode_words (words of any script, CJK characters "
        "one word each)",
        "default_tokenizer_discards_most": {
            "n_docs": len(discarded),
            "ids": discarded[:20],
            "min_kept_fraction": DEFAULT_TOKENIZER_MIN_KEPT,
        },
    }
    margins = [
        (row["min_logit_margin"], str(row["id"]), row.get("min_margin_position"))
        for row in rows
        if row.get("min_logit_margin") is not None
    ]
    if margins:
        margin, doc_id, position = min(margins)
        summary["near_tie"] = {"min_logit_margin": margin, "id": doc_id, "position": position}
    else:
        summary["near_tie"] = None
    return summary


def write_extraction(rows: list[dict[str, Any]], summary: dict[str, Any], out_dir: str | Path) -> None:
    """Write ``out_dir/extraction.jsonl`` (one row per document) and ``out_dir/summary.json`` atomically."""
    out = Path(out_dir)
    write_jsonl_atomic(out / "extraction.jsonl", rows)
    write_json_atomic(out / "summary.json", summary)
