"""Sharded, atomic checkpoints of a parallelized model and its optimizer; re-sharding; consolidation.

Layout of a checkpoint folder (next to whatever the caller's `save_model` writes there, e.g. an HF model):

    engine_checkpoint.json            written by rank 0: format version, grid, step, the HF config, and for
                                      every state-dict key how its tensor is sharded (see _Entry)
    engine_shards/rank-NNNNN.safetensors
                                      the tensor pieces rank NNNNN owns: "model/<key>" and
                                      "optim/<param name>/<state key>" (AdamW exp_avg, exp_avg_sq, step)
    engine_shards/rank-NNNNN.state.json, .state.safetensors
                                      every rank: its extra_state (e.g. its RNG) and the optimizer's groups
    trainer_state.json, trainer_state.safetensors
                                      rank 0's extra_state (step, schedule, RNG: what the training loop resumes)

A run without a grid (one process) writes the simpler serial layout instead: what `save_model` writes (an
ordinary HF folder) plus trainer_state.json/.safetensors holding extra_state and the optimizer's own state dict.

Nothing in a checkpoint is pickled: tensors are safetensors, everything else JSON (engine/training/state_files.py),
so reading a checkpoint from someone else can never run code. A folder of the older pickle format (trainer_state.pt,
rank-NNNNN.pt) is refused without opening those files.

Every tensor piece is written once: a ParallelLinear weight shard by the rank at data=0 with the same
(x, y, z); a bias shard (replicated over the axis that splits the layer's input) by the rank at index 0 of
that axis and data=0; replicated tensors (norms, embeddings, lm_head, AdamW's step) by rank 0.

Atomicity: everything goes to a staging sibling folder; rank 0 renames it to the target only after
every rank reported its files written, so a crash at any point leaves the previous checkpoint (the
staging folder is never read; the next save removes the staging folders of processes that are gone). A
kill between the two renames that replace an older checkpoint leaves it set aside complete; every reader
renames it back first. Loading at the same grid reads each rank's own pieces; at another grid
(or into a plain serial model) each full tensor is rebuilt from the saved pieces and sharded again, one
tensor at a time. `consolidate_checkpoint` merges the pieces into an ordinary HF checkpoint.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import struct
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

from data.atomic import recover_directory, remove_leftovers, replace_directory, staging_directory, write_text_atomic
from engine.core import comm
from engine.core.grid import AXES, Grid, GridShape
from engine.core.linear import ParallelLinear, mode_axes
from engine.core.vocab_parallel import is_vocab_parallel
from engine.memory.zero import full, like, model_class_name, optimizer_value
from engine.training.state_files import StateFileError, load_state, save_state, state_files

FORMAT = "goldfish-engine-checkpoint"
VERSION = 2  # 1: rank records and trainer state were pickles (never read: unpickling can run code)
METADATA_FILE = "engine_checkpoint.json"
SHARDS_DIR = "engine_shards"
TRAINER_STATE = "trainer_state"  # step, schedule, RNG (and, in the serial layout, the optimizer)
TRAINER_STATE_FILE = f"{TRAINER_STATE}.json"  # with trainer_state.safetensors beside it (state_files)
PICKLED_TRAINER_STATE_FILE = "trainer_state.pt"  # the older pickle format, refused unread

# Files of an HF model folder that consolidation writes itself rather than copying.
_MODEL_FILES = (
    "config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "generation_config.json",
)
# Files of a checkpoint folder that are the engine's own, not part of an HF folder.
_ENGINE_FILES = (METADATA_FILE, f"{TRAINER_STATE}.json", f"{TRAINER_STATE}.safetensors", PICKLED_TRAINER_STATE_FILE)


class CheckpointError(ValueError):
    """A checkpoint that cannot be written or loaded (missing, incomplete, corrupt, or for another model)."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """The folder given is not there, or holds no resumable checkpoint."""


@dataclass(frozen=True)
class _Entry:
    """How one state-dict key is stored.

    kind: "replicated" (one full tensor, written by rank 0), "weight" or "bias" (ParallelLinear pieces),
        "vocab" (a vocabulary-parallel embedding or lm_head: rows split evenly over x*y*z in the group order
        x + X*y + X*Y*z, see engine/core/vocab_parallel.py), or "alias" (the same tensor as key `alias_of`, e.g. a
        tied lm_head; its shape is the full one).
    shape: the tensor's full shape in the SERIAL model (GPT-2 Conv1D weights are (in, out)).
    mode, out_order, layout: the ParallelLinear's mode, output order (None = natural) and serial layout
        ("linear" (out, in) or "conv1d" (in, out)); unused for replicated tensors.
    """

    kind: str
    shape: tuple[int, ...]
    dtype: str
    mode: str = ""
    out_order: tuple[int, ...] | None = None
    layout: str = "linear"
    alias_of: str = ""

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["shape"] = list(self.shape)
        out["out_order"] = None if self.out_order is None else list(self.out_order)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "_Entry":
        order = data.get("out_order")
        return cls(
            kind=data["kind"],
            shape=tuple(data["shape"]),
            dtype=data["dtype"],
            mode=data.get("mode", ""),
            out_order=None if order is None else tuple(order),
            layout=data.get("layout", "linear"),
            alias_of=data.get("alias_of", ""),
        )

    def same_layout(self, other: "_Entry") -> bool:
        return (self.kind, self.shape, self.mode, self.out_order, self.layout) == (
            other.kind,
            other.shape,
            other.mode,
            other.out_order,
            other.layout,
        )


# ----- describing a model -------------------------------------------------------------------------------


def _describe(model: nn.Module) -> tuple[dict[str, _Entry], dict[str, torch.Tensor], dict[str, Any]]:
    """Every state-dict key of `model` with its _Entry, its local tensor, and its ParallelLinear or
    vocabulary-parallel module if any."""
    layers: dict[str, ParallelLinear] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        if isinstance(module, ParallelLinear):
            prefix = f"{name}." if name else ""
            layers[f"{prefix}weight"] = module
            if module.bias is not None:
                layers[f"{prefix}bias"] = module
    vocab: dict[str, Any] = {}  # vocabulary-parallel modules by their weight's key
    for name, module in model.named_modules(remove_duplicate=False):
        if is_vocab_parallel(module):
            vocab[f"{name}.weight" if name else "weight"] = module
    full_shapes = {id(m.weight): (m.full_vocab, *m.weight.shape[1:]) for m in vocab.values()}
    entries: dict[str, _Entry] = {}
    tensors: dict[str, torch.Tensor] = {}
    first_key: dict[int, str] = {}
    for key, tensor in model.state_dict(keep_vars=True).items():
        dtype = str(tensor.dtype).removeprefix("torch.")
        tensors[key] = tensor
        if id(tensor) in first_key:
            shape = full_shapes.get(id(tensor), tuple(tensor.shape))
            entries[key] = _Entry("alias", tuple(shape), dtype, alias_of=first_key[id(tensor)])
            continue
        first_key[id(tensor)] = key
        if key in vocab:
            entries[key] = _Entry("vocab", tuple(full_shapes[id(tensor)]), dtype)
            layers[key] = vocab[key]
            continue
        layer = layers.get(key)
        if layer is None:
            entries[key] = _Entry("replicated", tuple(tensor.shape), dtype)
            continue
        kind = "weight" if key.endswith("weight") else "bias"
        shape = (layer.out_features, layer.in_features) if kind == "weight" else (layer.out_features,)
        if kind == "weight" and layer.serial_layout == "conv1d":
            shape = shape[::-1]
        order = None if layer.out_order is None else tuple(int(i) for i in layer.out_order.tolist())
        entries[key] = _Entry(kind, shape, dtype, layer.mode, order, layer.serial_layout)
    return entries, tensors, layers


def _owner(entry: _Entry, coords: dict[str, int], shape: GridShape) -> int:
    """The rank whose shard file holds the piece that the rank at `coords` keeps of this entry."""
    if entry.kind == "replicated":
        return 0
    owner = {"x": coords["x"], "y": coords["y"], "z": coords["z"], "data": 0}  # also a "vocab" shard's writer
    if entry.kind == "bias":  # replicated over the axis that splits the input: its index 0 writes it
        owner[mode_axes(entry.mode)[0]] = 0
    return shape.rank(owner)


def _param_names(model: nn.Module) -> dict[int, str]:
    return {id(p): name for name, p in model.named_parameters()}


# ----- saving -------------------------------------------------------------------------------------------


def _shard_file(rank: int, suffix: str) -> str:
    return f"{SHARDS_DIR}/rank-{rank:05d}.{suffix}"


def _rank_state(rank: int) -> str:
    """The stem of rank `rank`'s record (extra_state, optimizer groups): STEM.json and STEM.safetensors."""
    return _shard_file(rank, "state")


