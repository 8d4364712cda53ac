"""Atomic checkpoints of a model and its optimizer; on a grid through torch.distributed.checkpoint (DCP), which
reshards them to any other grid or ZeRO stage; consolidation into an HF folder.

A checkpoint folder written on a grid holds, beside what the caller's `save_model` writes there (an HF model):

    engine_checkpoint.json       written last, by rank 0: format version, grid, step, HF config, every state-dict
                                 key's full shape, dtype and tied keys, the optimizer's class and state kinds
    engine_shards/               a DCP checkpoint (.metadata, __R_N.distcp) of "model/<key>" and
                                 "optim/<param>/<state key>", each a FULL tensor in the serial model's layout
                                 (GPT-2 Conv1D weights (in, out)); and every rank's record rank-NNNNN.state.json +
                                 .safetensors (its extra_state, the optimizer's groups and non-tensor values)
    trainer_state.json/.safetensors   rank 0's extra_state (step, schedule, RNG: what the training loop resumes)

Every rank hands DCP the chunks it holds of each full tensor (`_Chunks`, which speaks the protocol DTensor
implements), placed by the model's layout (engine/models/layout.py) and, for a ZeRO DTensor, its data-axis chunk;
DCP's planner writes a chunk several ranks hold once and reads at load whatever overlaps each rank's chunks. A run
without a grid writes the serial layout: `save_model`'s files plus trainer_state.json/.safetensors with extra_state
and the optimizer's state dict.

Nothing is unpickled as code: JSON and safetensors (engine/training/state_files.py), DCP's tensor records through
torch.load(weights_only=True) (as DCP's FileSystemReader reads them), and DCP's .metadata, a plain pickle that DCP
itself opens with pickle.load, through `_MetadataUnpickler`, which resolves DCP's metadata classes and a few torch
types only and refuses any other name before anything is built.

Atomicity: everything goes to a staging sibling folder, which rank 0 renames into place inside DCP's finish step
(`_Writer.finish`), which DCP runs only once every rank's write has returned, an asynchronous one (`AsyncSaver`) too.
A crash before leaves the previous checkpoint (a staging folder has no engine_checkpoint.json and never loads; the
next save removes those of processes that are gone); a kill between the two renames leaves the old one set aside
complete, and every reader renames it back first.
"""

from __future__ import annotations

import errno
import io
import json
import os
import pickle
import re
import shutil
import struct
import warnings
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed.checkpoint as dcp
from safetensors import SafetensorError
from safetensors.torch import save_file
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

from data.atomic import recover_directory, remove_leftovers, replace_directory, staging_directory, write_text_atomic
from engine.core import comm
from engine.core.grid import GRID_AXES, Grid
from engine.core.placement import local_shard
from engine.memory.zero import is_dtensor, model_class_name, optimizer_value
from engine.models.layout import ParamLayout, Piece, plan_of, tied_keys
from engine.training.state_files import StateFileError, load_state, save_state, state_files

FORMAT = "goldfish-engine-checkpoint"
VERSION = 3  # 2: the engine's own per-rank safetensors; 1: pickled rank records (neither is read)
METADATA_FILE = "engine_checkpoint.json"
SHARDS_DIR = "engine_shards"
TRAINER_STATE = "trainer_state"  # step, schedule, RNG (and, in the serial layout, the optimizer)
TRAINER_STATE_FILE = f"{TRAINER_STATE}.json"  # with trainer_state.safetensors beside it (state_files)
PICKLED_TRAINER_STATE_FILE = "trainer_state.pt"  # the older pickle format, refused unread
# Files of an HF model folder that consolidation writes itself rather than copying, and the engine's own files.
_MODEL_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
_MODEL_FILES += ("pytorch_model.bin.index.json", "generation_config.json")
_ENGINE_FILES = (METADATA_FILE, f"{TRAINER_STATE}.json", f"{TRAINER_STATE}.safetensors", PICKLED_TRAINER_STATE_FILE)


