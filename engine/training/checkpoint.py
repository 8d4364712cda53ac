"""Atomic checkpoints of a parallelized model and its optimizer through torch.distributed.checkpoint (DCP);
resuming at any grid or ZeRO stage; consolidation into an HF folder.

Layout of a checkpoint folder written on a grid (next to whatever the caller's `save_model` writes there, e.g. an
HF model):

    engine_checkpoint.json            written last, by rank 0: format version, grid, step, the HF config, every
                                      state-dict key with its full shape, dtype and tied aliases, the optimizer's
                                      class and which of its per-parameter values are tensors
    engine_shards/.metadata, __R_N.distcp
                                      a DCP checkpoint (FileSystemWriter's format) of the tensors "model/<key>" and
                                      "optim/<param name>/<state key>" (AdamW exp_avg, exp_avg_sq, step), each as the
                                      FULL tensor in the serial model's layout (GPT-2 Conv1D weights (in, out))
    engine_shards/rank-NNNNN.state.json, .state.safetensors
                                      every rank: its extra_state (e.g. its RNG), the optimizer's groups and its
                                      non-tensor values (engine/training/state_files.py)
    trainer_state.json, trainer_state.safetensors
                                      rank 0's extra_state (step, schedule, RNG: what the training loop resumes)

Every rank hands DCP the chunks of the full tensors it holds (`_Chunks`, the protocol DTensor implements:
engine.models.layout says where each rank's local tensor sits in the full tensor, a ZeRO DTensor where its data-axis
chunk sits in that); DCP's planner writes a chunk that several ranks hold (a replicated norm, AdamW's step) once, and
reads at load whatever overlaps each rank's chunks, so any grid and any ZeRO stage loads any other's checkpoint.
A run without a grid (one process) writes the serial layout instead: what `save_model` writes (an ordinary HF
folder) plus trainer_state.json/.safetensors holding extra_state and the optimizer's state dict.

Nothing in a checkpoint is unpickled as code. DCP keeps tensors as torch.save records, read with
torch.load(weights_only=True) (torch's unpickler that builds tensors and nothing else), and its `.metadata` as a
plain pickle of its metadata dataclasses, which torch's own reader opens with pickle.load; this module reads it
with `_MetadataUnpickler` instead, which resolves only DCP's metadata classes, torch.Size, dtypes, layouts and
paths, and refuses any other name (a function to call) before it is built. Everything else is JSON or safetensors.

Atomicity: everything goes to a staging sibling folder; rank 0 renames it to the target inside DCP's finish step,
which runs only after every rank's DCP write returned, so a crash at any point leaves the previous checkpoint (the
staging folder, without engine_checkpoint.json, is never read; the next save removes the staging folders of
processes that are gone). A kill between the two renames that replace an older checkpoint leaves it set aside
complete; every reader renames it back first. `AsyncSaver` runs the DCP write (and so the publication) in a
background thread on CPU copies of the chunks; the next save and `wait` wait for it.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import shutil
import struct
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors import SafetensorError
from safetensors.torch import save_file
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, Metadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

from data.atomic import recover_directory, remove_leftovers, replace_directory, staging_directory, write_text_atomic
from engine.core import comm
from engine.core.grid import AXES, Grid
from engine.memory.zero import is_dtensor, model_class_name, optimizer_value
from engine.models.layout import ParamLayout, layout_of
from engine.training.state_files import StateFileError, load_state, save_state, state_files

FORMAT = "goldfish-engine-checkpoint"
VERSION = 3  # 2: per-rank safetensors of the engine's own format; 1: pickled rank records (neither is read)
METADATA_FILE = "engine_checkpoint.json"
SHARDS_DIR = "engine_shards"  # the DCP checkpoint, with the per-rank records beside its files
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


# ----- a rank's chunks of the full tensors, as DCP asks for them --------------------------------------------------


@dataclass(frozen=True)
class Chunk:
    """A rectangular part of the tensor a rank holds and where it sits in the full tensor of the SERIAL model."""

    local: tuple[slice, ...]  # into the tensor the rank holds (a DTensor: its local chunk)
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    transposed: bool = False  # the serial model stores the transpose (GPT-2 Conv1D): the local part is .t()

    def of(self, local: torch.Tensor) -> torch.Tensor:
        """This chunk of `local`, shaped as it sits in the serial full tensor (a view)."""
        part = local[self.local]
        return part.t() if self.transposed else part


def serial_shape(p: ParamLayout) -> tuple[int, ...]:
    """The full shape of `p` in the serial model (GPT-2 Conv1D weights are (in, out))."""
    return tuple(reversed(p.full_shape)) if p.serial_transposed else tuple(p.full_shape)


def serial_chunks(p: ParamLayout, rows: range | None = None) -> list[Chunk]:
    """This rank's pieces of `p` (restricted to its local rows `rows`, e.g. a ZeRO chunk, whose local tensor starts at
    rows.start) as chunks of the serial full tensor."""
    start = 0 if rows is None else rows.start
    out = []
    for piece in p.pieces(rows):
        local = piece.local
        if start and local:  # the held tensor is the ZeRO chunk: its row 0 is local row `start`
            local = (slice(local[0].start - start, local[0].stop - start), *local[1:])
        if p.serial_transposed:
            out.append(Chunk(local, tuple(reversed(piece.offsets)), tuple(reversed(piece.sizes)), transposed=True))
        else:
            out.append(Chunk(local, tuple(piece.offsets), tuple(piece.sizes)))
    return out


class _Chunks:
    """One state-dict entry for DCP: the chunks of a full tensor that this rank holds.

    It speaks the protocol DCP's planners ask of DTensor (__create_write_items__, __create_chunk_list__,
    __get_tensor_shard__), so DCP writes and reads these chunks as it does a DTensor's local shard."""

    def __init__(self, held: torch.Tensor, full_shape: tuple[int, ...], chunks: list[Chunk]) -> None:
        self.held, self.full_shape, self.chunks = held, torch.Size(full_shape), chunks

    def size(self) -> torch.Size:
        return self.full_shape

    def __create_write_items__(self, fqn: str, obj: Any) -> list[WriteItem]:
        properties = TensorProperties.create_from_tensor(self.held)
        return [
            WriteItem(
                index=MetadataIndex(fqn, torch.Size(c.offsets)),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=ChunkStorageMetadata(torch.Size(c.offsets), torch.Size(c.sizes)),
                    properties=properties,
                    size=self.full_shape,
                ),
            )
            for c in self.chunks
        ]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return [ChunkStorageMetadata(torch.Size(c.offsets), torch.Size(c.sizes)) for c in self.chunks]

    def __get_tensor_shard__(self, index: MetadataIndex) -> torch.Tensor:
        for c in self.chunks:
            if torch.Size(c.offsets) == index.offset:
                return c.of(self.held)
        raise CheckpointError(f"{index.fqn} has no chunk at {list(index.offset or ())} on this rank")

    def staged(self) -> "_Chunks":
        """The same chunks over a CPU copy of the held tensor (what an asynchronous save writes while training
        goes on)."""
        return _Chunks(self.held.detach().to("cpu", copy=True), tuple(self.full_shape), self.chunks)