def _state_file_names(stem: str) -> list[str]:
    return [f"{stem}.json", f"{stem}.safetensors"]


def _all_ok(ok: bool, grid: Grid) -> bool:
    """True when every rank's `ok` is True (a collective over the whole world; free for one rank)."""
    return comm.all_agree(ok, grid.group(*AXES), grid.device)


def _optimizer_layout(
    optimizer: torch.optim.Optimizer | None, model: nn.Module, entries: dict[str, _Entry]
) -> tuple[dict[str, dict[str, str]], list[dict[str, Any]]]:
    """Per parameter name, how each optimizer state value is stored ("like_param" = sharded exactly as the
    parameter, "replicated" = one copy written by rank 0, "value" = a non-tensor kept in the rank's record), and
    the optimizer's groups with parameter names instead of indices."""
    if optimizer is None:
        return {}, []
    names = _param_names(model)
    state_layout: dict[str, dict[str, str]] = {}
    groups = []
    for group in optimizer.param_groups:
        group_names = []
        for param in group["params"]:
            if id(param) not in names:
                raise CheckpointError(
                    "the optimizer holds a parameter that is not part of the model; build the "
                    "optimizer from model.parameters()"
                )
            name = names[id(param)]
            group_names.append(name)
            layout = {}
            for key, value in optimizer.state.get(param, {}).items():
                if isinstance(value, torch.Tensor) and value.shape == param.shape and value.dim() > 0:
                    layout[key] = "like_param"
                elif isinstance(value, torch.Tensor) and (value.dim() == 0 or entries[name].kind == "replicated"):
                    layout[key] = "replicated"  # a scalar (AdamW's step) or the state of a replicated parameter
                elif isinstance(value, torch.Tensor):
                    raise CheckpointError(
                        f"optimizer state {key!r} of {name} has shape {list(value.shape)}, neither "
                        f"the parameter's shard shape {list(param.shape)} nor a scalar: the engine "
                        "cannot shard it (optimizers with per-element state such as AdamW or SGD "
                        "are supported)"
                    )
                else:
                    layout[key] = "value"
            if layout:
                state_layout[name] = layout
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": group_names})
    for name in state_layout:
        if entries[name].kind == "alias":
            raise CheckpointError(f"parameter {name} is an alias of {entries[name].alias_of} in the state dict")
    return state_layout, groups