class CheckpointError(ValueError):
    """A checkpoint that cannot be written or loaded (missing, incomplete, corrupt, or for another model)."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """The folder given is not there, or holds no resumable checkpoint."""


# ----- a rank's chunks of the full tensors, as DCP asks for them --------------------------------------------------


def serial_shape(p: ParamLayout) -> tuple[int, ...]:
    """The full shape of `p` in the serial model (GPT-2 Conv1D weights are (in, out))."""
    return tuple(reversed(p.full_shape)) if p.serial_transposed else tuple(p.full_shape)


def serial_chunks(p: ParamLayout, rows: range | None = None) -> list[Piece]:
    """This rank's pieces of `p` in the serial full tensor (its offsets and sizes transposed where the serial model
    stores the transpose); `rows`: the local rows held (a ZeRO chunk, whose row 0 is local row rows.start)."""
    start = 0 if rows is None else rows.start
    out = []
    for piece in p.pieces(rows):
        local = piece.local
        if start and local:
            local = (slice(local[0].start - start, local[0].stop - start), *local[1:])
        offsets, sizes = tuple(piece.offsets), tuple(piece.sizes)
        if p.serial_transposed:
            offsets, sizes = offsets[::-1], sizes[::-1]
        out.append(Piece(local, offsets, sizes, p.serial_transposed))
    return out


class _Chunks:
    """One DCP state-dict entry: the chunks of a full tensor this rank holds. It speaks the protocol DCP's planners
    ask of a DTensor (__create_write_items__, __create_chunk_list__, __get_tensor_shard__)."""

    def __init__(self, held: torch.Tensor, full_shape: tuple[int, ...], chunks: list[Piece]) -> None:
        self.held, self.full_shape, self.chunks = held, torch.Size(full_shape), chunks

    def size(self) -> torch.Size:
        return self.full_shape

    def __create_write_items__(self, fqn: str, obj: Any) -> list[WriteItem]:
        properties = TensorProperties.create_from_tensor(self.held)
        return [
            WriteItem(
                MetadataIndex(fqn, chunk.offsets),
                WriteItemType.SHARD,
                tensor_data=TensorWriteData(chunk, properties, self.full_shape),
            )
            for chunk in self.__create_chunk_list__()
        ]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return [ChunkStorageMetadata(torch.Size(c.offsets), torch.Size(c.sizes)) for c in self.chunks]

    def __get_tensor_shard__(self, index: MetadataIndex) -> torch.Tensor:
        return next(c.of(self.held) for c in self.chunks if torch.Size(c.offsets) == index.offset)

    def staged(self) -> "_Chunks":
        """The same chunks over a CPU copy of the held tensor: what an asynchronous save writes."""
        return _Chunks(self.held.to("cpu", copy=True), tuple(self.full_shape), self.chunks)


def _entry(p: ParamLayout | None, tensor: torch.Tensor) -> _Chunks:
    """The DCP entry of `tensor`, laid out as `p` (None: whole on every rank). A ZeRO DTensor holds the rows of the
    tensor-parallel local tensor that DTensor's own chunk arithmetic gives it."""
    held, rows = local_shard(tensor.detach()), None  # a placed DTensor: its local shard, a view of its storage
    if is_dtensor(held):  # FSDP2's Shard(0) over the data mesh, torch.chunk's split: ceil(n / D) rows per rank
        if held.device_mesh.ndim != 1 or not held.placements[0].is_shard(0):
            raise CheckpointError(f"unexpected ZeRO placement {held.placements} of a {tuple(held.shape)} tensor")
        per_rank = -(-held.shape[0] // held.device_mesh.size()) if held.dim() else 0
        start = held.device_mesh.get_local_rank() * per_rank
        held = held.to_local()
        rows = range(start, start + held.shape[0]) if held.dim() else None
    if p is None:
        shape = tuple(held.shape)
        return _Chunks(held, shape, [Piece(tuple(slice(0, n) for n in shape), (0,) * len(shape), shape)])
    return _Chunks(held, serial_shape(p), serial_chunks(p, rows))


class _SavePlanner(dcp.DefaultSavePlanner):
    """DCP's default planner (its dedup of chunks several ranks hold included) on a flat state dict of `_Chunks`."""

    def __init__(self) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)

    def lookup_object(self, index: MetadataIndex) -> Any:
        return self.state_dict[index.fqn].__get_tensor_shard__(index)


class _LoadPlanner(dcp.DefaultLoadPlanner):
    """DCP's default planner on a flat state dict of `_Chunks` (its set-up, which materialises meta tensors, would
    drop them: nothing to do here)."""

    def __init__(self) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)

    def set_up_planner(self, state_dict: dict, metadata: Metadata | None = None, is_coordinator: bool = False) -> None:
        self.original_state_dict = self.state_dict = state_dict
        self.metadata, self.is_coordinator = metadata, is_coordinator

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        return self.state_dict[index.fqn].__get_tensor_shard__(index)

    def load_bytes(self, read_item: Any, value: Any) -> None:
        # DCP's default unpickles the bytes (torch.load(weights_only=False)); a checkpoint of ours holds none
        raise CheckpointError(f"the checkpoint holds a non-tensor entry {read_item.dest_index.fqn!r}; it is not ours")


# ----- what a checkpoint holds --------------------------------------------------------------------------------


def _tensors(model: nn.Module, grid: Grid | None) -> dict[str, tuple[ParamLayout | None, torch.Tensor, list[str]]]:
    """Every distinct state-dict tensor by its first key: its layout on `grid` (None without one), the tensor and its
    other (tied) keys."""
    if grid is not None:
        return {key: (p, p.local, list(p.aliases)) for key, p in plan_of(model, grid).params.items()}
    tensors = model.state_dict(keep_vars=True)
    return {key: (None, tensors[key], ties) for key, ties in tied_keys(tensors).items()}


def _model_entries(tensors: dict[str, tuple[ParamLayout | None, torch.Tensor, list[str]]]) -> dict[str, _Chunks]:
    """The DCP entries ("model/<key>") of the tensors this rank holds: all of them, but on a pipe grid the other
    stages' parameters, which sit on the meta device (engine/training/pipeline.py)."""
    return {f"model/{key}": _entry(p, tensor) for key, (p, tensor, _) in tensors.items() if not tensor.is_meta}


def _described(tensors: dict[str, tuple[ParamLayout | None, torch.Tensor, list[str]]]) -> dict[str, dict]:
    """What the manifest records of each tensor: its serial full shape, dtype and tied keys."""
    return {
        key: {
            "shape": list(tensor.shape if p is None else serial_shape(p)),
            "dtype": str(tensor.dtype).removeprefix("torch."),
            "aliases": aliases,
        }
        for key, (p, tensor, aliases) in tensors.items()
    }


