"""Membership inference: does a model's behaviour on a document reveal that the document was trained on?

Each attack turns a document's teacher-forced token log-probabilities into one score; every score is ORIENTED SO
THAT HIGHER MEANS "MEMBER" (more likely a training document). With members = training documents and non-members =
held-out documents of the same source, an attack's quality is the ROC of its scores: AUC, and the true-positive
rate at a low false-positive rate (1% and 0.1%), the figure of merit of Carlini et al. 2022 ("Membership inference
attacks from first principles").

Attacks (loss = mean negative log-likelihood of the document's tokens, in nats per token; the first token of a
document is conditioned on, never scored):
  * ``loss``:      -loss (Yeom et al. 2018). Members have lower loss.
  * ``zlib``:      -loss / zlib_bytes, where zlib_bytes = len(zlib.compress(text.encode("utf-8"))) at zlib's
                   default level, text = the decoded tokens that were scored. Carlini et al. 2021 ("Extracting
                   training data from large language models") rank samples by the ratio of the model's
                   log-perplexity to the text's zlib entropy, low ratio = memorized; mimir computes the same ratio
                   (loss / compressed byte length). We negate it so higher = member. Texts that compress well
                   (repetitive, hence low loss anyway) are penalised; the absolute scale is meaningless.
  * ``min_k``:     mean of the lowest k-fraction of the token log-probabilities (Shi et al. 2024, "Detecting
                   pretraining data from large language models", Min-K% Prob). The number of tokens averaged is
                   floor(k * n), at least 1, over the n scored tokens. Members have few very unlikely tokens.
  * ``reference``: reference_loss - loss, the log of the ratio of the reference model's perplexity to the target's
                   (Carlini et al. 2021's comparison with another model; mimir's reference attack). The reference is
                   a model that never saw the documents, e.g. the untrained control: it calibrates away how easy a
                   text is in general. Only present when reference log-probabilities are given.
"""

from __future__ import annotations

import math
import zlib
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from sklearn.metrics import roc_auc_score, roc_curve

from eval.logprobs import token_log_probs

ATTACKS = ("loss", "zlib", "min_k", "reference")
DEFAULT_MIN_K = 0.2
DEFAULT_TARGET_FPRS = (0.01, 0.001)


def zlib_bytes(text: str) -> int:
    """Length in bytes of the zlib-compressed (default level 6) UTF-8 encoding of ``text``."""
    return len(zlib.compress(text.encode("utf-8")))


def min_k_count(n_tokens: int, k: float) -> int:
    """How many of ``n_tokens`` scored tokens the Min-K% attack averages: floor(k * n), at least 1.

    A small epsilon absorbs float error in k * n (0.29 * 100 = 28.999999999999996 means 29).
    """
    if not 0 < k <= 1:
        raise ValueError(f"min_k must be a fraction in (0, 1], e.g. 0.2 for Min-20% Prob, got {k!r}")
    if n_tokens < 1:
        raise ValueError(f"Min-K% needs at least one scored token, got {n_tokens}")
    return max(1, math.floor(k * n_tokens + 1e-9))


def membership_scores(
    log_probs: Sequence[float] | torch.Tensor | np.ndarray,
    text: str,
    *,
    min_k: float = DEFAULT_MIN_K,
    reference_log_probs: Sequence[float] | torch.Tensor | np.ndarray | None = None,
) -> dict[str, float | int]:
    """All attack scores of one document from its token log-probabilities (natural log, one per scored token).

    text: the text those tokens spell (for the zlib attack). reference_log_probs: the same tokens' log-probabilities
    under the reference model (same length), or None to leave out the reference attack.

    Returns the raw quantities (``loss``, ``zlib_bytes``, ``min_k_mean_log_prob``, ``reference_loss``, ``n_scored``)
    and one ``score_<attack>`` per attack, each oriented so that higher means member.
    """
    lp = np.asarray(log_probs, dtype=np.float64).reshape(-1)
    if lp.size == 0:
        raise ValueError("no token log-probabilities: a document needs at least one scored token")
    if np.any(lp > 1e-9) or np.any(np.isnan(lp)):
        raise ValueError("log-probabilities must be <= 0 and not NaN; pass log p (e.g. from token_log_probs), not p")
    loss = float(-lp.mean())
    compressed = zlib_bytes(text)
    if compressed == 0:  # zlib always writes a header, so this guards only against a broken zlib
        raise ValueError("zlib-compressed length is 0")
    lowest = np.sort(lp)[: min_k_count(lp.size, min_k)]
    row: dict[str, float | int] = {
        "n_scored": int(lp.size),
        "loss": loss,
        "zlib_bytes": compressed,
        "min_k_mean_log_prob": float(lowest.mean()),
        "score_loss": -loss,
        "score_zlib": -loss / compressed,
        "score_min_k": float(lowest.mean()),
    }
    if reference_log_probs is not None:
        ref = np.asarray(reference_log_probs, dtype=np.float64).reshape(-1)
        if ref.shape != lp.shape:
            raise ValueError(f"reference_log_probs has {ref.size} entries but log_probs has {lp.size}: score the same "
                             "tokens with both models (they must share the tokenizer)")
        reference_loss = float(-ref.mean())
        row["reference_loss"] = reference_loss
        row["score_reference"] = reference_loss - loss
    return row