class _SavePlanner(dcp.DefaultSavePlanner):
    """DCP's default planner (its dedup of chunks several ranks hold included) that also finds `_Chunks`' data. The
    state dict is flat already: nothing to flatten."""

    def __init__(self) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)

    def lookup_object(self, index: MetadataIndex) -> Any:
        obj = self.state_dict[index.fqn]
        return obj.__get_tensor_shard__(index) if isinstance(obj, _Chunks) else super().lookup_object(index)


class _LoadPlanner(dcp.DefaultLoadPlanner):
    """DCP's default planner that also finds where `_Chunks`' data goes. The state dict is flat and holds no meta
    tensors, so nothing is flattened or initialised (DefaultLoadPlanner's initialisation would drop `_Chunks`)."""

    def __init__(self) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)

    def set_up_planner(
        self, state_dict: dict[str, Any], metadata: Metadata | None = None, is_coordinator: bool = False
    ) -> None:
        self.original_state_dict = self.state_dict = state_dict
        self.metadata, self.is_coordinator = metadata, is_coordinator

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        obj = self.state_dict[index.fqn]
        return obj.__get_tensor_shard__(index) if isinstance(obj, _Chunks) else super().lookup_tensor(index)


class _Staged:
    """DCP's AsyncStager for a state dict of CPU copies made beforehand (`_Chunks.staged`): nothing more to copy."""

    _synchronize_after_execute = False
    should_synchronize_after_execute = False

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        return state_dict

    def close(self) -> None:
        pass