def _param_names(model: nn.Module) -> dict[int, str]:
    return {id(p): name for name, p in model.named_parameters()}


def _optimizer_class(optimizer: torch.optim.Optimizer) -> str:
    """The optimizer whose state a checkpoint holds; ZeRO-1's ZeroAdamW keeps AdamW's state (checkpoint_class)."""
    return getattr(optimizer, "checkpoint_class", type(optimizer).__name__)


def _optimizer_entries(
    optimizer: torch.optim.Optimizer, model: nn.Module, layouts: dict[str, ParamLayout | None]
) -> tuple[dict[str, _Chunks], list[dict[str, Any]]]:
    """The optimizer's DCP entries ("optim/<name>/<key>": its tensor states, as _state_kinds classifies them) and
    the groups with parameter names instead of indices."""
    names = _param_names(model)
    entries: dict[str, _Chunks] = {}
    groups = []
    for group in optimizer.param_groups:
        if any(id(param) not in names or names[id(param)] not in layouts for param in group["params"]):
            raise CheckpointError(
                "the optimizer holds a parameter that is not part of the model, or a tied one; "
                "build the optimizer from model.parameters()"
            )
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": []})
        for param in group["params"]:
            name = names[id(param)]
            groups[-1]["params"].append(name)
            for key, value in optimizer.state.get(param, {}).items():
                if not isinstance(value, torch.Tensor):
                    continue  # a "value", kept in the rank's record
                if value.dim() and value.shape != param.shape:
                    raise CheckpointError(
                        f"optimizer state {key!r} of {name} has shape {list(value.shape)}, neither the parameter's "
                        f"{list(param.shape)} nor a scalar: the engine cannot shard it (optimizers with per-element "
                        "state such as AdamW or SGD are supported)"
                    )
                entries[f"optim/{name}/{key}"] = _entry(layouts[name] if value.dim() else None, value)
    return entries, groups


def _state_kinds(optimizer: torch.optim.Optimizer, model: nn.Module) -> tuple[dict, dict]:
    """How this rank's optimizer keeps each state value, by parameter name ("like_param": laid out as its
    parameter; "scalar": one copy, e.g. AdamW's step; "value": a non-tensor, in the rank's record), and its
    non-tensor values, in the order of the optimizer's groups."""
    names = _param_names(model)
    kinds: dict[str, dict[str, str]] = {}
    values: dict[str, dict[str, Any]] = {}
    for param in (param for group in optimizer.param_groups for param in group["params"]):
        name = names.get(id(param))
        for key, value in optimizer.state.get(param, {}).items() if name is not None else ():
            if isinstance(value, torch.Tensor):
                kinds.setdefault(name, {})[key] = "like_param" if value.dim() else "scalar"
            else:
                kinds.setdefault(name, {})[key] = "value"
                values.setdefault(name, {})[key] = value
    return kinds, values


def _merged(per_rank: list[tuple[dict, dict]]) -> tuple[dict, dict]:
    """Every rank's (kinds, values) of _state_kinds, merged by parameter name."""
    kinds: dict[str, dict[str, str]] = {}
    values: dict[str, dict[str, Any]] = {}
    for rank_kinds, rank_values in per_rank:
        for name, kind in rank_kinds.items():
            kinds.setdefault(name, {}).update(kind)
        for name, value in rank_values.items():
            values.setdefault(name, {}).update(value)
    return kinds, values


def _hf_part(model: nn.Module, keys: list[str]) -> tuple[str, nn.Module] | None:
    """The HF model that consolidation can write as an HF folder, with its key prefix: the model itself when it
    has an HF config, else the one child holding an HF config when every saved key lies inside it (a
    LightningModule wrapping an HF model as `self.model`: prefix "model."). None when no such part exists or
    other tensors sit beside it (an HF folder could not hold them, and none may be dropped)."""

    def has_config(module: nn.Module) -> bool:
        return hasattr(getattr(module, "config", None), "to_json_string")

    if has_config(model):
        return "", model
    parts = [(name + ".", child) for name, child in model.named_children() if has_config(child)]
    return parts[0] if len(parts) == 1 and all(k.startswith(parts[0][0]) for k in keys) else None


def _hf_config(module: nn.Module) -> dict[str, Any]:
    data = json.loads(module.config.to_json_string(use_diff=False))
    data["architectures"] = data.get("architectures") or [model_class_name(module)]
    return data


# ----- saving -------------------------------------------------------------------------------------------


def _rank_state(rank: int) -> str:
    """The stem of rank `rank`'s record: STEM.json and STEM.safetensors."""
    return f"{SHARDS_DIR}/rank-{rank:05d}.state"