def _optimizer_class(optimizer: torch.optim.Optimizer) -> str:
    """The optimizer whose state a checkpoint holds; ZeRO-1's ZeroAdamW keeps AdamW's state (checkpoint_class)."""
    return getattr(optimizer, "checkpoint_class", type(optimizer).__name__)


def _has_hf_config(module: nn.Module) -> bool:
    return hasattr(getattr(module, "config", None), "to_json_string")


def _hf_part(model: nn.Module, keys: Iterable[str]) -> tuple[str, nn.Module] | None:
    """The HF model that consolidation can write as an HF folder, with its key prefix: the model itself when it
    has an HF config, else the one child holding an HF config when every saved key lies inside it (a
    LightningModule wrapping an HF model as `self.model`: prefix "model."). None when no such part exists or
    other tensors sit beside it (an HF folder could not hold them, and none may be dropped)."""
    if _has_hf_config(model):
        return "", model
    parts = [(name, child) for name, child in model.named_children() if _has_hf_config(child)]
    if len(parts) != 1:
        return None
    prefix = parts[0][0] + "."
    return (prefix, parts[0][1]) if all(key.startswith(prefix) for key in keys) else None


def _hf_config(module: nn.Module) -> dict[str, Any]:
    data = json.loads(module.config.to_json_string(use_diff=False))
    if not data.get("architectures"):
        data["architectures"] = [model_class_name(module)]
    return data


def _expected_files(entries: dict[str, _Entry], shape: GridShape) -> list[str]:
    files = []
    for rank in range(shape.world_size):
        coords = shape.coords(rank)
        if any(e.kind != "alias" and _owner(e, coords, shape) == rank for e in entries.values()):
            files.append(_shard_file(rank, "safetensors"))
        files.extend(_state_file_names(_rank_state(rank)))
    return files


def _write_own_files(
    staging: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None, grid: Grid, extra_state: dict[str, Any]
) -> dict[str, Any] | None:
    """This rank's shard files, and on rank 0 the trainer state; rank 0 returns the metadata, which it writes
    once every rank has written its files."""
    entries, tensors, layers = _describe(model)
    for key, layer in layers.items():
        if layer.grid.shape != grid.shape:
            raise CheckpointError(
                f"{key} is sharded on grid {layer.grid.shape}, not on the grid {grid.shape} given to save_checkpoint"
            )
    state_layout, groups = _optimizer_layout(optimizer, model, entries)
    owned: dict[str, torch.Tensor] = {}
    values: dict[str, dict[str, Any]] = {}
    # Tensors partitioned over the data axis (ZeRO: DTensors) are gathered whole one at a time with
    # DTensor.full_tensor(), a collective of the data group: every rank takes part in the same order, the
    # owner writes. The files are then those of a run without ZeRO, so any stage and grid reads them.
    for key, entry in entries.items():
        if entry.kind == "alias":
            continue
        value = full(tensors[key].detach())
        if _owner(entry, grid.coords, grid.shape) == grid.rank:
            owned[f"model/{key}"] = value.contiguous().cpu()
    if optimizer is not None:
        params = dict(model.named_parameters())
        for name, layout in state_layout.items():
            param_owner = _owner(entries[name], grid.coords, grid.shape)
            for state_key, how in layout.items():
                value = optimizer.state[params[name]][state_key]
                if how == "value":
                    values.setdefault(name, {})[state_key] = value
                    continue
                value = full(value.detach())
                if (param_owner if how == "like_param" else 0) == grid.rank:
                    owned[f"optim/{name}/{state_key}"] = value.contiguous().cpu()
    (staging / SHARDS_DIR).mkdir(exist_ok=True)
    if owned:
        save_file(
            owned,
            str(staging / _shard_file(grid.rank, "safetensors")),
            metadata={"format": "pt", "rank": str(grid.rank)},
        )
    _save_state(
        staging / _rank_state(grid.rank),
        {"extra_state": extra_state, "optimizer_groups": groups, "optimizer_values": values},
    )
    if grid.rank != 0:
        return None
    _save_state(staging / TRAINER_STATE, extra_state)
    hf_part = _hf_part(model, entries)
    return {
        "format": FORMAT,
        "version": VERSION,
        "grid": asdict(grid.shape),
        "step": extra_state.get("step"),
        "model_class": model_class_name(model),
        "hf_config": None if hf_part is None else _hf_config(hf_part[1]),
        "hf_prefix": None if hf_part is None else hf_part[0],
        "tensors": {key: entry.to_json() for key, entry in entries.items()},
        "optimizer": None if optimizer is None else {"class": _optimizer_class(optimizer), "state": state_layout},
        "files": _expected_files(entries, grid.shape),
    }


