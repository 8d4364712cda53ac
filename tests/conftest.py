"""Shared fixtures: the `goldfish train` run the integration examples are compared with (its settings and checks in
tests/integration_reference.py). The tiny models the tests build come from tests/tiny_models.py: plain functions,
because the multi-process tests build them inside spawned workers.

Every test session caches datasets and models in a temporary folder of its own (GOLDFISH_CACHE_DIR, inherited by
the processes the tests start), never in the user's ~/.cache/goldfish."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from integration_reference import SETTINGS

CACHE_VARIABLE = "GOLDFISH_CACHE_DIR"  # goldfish.app.caches.CACHE_VARIABLE (imported only once the session runs)
_SAVED = pytest.StashKey[str | None]()  # the variable's value before the session
_FOLDER = pytest.StashKey[str]()  # the session's cache folder


def pytest_configure(config: pytest.Config) -> None:
    """Point the cache at a fresh folder before any test module imports goldfish (the model cache is read once)."""
    config.stash[_SAVED] = os.environ.get(CACHE_VARIABLE)
    config.stash[_FOLDER] = tempfile.mkdtemp(prefix="goldfish-test-cache-")
    os.environ[CACHE_VARIABLE] = config.stash[_FOLDER]


def pytest_unconfigure(config: pytest.Config) -> None:
    if _FOLDER not in config.stash:
        return
    shutil.rmtree(config.stash[_FOLDER], ignore_errors=True)
    saved = config.stash[_SAVED]
    if saved is None:
        os.environ.pop(CACHE_VARIABLE, None)
    else:
        os.environ[CACHE_VARIABLE] = saved


@pytest.fixture(scope="session")
def goldfish_train_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`goldfish train` with SETTINGS in this process (about 3 s): OUT/metrics.jsonl and OUT/checkpoint."""
    from goldfish.app.cli import main

    out = tmp_path_factory.mktemp("goldfish_train") / "run"
    assert main(["train", "--out", str(out), "--no-progress", "--threads", "1", *SETTINGS]) == 0
    return out


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """The module's tests run torch on one thread (tests/distributed.worker_threads; restored afterwards): tiny models
    run fastest on one, and two OpenMP threads spinning on a busy 2-core machine (tests of other modules in parallel)
    slow them down by 10x or more. Use it with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    from distributed import worker_threads  # here, not at the top: a session of torch-free tests never imports torch

    with worker_threads():
        yield