class _Writer(dcp.FileSystemWriter):
    """DCP's FileSystemWriter into the staging folder's engine_shards/. Its finish step, which DCP runs on rank 0
    once every rank's write has returned, writes the manifest and publishes the staging folder."""

    def __init__(self, staging: Path, directory: Path, manifest: dict[str, Any] | None) -> None:
        super().__init__(staging / SHARDS_DIR)
        self.staging, self.directory, self.manifest = staging, directory, manifest

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """dcp.async_save's staging step: the entries are CPU copies already (`_Chunks.staged`)."""
        self.per_thread_copy_ahead = 0
        return state_dict

    def write_data(self, plan: Any, planner: Any) -> Any:
        try:
            return super().write_data(plan, planner)
        except RuntimeError as error:  # torch.save's writer reports a failed write without its errno
            raise _os_cause(sorted(Path(self.path).glob(f"{plan.storage_data.prefix}*.distcp"))) or error

    def finish(self, metadata: Metadata, results: list) -> None:
        super().finish(metadata, results)
        assert self.manifest is not None  # DCP's coordinator is rank 0, which has the manifest
        missing = [f for f in self.manifest["files"] if not (self.staging / f).exists()]
        if missing:
            raise CheckpointError(
                f"rank 0 does not see the files {missing[:4]} that other ranks wrote into {self.staging}: the "
                "checkpoint directory must be on a filesystem shared by all ranks (e.g. the cluster's shared "
                "disk, not a node-local /tmp)"
            )
        # written last: a folder without it is no checkpoint, so a staging folder never loads
        write_text_atomic(self.staging / METADATA_FILE, json.dumps(self.manifest, indent=1))
        try:
            replace_directory(self.staging, self.directory)
        except BaseException:
            if not self.directory.exists():  # cut off between the two renames: the previous checkpoint goes back
                recover_directory(self.directory)
            raise


def _os_cause(files: list[Path]) -> OSError | None:
    """Why writing `files` failed, as the system says it: one more byte appended to each (they are discarded with
    the failed save) raises the OSError (EFBIG, ENOSPC, ...) that torch.save's writer reported without its errno."""
    for file in files:
        try:
            with open(file, "ab") as handle:
                handle.write(b"\0")
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as error:
            return error
    return None


@dataclass
class _Prepared:
    """A save whose staging folder holds everything but DCP's files: the entries DCP writes and its writer."""

    directory: Path
    staging: Path
    entries: dict[str, _Chunks]
    writer: _Writer


def _prepare(
    directory: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    grid: Grid,
    extra_state: dict[str, Any] | None,
    save_model: Callable[[nn.Module, Path], None] | None,
) -> _Prepared:
    """Collective: a staging folder (made by rank 0) holding save_model's files and every rank's record."""
    extra_state = _checked_extra_state(extra_state)
    world = grid.group(*GRID_AXES)
    staging_name: str | None = None
    if grid.rank == 0:
        try:
            staging_name = str(_new_staging(directory))
        except OSError as error:
            staging_name = f"error: {_write_error(error, directory)}"
    staging_name = comm.broadcast_object(staging_name, world, grid.device)
    if staging_name is None or staging_name.startswith("error: "):
        reason = str(staging_name).removeprefix("error: ")
        raise CheckpointError(f"rank 0 could not create a staging folder next to {directory}: {reason}")
    staging = Path(staging_name)
    kinds, values = _state_kinds(optimizer, model) if optimizer is not None else ({}, {})
    if optimizer is not None and grid.shape.pipe > 1:
        # a stage's ranks hold the optimizer state of its parameters only; gathered before anything below can fail
        # on one rank alone (every rank reaches this collective)
        kinds, values = _merged(comm.all_gather_objects((kinds, values), world))
    failure: BaseException | None = None
    try:
        if save_model is not None:
            save_model(model, staging)
        tensors = _tensors(model, grid)
        entries = _model_entries(tensors)  # a pipeline's rank: its own stages' tensors (their owners write them)
        layouts = {key: p for key, (p, _, _) in tensors.items()}
        optim, groups = _optimizer_entries(optimizer, model, layouts) if optimizer else ({}, [])
        record = {"extra_state": extra_state, "optimizer_groups": groups, "optimizer_values": values}
        _save_state(staging / _rank_state(grid.rank), record)
        manifest = None
        if grid.rank == 0:
            _save_state(staging / TRAINER_STATE, extra_state)
            hf_part = _hf_part(model, list(tensors))
            manifest = {
                "format": FORMAT,
                "version": VERSION,
                "grid": asdict(grid.shape),
                "step": extra_state.get("step"),
                "model_class": model_class_name(model),
                "hf_config": None if hf_part is None else _hf_config(hf_part[1]),
                "hf_prefix": None if hf_part is None else hf_part[0],
                "tensors": _described(tensors),
                "optimizer": None if optimizer is None else {"class": _optimizer_class(optimizer), "state": kinds},
                "files": [
                    f"{_rank_state(r)}.{ext}" for r in range(grid.shape.world_size) for ext in ("json", "safetensors")
                ],
            }
    except Exception as error:  # noqa: BLE001 - every rank must learn that the save failed, then it re-raises
        failure = _write_error(error, directory)
    if not comm.all_agree(failure is None, world, grid.device):
        if grid.rank == 0:  # every rank has stopped writing into it
            shutil.rmtree(staging, ignore_errors=True)
        raise failure or CheckpointError(
            f"another rank failed while writing the checkpoint {directory}; the previous checkpoint (if any) is intact"
        )
    return _Prepared(directory, staging, {**entries, **optim}, _Writer(staging, directory, manifest))


