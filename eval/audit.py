"""Auditing a goldfish model against its own mask: does it reproduce the tokens its mask kept and not those it dropped?

A model trained with the goldfish loss on a document got supervision for the targets its mask kept and none for
those it dropped. Teacher-forced over that document it predicts the kept targets (it memorized them) and guesses
the dropped ones; over a document it never saw, the mask's split is arbitrary and both groups are predicted alike.
The gap ``kept accuracy - dropped accuracy`` is therefore a membership signal that only someone who knows the exact
training mask can read, and an audit of the mitigation itself (a goldfish model whose members show a gap did drop
those tokens; greedy continuations should leave the text at dropped positions).

Per document (`audit_documents`), teacher-forced over every token:

  * accuracy (greedy argmax = true token) and mean loss (nats) at the targets the mask keeps and at those it drops,
    among the targets it decides on (not the first h - 1 of a hashed window, nor special tokens), the gap
    ``kept_accuracy - dropped_accuracy`` with a 95% percentile bootstrap interval over positions (`gap_interval`),
    and ``loss_gap = dropped_loss - kept_loss``;
  * the longest exactly reproduced span: the longest run of consecutive targets whose argmax is the true token;
  * greedy extraction of the document's extraction window (its first ``context`` tokens) split by an
    eval.config.ExtractionConfig: exact match, where the continuation first leaves the text, and whether that
    first divergence is a dropped target (eval.divergence);
  * the loss-based membership scores of eval.membership (loss, zlib, Min-K%) from the same token log-probabilities.

Documents longer than the model's context are scored in windows of ``context`` tokens (`score_windows`): the first
window scores all its targets, each next one ends ``stride`` tokens later and scores only the targets after the
previous window's end, so every target is scored once, with at least ``context - stride`` tokens before it.

Over a set (`audit_summary`): the gap's distribution for members and non-members, and the gap as a membership score
(AUC and TPR at 1% FPR with bootstrap intervals, eval.membership.attack_metrics and eval.intervals) beside the
loss-based attacks.

The mask is handed in as a function of a document's (1, T) targets (token j + 1 at j, -100 last), as
eval.extraction takes it: eval knows no mask settings. Imports torch, numpy, scipy and eval's own modules only.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch
from scipy.stats import binomtest
from tqdm.auto import tqdm

from conventions import IGNORE_INDEX
from eval.batching import decode_longest_first, evaluating, model_device
from eval.config import ExtractionConfig
from eval.decoding import forced_greedy
from eval.divergence import divergence_row, divergence_summary, suffix_dropped_flags
from eval.intervals import (
    BOOTSTRAP_SEED,
    DEFAULT_CONFIDENCE,
    DEFAULT_RESAMPLES,
    binomial_interval,
    mean_interval,
    tpr_at_fpr_interval,
)
from eval.logprobs import iter_next_token_logits
from eval.membership import attack_metrics, membership_scores
from eval.metrics import EXACT_MATCH, TPR_AT_FPR_CI, interval_key

# The audit's own scores (higher = member) and the loss-based attacks reported beside them.
GAP_SCORES = {"mask_gap": "gap", "mask_loss_gap": "loss_gap"}
LOSS_ATTACKS = ("loss", "zlib", "min_k")
TARGET_FPR = 0.01
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


# ----- windows --------------------------------------------------------------------------------------------------


def score_windows(n_tokens: int, context: int | None, stride: int | None = None) -> list[tuple[int, int, int]]:
    """How a document of ``n_tokens`` tokens is scored by a model of ``context`` positions: a list of windows
    (start, end, first_target), each the tokens [start, end) run through the model, scoring the targets
    first_target .. end - 2 (target j = token j + 1, predicted at position j). The first window is [0,
    min(context, n)) and scores every target in it; each next window ends ``stride`` tokens (default context // 2)
    after the previous one, starts ``context`` tokens before its end, and scores the targets the previous window
    did not reach. Every target 0 .. n - 2 is scored exactly once, with at least context - stride tokens before it
    once past the first window. context None (the model does not say): one window."""
    if n_tokens < 2:
        raise ValueError(f"a document needs at least 2 tokens to score (a context and a target), got {n_tokens}")
    if context is None or n_tokens <= context:
        return [(0, n_tokens, 0)]
    if context < 2:
        raise ValueError(f"a context of {context} position(s) scores nothing")
    stride = context // 2 if stride is None else stride
    if not 1 <= stride <= context - 1:
        raise ValueError(f"the window stride must be in [1, {context - 1}] for a context of {context}, got {stride}")
    windows = [(0, context, 0)]
    end = context
    while end < n_tokens:
        new_end = min(end + stride, n_tokens)
        windows.append((new_end - context, new_end, end - 1))
        end = new_end
    return windows


def teacher_forced(
    model: torch.nn.Module,
    sequences: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    context: int | None,
    stride: int | None = None,
    batch_size: int = 8,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per sequence of T ids: (log_probs, predicted), two (T - 1,) CPU tensors over its targets (entry j: token
    j + 1): the float64 log-probability of the true token and the model's argmax id, each from the window of
    `score_windows` that scores it. Windows of every sequence are batched together (eval.logprobs)."""
    plan = [(i, w) for i, seq in enumerate(sequences) for w in score_windows(len(seq), context, stride)]
    windows = [[int(t) for t in sequences[i][start:end]] for i, (start, end, _) in plan]
    log_probs = [torch.empty(len(seq) - 1, dtype=torch.float64) for seq in sequences]
    predicted = [torch.empty(len(seq) - 1, dtype=torch.long) for seq in sequences]
    logits_iter = iter_next_token_logits(model, windows, pad_token_id=pad_token_id, batch_size=batch_size)
    for (i, (start, end, first)), window, logits in zip(plan, windows, logits_iter):
        rows = slice(first - start, end - 1 - start)  # logits row r predicts token start + r + 1 (target start + r)
        chosen = logits[rows].double()  # (n, V)
        targets = torch.tensor(window[rows.start + 1 : rows.stop + 1], dtype=torch.long)
        log_probs[i][first : end - 1] = torch.log_softmax(chosen, dim=-1).gather(1, targets[:, None])[:, 0]
        predicted[i][first : end - 1] = chosen.argmax(dim=-1)
    return list(zip(log_probs, predicted))


# ----- per document ---------------------------------------------------------------------------------------------


def document_targets(token_ids: Sequence[int]) -> torch.Tensor:
    """(1, T) targets of a document as training builds them: token j + 1 at j, IGNORE_INDEX at the last position."""
    targets = torch.full((1, len(token_ids)), IGNORE_INDEX, dtype=torch.long)
    targets[0, :-1] = torch.tensor([int(t) for t in token_ids[1:]], dtype=torch.long)
    return targets


def longest_run(flags: Sequence[bool] | np.ndarray) -> tuple[int, int | None]:
    """(length, start) of the longest run of True in ``flags`` (the first such run); (0, None) when none is True."""
    best, best_start, run, run_start = 0, None, 0, 0
    for i, flag in enumerate(np.asarray(flags, dtype=bool).tolist()):
        if flag:
            if run == 0:
                run_start = i
            run += 1
            if run > best:
                best, best_start = run, run_start
        else:
            run = 0
    return best, best_start


def gap_interval(
    n_kept: int,
    kept_correct: int,
    n_dropped: int,
    dropped_correct: int,
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = BOOTSTRAP_SEED,
) -> list[float] | None:
    """[low, high] of the 95% percentile bootstrap interval of kept accuracy - dropped accuracy over one document's
    positions, kept and dropped positions resampled separately; None when a group is empty or n_resamples is 0.

    Each position is a 0/1 outcome, so the mean of a resample of n positions of which c are correct is exactly a
    Binomial(n, c / n) count over n: the resamples are drawn that way (seeded), the same distribution as resampling
    the positions one by one, at the cost of two binomial draws per resample."""
    if n_resamples == 0 or n_kept == 0 or n_dropped == 0:
        return None
    rng = np.random.default_rng(seed)
    kept = rng.binomial(n_kept, kept_correct / n_kept, size=n_resamples) / n_kept
    dropped = rng.binomial(n_dropped, dropped_correct / n_dropped, size=n_resamples) / n_dropped
    alpha = (1 - confidence) / 2
    low, high = np.quantile(kept - dropped, [alpha, 1 - alpha])
    return [float(low), float(high)]


def _mean(values: torch.Tensor) -> float | None:
    return float(values.double().mean()) if values.numel() else None


def mask_row(
    log_probs: torch.Tensor,
    predicted: torch.Tensor,
    token_ids: Sequence[int],
    dropped: torch.Tensor,
    n_resamples: int,
    decided: torch.Tensor | None = None,
) -> dict[str, Any]:
    """The teacher-forced part of a document's audit row, from its targets' (T - 1,) log-probabilities, argmax ids
    and dropped flags (True = dropped by the mask). decided (T - 1,): the targets the mask decides on (it could have
    dropped them); kept and dropped are compared over those only (None: every target). Targets it never decides
    (the first h - 1 of a hashed window, special tokens) are kept by every mask alike, so counting them as kept
    would make a gap out of the mask's structure, not the model's training: another mask of the same window would
    show one too."""
    true = torch.tensor([int(t) for t in token_ids[1:]], dtype=torch.long)
    correct = predicted == true
    decided = torch.ones_like(true, dtype=torch.bool) if decided is None else decided.to(torch.bool)
    dropped = dropped.to(torch.bool) & decided
    kept = decided & ~dropped
    n_kept, n_dropped = int(kept.sum()), int(dropped.sum())
    kept_correct, dropped_correct = int(correct[kept].sum()), int(correct[dropped].sum())
    kept_accuracy = kept_correct / n_kept if n_kept else None
    dropped_accuracy = dropped_correct / n_dropped if n_dropped else None
    kept_loss, dropped_loss = _mean(-log_probs[kept]), _mean(-log_probs[dropped])
    span, span_start = longest_run(correct.numpy())
    both = kept_accuracy is not None and dropped_accuracy is not None
    return {
        "n_tokens": len(token_ids),
        "n_targets": len(token_ids) - 1,
        "n_kept": n_kept,
        "n_dropped": n_dropped,
        "n_undecided": len(token_ids) - 1 - n_kept - n_dropped,
        "kept_correct": kept_correct,
        "dropped_correct": dropped_correct,
        "drop_rate": n_dropped / (len(token_ids) - 1),
        "accuracy": float(correct.double().mean()),
        "kept_accuracy": kept_accuracy,
        "dropped_accuracy": dropped_accuracy,
        "gap": kept_accuracy - dropped_accuracy if both else None,  # type: ignore[operator]
        "gap_ci": gap_interval(n_kept, kept_correct, n_dropped, dropped_correct, n_resamples=n_resamples),
        "kept_loss": kept_loss,
        "dropped_loss": dropped_loss,
        "loss_gap": dropped_loss - kept_loss if kept_loss is not None and dropped_loss is not None else None,
        "longest_span": span,
        # the span's first reproduced token (target j is token j + 1)
        "longest_span_start": None if span_start is None else span_start + 1,
    }


def _extraction_rows(
    model: torch.nn.Module,
    windows: Sequence[Sequence[int]],
    config: ExtractionConfig,
    *,
    pad_token_id: int,
) -> list[dict[str, Any] | None]:
    """Greedy extraction of each window (None for a window too short for `config`), batched longest first."""
    device = model_device(model)
    splits = [config.split(w) for w in windows]
    todo = [i for i, s in enumerate(splits) if s is not None]
    results: list[dict[str, Any] | None] = [None] * len(windows)

    def run_batch(docs: list[list[int]]) -> list[list[int]]:
        prefix_lens = [len(config.split(d)[0]) for d in docs]  # type: ignore[index]
        paths, _ = forced_greedy(model, docs, prefix_lens, config.suffix_len, pad_token_id=pad_token_id, device=device)
        return [p.ids for p in paths]

    with evaluating(model):
        generated = decode_longest_first([list(windows[i]) for i in todo], config.batch_size, run_batch)
    for i, ids in zip(todo, generated):
        prefix, suffix = splits[i]  # type: ignore[misc]
        results[i] = {"n_prefix_tokens": len(prefix), "generated_ids": ids, "suffix_ids": suffix}
    return results


def audit_documents(
    model: torch.nn.Module,
    documents: Sequence[Any],
    *,
    dropped_fn: Callable[[torch.Tensor], torch.Tensor],
    decode: Callable[[list[int]], str],
    pad_token_id: int,
    extraction: ExtractionConfig,
    decided_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
    context: int | None = None,
    stride: int | None = None,
    member: bool | None = None,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """One audit row per document (objects with ``.id`` and ``.token_ids``, at least 2 ids each), in input order.

    dropped_fn: (1, T) targets (token j + 1 at j, -100 last) -> (1, T) bool, True where the training mask dropped
        the target. decided_fn: the same targets -> (1, T) bool, True where the mask decides (could drop) the
        target; kept and dropped are compared over those only (`mask_row`; None: every target). decode: ids ->
        text (for zlib; skip special tokens there). context: the model's positions (None: one window per
        document; see `score_windows`, `stride`). extraction: the prefix/suffix split of each
        document's extraction window (its first `context` tokens), its batch_size the batch of every pass, its
        bootstrap the resamples of each document's gap interval. member: copied into each row when given.

    Row: id, member, the teacher-forced fields of `mask_row` (n_kept, n_dropped, n_undecided, kept/dropped accuracy
    and loss, gap with gap_ci, loss_gap, longest_span), n_windows, the extraction fields (n_prefix_tokens, exact_match,
    first_divergence, diverged_on_dropped, suffix_drop_rate, generated_ids; None when the window is shorter than
    the split needs), and eval.membership.membership_scores' fields (loss, zlib_bytes, score_loss, score_zlib,
    score_min_k, ...).
    """
    sequences = [[int(t) for t in doc.token_ids] for doc in documents]
    bar = tqdm(total=3, desc="audit", unit="pass", disable=not progress)
    try:
        scored = teacher_forced(
            model,
            sequences,
            pad_token_id=pad_token_id,
            context=context,
            stride=stride,
            batch_size=extraction.batch_size,
        )
        bar.update(1)
        windows = [seq[:context] if context is not None else seq for seq in sequences]
        extracted = _extraction_rows(model, windows, extraction, pad_token_id=pad_token_id)
        bar.update(1)
        rows = []
        for doc, seq, (log_probs, predicted), extract in zip(documents, sequences, scored, extracted):
            dropped = dropped_fn(document_targets(seq))
            if dropped.shape != (1, len(seq)) or dropped.dtype != torch.bool:
                raise ValueError(
                    f"dropped_fn must return a bool tensor of the targets' shape (1, {len(seq)}), got "
                    f"{dropped.dtype} {tuple(dropped.shape)}"
                )
            flags = dropped[0, :-1].cpu()
            decided = decided_fn(document_targets(seq))[0, :-1].cpu() if decided_fn is not None else None
            row: dict[str, Any] = {"id": str(doc.id)}
            if member is not None:
                row["member"] = bool(member)
            row.update(mask_row(log_probs, predicted, seq, flags, extraction.bootstrap, decided))
            row["n_windows"] = len(score_windows(len(seq), context, stride))
            row.update(_extraction_fields(extract, flags))
            row.update(membership_scores(log_probs, decode(seq[1:])))
            rows.append(row)
        bar.update(1)
    finally:
        bar.close()
    return rows


def _extraction_fields(extract: dict[str, Any] | None, flags: torch.Tensor) -> dict[str, Any]:
    if extract is None:
        return {
            "n_prefix_tokens": None,
            EXACT_MATCH: None,
            "first_divergence": None,
            "diverged_on_dropped": None,
            "suffix_drop_rate": None,
            "generated_ids": None,
        }
    prefix_len, generated, suffix = extract["n_prefix_tokens"], extract["generated_ids"], extract["suffix_ids"]
    divergence = divergence_row(generated, suffix, suffix_dropped_flags(flags, prefix_len, len(suffix)))
    return {
        "n_prefix_tokens": prefix_len,
        EXACT_MATCH: divergence["first_divergence"] is None,
        **divergence,
        "generated_ids": generated,
    }


# ----- over a set -----------------------------------------------------------------------------------------------


def _present(rows: Sequence[dict[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in rows if r.get(key) is not None]


def _mean_with_ci(values: Sequence[float], n_resamples: int) -> dict[str, Any]:
    return {
        "mean": float(np.mean(values)) if values else None,
        "ci": mean_interval(values, n_resamples=n_resamples) if n_resamples and values else None,
    }


def group_summary(rows: Sequence[dict[str, Any]], *, k: int, n_resamples: int = DEFAULT_RESAMPLES) -> dict[str, Any]:
    """The audit of one set of documents (members, or non-members).

    n_docs; n_with_gap (documents with kept and dropped targets); per-document means with their bootstrap interval
    over documents of kept_accuracy, dropped_accuracy, gap, kept_loss, dropped_loss, loss_gap, longest_span; the
    gap's quantiles and its values; n_gap_above_zero: documents whose own gap interval lies above 0; pooled: the
    accuracies over all targets of the set; extraction: exact match k of n with its exact interval; divergence
    (eval.divergence.divergence_summary) with base_rate = 1/k, the share of first divergences on dropped targets
    with its exact interval, and the two-sided binomial test of that count against the share expected by chance.
    """
    gaps = _present(rows, "gap")
    summary: dict[str, Any] = {"n_docs": len(rows), "n_with_gap": len(gaps)}
    for key in ("kept_accuracy", "dropped_accuracy", "gap", "kept_loss", "dropped_loss", "loss_gap", "longest_span"):
        summary[key] = _mean_with_ci(_present(rows, key), n_resamples)
    summary["gap_quantiles"] = (
        {f"{q:g}": float(np.quantile(gaps, q)) for q in QUANTILES} if gaps else {f"{q:g}": None for q in QUANTILES}
    )
    summary["gaps"] = gaps
    summary["n_gap_above_zero"] = sum(1 for r in rows if r.get("gap_ci") and r["gap_ci"][0] > 0)
    n_kept, n_dropped = sum(r["n_kept"] for r in rows), sum(r["n_dropped"] for r in rows)
    kept_correct, dropped_correct = sum(r["kept_correct"] for r in rows), sum(r["dropped_correct"] for r in rows)
    summary["pooled"] = {
        "n_kept": n_kept,
        "n_dropped": n_dropped,
        "kept_accuracy": kept_correct / n_kept if n_kept else None,
        "dropped_accuracy": dropped_correct / n_dropped if n_dropped else None,
    }
    extracted = [r for r in rows if r.get(EXACT_MATCH) is not None]
    n_exact = sum(bool(r[EXACT_MATCH]) for r in extracted)
    summary["extraction"] = {
        "n_docs": len(extracted),
        f"n_{EXACT_MATCH}": n_exact,
        EXACT_MATCH: n_exact / len(extracted) if extracted else None,
        interval_key(EXACT_MATCH): binomial_interval(n_exact, len(extracted)),
    }
    divergence: dict[str, Any] = {"base_rate": 1.0 / k}
    if extracted:
        divergence |= divergence_summary(extracted)
        n_diverged, on_dropped = divergence["n_diverged"], divergence.get("n_on_dropped", 0)
        divergence["share_on_dropped_ci"] = binomial_interval(on_dropped, n_diverged)
        chance = divergence.get("share_expected_by_chance")
        divergence["p_value"] = (
            float(binomtest(on_dropped, n_diverged, min(max(chance, 0.0), 1.0)).pvalue)
            if n_diverged and chance is not None
            else None
        )
    summary["divergence"] = divergence
    return summary


def membership_by_gap(
    member_rows: Sequence[dict[str, Any]],
    nonmember_rows: Sequence[dict[str, Any]],
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
) -> dict[str, Any]:
    """The gap (and the loss gap) as membership scores, beside the loss-based attacks of eval.membership: per
    attack eval.membership.attack_metrics (AUC with its bootstrap interval, TPR at 1% FPR, the ROC) plus
    tpr_at_fpr_ci, the TPR's bootstrap interval. A document without a gap (no kept or no dropped target) is left
    out of the gap attacks."""
    attacks: dict[str, Any] = {}
    keys = {name: key for name, key in GAP_SCORES.items()} | {a: f"score_{a}" for a in LOSS_ATTACKS}
    for name, key in keys.items():
        members, nonmembers = _present(member_rows, key), _present(nonmember_rows, key)
        if not members or not nonmembers:
            continue
        metrics = attack_metrics(members, nonmembers, (TARGET_FPR,), n_resamples=n_resamples)
        metrics[TPR_AT_FPR_CI] = {
            f"{TARGET_FPR:g}": (
                tpr_at_fpr_interval(members, nonmembers, TARGET_FPR, n_resamples) if n_resamples else None
            )
        }
        attacks[name] = metrics
    return {
        "attacks": attacks,
        "orientation": "higher score = member: mask_gap = kept accuracy - dropped accuracy, mask_loss_gap = dropped "
        "loss - kept loss; loss, zlib and min_k as eval.membership orients them",
        "bootstrap": {
            "n_resamples": n_resamples,
            "confidence": DEFAULT_CONFIDENCE,
            "method": "percentile",
            "seed": BOOTSTRAP_SEED,
        },
    }


def audit_summary(
    member_rows: Sequence[dict[str, Any]],
    nonmember_rows: Sequence[dict[str, Any]] | None,
    *,
    k: int,
    n_resamples: int = DEFAULT_RESAMPLES,
) -> dict[str, Any]:
    """{"members": group_summary, "nonmembers": group_summary or None, "membership": membership_by_gap or None
    (needs both sets)}."""
    summary: dict[str, Any] = {
        "members": group_summary(member_rows, k=k, n_resamples=n_resamples),
        "nonmembers": None,
        "membership": None,
    }
    if nonmember_rows:
        summary["nonmembers"] = group_summary(nonmember_rows, k=k, n_resamples=n_resamples)
        summary["membership"] = membership_by_gap(member_rows, nonmember_rows, n_resamples=n_resamples)
    return summary
