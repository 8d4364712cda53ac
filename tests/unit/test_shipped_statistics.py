"""The shipped study results (bench/results/*): where a comparison ships its per-target rows (targets.jsonl), the
paired and clustered statistics its summary.json and report.md give are recomputed from those rows with scipy and
statsmodels (tests/statistics_recompute.py). A result folder without rows (shipped before they were written) has
nothing to check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from statistics_recompute import check_one_seed, check_seeds

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
SHIPPED = sorted(path.parent for path in RESULTS.glob("**/targets.jsonl") if (path.parent / "summary.json").is_file())


@pytest.mark.parametrize("folder", SHIPPED, ids=[str(f.relative_to(RESULTS)) for f in SHIPPED])
def test_shipped_rows_give_the_shipped_statistics(folder: Path) -> None:
    several_seeds = "seeds" in json.loads((folder / "summary.json").read_text())  # a --seeds combination
    assert (check_seeds if several_seeds else check_one_seed)(folder) > 0


def test_the_registered_decision_rule_from_the_mechanism_rows() -> None:
    """bench/preregistered/corpus_mechanism.json's rule, recomputed from the shipped per-target rows alone (scipy's
    exact binomial intervals, a brute-force sign flip): at the top bucket the standard and random-mask models'
    conservative exact lower bounds lie above goldfish's upper bound, and each differs from goldfish over targets."""
    from itertools import product

    from scipy.stats import binomtest

    folder = RESULTS / "compare_corpus_mechanism"
    rows = [json.loads(line) for line in (folder / "targets.jsonl").read_text().splitlines() if line]
    registered = json.loads((RESULTS.parent / "preregistered" / "corpus_mechanism.json").read_text())
    assert sorted({r["seed"] for r in rows}) == registered["confirmatory_seeds"]
    top = max(registered["config"]["repeats"])

    def per_target(model: str) -> dict[str, int]:  # target -> seeds under which it is extracted
        out: dict[str, int] = {}
        for r in rows:
            if r["model"] == model and r["bucket"] == top:
                out[r["id"]] = out.get(r["id"], 0) + int(r["exact_match"])
        return out

    seeds = len(registered["confirmatory_seeds"])
    goldfish = per_target("goldfish-hashed-k4-h13")
    n = len(goldfish)
    upper = binomtest(sum(v > 0 for v in goldfish.values()), n).proportion_ci(method="exact").high
    for model in ("standard", "goldfish-random-k4"):
        counts = per_target(model)
        lower = binomtest(sum(v == seeds for v in counts.values()), n).proportion_ci(method="exact").low
        assert lower > upper, model
        differences = [counts[t] - goldfish[t] for t in sorted(goldfish)]
        observed = abs(sum(differences))
        flips = [abs(sum(s * d for s, d in zip(signs, differences))) for signs in product((1, -1), repeat=n)]
        p = sum(f >= observed for f in flips) / len(flips)
        assert p < 0.05, (model, p)
