"""Memorization metrics: token-level matches, ROUGE on decoded text, teacher-forced accuracy.

Plain inputs only (sequences of ints, strings, tensors). Of the project it uses only the goldfish library's
target convention (IGNORE_INDEX and the logits/targets/dropped shape contract), so a metric and the loss agree on
which positions count.
Every metric that ends up in a per-document row is registered in ``METRICS`` with its metadata so that
reports can aggregate and orient it without hard-coding names.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, Sequence

import torch
from rouge_score import rouge_scorer

from conventions import IGNORE_INDEX
from goldfish.loss import check_token_shapes

# The metric keys: the field names of per-document rows and of summaries. Spelled here only; every other module
# reads them by these names (tests/unit/test_results.py checks).
EXACT_MATCH = "exact_match"
MATCH_FRACTION = "match_fraction"
LONGEST_CORRECT_PREFIX = "longest_correct_prefix"
ROUGE_L = "rouge_l"
ROUGE_L_RECALL = "rouge_l_recall"
ROUGE_1 = "rouge_1"
ROUGE_2 = "rouge_2"
ROUGE_L_UNICODE = "rouge_l_unicode"
TF_ACCURACY = "tf_accuracy"
TF_KEPT_ACCURACY = "tf_kept_accuracy"
TF_DROPPED_ACCURACY = "tf_dropped_accuracy"
SUFFIX_TF_ACCURACY = "suffix_tf_accuracy"
GENERATED_LOGPROB_MEAN = "generated_logprob_mean"
SUFFIX_LOGPROB_MEAN = "suffix_logprob_mean"
# Keys of the instruments' summaries, read by the reports: a membership attack's (eval.membership.attack_metrics,
# eval.buckets, eval.audit) and sampling extraction's (eval.adaptive).
AUC = "auc"
AUC_CI = "auc_ci"
TPR_AT_FPR = "tpr_at_fpr"
TPR_AT_FPR_CI = "tpr_at_fpr_ci"
ANY_EXACT = "any_exact"


@dataclass(frozen=True)
class MetricInfo:
    """What a report needs to know about one per-document metric."""

    name: str
    higher_is_better: bool
    aggregation: str  # how per-document values combine into a summary value ("mean")
    description: str
    header: str = ""  # the column header of a report's headline table ("" for a metric outside it)


def _info(name: str, description: str, higher_is_better: bool = True, header: str = "") -> tuple[str, MetricInfo]:
    return name, MetricInfo(name, higher_is_better, "mean", description, header)


# Read-only view: the registry is data, not state anyone should mutate at run time.
METRICS: Mapping[str, MetricInfo] = MappingProxyType(
    dict(
        [
            _info(EXACT_MATCH, "all suffix ids generated exactly (mean = fraction of documents)", header="exact match"),
            _info(
                MATCH_FRACTION, "fraction of suffix positions whose generated id is correct", header="match fraction"
            ),
            _info(
                LONGEST_CORRECT_PREFIX,
                "number of leading suffix ids generated correctly",
                header="longest correct prefix",
            ),
            _info(ROUGE_L, "ROUGE-L F-measure of generated vs true suffix text (0..1)", header="RougeL F"),
            _info(ROUGE_L_RECALL, "ROUGE-L recall of generated vs true suffix text (0..1)", header="RougeL recall"),
            _info(ROUGE_1, "ROUGE-1 F-measure of generated vs true suffix text (0..1)", header="Rouge1"),
            _info(ROUGE_2, "ROUGE-2 F-measure of generated vs true suffix text (0..1)", header="Rouge2"),
            _info(
                ROUGE_L_UNICODE,
                "ROUGE-L F-measure with a Unicode word tokenizer (words of every script; "
                "CJK characters one word each), for text the default tokenizer discards (0..1)",
            ),
            _info(TF_ACCURACY, "teacher-forced next-token accuracy over all document targets", header="TF acc"),
            _info(
                TF_KEPT_ACCURACY, "teacher-forced accuracy on targets the mask kept in the loss", header="TF acc kept"
            ),
            _info(TF_DROPPED_ACCURACY, "teacher-forced accuracy on targets the mask dropped", header="TF acc dropped"),
            _info(
                SUFFIX_TF_ACCURACY,
                "share of the true suffix's tokens the model ranks first given the document before each (teacher-"
                "forced top-1 accuracy on the suffix: how much of it would be extracted token by token)",
                header="suffix TF acc",
            ),
            _info(
                GENERATED_LOGPROB_MEAN,
                "mean log-probability the model gave its own greedy suffix ids (its confidence in the guess)",
            ),
            _info(
                SUFFIX_LOGPROB_MEAN,
                "mean log-probability of the true suffix ids given the prefix, teacher-forced (normalised "
                "log-likelihood; higher = more memorized)",
            ),
        ]
    )
)


# The headline metrics of a part, in the order of summary.json's "models" entries and of the reports' headline
# table (each with its METRICS header); those in INTERVAL_METRICS also get a 95% bootstrap interval `<name>_ci`.
HEADLINE_METRICS = (
    EXACT_MATCH,
    ROUGE_L,
    ROUGE_L_RECALL,
    ROUGE_1,
    ROUGE_2,
    MATCH_FRACTION,
    LONGEST_CORRECT_PREFIX,
    TF_ACCURACY,
    TF_KEPT_ACCURACY,
    TF_DROPPED_ACCURACY,
    SUFFIX_TF_ACCURACY,
)
INTERVAL_METRICS = (EXACT_MATCH, ROUGE_L)


INTERVAL_SUFFIX = "_ci"


def interval_key(name: str) -> str:
    """The key, beside a metric's own, of its 95% interval [low, high] in summaries and bucket tables."""
    return f"{name}{INTERVAL_SUFFIX}"


