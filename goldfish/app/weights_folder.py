"""Where a model's weights sit as a local folder of safetensors files, so that the ranks of a parallel run read only
their own parts of them (engine.load_sharded: their tensor shards, a pipe rank its own stages) instead of each
building the whole model first.

A local folder is used as it is. A GGUF file (or alias) is exported once to an HF folder under the model cache, by
rank 0 alone (the whole model is built on that rank, that one time). A hub name is its snapshot in the HF cache,
holding only what sharded loading reads (config, generation config, safetensors weights and their index); rank 0
downloads it while the others wait, then they find it cached (or download it themselves on a node with another
cache). The tokenizer is loaded by name as before."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from engine import GRID_AXES, Grid, ShardedRunError, broadcast_object, can_load_sharded
from goldfish.app.pretrained import DEFAULT_MODEL_CACHE, export_gguf_once, resolve_gguf

T = TypeVar("T")

# What engine.load_sharded reads of a model folder; the hub's other files (pickled weights, ONNX or GGUF copies in
# subfolders, README) are not downloaded. "model*.safetensors" keeps to the top level: "*" would match "onnx/...".
HUB_PATTERNS = ("config.json", "generation_config.json", "model*.safetensors", "model.safetensors.index.json")


def rank0_first(grid: Grid | None, load: Callable[[], T | None]) -> T | None:
    """`load()` on rank 0, then on the other ranks (which find what rank 0 cached), so that one rank downloads or
    converts while the others wait; rank 0's error on every rank. When rank 0's `load()` gives None every rank gives
    None without loading, so the ranks agree; a rank whose own `load()` then gives None raises ShardedRunError."""
    if grid is None or grid.is_trivial:
        return load()
    value, failure = None, None
    if grid.rank == 0:
        try:
            value = load()
        except Exception as error:  # noqa: BLE001 - sent to every rank below, then raised
            failure = f"{type(error).__name__}: {error}"
    failure, found = broadcast_object((failure, value is not None), grid.group(*GRID_AXES), grid.device)
    if failure is not None:
        raise ShardedRunError(f"loading the model failed on rank 0: {failure}")
    if grid.rank == 0 or not found:
        return value
    value = load()
    if value is None:
        raise ShardedRunError(f"rank {grid.rank} cannot find the model files rank 0 found (a node without that cache?)")
    return value


def local_weights_folder(name: str, grid: Grid | None, *, cache_dir: Path = DEFAULT_MODEL_CACHE) -> Path | None:
    """The local folder of safetensors weights that holds model `name` (a folder, a GGUF file or alias, or a hub
    name), made on rank 0 first where it has to be (a GGUF export, a hub download); None when there is none: a folder
    or hub repository of pickled weights only, or a hub name not found (offline and not cached, unknown, private),
    which the whole-model load then reports in its own words. Collective when `grid` has more than one rank."""
    if resolve_gguf(name) is not None:
        return rank0_first(grid, lambda: export_gguf_once(name, cache_dir))
    folder = Path(name).expanduser()
    if folder.exists():
        return folder if can_load_sharded(folder) else None
    if not _is_repo_id(name):
        return None
    return rank0_first(grid, lambda: _hub_snapshot(name))


def _is_repo_id(name: str) -> bool:
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def _hub_snapshot(name: str) -> Path | None:
    """The HF cache's snapshot of hub model `name` with HUB_PATTERNS' files (downloaded if missing, read from the
    cache offline); None when the hub cannot give one or it holds no safetensors weights."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(name, allow_patterns=list(HUB_PATTERNS)))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError):
        return None  # the whole-model load tries again and says why, as it does without a grid
    return folder if can_load_sharded(folder) else None
