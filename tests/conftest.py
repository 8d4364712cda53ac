"""Shared fixtures: the tiny model builders (tests/tiny_models.py) for single-process tests."""

from __future__ import annotations

from typing import Callable

import pytest
import torch

from tiny_models import tiny_gpt2, tiny_llama


@pytest.fixture
def llama_builder() -> Callable[..., torch.nn.Module]:
    """tiny_llama: call it with the sizes the test needs, e.g. llama_builder(vocab=64, hidden=32, heads=4)."""
    return tiny_llama


@pytest.fixture
def gpt2_builder() -> Callable[..., torch.nn.Module]:
    """tiny_gpt2: call it with the sizes the test needs."""
    return tiny_gpt2
