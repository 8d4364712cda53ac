"""Atomic writers for result files: a reader never sees a half-written JSON or JSON-lines file."""

from __future__ import annotations

import json
import math
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


def json_safe(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by the string "inf", "-inf" or "nan".

    JSON has no infinity (Python's json would write the invalid token ``Infinity``), yet some results are infinite
    by definition, e.g. the samples needed to extract a suffix sampling can never emit. Strings keep them readable
    by any JSON parser and unmistakable; ``float("inf")`` reads them back.
    """
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {key: json_safe(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(value) for value in obj]
    return obj


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` (non-finite floats as strings, see ``json_safe``)."""
    _write_text_atomic(Path(path), json.dumps(json_safe(obj), indent=2, allow_nan=False) + "\n")


def write_jsonl_atomic(path: str | Path, rows: Iterable[dict[str, Any]]) -> None:
    """Write one compact JSON object per line to ``path`` (non-finite floats as strings, see ``json_safe``)."""
    text = "".join(json.dumps(json_safe(row), allow_nan=False) + "\n" for row in rows)
    _write_text_atomic(Path(path), text)