def save_checkpoint(
    directory: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    grid: Grid | None,
    *,
    extra_state: dict[str, Any] | None = None,
    save_model: Callable[[nn.Module, Path], None] | None = None,
) -> Path:
    """Write a checkpoint of `model` and `optimizer` to `directory`, atomically.

    grid None (one process, plain model): the serial layout, i.e. `save_model`'s files plus trainer_state.json and
    .safetensors with extra_state and the optimizer's state dict. With a grid: the sharded layout; collective,
    every rank of the grid calls it with the same directory, and the filesystem must be shared by all ranks.

    save_model(model, folder) runs on EVERY rank with the staging folder (it may run collectives, e.g.
    engine.full_state_dict; typically rank 0 then writes an ordinary HF model there). extra_state is each
    rank's own small state (step, scheduler, RNG; none by default) made of tensors, numbers, strings, None and
    lists, tuples or dicts of them (it is stored as JSON plus safetensors, never pickled); rank 0's also goes to
    trainer_state.json and load_checkpoint returns it. An existing checkpoint at `directory` is replaced only
    once the new one is complete; staging folders that killed saves left beside it are removed. Returns
    `directory`. Raises CheckpointError on every rank when any rank fails to write its files (a full disk, a
    read-only folder: one line saying what to free or fix; the previous checkpoint stays intact).
    """
    directory = Path(directory)
    extra_state = {} if extra_state is None else extra_state
    if "step" in extra_state and not isinstance(extra_state["step"], int):
        raise CheckpointError(f"extra_state['step'] must be an int, got {extra_state['step']!r}")
    if grid is None:
        return _save_serial(directory, model, optimizer, extra_state, save_model)
    staging_name: str | None = None
    if grid.rank == 0:
        try:
            staging_name = str(_new_staging(directory))
        except OSError as error:
            staging_name = f"error: {_write_error(error, directory)}"
    staging_name = comm.broadcast_object(staging_name, grid.group(*AXES), grid.device)
    if staging_name is None or staging_name.startswith("error: "):
        reason = str(staging_name).removeprefix("error: ")
        raise CheckpointError(f"rank 0 could not create a staging folder next to {directory}: {reason}")
    staging = Path(staging_name)

    failure: BaseException | None = None
    metadata = None
    try:
        if save_model is not None:
            save_model(model, staging)
        metadata = _write_own_files(staging, model, optimizer, grid, extra_state)
    except Exception as error:  # noqa: BLE001 - every rank must learn that the save failed, then it re-raises
        failure = _write_error(error, directory)
    if not _all_ok(failure is None, grid):
        if grid.rank == 0:  # every rank has stopped writing into it
            shutil.rmtree(staging, ignore_errors=True)
        if failure is not None:
            raise failure
        raise CheckpointError(
            f"another rank failed while writing the checkpoint {directory}; the previous checkpoint (if any) is intact"
        )

    published: BaseException | None = None
    if grid.rank == 0:
        try:
            assert metadata is not None
            missing = [f for f in metadata["files"] if not (staging / f).exists()]
            if missing:
                raise CheckpointError(
                    f"rank 0 does not see the shard files {missing[:4]} that other ranks wrote into {staging}: the "
                    "checkpoint directory must be on a filesystem shared by all ranks (e.g. the cluster's shared "
                    "disk, not a node-local /tmp)"
                )
            # written last: a folder without it is no checkpoint, so a staging folder never loads
            write_text_atomic(staging / METADATA_FILE, json.dumps(metadata, indent=1))
            replace_directory(staging, directory)
        except Exception as error:  # noqa: BLE001
            published = _write_error(error, directory)
            if not directory.exists():  # cut off between the two renames: the previous checkpoint goes back
                recover_directory(directory)
            shutil.rmtree(staging, ignore_errors=True)
    if not _all_ok(published is None, grid):
        if published is not None:
            raise published
        raise CheckpointError(f"rank 0 could not publish the checkpoint {directory}")
    return directory


def _save_serial(
    directory: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    extra_state: dict[str, Any],
    save_model: Callable[[nn.Module, Path], None] | None,
) -> Path:
    """The serial layout: save_model's files and trainer_state.json/.safetensors (extra_state + the optimizer's
    state dict), published by replace_directory so a crash leaves either the previous checkpoint or the new one."""
    staging: Path | None = None
    try:
        staging = _new_staging(directory)
        if save_model is not None:
            save_model(model, staging)
        state = dict(extra_state)
        if optimizer is not None:
            state["optimizer"] = optimizer.state_dict()
        _save_state(staging / TRAINER_STATE, state)
        return replace_directory(staging, directory)
    except BaseException as error:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if not directory.exists():  # cut off between the two renames: the previous checkpoint goes back
            recover_directory(directory)
        failure = _write_error(error, directory)
        if failure is not error:
            raise failure from None
        raise


def _new_staging(directory: Path) -> Path:
    """A fresh staging folder for `directory`, after removing those that killed saves left beside it."""
    remove_leftovers(directory)
    return staging_directory(directory)