def _held(tensor: torch.Tensor) -> tuple[torch.Tensor, range | None]:
    """The tensor this rank holds of a state-dict tensor, and for a DTensor sharded over the data axis (ZeRO) the
    rows of the tensor-parallel local tensor that its chunk covers."""
    tensor = tensor.detach()
    if not is_dtensor(tensor):
        return tensor, None
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    sizes, offsets = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
    local = tensor.to_local()
    if not sizes:  # a 0-d (replicated) DTensor
        return local, None
    return local, range(offsets[0], offsets[0] + sizes[0])


def _entry(p: ParamLayout | None, tensor: torch.Tensor) -> _Chunks:
    """The DCP entry of `tensor` (a parameter, buffer or per-element optimizer state laid out as `p`; p None: the
    tensor is whole on every rank)."""
    held, rows = _held(tensor)
    if p is None:
        shape = tuple(held.shape)
        return _Chunks(held, shape, [Chunk(tuple(slice(0, n) for n in shape), (0,) * len(shape), shape)])
    return _Chunks(held, serial_shape(p), serial_chunks(p, rows))


# ----- what a checkpoint holds --------------------------------------------------------------------------------


def _layouts(model: nn.Module, grid: Grid | None) -> dict[str, ParamLayout | None]:
    """Every distinct state-dict tensor of `model` by its first key: its layout on `grid` (None for a plain model)."""
    if grid is not None:
        return dict(layout_of(model, grid).params)
    first: dict[int, str] = {}
    return {first.setdefault(id(t), k): None for k, t in model.state_dict(keep_vars=True).items() if id(t) not in first}


def _described(model: nn.Module, grid: Grid | None) -> tuple[dict[str, ParamLayout | None], dict[str, dict]]:
    """The layouts and, per key, what the manifest records: serial shape, dtype and the tied keys beside it."""
    tensors = model.state_dict(keep_vars=True)
    layouts = _layouts(model, grid)
    aliases: dict[int, list[str]] = {}
    for key, tensor in tensors.items():
        aliases.setdefault(id(tensor), []).append(key)
    described = {}
    for key, p in layouts.items():
        tensor = tensors[key]
        shape = tuple(tensor.shape) if p is None else serial_shape(p)
        dtype = str(tensor.dtype).removeprefix("torch.")
        described[key] = {"shape": list(shape), "dtype": dtype, "aliases": aliases[id(tensor)][1:]}
    return layouts, described


def _param_names(model: nn.Module) -> dict[int, str]:
    return {id(p): name for name, p in model.named_parameters()}


def _optimizer_class(optimizer: torch.optim.Optimizer) -> str:
    """The optimizer whose state a checkpoint holds; ZeRO-1's ZeroAdamW keeps AdamW's state (checkpoint_class)."""
    return getattr(optimizer, "checkpoint_class", type(optimizer).__name__)


