"""Where goldfish caches what it builds once: tokenized datasets and models converted from GGUF files.

The cache folder is `--cache-dir`, else the environment variable GOLDFISH_CACHE_DIR, else ~/.cache/goldfish; the
dataset cache is its datasets/ folder (keyed by content, data.corpus), the model cache its models/ folder.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_VARIABLE = "GOLDFISH_CACHE_DIR"
DEFAULT_CACHE_ROOT = Path.home() / ".cache" / "goldfish"


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """goldfish's cache folder: `cache_dir` (--cache-dir), else $GOLDFISH_CACHE_DIR, else ~/.cache/goldfish."""
    return Path(cache_dir or os.environ.get(CACHE_VARIABLE) or DEFAULT_CACHE_ROOT).expanduser()


def dataset_cache(cache_dir: str | os.PathLike | None = None) -> Path:
    """The dataset cache, the datasets/ folder of `cache_root(cache_dir)` (created when first written). Raises
    ValueError when the cache folder, or its datasets/, is a file."""
    root = cache_root(cache_dir)
    for folder in (root, root / "datasets"):
        if folder.exists() and not folder.is_dir():
            raise ValueError(
                f"the cache folder {root}: {folder} is a file, not a folder. Fix: give --cache-dir (or "
                f"${CACHE_VARIABLE}) a folder, created if missing"
            )
    return root / "datasets"