def _save_state(stem: Path, state: dict[str, Any]) -> None:
    try:
        save_state(stem, state, name="extra_state" if stem.name == TRAINER_STATE else "the rank's checkpoint record")
    except StateFileError as error:
        raise CheckpointError(str(error)) from None


# What to free or fix when a write fails, by errno (the rest: the system's own words).
_WRITE_FIXES = {
    errno.ENOSPC: "free disk space there",
    errno.EDQUOT: "free space within your disk quota there",
    errno.EFBIG: "raise the file size limit (ulimit -f) or write the checkpoint elsewhere",
    errno.EROFS: "write the checkpoint to a writable filesystem",
    errno.EACCES: "make the folder writable for this user or write the checkpoint elsewhere",
    errno.EPERM: "make the folder writable for this user or write the checkpoint elsewhere",
}


def _write_error(error: BaseException, directory: Path) -> BaseException:
    """A failed write (an OSError, or safetensors' error for one: "I/O error: ... (os error N)") as one line: what
    failed, what to free or fix, and that the previous checkpoint is intact. Any other error comes back as it is."""
    code, filename = None, None
    if isinstance(error, OSError):
        code, filename = error.errno, error.filename
    elif isinstance(error, SafetensorError):
        found = re.search(r"os error (\d+)", str(error))
        code = int(found.group(1)) if found else None
    if code is None:
        return error
    fix = _WRITE_FIXES.get(code, "check the disk and the folder's permissions there")
    return CheckpointError(
        f"cannot write the checkpoint {directory}: {os.strerror(code)} (errno {code}"
        + (f", {filename}" if filename else "")
        + f"). Fix: {fix} ({directory.parent}); the previous checkpoint there (if any) is intact"
    )


# ----- reading ------------------------------------------------------------------------------------------


def read_trainer_state(directory: str | Path) -> dict[str, Any]:
    """The trainer state of a checkpoint folder (either layout): rank 0's extra_state, and in the serial layout
    the optimizer state dict under "optimizer". Reads JSON and safetensors only."""
    directory = Path(directory)
    recover_directory(directory)  # a save killed between its two renames set the complete checkpoint aside
    if not directory.is_dir():
        raise CheckpointNotFoundError(
            f"checkpoint {directory} does not exist (no {TRAINER_STATE_FILE} to resume "
            "from); give the checkpoint folder a training run wrote (OUT/checkpoint)"
        )
    if not (directory / TRAINER_STATE_FILE).exists():
        _refuse_pickled(directory, PICKLED_TRAINER_STATE_FILE)
        raise CheckpointNotFoundError(
            f"{directory} is not a resumable checkpoint: {TRAINER_STATE_FILE} is missing "
            "(give the checkpoint/ folder that a training run wrote)"
        )
    return _read_state(directory / TRAINER_STATE)


def _refuse_pickled(directory: Path, name: str) -> None:
    """Refuse a checkpoint of the older pickle format, without opening the pickle."""
    if (directory / name).exists():
        raise CheckpointError(
            f"{directory / name} is a pickle (the older checkpoint format), which can run code when read; it is "
            f"never opened. Fix: train again from the start (the model weights of that folder still load as an "
            "HF model: they are safetensors)"
        )


def is_engine_checkpoint(directory: str | Path) -> bool:
    """True when `directory` holds a sharded engine checkpoint (its metadata file)."""
    return (Path(directory) / METADATA_FILE).is_file()


def _read_metadata(directory: Path) -> dict[str, Any]:
    recover_directory(directory)  # a save killed between its two renames set the complete checkpoint aside
    if not directory.is_dir():
        raise CheckpointError(
            f"checkpoint {directory} does not exist; give the checkpoint folder a training run wrote (OUT/checkpoint)"
        )
    path = directory / METADATA_FILE
    if not path.is_file():
        raise CheckpointError(
            f"{directory} is not a sharded engine checkpoint: {METADATA_FILE} is missing (an "
            "unfinished save leaves only a hidden .partial folder; give the last complete "
            "checkpoint folder)"
        )
    try:
        metadata = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{path} is corrupt ({error}); restore the checkpoint from a copy") from None
    if metadata.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an engine checkpoint (format {metadata.get('format')!r})")
    if metadata.get("version") == 1:
        raise CheckpointError(
            f"{path} is a version 1 engine checkpoint, whose per-rank records are pickles (they can run code "
            "when read, so they are never opened). Fix: train again from the start"
        )
    if metadata.get("version") != VERSION:
        raise CheckpointError(
            f"{path} has format version {metadata.get('version')}, this engine reads version "
            f"{VERSION}; load it with the engine release that wrote it"
        )
    missing = [f for f in metadata["files"] if not (directory / f).is_file()]
    if missing:
        raise CheckpointError(
            f"checkpoint {directory} is incomplete: {', '.join(missing[:4])} missing; restore "
            "the missing shard files or use an earlier checkpoint"
        )
    for name in metadata["files"]:
        if name.endswith(".safetensors"):
            check_safetensors(directory / name, "restore the shard file or use an earlier checkpoint")
    return metadata