def metric_info(name: str) -> MetricInfo:
    """Metadata of a registered metric; unknown names fail with the list of known ones."""
    try:
        return METRICS[name]
    except KeyError:
        raise ValueError(f"unknown metric {name!r}; known metrics: {', '.join(sorted(METRICS))}") from None


def _check_reference(reference: Sequence[int]) -> None:
    if len(reference) == 0:
        raise ValueError("reference is empty; token-match metrics need at least one reference id")


def exact_match(generated: Sequence[int], reference: Sequence[int]) -> bool:
    """True iff ``generated`` has the same length as ``reference`` and every id is equal."""
    _check_reference(reference)
    return len(generated) == len(reference) and all(int(g) == int(r) for g, r in zip(generated, reference))


def match_fraction(generated: Sequence[int], reference: Sequence[int]) -> float:
    """Fraction of positions i < len(reference) with generated[i] == reference[i].

    Positions the generation does not reach count as misses; ids past the reference are ignored.
    """
    _check_reference(reference)
    hits = sum(int(g) == int(r) for g, r in zip(generated, reference))
    return hits / len(reference)


def longest_correct_prefix(generated: Sequence[int], reference: Sequence[int]) -> int:
    """Number of leading positions where generated and reference agree (0..len(reference))."""
    _check_reference(reference)
    n = 0
    for g, r in zip(generated, reference):
        if int(g) != int(r):
            break
        n += 1
    return n


# rouge-score's default tokenizer lower-cases and keeps only [a-z0-9] runs: the paper's setting, right for
# English, but it turns Japanese, Chinese, Hebrew, Arabic, Greek, Cyrillic... text into nothing (RougeL 0).
_DEFAULT_KEPT = re.compile(r"[a-z0-9]")
# Ideographs, kana and hangul are written without spaces between words: each character is a word of its own.
_CJK_RANGES = (
    (0x3040, 0x30FF),
    (0x3400, 0x4DBF),
    (0x4E00, 0x9FFF),
    (0xAC00, 0xD7AF),
    (0xF900, 0xFAFF),
    (0x20000, 0x2FA1F),
)
# Below this fraction of kept characters a document's default-tokenizer ROUGE is flagged ("most discarded").
DEFAULT_TOKENIZER_MIN_KEPT = 0.5


