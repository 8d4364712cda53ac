"""Every summary.json shipped under bench/results reads into its typed result, writes back byte for byte and renders
its report.md, whatever version wrote it (the oldest lack the paired tests and the pooled cluster statistics: their
reports say so). Markdown only, no plots and no training: cheap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data.atomic import json_safe
from goldfish.app.compare_result import CompareResult
from goldfish.app.report import render_markdown
from goldfish.app.report_buckets import BUCKETS_FILE, K_SWEEP_FILE
from goldfish.app.report_seeds import render_seeds_markdown, seeds_k_sweep_series
from goldfish.app.seeds_result import SeedsResult

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
SHIPPED = sorted(RESULTS.glob("**/summary.json"))
IDS = [str(path.parent.relative_to(RESULTS)) for path in SHIPPED]
# Written before the paired tests and the pooled cluster statistics (the first corpus study and its k=8 rerun).
OLDER = {"compare_corpus", "compare_corpus_k8"}


def _typed(summary: dict) -> CompareResult | SeedsResult:
    return SeedsResult.from_json(summary) if "seeds" in summary else CompareResult.from_json(summary)


def test_every_study_ships_its_summaries() -> None:
    assert len(SHIPPED) >= 18 and {Path(i).parts[0] for i in IDS} >= OLDER


@pytest.mark.parametrize("path", SHIPPED, ids=IDS)
def test_a_shipped_summary_writes_back_byte_for_byte(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    typed = _typed(json.loads(text))
    # as the report writers write summary.json (goldfish.app.report, goldfish.app.report_seeds)
    assert json.dumps(json_safe(typed.to_json()), indent=2, default=str, allow_nan=False) == text


@pytest.mark.parametrize("path", SHIPPED, ids=IDS)
def test_a_shipped_summary_renders(path: Path) -> None:
    typed = _typed(json.loads(path.read_text(encoding="utf-8")))
    older = Path(path.parent.relative_to(RESULTS)).parts[0] in OLDER
    if isinstance(typed, SeedsResult):
        markdown = render_seeds_markdown(typed, [BUCKETS_FILE, K_SWEEP_FILE])
        seeds_k_sweep_series(typed)
        assert markdown.startswith("# goldfish compare over seeds")
        assert ("written before the pooled cluster statistics" in markdown) == older
        for label, model in typed.combined.items():
            assert (f"**{label}**" in markdown) == bool(model.buckets)
    else:
        markdown = render_markdown(typed)
        assert markdown.startswith("# goldfish compare")
        for label in typed.headlines:
            assert f"| {label} |" in markdown
        if typed.bucket_tests is not None:
            assert ("written before the paired tests" in markdown) == older
            assert ("Against standard, paired over the same targets" in markdown) != older
