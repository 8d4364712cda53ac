"""The field's named scores (eval.field_scores) against their definitions and hand-computed examples."""

from __future__ import annotations

import pytest

from eval.field_scores import memorization_score, recall_at_incorrect


def test_memorization_score_is_pythias_definition():
    """M = (1/32) sum_i 1[g_i == s_i] over the 32 continuation tokens, matches anywhere (not only leading)."""
    reference = list(range(100, 132))
    assert memorization_score(reference, reference) == 1.0
    generated = list(reference)
    for i in (0, 5, 31):  # three misses, one of them the first token
        generated[i] = 7
    assert memorization_score(generated, reference) == pytest.approx(29 / 32)
    # the definition written out
    assert memorization_score(generated, reference) == sum(g == s for g, s in zip(generated, reference)) / 32
    assert memorization_score([1, 2, 3, 4], [1, 9, 3, 9]) == 0.5  # other lengths are allowed
    assert memorization_score([0] * 32, reference) == 0.0
    with pytest.raises(ValueError, match="generate exactly"):
        memorization_score(reference[:31], reference)


def test_recall_at_incorrect_by_hand():
    """Guesses (confidence, correct), read most confident first:
    0.9 T, 0.8 F (1st wrong), 0.7 T, 0.6 F (2nd wrong), 0.5 T, 0.4 F (3rd), 0.3 T.
    N = 1: read 0.9, 0.8 -> 1 found; N = 2: through 0.6 -> 2; N = 3: through 0.4 -> 3; N = 4: the list ends -> 4.
    The input order is shuffled: only the confidences order the guesses."""
    confidences = [0.5, 0.9, 0.4, 0.7, 0.3, 0.8, 0.6]
    correct = [True, True, False, True, True, False, False]
    expected = {1: (1, 2), 2: (2, 4), 3: (3, 6), 4: (4, 7), 100: (4, 7)}
    for n_incorrect, (n_correct, n_read) in expected.items():
        result = recall_at_incorrect(confidences, correct, n_incorrect)
        assert result == {
            "recall": n_correct / 7,
            "n_correct": n_correct,
            "n_guesses_read": n_read,
            "n_incorrect": n_incorrect,
            "n_targets": 7,
        }
    # targets that were not guessed at all count in the denominator when n_targets says so
    assert recall_at_incorrect(confidences, correct, 2, n_targets=10)["recall"] == pytest.approx(0.2)


def test_recall_at_incorrect_several_guesses_per_target_and_ties():
    """Target a guessed right twice counts once; a repeated right guess is no error; a tie reads wrong guesses
    first, whatever the input order."""
    confidences = [0.9, 0.8, 0.7, 0.6]
    correct = [True, True, False, True]
    targets = ["a", "a", "b", "c"]
    result = recall_at_incorrect(confidences, correct, 1, target_ids=targets)
    assert result["n_correct"] == 1 and result["n_guesses_read"] == 3 and result["n_targets"] == 3
    assert result["recall"] == pytest.approx(1 / 3)
    assert recall_at_incorrect(confidences, correct, 2, target_ids=targets)["n_correct"] == 2  # c after the end
    # a tie between a right and a wrong guess at the top: the wrong one is read first, so N = 1 finds nothing
    for order in ([True, False], [False, True]):
        tied = recall_at_incorrect([0.5, 0.5, 0.1], order + [True], 1)
        assert tied["n_correct"] == 0 and tied["n_guesses_read"] == 1


def test_recall_at_incorrect_rejects_bad_input():
    with pytest.raises(ValueError, match="one correctness flag per guess"):
        recall_at_incorrect([0.1, 0.2], [True], 1)
    with pytest.raises(ValueError, match="n_incorrect"):
        recall_at_incorrect([0.1], [True], 0)
    with pytest.raises(ValueError, match="finite"):
        recall_at_incorrect([float("nan")], [True], 1)
    with pytest.raises(ValueError, match="n_targets"):
        recall_at_incorrect([0.1, 0.2], [True, False], 1, n_targets=1)
    with pytest.raises(ValueError, match="give n_targets"):
        recall_at_incorrect([], [], 1)
    assert recall_at_incorrect([], [], 1, n_targets=5)["recall"] == 0.0
