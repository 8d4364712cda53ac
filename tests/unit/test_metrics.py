"""Metrics against hand-computed values and against rouge-score called directly."""

import pytest
import torch
from rouge_score import rouge_scorer

from eval.metrics import (
    METRICS,
    UnicodeWordTokenizer,
    default_tokenizer_kept_fraction,
    exact_match,
    longest_correct_prefix,
    match_fraction,
    metric_info,
    prediction_accuracy,
    rouge_scores,
    teacher_forced_accuracy,
    unicode_words,
)

REF = [5, 6, 7, 8]


@pytest.mark.parametrize(
    "generated, exact, fraction, prefix",
    [
        ([5, 6, 7, 8], True, 1.0, 4),
        ([5, 6, 0, 8], False, 0.75, 2),
        ([0, 6, 7, 8], False, 0.75, 0),
        ([9, 9, 9, 9], False, 0.0, 0),
        # shorter generation: missing positions are misses
        ([5, 6], False, 0.5, 2),
        # longer generation: extra ids ignored by fraction and prefix, but not an exact match
        ([5, 6, 7, 8, 9], False, 1.0, 4),
        ([], False, 0.0, 0),
    ],
)
def test_token_metrics_hand_computed(generated, exact, fraction, prefix):
    assert exact_match(generated, REF) is exact
    assert match_fraction(generated, REF) == fraction
    assert longest_correct_prefix(generated, REF) == prefix


def test_token_metrics_accept_tensors_and_reject_empty_reference():
    assert exact_match(torch.tensor([5, 6, 7, 8]), REF)
    assert match_fraction(torch.tensor([5, 0, 7, 0]), torch.tensor(REF)) == 0.5
    for fn in (exact_match, match_fraction, longest_correct_prefix):
        with pytest.raises(ValueError, match="reference is empty"):
            fn([1], [])


PAIRS = [
    ("the cat sat on the mat", "the cat sat on the mat"),
    ("the cat sat on a mat today", "the cat sat on the mat"),
    ("Running dogs RAN quickly, home!", "the running dog runs quickly home"),
    ("completely different words here", "the cat sat on the mat"),
    ("", "the cat sat on the mat"),
]


@pytest.mark.parametrize("prediction, reference", PAIRS)
def test_rouge_matches_rouge_score_directly(prediction, reference):
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=False)
    expected = scorer.score(reference, prediction)
    got = rouge_scores(prediction, reference)
    assert got == {
        "rouge_l": expected["rougeL"].fmeasure,
        "rouge_l_recall": expected["rougeL"].recall,
        "rouge_1": expected["rouge1"].fmeasure,
        "rouge_2": expected["rouge2"].fmeasure,
        "rouge_l_unicode": rouge_scorer.RougeScorer(["rougeL"], tokenizer=UnicodeWordTokenizer())
        .score(reference, prediction)["rougeL"]
        .fmeasure,
    }
    if prediction and reference.isascii():  # on English text both tokenizers give the same words
        assert got["rouge_l_unicode"] == pytest.approx(got["rouge_l"])


def test_rouge_hand_computed_and_no_stemmer():
    # LCS("a b c d", "a x c d") = 3 of 4 words on both sides -> P = R = F = 0.75.
    s = rouge_scores("a x c d", "a b c d")
    assert s["rouge_l"] == pytest.approx(0.75) and s["rouge_l_recall"] == pytest.approx(0.75)
    # bigrams: {a x, x c, c d} vs {a b, b c, c d}: 1 of 3 -> 1/3.
    assert s["rouge_2"] == pytest.approx(1 / 3)
    # recall is against the reference: prediction "a" covers 1 of 4 reference words.
    assert rouge_scores("a", "a b c d")["rouge_l_recall"] == pytest.approx(0.25)
    # No stemming: "runs" and "running" are different words.
    assert rouge_scores("runs", "running")["rouge_1"] == 0.0
    with pytest.raises(ValueError, match="two strings"):
        rouge_scores([1, 2], "a")  # type: ignore[arg-type]


NON_LATIN = [
    # Japanese (no spaces between words: every kanji/kana is a word)
    ("猫が窓の外を見た。今日は晴れです。", "猫が窓の外を見ている。今日は雨です。"),
    # Chinese
    ("我们明天去北京看长城", "我们今天去北京看故宫"),
    # Hebrew (right to left), 4 of 5 words shared
    ("החתול יושב על הכיסא היום", "החתול יושב על השטיח היום"),
    # Arabic with vowel marks (combining characters stay inside their word)
    ("كَتَبَ الوَلَدُ الدَّرْسَ فِي البَيْتِ", "كَتَبَ الوَلَدُ الرِّسَالَةَ فِي البَيْتِ"),
]


@pytest.mark.parametrize("prediction, reference", NON_LATIN, ids=["japanese", "chinese", "hebrew", "arabic"])
def test_rouge_unicode_equals_rouge_score_with_the_same_tokenizer(prediction, reference):
    got = rouge_scores(prediction, reference)
    expected = (
        rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False, tokenizer=UnicodeWordTokenizer())
        .score(reference, prediction)["rougeL"]
        .fmeasure
    )
    assert got["rouge_l_unicode"] == expected
    assert got["rouge_l"] == 0.0 and got["rouge_l_unicode"] > 0.5  # the default tokenizer sees no word at all
    assert default_tokenizer_kept_fraction(reference) == 0.0


