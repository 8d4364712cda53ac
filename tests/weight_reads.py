"""Which tensors engine.training.loading reads from safetensors files: for the tests that check a rank reads only its
own stage's (or shard's) tensors."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock


class _SliceLog:
    """A safetensors file as safe_open gives it, logging the names of the tensors sliced from it (the loader reads
    every tensor through get_slice; keys only lists them)."""

    def __init__(self, weights: Any, read: list[str]) -> None:
        self.weights, self.read = weights, read

    def keys(self) -> Any:
        return self.weights.keys()

    def get_slice(self, name: str) -> Any:
        self.read.append(name)
        return self.weights.get_slice(name)


@contextlib.contextmanager
def logged_weight_reads() -> Iterator[list[str]]:
    """Inside: every tensor engine.training.loading slices from a safetensors file is appended, by name, to the
    list this yields."""
    import engine.training.loading as loading

    read: list[str] = []
    opened = loading.safe_open

    @contextlib.contextmanager
    def logged(*args: Any, **kwargs: Any) -> Iterator[_SliceLog]:
        with opened(*args, **kwargs) as weights:
            yield _SliceLog(weights, read)

    with mock.patch.object(loading, "safe_open", logged):
        yield read