def membership_rows(
    model: torch.nn.Module,
    documents: Sequence[Any],
    *,
    decode: Callable[[list[int]], str],
    pad_token_id: int,
    reference_model: torch.nn.Module | None = None,
    min_k: float = DEFAULT_MIN_K,
    batch_size: int = 8,
    member: bool | None = None,
) -> list[dict[str, Any]]:
    """Per-document attack scores for ``documents`` (objects with ``.id`` and ``.token_ids``).

    Every token after the first is scored (the whole document, as in the attacks' papers). ``decode`` turns the
    scored ids into the text for zlib (skip special tokens there). ``reference_model`` must share the tokenizer.
    ``member`` (True for training documents, False for held-out ones) is copied into each row when given.
    """
    sequences = [[int(t) for t in doc.token_ids] for doc in documents]
    target = token_log_probs(model, sequences, pad_token_id=pad_token_id, batch_size=batch_size)
    reference = (token_log_probs(reference_model, sequences, pad_token_id=pad_token_id, batch_size=batch_size)
                 if reference_model is not None else [None] * len(sequences))
    rows = []
    for doc, seq, lp, ref in zip(documents, sequences, target, reference):
        row: dict[str, Any] = {"id": str(doc.id)}
        if member is not None:
            row["member"] = bool(member)
        row.update(membership_scores(lp, decode(seq[1:]), min_k=min_k, reference_log_probs=ref))
        rows.append(row)
    return rows


def tpr_at_fpr(fpr: np.ndarray, tpr: np.ndarray, target_fpr: float) -> float:
    """TPR of the ROC curve at ``target_fpr``, by linear interpolation between the curve's vertices.

    ``fpr``/``tpr`` are sklearn's ``roc_curve`` output (non-decreasing, starting at (0, 0), ending at (1, 1)). At
    an FPR the curve reaches exactly, the value is the highest TPR there (top of a vertical step). Between two
    vertices it is the straight line from the last vertex with fpr <= target to the first with fpr > target:
    the TPR a randomised mix of the two neighbouring thresholds achieves, and the same interpolation sklearn's
    ``roc_auc_score(max_fpr=...)`` applies. With n non-members the curve has a vertex only every 1/n in FPR, so
    below 1/n the value interpolates from the (0, TPR at no false positive) vertex and says little.
    """
    if not 0 <= target_fpr <= 1:
        raise ValueError(f"target FPR must be in [0, 1], got {target_fpr}")
    fpr = np.asarray(fpr, dtype=np.float64)
    tpr = np.asarray(tpr, dtype=np.float64)
    last = int(np.searchsorted(fpr, target_fpr, side="right")) - 1  # last vertex with fpr <= target
    if fpr[last] == target_fpr or last == len(fpr) - 1:
        return float(tpr[last])
    x0, x1, y0, y1 = fpr[last], fpr[last + 1], tpr[last], tpr[last + 1]
    return float(y0 + (y1 - y0) * (target_fpr - x0) / (x1 - x0))


def attack_metrics(
    member_scores: Sequence[float],
    nonmember_scores: Sequence[float],
    target_fprs: Sequence[float] = DEFAULT_TARGET_FPRS,
) -> dict[str, Any]:
    """ROC of one attack: AUC (sklearn ``roc_auc_score``), TPR at each target FPR (see ``tpr_at_fpr``), the curve.

    Scores must be oriented higher = member. Ties between a member and a non-member count half (AUC) and make a
    diagonal ROC segment. Returns {"auc", "tpr_at_fpr": {"0.01": ..., ...}, "roc": {"fpr": [...], "tpr": [...]},
    "n_members", "n_nonmembers", "fpr_resolution" (= 1 / n_nonmembers)}.
    """
    if len(member_scores) == 0 or len(nonmember_scores) == 0:
        raise ValueError(f"an ROC needs members and non-members, got {len(member_scores)} and "
                         f"{len(nonmember_scores)}: evaluate both training and held-out documents")
    scores = np.concatenate([np.asarray(member_scores, float), np.asarray(nonmember_scores, float)])
    if not np.all(np.isfinite(scores)):
        raise ValueError("attack scores must be finite numbers")
    labels = np.concatenate([np.ones(len(member_scores)), np.zeros(len(nonmember_scores))])
    # drop_intermediate=False keeps every threshold, so the interpolation sees the exact curve.
    fpr, tpr, _ = roc_curve(labels, scores, drop_intermediate=False)
    return {
        "auc": float(roc_auc_score(labels, scores)),
        "tpr_at_fpr": {f"{t:g}": tpr_at_fpr(fpr, tpr, t) for t in target_fprs},
        "roc": {"fpr": fpr.tolist(), "tpr": tpr.tolist()},
        "n_members": len(member_scores),
        "n_nonmembers": len(nonmember_scores),
        "fpr_resolution": 1.0 / len(nonmember_scores),
    }


def membership_summary(
    member_rows: Sequence[Mapping[str, Any]],
    nonmember_rows: Sequence[Mapping[str, Any]],
    target_fprs: Sequence[float] = DEFAULT_TARGET_FPRS,
    *,
    min_k: float | None = None,
) -> dict[str, Any]:
    """Attack metrics for every attack whose ``score_<attack>`` is present in all rows.

    Returns {"attacks": {attack: attack_metrics(...)}, "orientation": ..., "min_k": min_k}.
    """
    attacks = {}
    for attack in ATTACKS:
        key = f"score_{attack}"
        if member_rows and nonmember_rows and all(key in r for r in (*member_rows, *nonmember_rows)):
            attacks[attack] = attack_metrics([r[key] for r in member_rows], [r[key] for r in nonmember_rows],
                                             target_fprs)
    return {
        "attacks": attacks,
        "orientation": "higher score = member; members are training documents, non-members held-out documents",
        "min_k": min_k,
    }