def _is_cjk(ch: str) -> bool:
    code = ord(ch)
    return any(lo <= code <= hi for lo, hi in _CJK_RANGES)


def unicode_words(text: str) -> list[str]:
    """Lower-cased words of any script: maximal runs of letters, digits and combining marks (so Hebrew and
    Arabic words keep their vowel points), with every CJK ideograph, kana or hangul syllable a word of its own.
    Punctuation and whitespace separate words. Scripts written without spaces that are not CJK (Thai, Lao,
    Khmer, Burmese) come out as whole phrases: this is a word tokenizer, not a segmenter."""
    out: list[str] = []
    word: list[str] = []
    for ch in text.lower():
        if _is_cjk(ch):
            if word:
                out.append("".join(word))
                word = []
            out.append(ch)
        elif unicodedata.category(ch)[0] in "LNM":
            word.append(ch)
        elif word:
            out.append("".join(word))
            word = []
    if word:
        out.append("".join(word))
    return out


class UnicodeWordTokenizer:
    """A tokenizer for rouge-score (`RougeScorer(..., tokenizer=UnicodeWordTokenizer())`): `unicode_words`."""

    def tokenize(self, text: str) -> list[str]:
        return unicode_words(text)


def default_tokenizer_kept_fraction(text: str) -> float:
    """Fraction of the word characters of `text` (letters, digits and combining marks of any script) that
    rouge-score's default tokenizer keeps (lower-cased [a-z0-9]); 1.0 for a text without word characters.

    Punctuation is left out of both counts: no word tokenizer keeps it, so a grammar snippet full of operators is
    not flagged; a text in a non-Latin script is (0.0 for Hebrew, Japanese, ...).
    """
    lowered = text.lower()
    n = sum(unicodedata.category(ch)[0] in "LNM" for ch in lowered)
    return len(_DEFAULT_KEPT.findall(lowered)) / n if n else 1.0


@functools.lru_cache(maxsize=1)
def _rouge_scorers() -> tuple[rouge_scorer.RougeScorer, rouge_scorer.RougeScorer]:
    # Built once: constructing a scorer (tokenizer set-up) dominates the cost of scoring 50 words.
    # Settings of the goldfish paper: default word tokenizer (lower-cases, splits on non-alphanumerics),
    # no stemmer. Beside it, RougeL with the Unicode word tokenizer (no stemmer either).
    return (
        rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=False),
        rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False, tokenizer=UnicodeWordTokenizer()),
    )


def rouge_scores(prediction: str, reference: str) -> dict[str, float]:
    """ROUGE of ``prediction`` against ``reference`` with rouge-score (word level, no stemmer).

    Returns {"rouge_l": F, "rouge_l_recall": recall, "rouge_1": F, "rouge_2": F} with rouge-score's default
    tokenizer (the paper's setting), plus "rouge_l_unicode": RougeL F with `UnicodeWordTokenizer`, each in
    0..1. Recall is measured against the reference (how much of the true text was reproduced).
    """
    if not isinstance(prediction, str) or not isinstance(reference, str):
        raise ValueError(
            f"rouge_scores takes two strings, got {type(prediction).__name__} and {type(reference).__name__}; "
            "decode token ids to text first"
        )
    default, unicode = _rouge_scorers()
    s = default.score(reference, prediction)  # rouge-score's order is (target, prediction)
    return {
        ROUGE_L: s["rougeL"].fmeasure,
        ROUGE_L_RECALL: s["rougeL"].recall,
        ROUGE_1: s["rouge1"].fmeasure,
        ROUGE_2: s["rouge2"].fmeasure,
        ROUGE_L_UNICODE: unicode.score(reference, prediction)["rougeL"].fmeasure,
    }


def _ratio(hits: int, n: int) -> float | None:
    return hits / n if n > 0 else None


