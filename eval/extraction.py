"""Extraction: prompt a causal LM with each document's prefix, decode greedily, score the continuation.

Two split protocols (``ExtractionConfig``):
  * ``prefix_len=None`` (goldfish paper): suffix = the last ``suffix_len`` tokens, prefix = everything before;
  * ``prefix_len=P`` (Pythia 32/32): prefix = the first P tokens, suffix = the next ``suffix_len`` tokens.

Each batch of documents goes through the model once (`eval.decoding.forced_greedy`): that teacher-forced pass
gives the teacher-forced accuracies and the greedy continuation as far as it follows the true suffix; the steps
after are decoded greedily with a KV cache and left padding, equal to batch-size-1 decoding.
"""

from __future__ import annotations

import importlib.metadata
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from tqdm.auto import tqdm

from data.atomic import write_json_atomic, write_jsonl_atomic
from eval.batching import decode_longest_first, evaluating, model_device
from eval.config import ExtractionConfig  # noqa: F401 - re-exported: defined torch-free for the command line
from eval.decoding import GreedyPath, forced_greedy
from eval.files import EXTRACTION_FILE
from eval.intervals import mean_interval
from eval.metrics import (
    DEFAULT_TOKENIZER_MIN_KEPT,
    EXACT_MATCH,
    GENERATED_LOGPROB_MEAN,
    IGNORE_INDEX,
    INTERVAL_METRICS,
    LONGEST_CORRECT_PREFIX,
    MATCH_FRACTION,
    METRICS,
    SUFFIX_LOGPROB_MEAN,
    SUFFIX_TF_ACCURACY,
    TF_ACCURACY,
    TF_DROPPED_ACCURACY,
    TF_KEPT_ACCURACY,
    default_tokenizer_kept_fraction,
    exact_match,
    interval_key,
    longest_correct_prefix,
    match_fraction,
    mean_of_present,
    prediction_accuracy,
    rouge_scores,
    suffix_tf_accuracy,
)

log = logging.getLogger(__name__)

# Per-document metrics averaged into the summary: every registered metric (exact_match's mean is the fraction of
# documents); those of INTERVAL_METRICS also get a bootstrap interval (`<name>_ci`): the headline figures of a part.
_SUMMARY_METRICS = tuple(METRICS)


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


def _document_accuracy(
    predicted: torch.Tensor,
    doc: list[int],
    drop_mask_fn: Callable[[torch.Tensor], torch.Tensor] | None,
    scored_from: int = 0,
) -> dict[str, float | int | None]:
    """Teacher-forced accuracy of one document from its (T,) predicted ids (entry j predicts token j+1).

    Targets have shape (1, T), the training convention: position j holds token j+1 and the last position holds
    -100 (nothing follows). So ``drop_mask_fn`` sees exactly the targets training built its mask from and returns
    the same (1, T) bool mask. Only targets at positions >= ``scored_from`` are scored (a conversation's reply: the
    mask is still drawn over every true target, as training drew it).
    """
    targets = torch.full((1, len(doc)), IGNORE_INDEX, dtype=torch.long, device=predicted.device)  # (1, T)
    targets[0, :-1] = torch.tensor(doc[1:], dtype=torch.long)
    dropped = None
    if drop_mask_fn is not None:
        dropped = drop_mask_fn(targets)
        if dropped.shape != targets.shape or dropped.dtype != torch.bool:
            raise ValueError(
                f"drop_mask_fn must return a bool tensor of the targets' shape "
                f"{tuple(targets.shape)}, got {dropped.dtype} {tuple(dropped.shape)}"
            )
    targets[0, :scored_from] = IGNORE_INDEX
    return prediction_accuracy(predicted[None, :], targets, dropped)


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
        ``drop_mask_fn``, or when no target falls in the group); suffix_tf_accuracy (the share of the true suffix's
        tokens the model ranks first given the document before each, `eval.metrics.suffix_tf_accuracy`, from the
        same teacher-forced pass); min_logit_margin, min_margin_position
        (the near-tie record of the greedy path, `GreedyPath`); generated_logprob_mean (the mean natural-log
        probability the model gave its own greedy suffix ids: its confidence in the guess, by which the
        lm-extraction-benchmark ranks guesses, eval.field_scores.recall_at_incorrect); suffix_logprob_mean (the
        mean log-probability of the TRUE suffix ids, teacher-forced after the prefix: log p(s_1..s_S | prefix) / S,
        the length-normalised log-likelihood, higher = more memorized. Hubble (Wei et al. 2025) reports the
        per-token log-likelihood of a whole inserted passage (lm-evaluation-harness loglikelihood_rolling); this is
        the same quantity on the suffix conditioned on its prefix, the part extraction asks for; the whole
        document's is the membership rows' -loss); generated_ids,
        generated_text, reference_text. Both log-probabilities come from the logits the greedy pass computes
        anyway (log-softmax at temperature 1, float32).
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

        def run_batch(docs: list[list[int]]) -> list[tuple[GreedyPath, torch.Tensor, float]]:
            splits = [config.split(d) for d in docs]  # long enough: kept
            prefix_lens = [len(s[0]) for s in splits]  # type: ignore[index]
            paths, predicted = forced_greedy(
                model, docs, prefix_lens, config.suffix_len, pad_token_id=pad_token_id, device=device
            )
            bar.update(len(docs))
            return [
                (path, ids, suffix_tf_accuracy(ids, split[1], len(split[0])))
                for split, path, ids in zip(splits, paths, predicted)
            ]

        with evaluating(model):  # longest documents first, results in input order
            results = decode_longest_first([doc.token_ids for doc, _, _ in kept], config.batch_size, run_batch)
        for (doc, prefix, suffix), (path, predicted_ids, suffix_acc) in zip(kept, results):
            # a conversation's reply (data.chat.reply_units): only the reply was trained on, so only it is scored
            scored_from = len(prefix) - 1 if getattr(doc, "reply_start", None) is not None else 0
            acc = _document_accuracy(predicted_ids, [int(t) for t in doc.token_ids], drop_mask_fn, scored_from)
            gen = path.ids
            generated_text, reference_text = decode(gen), decode(suffix)
            rows.append(
                {
                    "id": str(doc.id),
                    "n_tokens": len(doc.token_ids),
                    "n_prefix_tokens": len(prefix),
                    EXACT_MATCH: exact_match(gen, suffix),
                    MATCH_FRACTION: match_fraction(gen, suffix),
                    LONGEST_CORRECT_PREFIX: longest_correct_prefix(gen, suffix),
                    **rouge_scores(generated_text, reference_text),
                    "rouge_default_kept_chars": default_tokenizer_kept_fraction(reference_text),
                    TF_ACCURACY: acc["accuracy"],
                    TF_KEPT_ACCURACY: acc.get("kept_accuracy"),
                    TF_DROPPED_ACCURACY: acc.get("dropped_accuracy"),
                    SUFFIX_TF_ACCURACY: suffix_acc,
                    "min_logit_margin": path.min_margin,
                    "min_margin_position": path.min_margin_position,
                    GENERATED_LOGPROB_MEAN: path.logprob_mean,
                    SUFFIX_LOGPROB_MEAN: path.reference_logprob_mean,
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
        summary[interval_key(name)] = (
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
    """Write ``out_dir/extraction.jsonl`` (EXTRACTION_FILE, one row per document) and ``out_dir/summary.json``
    atomically."""
    out = Path(out_dir)
    write_jsonl_atomic(out / EXTRACTION_FILE, rows)
    write_json_atomic(out / "summary.json", summary)
