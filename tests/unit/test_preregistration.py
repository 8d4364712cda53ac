"""The pre-registered study's configuration cannot drift: the corpus-mechanism preset equals the frozen file committed
before its confirmatory seeds ran (bench/preregistered/corpus_mechanism.json), and its tuning seeds are the file's
exploratory ones, disjoint from the confirmatory ones."""

from __future__ import annotations

import json
from pathlib import Path

from goldfish.app.presets import COMPARE_PRESETS

FROZEN = Path(__file__).resolve().parents[2] / "bench" / "preregistered" / "corpus_mechanism.json"


def test_the_preset_is_the_registered_configuration() -> None:
    registered = json.loads(FROZEN.read_text())
    preset = dict(COMPARE_PRESETS["corpus-mechanism"].settings)
    assert list(preset.pop("seeds")) == registered["confirmatory_seeds"]
    assert [str(s) for s in preset.pop("tuning_seeds")] == list(registered["exploratory_seeds"])
    as_json = json.loads(json.dumps(preset))  # tuples as lists, as the file holds them
    assert as_json == registered["config"]
    assert not set(registered["confirmatory_seeds"]) & {int(s) for s in registered["exploratory_seeds"]}
    assert len(registered["confirmatory_seeds"]) >= 5
