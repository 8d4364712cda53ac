"""Shared fixtures: the `goldfish train` run the integration examples are compared with (its settings and checks in
tests/integration_reference.py). The tiny models the tests build come from tests/tiny_models.py: plain functions,
because the multi-process tests build them inside spawned workers."""

from __future__ import annotations

from pathlib import Path

import pytest
from integration_reference import SETTINGS


@pytest.fixture(scope="session")
def goldfish_train_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`goldfish train` with SETTINGS in this process (about 3 s): OUT/metrics.jsonl and OUT/checkpoint."""
    from goldfish.app.cli import main

    out = tmp_path_factory.mktemp("goldfish_train") / "run"
    assert main(["train", "--out", str(out), "--no-progress", "--threads", "1", *SETTINGS]) == 0
    return out