def test_unicode_words_hand_checked():
    assert unicode_words("החתול יושב, על השטיח!") == ["החתול", "יושב", "על", "השטיח"]
    assert unicode_words("東京に行く") == ["東", "京", "に", "行", "く"]
    assert unicode_words("Hello, Wörld 42") == ["hello", "wörld", "42"]
    arabic = unicode_words("كَتَبَ الوَلَدُ")
    assert len(arabic) == 2 and arabic[0] == "كَتَبَ"  # vowel marks kept inside the word
    # Hebrew: 4 of 5 words in common, in order -> P = R = F = 0.8.
    assert rouge_scores("החתול יושב על הכיסא היום", "החתול יושב על השטיח היום")["rouge_l_unicode"] == pytest.approx(0.8)
    assert default_tokenizer_kept_fraction("abc def") == 1.0 and default_tokenizer_kept_fraction("") == 1.0
    assert default_tokenizer_kept_fraction("ab שלום") == pytest.approx(2 / 6)
    # Punctuation counts on neither side: operator-heavy English is not flagged.
    assert default_tokenizer_kept_fraction('augassign ::= "+=" | "-=" | "*="') == 1.0


def _one_hot_logits(predictions: list[list[int]], vocab: int = 5) -> torch.Tensor:
    """(B, T, V) logits whose argmax at (b, t) is predictions[b][t]."""
    ids = torch.tensor(predictions)
    return torch.nn.functional.one_hot(ids, vocab).float() * 3.0 - 1.0


def test_teacher_forced_accuracy_hand_built():
    logits = _one_hot_logits([[1, 2, 3, 4], [0, 0, 0, 0]])
    targets = torch.tensor([[1, 2, 0, -100], [0, 1, -100, -100]])
    # row 0: hits at t=0,1, miss t=2, t=3 ignored; row 1: hit t=0, miss t=1 -> 3 of 5.
    res = teacher_forced_accuracy(logits, targets)
    assert res == {"accuracy": 3 / 5, "n_tokens": 5}

    dropped = torch.tensor([[False, True, True, True], [True, False, False, False]])
    res = teacher_forced_accuracy(logits, targets, dropped)
    # dropped & valid: (0,1) hit, (0,2) miss, (1,0) hit -> 2/3; the ignored (0,3) never counts.
    # kept & valid: (0,0) hit, (1,1) miss -> 1/2.
    assert res["accuracy"] == 3 / 5
    assert res["dropped_accuracy"] == pytest.approx(2 / 3) and res["n_dropped"] == 3
    assert res["kept_accuracy"] == 0.5 and res["n_kept"] == 2


def test_teacher_forced_accuracy_empty_groups_are_none():
    logits = _one_hot_logits([[1, 2]])
    res = teacher_forced_accuracy(logits, torch.tensor([[1, 0]]), torch.zeros(1, 2, dtype=torch.bool))
    assert res["dropped_accuracy"] is None and res["n_dropped"] == 0 and res["kept_accuracy"] == 0.5
    res = teacher_forced_accuracy(logits, torch.full((1, 2), -100))
    assert res["accuracy"] is None and res["n_tokens"] == 0


def test_teacher_forced_accuracy_rejects_bad_shapes():
    logits = _one_hot_logits([[1, 2]])
    with pytest.raises(ValueError, match="logits must be"):
        teacher_forced_accuracy(logits[0], torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="targets must be"):
        teacher_forced_accuracy(logits, torch.tensor([[1, 2, 3]]))
    with pytest.raises(ValueError, match="bool"):
        teacher_forced_accuracy(logits, torch.tensor([[1, 2]]), torch.tensor([[0, 1]]))


def test_prediction_accuracy_equals_the_logits_version():
    """extract() counts teacher-forced accuracy from predicted ids (the logits are not kept): the same figures as
    from the logits, on the hand-built case above."""
    logits = _one_hot_logits([[1, 2, 3, 4], [0, 0, 0, 0]])
    targets = torch.tensor([[1, 2, 0, -100], [0, 1, -100, -100]])
    dropped = torch.tensor([[False, True, True, True], [True, False, False, False]])
    for mask in (None, dropped):
        assert prediction_accuracy(logits.argmax(-1), targets, mask) == teacher_forced_accuracy(logits, targets, mask)
    with pytest.raises(ValueError, match="one shape"):
        prediction_accuracy(torch.tensor([[1, 2, 3]]), targets[:1])


def test_metric_registry():
    for name in (
        "exact_match",
        "match_fraction",
        "longest_correct_prefix",
        "rouge_l",
        "rouge_l_recall",
        "rouge_1",
        "rouge_2",
        "tf_accuracy",
        "tf_kept_accuracy",
        "tf_dropped_accuracy",
    ):
        info = metric_info(name)
        assert info.name == name and info.aggregation == "mean" and info.higher_is_better
    with pytest.raises(ValueError, match="known metrics: .*rouge_l"):
        metric_info("rougeL")
    with pytest.raises(TypeError):
        METRICS["x"] = None  # type: ignore[index]  # read-only registry
