"""Reading an ROC curve: the true-positive rate an attack reaches at a given false-positive rate.

Plain numpy on scores, no model and nothing else of the project, so that both the membership instruments
(eval.membership) and the bootstrap intervals (eval.intervals) can use one definition without importing each other.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


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


def roc_points(member_scores: Sequence[float], nonmember_scores: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """(fpr, tpr) of the ROC of scores oriented higher = member, one vertex per distinct score (threshold
    "score >= t", t from the highest score down) after a (0, 0) vertex: sklearn's ``roc_curve(...,
    drop_intermediate=False)`` without its input checks, a few times faster for the thousand curves of a
    bootstrap."""
    members = np.sort(np.asarray(member_scores, dtype=np.float64))
    nonmembers = np.sort(np.asarray(nonmember_scores, dtype=np.float64))
    if members.size == 0 or nonmembers.size == 0:
        raise ValueError("an ROC needs members and non-members")
    thresholds = np.unique(np.concatenate([members, nonmembers]))[::-1]  # distinct scores, highest first
    # how many scores of each class are >= each threshold
    tp = members.size - np.searchsorted(members, thresholds, side="left")
    fp = nonmembers.size - np.searchsorted(nonmembers, thresholds, side="left")
    fpr = np.concatenate([[0.0], fp / nonmembers.size])
    tpr = np.concatenate([[0.0], tp / members.size])
    return fpr, tpr


def tpr_at_fpr_of_scores(member_scores: Sequence[float], nonmember_scores: Sequence[float], target_fpr: float) -> float:
    """`tpr_at_fpr` of the ROC of these scores (`roc_points`), higher = member."""
    fpr, tpr = roc_points(member_scores, nonmember_scores)
    return tpr_at_fpr(fpr, tpr, target_fpr)
