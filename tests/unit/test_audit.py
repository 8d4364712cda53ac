"""eval.audit: scoring windows, the teacher-forced pass, per-document rows and the set summary of `goldfish audit`."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from tiny_models import tiny_llama

from eval.audit import (
    audit_documents,
    audit_summary,
    document_targets,
    gap_interval,
    group_summary,
    longest_run,
    mask_row,
    score_windows,
    teacher_forced,
)
from eval.config import ExtractionConfig
from eval.logprobs import token_log_probs
from goldfish.masks import drop_mask

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 97
CONTEXT = 32


@dataclass
class Doc:
    id: str
    token_ids: list[int]


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return tiny_llama(vocab=VOCAB, positions=CONTEXT, initializer_range=0.2).eval()


def _docs(lengths: list[int], seed: int = 0) -> list[Doc]:
    generator = torch.Generator().manual_seed(seed)
    return [
        Doc(f"d{i}", [1] + torch.randint(3, VOCAB, (n - 1,), generator=generator).tolist())
        for i, n in enumerate(lengths)
    ]


WINDOW_CASES = [(10, 32, None), (32, 32, None), (33, 32, None), (100, 32, 16), (77, 8, 3)]


@pytest.mark.parametrize("n, context, stride", WINDOW_CASES)
def test_windows_score_every_target_once_within_the_context(n, context, stride):
    windows = score_windows(n, context, stride)
    scored = [j for start, end, first in windows for j in range(first, end - 1)]
    assert scored == list(range(n - 1))  # every target once, in order
    least = context - (stride or context // 2)
    for start, end, first in windows:
        assert 0 <= start <= first and end - start <= context and end <= n
        if start > 0:
            assert first + 1 - start >= least  # tokens before the first target a later window scores
    assert windows[-1][1] == n


def test_windows_refuse_what_cannot_be_scored():
    assert score_windows(5, None) == [(0, 5, 0)]
    with pytest.raises(ValueError, match="at least 2 tokens"):
        score_windows(1, 8)
    with pytest.raises(ValueError, match="stride"):
        score_windows(20, 8, 8)


def test_teacher_forced_equals_one_pass_when_the_document_fits(model):
    docs = _docs([20, 32, 7])
    seqs = [d.token_ids for d in docs]
    scored = teacher_forced(model, seqs, pad_token_id=0, context=CONTEXT, batch_size=2)
    reference = token_log_probs(model, seqs, pad_token_id=0, batch_size=1)
    for (lp, predicted), ref, seq in zip(scored, reference, seqs):
        torch.testing.assert_close(lp, ref, rtol=0, atol=1e-5)
        with torch.no_grad():
            argmax = model(input_ids=torch.tensor([seq])).logits[0, :-1].argmax(-1)
        assert torch.equal(predicted, argmax)


def test_teacher_forced_windows_a_long_document(model):
    """Each target of a document longer than the context is scored from the window the formula assigns it: the
    first window while it fits, else the window ending at the first multiple of the stride past it."""
    (doc,) = _docs([90])
    seq, stride = doc.token_ids, 8
    ((lp, predicted),) = teacher_forced(model, [seq], pad_token_id=0, context=CONTEXT, stride=stride)
    assert lp.shape == predicted.shape == (89,)
    for j in (0, 30, 31, 32, 45, 60, 88):  # target j is token j + 1
        token = j + 1
        end = CONTEXT if token < CONTEXT else min(CONTEXT + math.ceil((token + 1 - CONTEXT) / stride) * stride, 90)
        start = max(0, end - CONTEXT)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([seq[start : token + 1]])).logits[0, -2].double()
        assert lp[j].item() == pytest.approx(torch.log_softmax(logits, -1)[seq[token]].item(), abs=1e-5)
        assert predicted[j].item() == logits.argmax().item()


def test_longest_run():
    assert longest_run([]) == (0, None)
    assert longest_run([False, False]) == (0, None)
    assert longest_run([True, True, False, True, True, True, False]) == (3, 3)
    assert longest_run([True, False, True]) == (1, 0)


def test_gap_interval_contains_the_gap_and_is_none_without_a_group():
    low, high = gap_interval(40, 38, 12, 2)
    assert low <= 38 / 40 - 2 / 12 <= high and high - low < 0.6
    assert gap_interval(40, 38, 0, 0) is None and gap_interval(4, 4, 4, 0, n_resamples=0) is None
    assert gap_interval(10, 10, 5, 0) == [1.0, 1.0]  # all kept right, all dropped wrong: no spread
    # the binomial draw is the bootstrap of 0/1 outcomes: its spread matches resampling positions one by one
    rng = np.random.default_rng(1)
    kept, dropped = np.array([1] * 30 + [0] * 10), np.array([1] * 3 + [0] * 9)
    brute = [rng.choice(kept, kept.size).mean() - rng.choice(dropped, dropped.size).mean() for _ in range(4000)]
    low, high = gap_interval(40, 30, 12, 3, n_resamples=4000)
    assert low == pytest.approx(np.quantile(brute, 0.025), abs=0.05)
    assert high == pytest.approx(np.quantile(brute, 0.975), abs=0.05)


def test_mask_row_counts_kept_and_dropped_targets():
    tokens = [1, 10, 11, 12, 13, 14]
    predicted = torch.tensor([10, 11, 99, 13, 99])  # right, right, wrong, right, wrong
    dropped = torch.tensor([False, False, True, False, True])
    log_probs = torch.tensor([-0.1, -0.1, -3.0, -0.1, -5.0], dtype=torch.float64)
    row = mask_row(log_probs, predicted, tokens, dropped, 100)
    assert (row["n_kept"], row["n_dropped"], row["kept_correct"], row["dropped_correct"]) == (3, 2, 3, 0)
    assert row["kept_accuracy"] == 1.0 and row["dropped_accuracy"] == 0.0 and row["gap"] == 1.0
    assert row["kept_loss"] == pytest.approx(0.1) and row["dropped_loss"] == pytest.approx(4.0)
    assert row["loss_gap"] == pytest.approx(3.9) and row["gap_ci"] == [1.0, 1.0]
    assert row["longest_span"] == 2 and row["longest_span_start"] == 1
    # targets the mask does not decide on (a hashed window's first h - 1) count in neither group
    decided = torch.tensor([False, True, True, True, True])
    row = mask_row(log_probs, predicted, tokens, dropped, 100, decided)
    assert (row["n_kept"], row["n_dropped"], row["n_undecided"], row["kept_correct"]) == (2, 2, 1, 2)
    none_dropped = mask_row(log_probs, predicted, tokens, torch.zeros(5, dtype=torch.bool), 100)
    assert none_dropped["gap"] is None and none_dropped["gap_ci"] is None and none_dropped["dropped_loss"] is None


def test_audit_rows_follow_the_mask(model):
    docs = _docs([30, 60, 12])  # 60 > the context: windows; 12 < prefix + suffix of the split: no extraction

    def dropped(targets: torch.Tensor) -> torch.Tensor:
        return drop_mask(targets, "hashed", 3, 4, special_token_ids=[0, 1, 2])

    config = ExtractionConfig(suffix_len=8, prefix_len=16, batch_size=2, bootstrap=50)
    rows = audit_documents(
        model,
        docs,
        dropped_fn=dropped,
        decode=lambda ids: " ".join(map(str, ids)),
        pad_token_id=0,
        extraction=config,
        context=CONTEXT,
        member=True,
    )
    assert [r["id"] for r in rows] == ["d0", "d1", "d2"] and all(r["member"] for r in rows)
    assert [r["n_windows"] for r in rows] == [1, 3, 1]
    for doc, row in zip(docs, rows):
        flags = dropped(document_targets(doc.token_ids))[0, :-1]
        assert row["n_dropped"] == int(flags.sum()) and row["n_kept"] + row["n_dropped"] == len(doc.token_ids) - 1
        assert {"score_loss", "score_zlib", "score_min_k"} <= set(row)
        if row["exact_match"] is None:
            assert doc.id == "d2" and row["first_divergence"] is None
            continue
        assert row["n_prefix_tokens"] == 16 and len(row["generated_ids"]) == 8
        index = row["first_divergence"]
        if index is not None:
            assert row["diverged_on_dropped"] == bool(flags[16 + index - 1])


def _row(gap: float, member: bool, diverged_on_dropped: bool) -> dict:
    return {
        "member": member,
        "n_kept": 30,
        "n_dropped": 10,
        "kept_correct": 30,
        "dropped_correct": round(10 * (1 - gap)),
        "kept_accuracy": 1.0,
        "dropped_accuracy": 1 - gap,
        "gap": gap,
        "gap_ci": [gap - 0.1, gap + 0.1],
        "kept_loss": 0.1,
        "dropped_loss": 0.1 + 5 * gap,
        "loss_gap": 5 * gap,
        "longest_span": 5,
        "exact_match": False,
        "first_divergence": 3,
        "diverged_on_dropped": diverged_on_dropped,
        "suffix_drop_rate": 0.25,
        "score_loss": -1.0 - gap,
        "score_zlib": -0.01,
        "score_min_k": -2.0,
    }


def test_summary_separates_members_by_their_gap():
    members = [_row(g, True, True) for g in (0.9, 0.8, 0.7, 0.6)]
    nonmembers = [_row(g, False, i == 0) for i, g in enumerate((0.0, 0.1, -0.1, 0.05))]
    summary = audit_summary(members, nonmembers, k=4, n_resamples=200)
    gap = summary["membership"]["attacks"]["mask_gap"]
    assert gap["auc"] == 1.0 and gap["tpr_at_fpr"]["0.01"] == 1.0 and gap["tpr_at_fpr_ci"]["0.01"] is not None
    assert summary["membership"]["attacks"]["loss"]["auc"] == 0.0  # the rows' loss scores point the other way
    assert set(summary["membership"]["attacks"]) == {"mask_gap", "mask_loss_gap", "loss", "zlib", "min_k"}
    group = summary["members"]
    assert group["gap"]["mean"] == pytest.approx(0.75) and group["n_gap_above_zero"] == 4
    assert group["pooled"] == {"n_kept": 120, "n_dropped": 40, "kept_accuracy": 1.0, "dropped_accuracy": 0.25}
    divergence = group["divergence"]
    assert divergence["base_rate"] == 0.25 and divergence["share_on_dropped"] == 1.0
    assert divergence["share_expected_by_chance"] == 0.25 and divergence["p_value"] < 0.05
    assert summary["nonmembers"]["divergence"]["share_on_dropped"] == 0.25
    alone = audit_summary(members, None, k=4, n_resamples=0)
    assert alone["nonmembers"] is None and alone["membership"] is None and alone["members"]["gap"]["ci"] is None


def test_group_summary_without_gaps():
    row = _row(0.5, True, False) | {"gap": None, "gap_ci": None, "n_dropped": 0, "dropped_correct": 0}
    summary = group_summary([row], k=3, n_resamples=10)
    assert summary["n_with_gap"] == 0 and summary["gap"]["mean"] is None and summary["gap_quantiles"]["0.5"] is None