def _optimizer_entries(
    optimizer: torch.optim.Optimizer | None, model: nn.Module, layouts: dict[str, ParamLayout | None]
) -> tuple[dict[str, Any], dict[str, dict[str, str]], list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The optimizer's DCP entries ("optim/<name>/<key>"), per parameter name how each state value is stored
    ("like_param": in DCP, laid out as its parameter; "scalar": in DCP, one copy; "value": a non-tensor in the rank's
    record), the groups with parameter names instead of
    indices, and the non-tensor values."""
    if optimizer is None:
        return {}, {}, [], {}
    names = _param_names(model)
    entries: dict[str, Any] = {}
    kinds: dict[str, dict[str, str]] = {}
    values: dict[str, dict[str, Any]] = {}
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
            if name not in layouts:
                raise CheckpointError(f"parameter {name} is tied to another key of the state dict; untie it")
            for key, value in optimizer.state.get(param, {}).items():
                kind = (
                    "value" if not isinstance(value, torch.Tensor) else "scalar" if value.dim() == 0 else "like_param"
                )
                kinds.setdefault(name, {})[key] = kind
                if kind == "value":
                    values.setdefault(name, {})[key] = value
                elif kind == "scalar":  # AdamW's step: the same on every rank
                    entries[f"optim/{name}/{key}"] = _entry(None, value)
                elif value.shape == param.shape:
                    entries[f"optim/{name}/{key}"] = _entry(layouts[name], value)
                else:
                    raise CheckpointError(
                        f"optimizer state {key!r} of {name} has shape {list(value.shape)}, neither the parameter's "
                        f"shape {list(param.shape)} nor a scalar: the engine cannot shard it (optimizers with "
                        "per-element state such as AdamW or SGD are supported)"
                    )
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": group_names})
    return entries, kinds, groups, values


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


# ----- saving -------------------------------------------------------------------------------------------


def _rank_state(rank: int) -> str:
    """The stem of rank `rank`'s record (extra_state, optimizer groups): STEM.json and STEM.safetensors."""
    return f"{SHARDS_DIR}/rank-{rank:05d}.state"


def _record_files(world_size: int) -> list[str]:
    return [
        name for rank in range(world_size) for name in (f"{_rank_state(rank)}.json", f"{_rank_state(rank)}.safetensors")
    ]


class _Writer(dcp.FileSystemWriter):
    """DCP's FileSystemWriter into the staging folder's engine_shards/; its finish step, which DCP runs on rank 0
    once every rank's write has returned, also writes the manifest and publishes the staging folder."""

    def __init__(self, staging: Path, directory: Path, manifest: dict[str, Any] | None) -> None:
        super().__init__(staging / SHARDS_DIR)
        self.staging, self.directory, self.manifest = staging, directory, manifest

    def write_data(self, plan: Any, planner: Any) -> Any:
        try:
            return super().write_data(plan, planner)
        except RuntimeError as error:  # torch.save's writer reports a failed write without its errno
            raise _os_cause(sorted(Path(self.path).glob(f"{plan.storage_data.prefix}*.distcp"))) or error

    def finish(self, metadata: Metadata, results: list) -> None:
        super().finish(metadata, results)
        assert self.manifest is not None  # DCP calls finish on the coordinator, rank 0, which has the manifest
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
    the failed save) raises the OSError (e.g. EFBIG, ENOSPC) that torch.save's writer reported without its errno."""
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
    """A save whose staging folder holds everything but the DCP write: the entries to write and the writer."""

    directory: Path
    staging: Path
    entries: dict[str, Any]
    writer: _Writer


def _prepare(
    directory: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    grid: Grid,
    extra_state: dict[str, Any],
    save_model: Callable[[nn.Module, Path], None] | None,
) -> _Prepared:
    """Collective: a staging folder (made by rank 0), save_model's files and every rank's record in it."""
    world = grid.group(*AXES)
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
    failure: BaseException | None = None
    prepared = None
    try:
        if save_model is not None:
            save_model(model, staging)
        layouts, described = _described(model, grid)
        entries = {f"model/{key}": _entry(p, model.state_dict(keep_vars=True)[key]) for key, p in layouts.items()}
        optim_entries, kinds, groups, values = _optimizer_entries(optimizer, model, layouts)
        entries.update(optim_entries)
        (staging / SHARDS_DIR).mkdir(exist_ok=True)
        _save_state(
            staging / _rank_state(grid.rank),
            {"extra_state": extra_state, "optimizer_groups": groups, "optimizer_values": values},
        )
        manifest = None
        if grid.rank == 0:
            _save_state(staging / TRAINER_STATE, extra_state)
            hf_part = _hf_part(model, described)
            manifest = {
                "format": FORMAT,
                "version": VERSION,
                "grid": asdict(grid.shape),
                "step": extra_state.get("step"),
                "model_class": model_class_name(model),
                "hf_config": None if hf_part is None else _hf_config(hf_part[1]),
                "hf_prefix": None if hf_part is None else hf_part[0],
                "tensors": described,
                "optimizer": None if optimizer is None else {"class": _optimizer_class(optimizer), "state": kinds},
                "files": _record_files(grid.shape.world_size),
            }
        prepared = _Prepared(directory, staging, entries, _Writer(staging, directory, manifest))
    except Exception as error:  # noqa: BLE001 - every rank must learn that the save failed, then it re-raises
        failure = _write_error(error, directory)
    if not comm.all_agree(failure is None, world, grid.device):
        if grid.rank == 0:  # every rank has stopped writing into it
            shutil.rmtree(staging, ignore_errors=True)
        if failure is not None:
            raise failure
        raise CheckpointError(
            f"another rank failed while writing the checkpoint {directory}; the previous checkpoint (if any) is intact"
        )
    assert prepared is not None
    return prepared


