"""The table `goldfish compare` prints at the end has the README's quick-start table's columns and its numbers."""

from __future__ import annotations

import json
import re
from pathlib import Path

from eval.metrics import EXACT_MATCH, ROUGE_L
from goldfish.app.compare_result import CompareResult
from goldfish.app.compare_table import format_table

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "bench" / "results" / "compare_quickstart_masks" / "summary.json"


def _readme_table() -> list[list[str]]:
    """The README's first markdown table whose header starts with `model`: its header and rows, cells stripped."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| model |"))
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        if not line.startswith("|---"):
            table.append([cell.strip() for cell in line.strip("|").split("|")])
    return table


def test_the_printed_header_is_the_readmes() -> None:
    printed = format_table(CompareResult.from_json(json.loads(SHIPPED.read_text()))).splitlines()[0]
    assert re.split(r" {2,}", printed.strip()) == _readme_table()[0]


def test_the_printed_kept_and_dropped_accuracy_are_the_readmes() -> None:
    """The README's rows are the shipped compare_quickstart_masks run; its TF accuracy column is the printed one."""
    printed = format_table(CompareResult.from_json(json.loads(SHIPPED.read_text()))).splitlines()[2:]
    column = _readme_table()[0].index("TF accuracy kept / dropped")
    readme = [row[column] for row in _readme_table()[1:]]
    assert [re.split(r" {2,}", line.strip())[column] for line in printed] == readme


def test_a_summary_without_teacher_forced_accuracy_prints_n_a() -> None:
    part = {EXACT_MATCH: 1.0, ROUGE_L: 0.5}
    row = format_table(CompareResult(models={}, headlines={"standard": {"train": part, "heldout": part}})).splitlines()[
        2
    ]
    assert re.split(r" {2,}", row) == ["standard", "1.000", "0.500", "1.000", "0.500", "n/a / n/a", "n/a"]
