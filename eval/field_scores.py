"""The memorization scores other studies report under their own names, so results can be set beside theirs.

* `memorization_score`: Pythia's per-sequence score (Biderman et al. 2023, "Emergent and predictable memorization
  in large language models"), 32-token prefix, 32 greedy tokens.
* `recall_at_incorrect`: the Training Data Extraction Challenge's metric (google-research/lm-extraction-benchmark,
  Carlini et al. 2022): 50-token prefix and suffix, guesses ranked by the attacker's confidence, recall when the
  N-th incorrect guess is read (N = 100 in the challenge).

Plain inputs (token ids, confidences, booleans); no model.
"""

from __future__ import annotations

from typing import Any, Sequence

from eval.metrics import match_fraction

PYTHIA_PREFIX_LEN = 32  # tokens of the prompt in Pythia's memorization study
PYTHIA_SUFFIX_LEN = 32  # tokens generated and compared
BENCHMARK_PREFIX_LEN = 50  # lm-extraction-benchmark: prefix and suffix of 50 tokens each
BENCHMARK_SUFFIX_LEN = 50
BENCHMARK_INCORRECT = 100  # the challenge's N: recall at 100 incorrect guesses


def memorization_score(generated: Sequence[int], reference: Sequence[int]) -> float:
    """Pythia's memorization score of one sequence: M = (1/l) * sum_{i=1..l} 1[g_i == s_i], where s_1..s_l are the
    l true tokens that follow a k-token prefix in the training data and g_1..g_l the model's greedy continuation of
    that prefix (Biderman et al. 2023, k = l = 32; 1.0 = memorized, i.e. 32-extractable from 32 tokens). Any l >= 1
    is accepted; ``generated`` and ``reference`` must have the same length l.

    On equal lengths this is exactly eval.metrics.match_fraction (the fraction of suffix positions whose generated
    id is correct), which it calls; extraction rows of a 32/32 split (``ExtractionConfig(suffix_len=32,
    prefix_len=32)``) therefore carry the score as ``match_fraction``. It counts matches anywhere in the suffix,
    unlike longest_correct_prefix, which stops at the first miss.
    """
    if len(generated) != len(reference):
        raise ValueError(
            f"the memorization score compares l generated ids with the l true ones, got {len(generated)} generated "
            f"and {len(reference)} true ids; generate exactly len(reference) tokens"
        )
    return match_fraction(generated, reference)


def recall_at_incorrect(
    confidences: Sequence[float],
    correct: Sequence[bool],
    n_incorrect: int,
    *,
    target_ids: Sequence[Any] | None = None,
    n_targets: int | None = None,
) -> dict[str, Any]:
    """Recall at N incorrect guesses, the lm-extraction-benchmark metric.

    Each guess is one candidate suffix for one target (a 50-token prefix whose true 50-token suffix is known),
    with the attacker's confidence in it (here: the mean log-probability the model gave its own greedy suffix,
    ``generated_logprob_mean`` of an extraction row) and whether it equals the true suffix exactly. The guesses are
    read from the most to the least confident; reading stops right after the N-th incorrect guess (or at the end of
    the list). recall = (targets with a correct guess read) / (number of targets). In the benchmark's scorer,
    correct guesses after the N-th incorrect one do not count, and a target counts once however many correct
    guesses it gets.

    Args:
        confidences: one per guess, higher = more confident (finite numbers).
        correct: one per guess, True when the guess is the exact true suffix.
        n_incorrect: N >= 1, the incorrect guesses allowed (100 in the challenge).
        target_ids: the target each guess is for, when there may be several guesses per target: a target's
            second correct guess adds nothing (and is not an error); a wrong guess always counts as incorrect.
            None: one guess per target (greedy extraction: the guess of row i is for target i).
        n_targets: the recall's denominator, the number of targets attacked (targets with no guess count as
            missed). None: the number of distinct targets among the guesses.

    Ties: guesses of equal confidence are read incorrect ones first, so the result does not depend on the order
    of the input and never credits a tie with more than the worst order of it would give (a lower bound).

    Returns {"recall", "n_correct" (targets found), "n_guesses_read" (including the N-th incorrect guess),
    "n_incorrect" (N), "n_targets"}.
    """
    if len(confidences) != len(correct):
        raise ValueError(f"one correctness flag per guess: {len(confidences)} confidences, {len(correct)} flags")
    if isinstance(n_incorrect, bool) or not isinstance(n_incorrect, int) or n_incorrect < 1:
        raise ValueError(f"n_incorrect must be an int >= 1 (the benchmark uses 100), got {n_incorrect!r}")
    values = [float(c) for c in confidences]
    if any(v != v or v in (float("inf"), float("-inf")) for v in values):
        raise ValueError("confidences must be finite numbers")
    targets = list(range(len(values))) if target_ids is None else list(target_ids)
    if len(targets) != len(values):
        raise ValueError(f"one target id per guess: {len(values)} guesses, {len(targets)} target ids")
    guessed = len(set(targets))
    total = guessed if n_targets is None else n_targets
    if isinstance(total, bool) or not isinstance(total, int) or total < max(guessed, 1):
        raise ValueError(
            f"n_targets must be an int >= 1 and >= the {guessed} distinct targets guessed, got {total!r} "
            "(with no guesses, give n_targets)"
        )
    # Most confident first; within a tie, incorrect guesses first (False < True).
    order = sorted(range(len(values)), key=lambda i: (-values[i], bool(correct[i])))
    found: set[Any] = set()
    wrong = 0
    read = 0
    for i in order:
        read += 1
        if correct[i]:
            found.add(targets[i])
        else:
            wrong += 1
            if wrong == n_incorrect:
                break
    return {
        "recall": len(found) / total,
        "n_correct": len(found),
        "n_guesses_read": read,
        "n_incorrect": n_incorrect,
        "n_targets": total,
    }
