"""Cheap integrity check of safetensors files before anything loads them.

A safetensors file is an 8-byte little-endian header length N, an N-byte JSON header that gives every
tensor's [start, end) byte range in the data that follows, then the data. A file cut short by an
interrupted copy or download still opens in some readers and fails deep inside a loader with a
SafetensorError traceback; reading the header alone (no tensor data) tells a truncated file from a good
one and lets the caller say which file and what to do.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from engine.checkpoint import CheckpointError

_MAX_HEADER = 100 * 1024 * 1024  # safetensors itself refuses headers above 100 MB


def check_safetensors(path: str | Path, fix: str = "copy the file again, or re-save the model") -> None:
    """Raise CheckpointError (one line: the file, what is wrong, `fix`) unless `path` is a complete safetensors
    file: a readable header whose tensors' byte ranges end exactly at the end of the file."""
    path = Path(path)
    size = path.stat().st_size
    with path.open("rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path} is truncated ({size} bytes, not even a safetensors header). Fix: {fix}.")
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER or 8 + n > size:
            raise CheckpointError(f"{path} is truncated or not a safetensors file ({size} bytes, header claims "
                                  f"{n} bytes). Fix: {fix}.")
        try:
            header = json.loads(handle.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise CheckpointError(f"{path} has a corrupt safetensors header. Fix: {fix}.") from None
    try:
        data_end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (AttributeError, KeyError, IndexError, TypeError, ValueError):
        raise CheckpointError(f"{path} has a corrupt safetensors header (bad tensor entries). Fix: {fix}.") from None
    expected = 8 + n + data_end
    if size < expected:
        raise CheckpointError(f"{path} is truncated: {size} bytes, its header describes {expected} bytes "
                              f"({expected - size} missing). Fix: {fix}.")


def check_model_folder(folder: str | Path, fix: str = "copy the file again, or re-save the model") -> None:
    """`check_safetensors` on every *.safetensors file directly in `folder` (sorted; none is fine)."""
    for path in sorted(Path(folder).glob("*.safetensors")):
        check_safetensors(path, fix)