def _failed(error: CheckpointException, prepared: _Prepared, rank: int) -> CheckpointError:
    """DCP's report of a failed write or publication as one line on every rank (this rank's own error, else that
    another rank failed); rank 0 removes the staging folder."""
    if rank == 0:
        shutil.rmtree(prepared.staging, ignore_errors=True)
    if rank in error.failures:
        own = error.failures[rank][0]
        converted = _write_error(own, prepared.directory)
        return (
            converted
            if isinstance(converted, CheckpointError)
            else CheckpointError(f"cannot write the checkpoint {prepared.directory}: {own}")
        )
    return CheckpointError(
        f"another rank failed while writing the checkpoint {prepared.directory}; the previous checkpoint (if any) "
        "is intact"
    )


def save_checkpoint(
    directory: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    grid: Grid | None,
    *,
    extra_state: dict[str, Any] | None = None,
    save_model: Callable[[nn.Module, Path], None] | None = None,
) -> Path:
    """Write a checkpoint of `model` and `optimizer` to `directory`, atomically, and return `directory`.

    grid None (one process, plain model): the serial layout, i.e. `save_model`'s files plus trainer_state.json and
    .safetensors with extra_state and the optimizer's state dict. With a grid: a DCP checkpoint; collective, every
    rank of the grid calls it with the same directory, and the filesystem must be shared by all ranks.

    save_model(model, folder) runs on EVERY rank with the staging folder (it may run collectives, e.g.
    engine.full_state_dict; typically rank 0 then writes an ordinary HF model there). extra_state is each
    rank's own small state (step, scheduler, RNG; none by default) made of tensors, numbers, strings, None and
    lists, tuples or dicts of them (it is stored as JSON plus safetensors, never pickled); rank 0's also goes to
    trainer_state.json and load_checkpoint returns it. An existing checkpoint at `directory` is replaced only
    once the new one is complete; staging folders that killed saves left beside it are removed. Raises
    CheckpointError on every rank when any rank fails to write its files (a full disk, a read-only folder: one
    line saying what to free or fix; the previous checkpoint stays intact).
    """
    directory = Path(directory)
    if grid is None:
        return _save_serial(directory, model, optimizer, _checked_extra_state(extra_state), save_model)
    prepared = _prepare(directory, model, optimizer, grid, extra_state, save_model)
    try:
        dcp.save(
            prepared.entries,
            storage_writer=prepared.writer,
            planner=_SavePlanner(),
            process_group=grid.group(*GRID_AXES).group,
            no_dist=grid.shape.world_size == 1,
        )
    except CheckpointException as error:
        raise _failed(error, prepared, grid.rank) from None
    return directory


class AsyncSaver:
    """Checkpoints of a run on a grid written in the background (dcp.async_save). `save` returns once save_model's
    files and the ranks' records are written and the chunks copied to CPU memory; DCP writes the tensors, and rank
    0 publishes the folder, while training goes on. The next `save` and `close` wait for the previous one and raise
    its failure, on every rank.

    Collective: every rank of `grid` builds one (its collectives run on the grid's background group, which must not
    interleave with the training's) and calls `close` before the run ends."""

    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        self.group = grid.background_group()
        self.pending: tuple[Future, _Prepared] | None = None

    def save(
        self,
        directory: str | Path,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        *,
        extra_state: dict[str, Any] | None = None,
        save_model: Callable[[nn.Module, Path], None] | None = None,
    ) -> None:
        """Start a checkpoint of `model` and `optimizer` into `directory` (as save_checkpoint writes it)."""
        self.wait()
        prepared = _prepare(Path(directory), model, optimizer, self.grid, extra_state, save_model)
        staged = {key: entry.staged() for key, entry in prepared.entries.items()}
        future = dcp.async_save(
            staged,
            storage_writer=prepared.writer,
            planner=_SavePlanner(),
            process_group=self.group,
            no_dist=self.group is None,
        )
        self.pending = (future, prepared)

    def wait(self) -> None:
        """Block until the checkpoint in flight (if any) is written and published; CheckpointError if it failed."""
        if self.pending is not None:
            (future, prepared), self.pending = self.pending, None
            try:
                future.result()
            except CheckpointException as error:
                raise _failed(error, prepared, self.grid.rank) from None

    def close(self) -> None:
        """Wait for the checkpoint in flight (the background group is the grid's: Grid.close releases it)."""
        self.wait()


def _checked_extra_state(extra_state: dict[str, Any] | None) -> dict[str, Any]:
    extra_state = {} if extra_state is None else extra_state
    if "step" in extra_state and not isinstance(extra_state["step"], int):
        raise CheckpointError(f"extra_state['step'] must be an int, got {extra_state['step']!r}")
    return extra_state


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
        if (directory / PICKLED_TRAINER_STATE_FILE).exists():  # the older pickle format: never opened
            raise CheckpointError(
                f"{directory / PICKLED_TRAINER_STATE_FILE} is a pickle (the older checkpoint format), which can run "
                "code when read; it is never opened. Fix: train again from the start (the model weights of that "
                "folder still load as an HF model: they are safetensors)"
            )
        raise CheckpointNotFoundError(
            f"{directory} is not a resumable checkpoint: {TRAINER_STATE_FILE} is missing "
            "(give the checkpoint/ folder that a training run wrote)"
        )
    return _read_state(directory / TRAINER_STATE)