def _failed(error: CheckpointException, prepared: _Prepared, rank: int) -> CheckpointError:
    """DCP's report of a failed write or publication as one line on every rank (this rank's own error first); rank 0
    removes the staging folder."""
    if rank == 0:
        shutil.rmtree(prepared.staging, ignore_errors=True)
    own = error.failures.get(rank)
    if own is not None:
        converted = _write_error(own[0], prepared.directory)
        if isinstance(converted, CheckpointError):
            return converted
        return CheckpointError(f"cannot write the checkpoint {prepared.directory}: {own[0]}")
    return CheckpointError(
        f"another rank failed while writing the checkpoint {prepared.directory}; the previous checkpoint (if any) "
        "is intact"
    )


def _process_group(grid: Grid) -> dist.ProcessGroup | None:
    return grid.group(*AXES).group


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
    extra_state = _checked_extra_state(extra_state)
    if grid is None:
        return _save_serial(directory, model, optimizer, extra_state, save_model)
    prepared = _prepare(directory, model, optimizer, grid, extra_state, save_model)
    try:
        dcp.save(
            prepared.entries,
            storage_writer=prepared.writer,
            planner=_SavePlanner(),
            process_group=_process_group(grid),
            no_dist=grid.shape.world_size == 1,
        )
    except CheckpointException as error:
        raise _failed(error, prepared, grid.rank) from None
    return directory


class AsyncSaver:
    """Checkpoints of a run on a grid whose DCP write runs in the background (dcp.async_save): `save` returns once
    save_model's files and the ranks' records are written and the chunks copied to CPU; the tensors are written,
    and rank 0 publishes the folder, while training goes on. The next `save` and `wait` (call it before the run
    ends) wait for the previous one; a failure in the background is raised there, on every rank.

    Collective: every rank of `grid` builds one (it makes a gloo group of its own for the background thread's
    collectives, which must not interleave with the training's) and calls `close` at the end."""

    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        self.group = dist.new_group(backend="gloo") if grid.shape.world_size > 1 else None
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
        """Start a checkpoint of `model` and `optimizer` into `directory` (see save_checkpoint)."""
        self.wait()
        prepared = _prepare(Path(directory), model, optimizer, self.grid, _checked_extra_state(extra_state), save_model)
        staged = {key: entry.staged() for key, entry in prepared.entries.items()}
        future = dcp.async_save(
            staged,
            storage_writer=prepared.writer,
            planner=_SavePlanner(),
            process_group=self.group,
            async_stager=_Staged(),
            no_dist=self.group is None,
        )
        self.pending = (future, prepared)

    def wait(self) -> None:
        """Block until the checkpoint in flight (if any) is written and published; CheckpointError if it failed."""
        if self.pending is None:
            return
        future, prepared = self.pending
        self.pending = None
        try:
            future.result()
        except CheckpointException as error:
            raise _failed(error, prepared, self.grid.rank) from None

    def close(self) -> None:
        """Wait for the checkpoint in flight and release the background group."""
        try:
            self.wait()
        finally:
            if self.group is not None:
                dist.destroy_process_group(self.group)
                self.group = None


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


def _read_state(stem: Path) -> Any:
    """A state file pair of a checkpoint (state_files: JSON + safetensors, never a pickle)."""
    try:
        return load_state(stem)
    except FileNotFoundError:
        raise CheckpointError(f"{state_files(stem)[0]} is missing; the checkpoint is incomplete") from None
    except StateFileError as error:
        raise CheckpointError(f"{error}; restore the checkpoint from a copy or use an earlier one") from None


