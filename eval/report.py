"""Atomic writers for result files: a reader never sees a half-written JSON or JSON-lines file."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable


def _write_text_atomic(path: Path, text: str) -> None:
    # The temporary file lives in the target folder so os.replace is a same-filesystem rename.
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` (NaN/inf rejected: they are not valid JSON)."""
    _write_text_atomic(Path(path), json.dumps(obj, indent=2, allow_nan=False) + "\n")


def write_jsonl_atomic(path: str | Path, rows: Iterable[dict[str, Any]]) -> None:
    """Write one compact JSON object per line to ``path``."""
    text = "".join(json.dumps(row, allow_nan=False) + "\n" for row in rows)
    _write_text_atomic(Path(path), text)