def is_engine_checkpoint(directory: str | Path) -> bool:
    """True when `directory` holds a checkpoint written on a grid (its manifest)."""
    return (Path(directory) / METADATA_FILE).is_file()


def _read_state(stem: Path) -> Any:
    """A state file pair of a checkpoint (state_files: JSON + safetensors, never a pickle)."""
    try:
        return load_state(stem)
    except FileNotFoundError:
        raise CheckpointError(f"{state_files(stem)[0]} is missing; the checkpoint is incomplete") from None
    except StateFileError as error:
        raise CheckpointError(f"{error}; restore the checkpoint from a copy or use an earlier one") from None


class _MetadataUnpickler(pickle.Unpickler):
    """Reads DCP's .metadata, a pickle of its metadata dataclasses, resolving only the names such a file holds: DCP's
    metadata classes, torch.Size, dtypes, layouts, memory formats and paths. Any other name (builtins.exec,
    os.system, a class of some module) is refused before anything is called, so the file can hold data only."""

    _METADATA_CLASSES = ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata")
    _METADATA_CLASSES += ("TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")
    _ALLOWED = {("torch.distributed.checkpoint.metadata", name) for name in _METADATA_CLASSES} | {
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("pathlib", "PosixPath"),
        ("pathlib", "WindowsPath"),
        ("collections", "OrderedDict"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP's checkpoint metadata")


class _Reader(dcp.FileSystemReader):
    """DCP's FileSystemReader with its .metadata read by _MetadataUnpickler instead of pickle.load (tensor records go
    through torch.load(weights_only=True), as in FileSystemReader)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self.path) / ".metadata"
        try:
            with open(path, "rb") as handle:
                metadata = _MetadataUnpickler(handle).load()
        except FileNotFoundError:
            raise CheckpointError(f"{path} is missing; the checkpoint is incomplete") from None
        except Exception as error:  # noqa: BLE001 - whatever a broken or crafted file raises: one line
            raise CheckpointError(f"{path} is corrupt or not DCP metadata ({error}); restore the checkpoint") from None
        if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
            raise CheckpointError(f"{path} is not DCP metadata; restore the checkpoint from a copy")
        # the engine saves tensors only: DCP would read a "bytes" entry with torch.load(weights_only=False)
        if any(not isinstance(entry, TensorStorageMetadata) for entry in metadata.state_dict_metadata.values()):
            raise CheckpointError(f"{path} declares entries that are not tensors; restore the checkpoint from a copy")
        if metadata.storage_meta is not None:  # as FileSystemReader does
            metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan: Any, planner: Any) -> Any:
        """FileSystemReader's read, with a data file that weights-only loading refuses named in one line (torch's
        own message ends by advising `weights_only=False`, the one thing never to do with an untrusted file)."""
        try:
            return super().read_data(plan, planner)
        except pickle.UnpicklingError:
            infos = [self.storage_data[item.storage_index] for item in plan.items]
            files = sorted({info.relative_path for info in infos if not self._loads(info)}) or sorted(
                {info.relative_path for info in infos}
            )
            raise CheckpointError(
                f"{', '.join(files)} in {self.path} holds objects other than tensors, refused unread (loading it "
                "could run code); restore the checkpoint from a copy"
            ) from None

    def _loads(self, info: Any) -> bool:
        """Whether the record `info` (a _StorageInfo: file, offset, length) loads weights-only (an error path)."""
        with open(Path(self.path) / info.relative_path, "rb") as handle:
            handle.seek(info.offset)
            record = io.BytesIO(handle.read(info.length))
        try:
            torch.load(record, map_location="cpu", weights_only=True)
        except Exception:  # noqa: BLE001 - refused or unreadable: either way not this checkpoint's tensors
            return False
        return True


def _read_manifest(directory: Path) -> tuple[dict[str, Any], Metadata]:
    """The checkpoint's manifest and DCP metadata, after checking that every file they name is there and whole."""
    recover_directory(directory)  # a save killed between its two renames set the complete checkpoint aside
    if not directory.is_dir():
        raise CheckpointError(
            f"checkpoint {directory} does not exist; give the checkpoint folder a training run wrote (OUT/checkpoint)"
        )
    path = directory / METADATA_FILE
    if not path.is_file():
        raise CheckpointError(
            f"{directory} is not a sharded engine checkpoint: {METADATA_FILE} is missing (an unfinished save leaves "
            "only a hidden .partial folder; give the last complete checkpoint folder)"
        )
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{path} is corrupt ({error}); restore the checkpoint from a copy") from None
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an engine checkpoint (format {manifest.get('format')!r})")
    if manifest.get("version") in (1, 2):
        raise CheckpointError(
            f"{path} is a version {manifest['version']} engine checkpoint (the engine's own shard format, before "
            "DCP), which this release does not read. Fix: resume it to the end, or consolidate it into an HF "
            "folder, with the release that wrote it, then start a new run from that folder (--model)"
        )
    if manifest.get("version") != VERSION:
        raise CheckpointError(
            f"{path} has format version {manifest.get('version')}, this engine reads version {VERSION}; load it "
            "with the engine release that wrote it"
        )
    missing = [f for f in manifest["files"] if not (directory / f).is_file()]
    metadata = _Reader(directory / SHARDS_DIR).read_metadata()
    ends: dict[str, int] = {}  # DCP file -> the bytes its metadata describes
    for info in metadata.storage_data.values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    missing += [f"{SHARDS_DIR}/{name}" for name in sorted(ends) if not (directory / SHARDS_DIR / name).is_file()]
    if missing:
        raise CheckpointError(
            f"checkpoint {directory} is incomplete: {', '.join(missing[:4])} missing; restore the missing files or "
            "use an earlier checkpoint"
        )
    for name, end in sorted(ends.items()):
        size = (directory / SHARDS_DIR / name).stat().st_size
        if size < end:
            raise CheckpointError(
                f"{directory / SHARDS_DIR / name} is truncated: {size} bytes, the checkpoint's metadata describes "
                f"{end}. Fix: restore the shard file or use an earlier checkpoint."
            )
    return manifest, metadata


def _load_entries(directory: Path, entries: dict[str, _Chunks], grid: Grid | None) -> None:
    """Fill `entries` in place from the checkpoint's DCP files (collective on a grid of several ranks)."""
    distributed = grid is not None and grid.shape.world_size > 1
    try:
        with warnings.catch_warnings():  # DCP warns that no_dist loads in one process: what is asked for here
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(
                entries,
                storage_reader=_Reader(directory / SHARDS_DIR),
                planner=_LoadPlanner(),
                process_group=grid.group(*GRID_AXES).group if distributed else None,
                no_dist=not distributed,
            )
    except CheckpointException as error:
        own = [e for e, _ in error.failures.values() if isinstance(e, CheckpointError)]
        if own:  # already the whole story in one line (e.g. a data file refused unread)
            raise own[0] from None
        causes = sorted({" ".join(str(e).split()) for e, _ in error.failures.values()})
        raise CheckpointError(
            f"cannot read checkpoint {directory}: {'; '.join(causes)[:500]}; restore it or use an earlier one"
        ) from None


def _check_compatible(saved: dict[str, dict], current: dict[str, dict], directory: Path) -> None:
    missing = sorted(set(current) - set(saved))
    unexpected = sorted(set(saved) - set(current))
    mismatched = [
        f"{k}: checkpoint {saved[k]['shape']} vs model {current[k]['shape']}"
        for k in current
        if k in saved and saved[k]["shape"] != current[k]["shape"]
    ]
    parts = [f"missing keys {missing[:5]}"] if missing else []
    parts += [f"unexpected keys {unexpected[:5]}"] if unexpected else []
    parts += ["different shapes " + "; ".join(mismatched[:5])] if mismatched else []
    if parts:
        raise CheckpointError(
            f"checkpoint {directory} was written for another model ({', '.join(parts)}); build the model from the "
            "same config as the run that wrote it"
        )


@torch.no_grad()
def load_checkpoint(
    directory: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, grid: Grid | None = None
) -> dict[str, Any]:
    """Load a checkpoint written by save_checkpoint on a grid into `model` (and `optimizer`) in place; return the
    extra_state.

    model: parallelized for `grid` (any grid and ZeRO stage: DCP reads whatever overlaps this rank's chunks), or a
        plain serial model with grid=None (no torch.distributed needed). Collective on a grid.
    optimizer: built over model.parameters() with the same parameter groups as when saving; receives the
        saved state (AdamW exp_avg, exp_avg_sq, step, and the group settings such as the current lr).
    Returns this rank's own extra_state when the grid is the saving grid, else rank 0's (as in
    trainer_state.json). Raises CheckpointError for a missing, incomplete or corrupt checkpoint and for
    another model's (checked before anything is loaded; a file found corrupt while loading can leave the
    model partly loaded: build it again before retrying).
    """
    directory = Path(directory)
    manifest, metadata = _read_manifest(directory)
    tensors = _tensors(model, grid)
    _check_compatible(manifest["tensors"], _described(tensors), directory)
    same_grid = grid is not None and asdict(grid.shape) == manifest["grid"]
    record = _read_state(directory / _rank_state(grid.rank if same_grid else 0))
    entries = _model_entries(tensors)  # a pipeline's rank reads its own stages' tensors only
    if optimizer is None:
        _load_entries(directory, entries, grid)
        return record["extra_state"]
    saved = manifest.get("optimizer")
    if saved is None:
        raise CheckpointError(f"checkpoint {directory} holds no optimizer state; load it with optimizer=None")
    if saved["class"] != _optimizer_class(optimizer):
        raise CheckpointError(f"checkpoint {directory} holds {saved['class']} state, not {_optimizer_class(optimizer)}")
    layouts = {key: p for key, (p, _, _) in tensors.items()}
    state, groups = _empty_optimizer_state(record, saved["state"], metadata, optimizer, model, layouts, entries)
    _load_entries(directory, entries, grid)
    optimizer.load_state_dict({"state": state, "param_groups": groups})
    return record["extra_state"]


def _empty_optimizer_state(
    record: dict[str, Any],
    kinds: dict[str, dict[str, str]],
    metadata: Metadata,
    optimizer: torch.optim.Optimizer,
    model: nn.Module,
    layouts: dict[str, ParamLayout | None],
    entries: dict[str, _Chunks],
) -> tuple[dict[int, dict[str, Any]], list[dict[str, Any]]]:
    """The optimizer state to load, by parameter index, as tensors laid out as this model's optimizer keeps them
    (ZeRO: the data-axis chunk), added to `entries` for DCP to fill; and the saved groups with indices."""
    saved_groups = record["optimizer_groups"]
    if len(saved_groups) != len(optimizer.param_groups):
        raise CheckpointError(
            f"the optimizer has {len(optimizer.param_groups)} parameter groups, the checkpoint {len(saved_groups)}; "
            "build the optimizer as the run that wrote it did"
        )
    names = _param_names(model)
    state: dict[int, dict[str, Any]] = {}
    groups, index = [], 0
    for number, (group, saved_group) in enumerate(zip(optimizer.param_groups, saved_groups)):
        if [names.get(id(p)) for p in group["params"]] != saved_group["params"]:
            raise CheckpointError(
                f"parameter group {number} of the optimizer holds other parameters than the checkpoint's; build the "
                "optimizer as the run that wrote it did"
            )
        groups.append({**{k: v for k, v in saved_group.items() if k != "params"}, "params": []})
        for param in group["params"]:
            name = names[id(param)]
            held = not param.is_meta  # another pipeline stage's parameter: its ranks load its state
            for key, kind in kinds.get(name, {}).items() if held else ():
                fqn = f"optim/{name}/{key}"
                if kind == "value":
                    value = record["optimizer_values"][name][key]
                elif kind == "scalar":
                    value = torch.zeros((), dtype=metadata.state_dict_metadata[fqn].properties.dtype)
                    entries[fqn] = _entry(None, value)
                else:
                    held = local_shard(param)
                    empty = torch.zeros(held.shape, dtype=held.dtype, device=held.device)
                    value = optimizer_value(model, param, empty)
                    entries[fqn] = _entry(layouts[name], value)
                state.setdefault(index, {})[key] = value
            groups[-1]["params"].append(index)
            index += 1
    return state, groups


@torch.no_grad()
def load_serial_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a SERIAL model's optimizer state dict (full tensors, e.g. a single-process run's checkpoint) into
    the optimizer of the parallelized `model`: each rank keeps its shard of every per-element state.

    The optimizer must be built over the parallelized model's parameters in the serial model's order
    (engine.training.train.make_optimizer does so: parallelize keeps the parameter order). No communication.
    """
    layouts = plan_of(model).params
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
                f"the saved optimizer state has parameter index {index}, the optimizer only {len(params)} "
                "parameters; build the optimizer as the run that wrote it did"
            )
        param = params[int(index)]
        p = layouts[names[id(param)]]
        local[int(index)] = {}
        for key, value in param_state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                if tuple(value.shape) != serial_shape(p):
                    raise CheckpointError(
                        f"optimizer state {key!r} of {p.key} has shape {list(value.shape)}, the model's parameter "
                        f"{list(serial_shape(p))}; the state belongs to another model"
                    )
                value = optimizer_value(model, param, p.take_local(value.t() if p.serial_transposed else value))
            local[int(index)][key] = value
    optimizer.load_state_dict({"state": local, "param_groups": state["param_groups"]})


# ----- consolidation ------------------------------------------------------------------------------------


def consolidate_checkpoint(directory: str | Path, out_dir: str | Path) -> Path:
    """Merge a checkpoint written on a grid into an ordinary HF checkpoint folder and return it.

    Writes out_dir/model.safetensors (full tensors, the serial model's key names and layouts, tied keys
    included) and, when the saved model had an HF config, out_dir/config.json, so that
    transformers.AutoModelForCausalLM.from_pretrained(out_dir) loads it without the engine. Other files of
    the checkpoint folder that are not model weights (tokenizer files, run records) are copied. Runs in a
    single process without torch.distributed (DCP reads the full tensors); holds the full model in memory once.
    """
    directory, out_dir = Path(directory), Path(out_dir)
    manifest, metadata = _read_manifest(directory)
    if out_dir.resolve() == directory.resolve():
        raise CheckpointError("consolidate_checkpoint needs an out_dir other than the checkpoint folder")
    full = {
        key: torch.empty(entry["shape"], dtype=metadata.state_dict_metadata[f"model/{key}"].properties.dtype)
        for key, entry in manifest["tensors"].items()
    }
    _load_entries(directory, {f"model/{key}": _entry(None, tensor) for key, tensor in full.items()}, None)
    # A wrapper's HF model (a LightningModule's `self.model`) is written under the HF model's own key names;
    # the save recorded the prefix only when every tensor lies inside it.
    prefix = manifest.get("hf_prefix") or ""
    state: dict[str, torch.Tensor] = {}
    for key, entry in manifest["tensors"].items():
        for name in (key, *entry["aliases"]):  # tied keys each get a copy (from_pretrained ties them again)
            state[name[len(prefix) :]] = full[key] if name == key else full[key].clone()
    staging = staging_directory(out_dir)
    for item in directory.iterdir():
        if item.is_file() and item.name not in _MODEL_FILES and item.name not in _ENGINE_FILES:
            shutil.copy2(item, staging / item.name)
    save_file(state, str(staging / "model.safetensors"), metadata={"format": "pt"})
    if manifest.get("hf_config") is not None:
        write_text_atomic(staging / "config.json", json.dumps(manifest["hf_config"], indent=2, sort_keys=True) + "\n")
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