class _MetadataUnpickler(pickle.Unpickler):
    """Reads DCP's .metadata (a pickle of its metadata dataclasses) resolving only the names such a file holds: DCP's
    metadata classes, torch.Size, dtypes, layouts, memory formats and paths. Any other name (builtins.exec, os.system,
    a class of some module) is refused before anything is called, so the file can hold data only."""

    _ALLOWED = {
        ("torch.distributed.checkpoint.metadata", name)
        for name in (
            "Metadata",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "MetadataIndex",
            "StorageMeta",
            "_MEM_FORMAT_ENCODING",
        )
    } | {
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
    """DCP's FileSystemReader whose .metadata goes through _MetadataUnpickler instead of pickle.load (tensor data
    goes through torch.load(weights_only=True), as in FileSystemReader)."""

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
        if metadata.storage_meta is not None:
            metadata.storage_meta.load_id = self.load_id
        return metadata


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
            f"{directory} is not a sharded engine checkpoint: {METADATA_FILE} is missing (an "
            "unfinished save leaves only a hidden .partial folder; give the last complete "
            "checkpoint folder)"
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
            f"{path} has format version {manifest.get('version')}, this engine reads version "
            f"{VERSION}; load it with the engine release that wrote it"
        )
    missing = [f for f in manifest["files"] if not (directory / f).is_file()]
    if missing:
        raise CheckpointError(
            f"checkpoint {directory} is incomplete: {', '.join(missing[:4])} missing; restore "
            "the missing files or use an earlier checkpoint"
        )
    reader = _Reader(directory / SHARDS_DIR)
    metadata = reader.read_metadata()
    ends: dict[str, int] = {}
    for info in metadata.storage_data.values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    for name, end in sorted(ends.items()):
        file = directory / SHARDS_DIR / name
        if not file.is_file():
            raise CheckpointError(
                f"checkpoint {directory} is incomplete: {SHARDS_DIR}/{name} missing; restore the missing files or "
                "use an earlier checkpoint"
            )
        if file.stat().st_size < end:
            raise CheckpointError(
                f"{file} is truncated: {file.stat().st_size} bytes, the checkpoint's metadata describes {end}. Fix: "
                "restore the shard file or use an earlier checkpoint."
            )
    return manifest, metadata


def _load_entries(directory: Path, entries: dict[str, Any], grid: Grid | None) -> None:
    """Fill `entries` in place from the checkpoint's DCP files (collective on a grid, through the world group)."""
    distributed = grid is not None and grid.shape.world_size > 1
    try:
        dcp.load(
            entries,
            storage_reader=_Reader(directory / SHARDS_DIR),
            planner=_LoadPlanner(),
            process_group=_process_group(grid) if distributed else None,
            no_dist=not distributed,
        )
    except CheckpointException as error:
        causes = {str(e) for e, _ in error.failures.values()}
        raise CheckpointError(
            f"cannot read checkpoint {directory}: {'; '.join(sorted(causes))[:500]}; restore it or use an earlier one"
        ) from None


