"""docs/cli.md documents exactly the fields of metrics.jsonl: those a real one-process `goldfish train` writes on every
step, and the conditional ones (parallel runs, --background) that the training loop writes under its conditions."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EVERY_STEP = "every step"


def documented_fields() -> dict[str, str]:
    """{field: when} from the table under docs/cli.md's `### metrics.jsonl` heading."""
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    section = text.split("### metrics.jsonl", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \|", section, flags=re.MULTILINE)
    assert rows, "docs/cli.md has no metrics.jsonl table"
    return {name: when.strip() for name, when in rows}


def test_docs_list_exactly_the_fields_of_a_real_metrics_file(goldfish_train_reference: Path) -> None:
    lines = (goldfish_train_reference / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    written = [set(json.loads(line)) for line in lines if line]
    assert written and all(keys == written[0] for keys in written)  # every step has the same fields
    documented = documented_fields()
    every_step = {name for name, when in documented.items() if when == EVERY_STEP}
    assert every_step == written[0], f"undocumented: {written[0] - every_step}; not written: {every_step - written[0]}"
    # The conditional fields are written by the training loop under their condition (a grid, a validation set).
    loop = (ROOT / "engine" / "training" / "train.py").read_text(encoding="utf-8")
    for name in set(documented) - every_step:
        assert f'record["{name}"]' in loop, f"docs/cli.md documents {name}, which the training loop never writes"
