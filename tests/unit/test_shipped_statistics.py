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