def _check_compatible(saved: dict[str, dict], current: dict[str, dict], directory: Path) -> None:
    missing = sorted(set(current) - set(saved))
    unexpected = sorted(set(saved) - set(current))
    mismatched = [
        f"{k}: checkpoint {saved[k]['shape']} vs model {current[k]['shape']}"
        for k in current
        if k in saved and saved[k]["shape"] != current[k]["shape"]
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
    layouts, described = _described(model, grid)
    _check_compatible(manifest["tensors"], described, directory)
    same_grid = grid is not None and asdict(grid.shape) == manifest["grid"]
    record = _read_state(directory / _rank_state(grid.rank if same_grid else 0))
    tensors = model.state_dict(keep_vars=True)
    entries: dict[str, Any] = {f"model/{key}": _entry(p, tensors[key]) for key, p in layouts.items()}
    state: dict[int, dict[str, Any]] = {}
    if optimizer is not None:
        groups = _optimizer_targets(directory, manifest, metadata, record, optimizer, model, layouts, entries, state)
    _load_entries(directory, entries, grid)
    if optimizer is not None:
        optimizer.load_state_dict({"state": state, "param_groups": groups})
    return record["extra_state"]


def _optimizer_targets(
    directory: Path,
    manifest: dict[str, Any],
    metadata: Metadata,
    record: dict[str, Any],
    optimizer: torch.optim.Optimizer,
    model: nn.Module,
    layouts: dict[str, ParamLayout | None],
    entries: dict[str, Any],
    state: dict[int, dict[str, Any]],
) -> list[dict[str, Any]]:
    """Empty optimizer state laid out as this model's optimizer keeps it, added to `entries` for DCP to fill and to
    `state` by parameter index; returns the saved groups with indices."""
    saved = manifest.get("optimizer")
    if saved is None:
        raise CheckpointError(f"checkpoint {directory} holds no optimizer state; load it with optimizer=None")
    if saved["class"] != _optimizer_class(optimizer):
        raise CheckpointError(f"checkpoint {directory} holds {saved['class']} state, not {_optimizer_class(optimizer)}")
    saved_groups, values = record["optimizer_groups"], record["optimizer_values"]
    if len(saved_groups) != len(optimizer.param_groups):
        raise CheckpointError(
            f"the optimizer has {len(optimizer.param_groups)} parameter groups, the checkpoint "
            f"{len(saved_groups)}; build the optimizer as the run that wrote it did"
        )
    names = _param_names(model)
    groups, index = [], 0
    for number, (group, saved_group) in enumerate(zip(optimizer.param_groups, saved_groups)):
        group_names = [names.get(id(p)) for p in group["params"]]
        if group_names != saved_group["params"]:
            raise CheckpointError(
                f"parameter group {number} of the optimizer holds other parameters than the "
                "checkpoint's; build the optimizer as the run that wrote it did"
            )
        ids = []
        for name, param in zip(group_names, group["params"]):
            for key, kind in saved["state"].get(name, {}).items():
                if kind == "value":
                    value = values[name][key]
                elif kind == "scalar":
                    value = torch.zeros((), dtype=metadata.state_dict_metadata[f"optim/{name}/{key}"].properties.dtype)
                    entries[f"optim/{name}/{key}"] = _entry(None, value)
                else:  # per element, laid out as the optimizer keeps it (ZeRO: the data-axis chunk)
                    value = optimizer_value(
                        model, param, torch.zeros(param.shape, dtype=param.dtype, device=param.device)
                    )
                    entries[f"optim/{name}/{key}"] = _entry(layouts[name], value)
                state.setdefault(index, {})[key] = value
            ids.append(index)
            index += 1
        groups.append({**{k: v for k, v in saved_group.items() if k != "params"}, "params": ids})
    return groups


@torch.no_grad()
def load_serial_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a SERIAL model's optimizer state dict (full tensors, e.g. a single-process run's checkpoint) into
    the optimizer of the parallelized `model`: each rank keeps its shard of every per-element state.

    The optimizer must be built over the parallelized model's parameters in the serial model's order
    (engine.training.train.make_optimizer does so: parallelize keeps the parameter order). No communication.
    """
    layouts = dict(layout_of(model).params)
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
    full: dict[str, Any] = {}
    for key, entry in manifest["tensors"].items():
        dtype = metadata.state_dict_metadata[f"model/{key}"].properties.dtype
        full[f"model/{key}"] = torch.empty(entry["shape"], dtype=dtype)
    _load_entries(directory, full, None)
    state: dict[str, torch.Tensor] = {}
    for key, entry in manifest["tensors"].items():
        state[key] = full[f"model/{key}"]
        for alias in entry["aliases"]:  # tied weights: safetensors wants a copy of its own (from_pretrained re-ties)
            state[alias] = state[key].clone()
    # A wrapper's HF model (a LightningModule's `self.model`) is written under the HF model's own key names;
    # the save recorded the prefix only when every tensor lies inside it.
    prefix = manifest.get("hf_prefix") or ""
    state = {key[len(prefix) :]: value for key, value in state.items()}
    staging = staging_directory(out_dir)
    for item in directory.iterdir():
        if item.is_file() and item.name not in _MODEL_FILES and item.name not in _ENGINE_FILES:
            shutil.copy2(item, staging / item.name)
    save_file(
        {k: v.contiguous() for k, v in state.items()}, str(staging / "model.safetensors"), metadata={"format": "pt"}
    )
    config = manifest.get("hf_config")
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