class _Shards:
    """Lazy reader of a checkpoint's safetensors shard files (opened once each)."""

    def __init__(self, directory: Path, shape: GridShape, stack: ExitStack) -> None:
        self.directory, self.shape, self.stack = directory, shape, stack
        self.handles: dict[int, Any] = {}

    def get(self, rank: int, key: str) -> torch.Tensor:
        path = self.directory / _shard_file(rank, "safetensors")
        try:
            if rank not in self.handles:
                self.handles[rank] = self.stack.enter_context(safe_open(str(path), framework="pt"))
            return self.handles[rank].get_tensor(key)
        except (SafetensorError, OSError) as error:
            raise CheckpointError(
                f"cannot read tensor {key} from {path}: {error}; the shard file is corrupt or "
                "incomplete, restore it or use an earlier checkpoint"
            ) from None

    def full(self, entry: _Entry, key: str) -> torch.Tensor:
        """The full tensor of `key` (a "model/..." or "optim/..." name) in the serial model's layout."""
        if entry.kind == "replicated":
            return self.get(0, key)
        if entry.kind == "vocab":
            return self._full_vocab(entry, key)
        in_axis, out_axis = mode_axes(entry.mode)
        n_in, n_out, n_z = self.shape.size(in_axis), self.shape.size(out_axis), self.shape.z
        natural_shape = entry.shape[::-1] if entry.kind == "weight" and entry.layout == "conv1d" else entry.shape
        rows = natural_shape[0] // (n_out * n_z)
        cols = natural_shape[1] // n_in if entry.kind == "weight" else 0
        stored = None
        for a in range(n_in if entry.kind == "weight" else 1):
            for b in range(n_out):
                for z in range(n_z):
                    piece = self.get(self.shape.rank({in_axis: a, out_axis: b, "z": z}), key)
                    expected = (rows, cols) if entry.kind == "weight" else (rows,)
                    if tuple(piece.shape) != expected:
                        raise CheckpointError(
                            f"{key} in the shard of {in_axis}={a}, {out_axis}={b}, z={z} has shape "
                            f"{list(piece.shape)}, the metadata implies {list(expected)}; the "
                            "checkpoint is corrupt"
                        )
                    if stored is None:
                        stored = piece.new_empty(natural_shape)
                    block = b * n_z + z
                    if entry.kind == "weight":
                        stored[block * rows : (block + 1) * rows, a * cols : (a + 1) * cols] = piece
                    else:
                        stored[block * rows : (block + 1) * rows] = piece
        assert stored is not None
        natural = stored
        if entry.out_order is not None:  # stored[i] = natural[out_order[i]]
            natural = torch.empty_like(stored)
            natural[torch.tensor(entry.out_order)] = stored
        if entry.kind == "weight" and entry.layout == "conv1d":
            natural = natural.t().contiguous()
        return natural

    def _full_vocab(self, entry: _Entry, key: str) -> torch.Tensor:
        """Rows of a vocabulary-parallel tensor, concatenated in x*y*z group order (x fastest)."""
        shape = self.shape
        parts = shape.x * shape.y * shape.z
        pieces = []
        for z in range(shape.z):
            for y in range(shape.y):
                for x in range(shape.x):
                    piece = self.get(shape.rank({"x": x, "y": y, "z": z}), key)
                    expected = (entry.shape[0] // parts, *entry.shape[1:])
                    if tuple(piece.shape) != expected:
                        raise CheckpointError(
                            f"{key} in the shard of x={x}, y={y}, z={z} has shape "
                            f"{list(piece.shape)}, the metadata implies {list(expected)}; the "
                            "checkpoint is corrupt"
                        )
                    pieces.append(piece)
        return torch.cat(pieces, 0)


def _local_piece(full: torch.Tensor, entry: _Entry, layer: Any) -> torch.Tensor:
    """This rank's piece of a serial-layout full tensor for the current model's entry (`layer`: its
    ParallelLinear or vocabulary-parallel module, None for a replicated tensor)."""
    if entry.kind == "replicated" or layer is None:
        return full
    if entry.kind == "vocab":
        return layer.shard_rows(full).contiguous()
    if entry.kind == "weight":
        return layer.shard_weight(full.t() if entry.layout == "conv1d" else full).contiguous()
    return layer.shard_bias(full).contiguous()


def _check_compatible(saved: dict[str, _Entry], current: dict[str, _Entry], directory: Path) -> None:
    missing = sorted(set(current) - set(saved))
    unexpected = sorted(set(saved) - set(current))
    mismatched = [
        f"{k}: checkpoint {list(saved[k].shape)} vs model {list(current[k].shape)}"
        for k in current
        if k in saved and saved[k].shape != current[k].shape
    ]
    if missing or unexpected or mismatched:
        parts = []
        if missing:
            parts.append(f"missing keys {missing[:5]}")
        if unexpected:
            parts.append(f"unexpected keys {unexpected[:5]}")
        if mismatched:
            parts.append("different shapes " + "; ".join(mismatched[:5]))
        raise CheckpointError(
            f"checkpoint {directory} was written for another model ({', '.join(parts)}); build "
            "the model from the same config as the run that wrote it"
        )


@torch.no_grad()
def load_checkpoint(
    directory: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, grid: Grid | None = None
) -> dict[str, Any]:
    """Load a checkpoint written by save_checkpoint into `model` (and `optimizer`) in place; return extra_state.

    model: built and parallelized for `grid` (any grid: the saved shards are re-sharded when it differs from
        the saving grid), or a plain serial model with grid=None. No communication: every rank reads the
        files it needs (at the same grid its own pieces; otherwise it rebuilds each full tensor, one at a
        time, and keeps its piece).
    optimizer: built over model.parameters() with the same parameter groups as when saving; receives the
        saved state (AdamW exp_avg, exp_avg_sq, step, and the group settings such as the current lr).
    Returns this rank's own extra_state when the grid is the saving grid, else rank 0's (as in
    trainer_state.json). Raises CheckpointError for a missing, incomplete or corrupt checkpoint and for
    another model's (checked before anything is loaded; a shard found corrupt while loading can leave the
    model partly loaded: build it again before retrying).
    """
    directory = Path(directory)
    metadata = _read_metadata(directory)
    saved_shape = GridShape(**metadata["grid"])
    saved = {key: _Entry.from_json(data) for key, data in metadata["tensors"].items()}
    current, tensors, layers = _describe(model)
    _check_compatible(saved, current, directory)
    same_grid = grid is not None and grid.shape == saved_shape
    rank = grid.rank if same_grid else 0

    with ExitStack() as stack:
        shards = _Shards(directory, saved_shape, stack)

        def local(key: str, stored_key: str, replicated: bool = False) -> torch.Tensor:
            """This rank's piece of stored tensor `stored_key`, sharded like state-dict key `key` (or, with
            `replicated`, the one full copy rank 0 wrote, e.g. AdamW's step)."""
            entry, mine = saved[key], current[key]
            if entry.kind == "alias":  # tied in the saving model: stored under the first key
                entry = saved[entry.alias_of]
            if replicated:
                return shards.get(0, stored_key)
            if same_grid and entry.same_layout(mine):
                return shards.get(_owner(entry, grid.coords, saved_shape), stored_key)
            return _local_piece(shards.full(entry, stored_key), mine, layers.get(key))

        for key, target in tensors.items():
            if current[key].kind == "alias":
                continue
            value = local(key, f"model/{saved[key].alias_of or key}")
            if value.shape != target.shape:
                raise CheckpointError(
                    f"{key}: the piece read has shape {list(value.shape)}, the model expects "
                    f"{list(target.shape)}; the checkpoint is inconsistent with its metadata"
                )
            target.copy_(like(target, value))  # a ZeRO DTensor keeps its data-axis chunk
        if optimizer is not None:
            _load_optimizer(directory, metadata, optimizer, model, local, rank)
    return _read_rank_record(directory, rank)["extra_state"]


@torch.no_grad()
def load_serial_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a SERIAL model's optimizer state dict (full tensors, e.g. a single-process run's checkpoint) into
    the optimizer of the parallelized `model`: each rank keeps its shard of every per-element state.

    The optimizer must be built over the parallelized model's parameters in the serial model's order
    (engine.training.train.make_optimizer does so: parallelize keeps the parameter order). No communication.
    """
    entries, _, layers = _describe(model)
    names = _param_names(model)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if len(state.get("param_groups", [])) != len(optimizer.param_groups):
        raise CheckpointError(
            f"the optimizer has {len(optimizer.param_groups)} parameter groups, the saved state "
            f"{len(state.get('param_groups', []))}; build the optimizer as the run that wrote it did"
        )
    local: dict[int, dict[str, Any]] = {}
    for index, param_state in state["state"].items():
        if not 0 <= int(index) < len(params):
            raise CheckpointError(
                f"the saved optimizer state has parameter index {index}, the optimizer only "
                f"{len(params)} parameters; build the optimizer as the run that wrote it did"
            )
        name = names[id(params[int(index)])]
        entry = entries[name]
        local[int(index)] = {}
        for key, value in param_state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                if tuple(value.shape) != entry.shape:
                    raise CheckpointError(
                        f"optimizer state {key!r} of {name} has shape {list(value.shape)}, the "
                        f"model's parameter {list(entry.shape)}; the state belongs to another model"
                    )
                value = optimizer_value(model, params[int(index)], _local_piece(value, entry, layers.get(name)))
            local[int(index)][key] = value
    optimizer.load_state_dict({"state": local, "param_groups": state["param_groups"]})


def _read_state(stem: Path) -> Any:
    """A state file pair of a checkpoint (state_files: JSON + safetensors, never a pickle)."""
    try:
        return load_state(stem)
    except FileNotFoundError:
        raise CheckpointError(f"{state_files(stem)[0]} is missing; the checkpoint is incomplete") from None
    except StateFileError as error:
        raise CheckpointError(f"{error}; restore the checkpoint from a copy or use an earlier one") from None


def _read_rank_record(directory: Path, rank: int) -> dict[str, Any]:
    return _read_state(directory / _rank_state(rank))


def _load_optimizer(
    directory: Path,
    metadata: dict[str, Any],
    optimizer: torch.optim.Optimizer,
    model: nn.Module,
    local: Callable[..., torch.Tensor],
    rank: int,
) -> None:
    saved = metadata.get("optimizer")
    if saved is None:
        raise CheckpointError(f"checkpoint {directory} holds no optimizer state; load it with optimizer=None")
    if saved["class"] != _optimizer_class(optimizer):
        raise CheckpointError(f"checkpoint {directory} holds {saved['class']} state, not {_optimizer_class(optimizer)}")
    record = _read_rank_record(directory, rank)
    saved_groups, values = record["optimizer_groups"], record["optimizer_values"]
    names = _param_names(model)
    params = dict(model.named_parameters())
    groups, state = [], {}
    if len(saved_groups) != len(optimizer.param_groups):
        raise CheckpointError(
            f"the optimizer has {len(optimizer.param_groups)} parameter groups, the checkpoint "
            f"{len(saved_groups)}; build the optimizer as the run that wrote it did"
        )
    index = 0
    for number, (group, saved_group) in enumerate(zip(optimizer.param_groups, saved_groups)):
        group_names = [names.get(id(p)) for p in group["params"]]
        if group_names != saved_group["params"]:
            raise CheckpointError(
                f"parameter group {number} of the optimizer holds other parameters than the "
                "checkpoint's; build the optimizer as the run that wrote it did"
            )
        ids = []
        for name in group_names:
            layout = saved["state"].get(name, {})
            param_state: dict[str, Any] = {}
            for state_key, how in layout.items():
                if how == "value":
                    param_state[state_key] = values[name][state_key]
                elif how == "like_param":
                    param_state[state_key] = optimizer_value(
                        model, params[name], local(name, f"optim/{name}/{state_key}")
                    )
                else:
                    param_state[state_key] = local(name, f"optim/{name}/{state_key}", replicated=True)
            if param_state:
                state[index] = param_state
            ids.append(index)
            index += 1
        groups.append({**{k: v for k, v in saved_group.items() if k != "params"}, "params": ids})
    optimizer.load_state_dict({"state": state, "param_groups": groups})


# ----- consolidation ------------------------------------------------------------------------------------


def consolidate_checkpoint(directory: str | Path, out_dir: str | Path) -> Path:
    """Merge a sharded checkpoint into an ordinary HF checkpoint folder and return it.

    Writes out_dir/model.safetensors (full tensors, the serial model's key names and layouts, tied keys
    included) and, when the saved model had an HF config, out_dir/config.json, so that
    transformers.AutoModelForCausalLM.from_pretrained(out_dir) loads it without the engine. Other files of
    the checkpoint folder that are not model weights (tokenizer files, run records) are copied. Runs in a
    single process without torch.distributed; holds the full model in memory once.
    """
    directory, out_dir = Path(directory), Path(out_dir)
    metadata = _read_metadata(directory)
    if out_dir.resolve() == directory.resolve():
        raise CheckpointError("consolidate_checkpoint needs an out_dir other than the checkpoint folder")
    shape = GridShape(**metadata["grid"])
    entries = {key: _Entry.from_json(data) for key, data in metadata["tensors"].items()}
    state: dict[str, torch.Tensor] = {}
    with ExitStack() as stack:
        shards = _Shards(directory, shape, stack)
        for key, entry in entries.items():  # an alias comes after the key it repeats
            if entry.kind == "alias":  # tied weights: safetensors wants a copy of its own (from_pretrained re-ties)
                state[key] = state[entry.alias_of].clone()
            else:
                state[key] = shards.full(entry, f"model/{key}")
    # A wrapper's HF model (a LightningModule's `self.model`) is written under the HF model's own key names;
    # the save recorded the prefix only when every tensor lies inside it.
    prefix = metadata.get("hf_prefix") or ""
    state = {key[len(prefix) :]: value for key, value in state.items()}
    staging = staging_directory(out_dir)
    for item in directory.iterdir():
        if item.is_file() and item.name not in _MODEL_FILES and item.name not in _ENGINE_FILES:
            shutil.copy2(item, staging / item.name)
    save_file(
        {k: v.contiguous() for k, v in state.items()}, str(staging / "model.safetensors"), metadata={"format": "pt"}
    )
    config = metadata.get("hf_config")
    if config is not None:
        write_text_atomic(staging / "config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")
    elif (directory / "config.json").is_file():
        shutil.copy2(directory / "config.json", staging / "config.json")
    return replace_directory(staging, out_dir)


# ----- integrity of safetensors files -------------------------------------------------------------------------------
# A safetensors file is an 8-byte little-endian header length N, an N-byte JSON header that gives every tensor's
# [start, end) byte range in the data that follows, then the data. A file cut short by an interrupted copy or download
# fails deep inside a loader with a SafetensorError traceback; reading the header alone (no tensor data) tells a
# truncated file from a good one and lets the caller say which file and what to do.

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
            raise CheckpointError(
                f"{path} is truncated or not a safetensors file ({size} bytes, header claims {n} bytes). Fix: {fix}."
            )
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
        raise CheckpointError(
            f"{path} is truncated: {size} bytes, its header describes {expected} bytes "
            f"({expected - size} missing). Fix: {fix}."
        )


def check_model_folder(folder: str | Path, fix: str = "copy the file again, or re-save the model") -> None:
    """`check_safetensors` on every *.safetensors file directly in `folder` (sorted; none is fine) but the trainer
    state of a checkpoint, which loading the model does not read."""
    for path in sorted(Path(folder).glob("*.safetensors")):
        if path.name != f"{TRAINER_STATE}.safetensors":
            check_safetensors(path, fix)