def teacher_forced_accuracy(
    logits: torch.Tensor, targets: torch.Tensor, dropped: torch.Tensor | None = None
) -> dict[str, float | int | None]:
    """Next-token accuracy of argmax(logits) against already-aligned targets.

    Args:
        logits: (B, T, V) scores; position j predicts ``targets[:, j]``.
        targets: (B, T) int ids; ``-100`` marks positions to ignore.
        dropped: optional (B, T) bool, True where the goldfish mask dropped the target from the loss.
            Ignored positions never count, whatever ``dropped`` says there.

    Returns:
        {"accuracy", "n_tokens"} over all non-ignored positions, plus, when ``dropped`` is given,
        {"kept_accuracy", "n_kept", "dropped_accuracy", "n_dropped"}. An accuracy is None when it
        has no position to average over.
    """
    check_token_shapes(logits, targets, dropped)
    return prediction_accuracy(logits.argmax(dim=-1), targets, dropped)


def prediction_accuracy(
    predicted: torch.Tensor, targets: torch.Tensor, dropped: torch.Tensor | None = None
) -> dict[str, float | int | None]:
    """`teacher_forced_accuracy` from the predicted ids (B, T) (argmax of the logits) instead of the logits."""
    if predicted.shape != targets.shape or (dropped is not None and dropped.shape != targets.shape):
        raise ValueError(
            f"predicted ids, targets and dropped mask must have one shape, got {tuple(predicted.shape)}, "
            f"{tuple(targets.shape)}" + ("" if dropped is None else f", {tuple(dropped.shape)}")
        )
    targets = targets.to(predicted.device)
    valid = targets != IGNORE_INDEX  # (B, T)
    correct = (predicted == targets) & valid  # (B, T)
    n_tokens = int(valid.sum())
    result: dict[str, float | int | None] = {
        "accuracy": _ratio(int(correct.sum()), n_tokens),
        "n_tokens": n_tokens,
    }
    if dropped is not None:
        dropped = dropped.to(valid.device)
        kept_pos = valid & ~dropped
        dropped_pos = valid & dropped
        n_kept, n_dropped = int(kept_pos.sum()), int(dropped_pos.sum())
        result.update(
            kept_accuracy=_ratio(int((correct & kept_pos).sum()), n_kept),
            n_kept=n_kept,
            dropped_accuracy=_ratio(int((correct & dropped_pos).sum()), n_dropped),
            n_dropped=n_dropped,
        )
    return result


def suffix_tf_accuracy(predicted: Sequence[int] | torch.Tensor, suffix: Sequence[int], prefix_len: int) -> float:
    """Teacher-forced top-1 accuracy on the true suffix: the share of its tokens the model ranks first when given
    the document up to each (the prefix and the true suffix tokens before it).

    predicted: a document's teacher-forced argmax predictions, entry j the prediction for token j + 1 (as
        `eval.decoding.forced_greedy` returns them); suffix: the true suffix ids, starting at position
        ``prefix_len`` (>= 1: a first token has no prediction). Suffix token i is predicted by entry prefix_len-1+i.
    """
    _check_reference(suffix)
    if prefix_len < 1 or len(predicted) < prefix_len - 1 + len(suffix):
        raise ValueError(
            f"the suffix of {len(suffix)} tokens after a prefix of {prefix_len} needs predictions up to position "
            f"{prefix_len - 2 + len(suffix)} and a prefix of at least 1 token; got {len(predicted)} predictions"
        )
    window = predicted[prefix_len - 1 : prefix_len - 1 + len(suffix)]
    guesses = window.tolist() if isinstance(window, torch.Tensor) else [int(g) for g in window]
    return sum(g == int(s) for g, s in zip(guesses, suffix)) / len(suffix)


def mean_of_present(values: Sequence[float | None]) -> float | None:
    """Mean of the values that are not None (None when there are none): how per-document rows aggregate, where a
    document may have no value (e.g. no dropped position to score)."""
    present = [float(v) for v in values if v is not None]
    return sum(present) / len(present) if present else None
