"""The pre-registered study's configuration cannot drift: the corpus-mechanism preset equals the frozen file committed
before its confirmatory seeds ran (bench/preregistered/corpus_mechanism.json), and its tuning seeds are the file's
exploratory ones, disjoint from the confirmatory ones."""

from __future__ import annotations

import json
from pathlib import Path

from goldfish.app.commands.compare import option_values
from goldfish.app.config import CompareSpec
from goldfish.app.presets import preset_spec

FROZEN = Path(__file__).resolve().parents[2] / "bench" / "preregistered" / "corpus_mechanism.json"


def test_the_preset_is_the_registered_configuration() -> None:
    registered = json.loads(FROZEN.read_text())
    preset = option_values(preset_spec("corpus-mechanism"))  # every option's value, by dest
    assert list(preset.pop("seeds")) == registered["confirmatory_seeds"]
    assert [str(s) for s in preset.pop("tuning_seeds")] == list(registered["exploratory_seeds"])
    defaults = option_values(CompareSpec())
    del defaults["seeds"], defaults["tuning_seeds"]
    as_json = json.loads(json.dumps(preset))  # tuples as lists, as the file holds them
    assert as_json == json.loads(json.dumps(defaults | registered["config"]))  # the file's values, defaults elsewhere
    assert not set(registered["confirmatory_seeds"]) & {int(s) for s in registered["exploratory_seeds"]}
    assert len(registered["confirmatory_seeds"]) >= 5
