"""`goldfish compare --seeds ... --resume`: the seeds of an interrupted (or earlier) multi-seed comparison that
finished are read back from their folders instead of trained again.

A seed counts as finished when OUT/seed-S/summary.json exists (it is written last, atomically) and its "config"
equals the one this run would write for that seed: the same model, data, masks, training, extraction and
instruments. Its models' per-target rows are read from the row files every evaluation wrote
(OUT/seed-S/<model>/eval/<part>/*.jsonl), and the per-bucket tables and the tests between models are computed again
from them with this version's code, so the seed's report and the combination are those a fresh run would write from
the same rows. Any other seed folder (missing, unfinished or of other settings) is cleared and the seed runs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from data.atomic import json_safe
from eval.files import MEMBERSHIP_FILE, ROW_FILES
from goldfish.app.buckets import bucket_results, bucket_tests_section
from goldfish.app.compare_result import CompareResult
from goldfish.app.config import CompareSpec, MaskSpec
from goldfish.app.results import PARTS


class SeedComparison(Protocol):
    """What a finished seed's reading needs of goldfish.app.compare.Comparison (prepared: its stream built)."""

    out_dir: Path
    spec: CompareSpec
    repeats: dict[str, int] | None
    target_rows: dict[str, list[dict[str, Any]]]


SUMMARY_FILE = "summary.json"


def _as_json(value: Any) -> Any:
    """`value` as summary.json holds it (tuples as lists, infinities as strings), to compare a config with a file's."""
    return json.loads(json.dumps(json_safe(value), default=str))


def finished_summary(folder: Path, config: Mapping[str, Any]) -> CompareResult | None:
    """The seed folder's result when it holds a finished comparison with exactly `config`; None otherwise."""
    path = Path(folder) / SUMMARY_FILE
    if not path.is_file():
        return None
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict) or summary.get("config") != _as_json(config):
        return None
    return CompareResult.from_json(summary)


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def read_finished_seed(comparison: SeedComparison, result: CompareResult) -> CompareResult:
    """Fill a prepared comparison of a finished seed from its folder: every model's target rows from its row files,
    and, with repetition buckets, the per-bucket tables and the tests against the standard model computed again
    from them (the result is updated and returned)."""
    folder, spec = comparison.out_dir, comparison.spec
    repeats = result.repeats
    if repeats is not None and repeats != comparison.repeats:
        raise ValueError(
            f"{folder}: the copies its targets trained differ from what this run's stream gives; run the seed again "
            "(rerun without --resume and with --overwrite)"
        )
    for label in result.headlines:
        evaluation = folder / label / "eval"
        rows = [row for part in PARTS for row in _rows(evaluation / part / ROW_FILES["extraction"])]
        if not rows:
            raise ValueError(
                f"{folder} has a summary but no extraction rows for {label!r} under {evaluation}: the seed folder "
                "is incomplete; run it again (rerun without --resume and with --overwrite)"
            )
        if repeats is None:  # a comparison keeps its targets' rows only with buckets, as a fresh one does
            continue
        comparison.target_rows[label] = rows
        result.buckets = result.buckets or {}
        result.buckets[label] = bucket_results(
            rows,
            repeats,
            spec.extraction,
            prefix_rows=_part_rows(evaluation, "prefix_length"),
            membership_rows=_rows(evaluation / MEMBERSHIP_FILE),
            beam_rows=_part_rows(evaluation, "beam"),
            n_resamples=spec.extraction.bootstrap,
        )
    if repeats is not None:
        standard = MaskSpec(strategy=None).label
        result.bucket_tests = bucket_tests_section(
            comparison.target_rows, repeats, standard, n_resamples=spec.extraction.bootstrap
        )
    return result


def _part_rows(evaluation: Path, instrument: str) -> list[dict[str, Any]]:
    return [row for part in PARTS for row in _rows(evaluation / part / ROW_FILES[instrument])]
