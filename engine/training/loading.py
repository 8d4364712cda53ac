"""Sharded loading of an HF safetensors checkpoint: build on the meta device, each rank reads only its own slices.

    model = load_sharded("path/to/hf_folder", grid)     # == parallelize(from_pretrained(folder), grid), never whole

The model is built from its config on the meta device (no memory), planned with `engine.parallelize` (so every
parameter already has its shard's shape), given empty storage for its shards only, and each tensor is filled from
the files with safetensors' `get_slice`: a ParallelLinear shard reads its rows and columns (GPT-2 Conv1D weights
transposed, fused projections regrouped by `out_order` read as contiguous runs), a vocabulary-parallel embedding or
lm_head its vocabulary rows, everything else (norms, position embeddings) whole. No rank ever holds more than its
shards plus one replicated tensor. Stored names are renamed as transformers renames them for the model (GPT-NeoX's
`embed_out` is its `lm_head`). Non-persistent buffers (rotary frequencies, Gemma's embedding scale) are computed
again by HF's own initialisation. No communication.

On a pipe grid, `load_sharded(folder, grid, pipe=config.pipe_config)` gives storage to, and reads, only this rank's
stages of the cut the Pipeline will take (engine.training.pipeline.own_stages); the other stages stay on the meta
device, so no rank ever holds (or reads) another stage's tensors.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from engine.core.grid import Grid
from engine.core.linear import ShardingError
from engine.models.layout import plan_of
from engine.spec import PipeConfig
from engine.training.checkpoint import serial_chunks, serial_shape
from engine.training.pipeline import StageModule, own_stages, stage_to_device
from engine.training.verify import parallelize


class LoadingError(ValueError):
    """A folder that cannot be loaded shard by shard (missing files or tensors, wrong shapes)."""


def safetensors_files(folder: str | Path) -> dict[str, Path]:
    """{tensor name: file} of an HF folder's model.safetensors or its sharded index."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: folder / file for name, file in weight_map.items()}
    single = folder / "model.safetensors"
    if not single.is_file():
        raise LoadingError(
            f"{folder} has no model.safetensors or model.safetensors.index.json; sharded loading reads "
            "safetensors only (save the model with save_pretrained(safe_serialization=True))"
        )
    with safe_open(str(single), framework="pt") as handle:
        return {name: single for name in handle.keys()}


def can_load_sharded(folder: str | Path) -> bool:
    """True for a local HF folder with a config and safetensors weights."""
    folder = Path(folder)
    return (
        folder.is_dir()
        and (folder / "config.json").is_file()
        and ((folder / "model.safetensors").is_file() or (folder / "model.safetensors.index.json").is_file())
    )


def _read_local(sliced: Any, p: Any, target: torch.Tensor) -> None:
    """Fill `target`, this rank's local tensor of layout `p`, through a safetensors slice of the serial full tensor
    (one read per chunk: a fused projection's regrouped rows are read as runs of natural rows)."""
    for chunk in serial_chunks(p):
        part = sliced[tuple(slice(o, o + n) for o, n in zip(chunk.offsets, chunk.sizes))]
        chunk.of(target).copy_(part)


def _restore_buffers(model: nn.Module) -> None:
    """Compute non-persistent buffers (not in the files: rotary frequencies, Gemma's embedding scale) again with HF's
    own initialisation of their modules, before the weights are read (it may draw weights too). Each buffer is
    filled with NaN first, so one that the initialisation does not compute is refused rather than left as whatever
    the fresh storage held."""
    owners = []
    for name, module in model.named_modules():
        buffers = [b for b in getattr(module, "_non_persistent_buffers_set", ()) if getattr(module, b) is not None]
        for buffer_name in buffers:
            buffer = getattr(module, buffer_name)
            if buffer.is_floating_point():
                buffer.fill_(float("nan"))
        if buffers:
            owners.append((name, module, buffers))
    for name, module, buffers in owners:
        if hasattr(model, "_init_weights"):
            with torch.no_grad():
                model._init_weights(module)
        for buffer_name in buffers:
            buffer = getattr(module, buffer_name)
            if not buffer.is_floating_point() or torch.isnan(buffer).any():
                raise LoadingError(
                    f"buffer {name}.{buffer_name} is not stored in the checkpoint and the engine cannot compute it; "
                    "load this model with from_pretrained and engine.parallelize instead"
                )


def _to_device(model: nn.Module, device: torch.device) -> None:
    """Give every parameter and buffer of a model on the meta device new (uninitialized) storage on `device`."""
    # to_empty gives each parameter new storage (its shard's size) and would untie shared ones: tie them again
    names_by_param: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names_by_param.setdefault(id(param), []).append(name)
    model.to_empty(device=device)
    for names in names_by_param.values():
        first = model.get_parameter(names[0])
        for other in names[1:]:
            owner, _, attr = other.rpartition(".")
            setattr(model.get_submodule(owner), attr, first)


def _stages_to_device(model: nn.Module, stages: list[StageModule], device: torch.device) -> None:
    """Give the parameters of `stages` (this pipe rank's) and every buffer of `model` new (uninitialized) storage on
    `device`; the other stages' parameters stay on the meta device. No parameter is shared between two stages
    (split_model refuses tied embeddings), so there is nothing to tie again."""
    for stage in stages:
        stage_to_device(stage, device)  # keeps the parameter objects, as the Pipeline's own moves do
    for module in model.modules():
        for name, buffer in module._buffers.items():
            if buffer is not None and buffer.is_meta:
                module._buffers[name] = torch.empty_like(buffer, device=device)


def stored_names(model: nn.Module, files: dict[str, Path]) -> dict[str, tuple[str, Path]]:
    """{model key: (stored key, file)}: the names the files use, renamed as transformers renames them when it loads
    this model (e.g. GPT-NeoX's head, saved as embed_out.weight, is the model's lm_head.weight). Raises LoadingError
    for a stored tensor that transformers would convert rather than rename (merged experts): sharded loading reads
    tensors as they are stored."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming
    except ImportError:  # an older transformers: names are stored as the model uses them
        return {key: (key, path) for key, path in files.items()}
    transforms = get_model_conversion_mapping(model)
    out: dict[str, tuple[str, Path]] = {}
    for stored, path in files.items():
        key = stored
        for transform in transforms:
            renamed, matched = transform.rename_source_key(key)
            if matched is None:
                continue
            if not isinstance(transform, WeightRenaming):
                raise LoadingError(
                    f"{stored} in {path.name} is stored in a layout transformers converts when it loads this model; "
                    "load it with from_pretrained and engine.parallelize instead"
                )
            key = renamed
        out[key] = (stored, path)
    return out


@torch.no_grad()
def load_sharded(
    folder: str | Path,
    grid: Grid,
    *,
    dtype: torch.dtype = torch.float32,
    overlap: bool = True,
    vocab_parallel: bool | None = None,
    verify: bool = False,
    report: Any = None,
    pipe: PipeConfig | None = None,
) -> nn.Module:
    """An HF causal LM from `folder` (config.json + safetensors), parallelized for `grid`, reading only this rank's
    slices. Equal to `parallelize(AutoModelForCausalLM.from_pretrained(folder, dtype=dtype), grid, ...)`; returned in
    eval mode. Raises LoadingError for missing files or tensors and ShardingError for a model the grid cannot split.
    `verify` and `report`: as engine.parallelize (engine.training.verify), before any tensor is read.

    `pipe`, on a grid whose pipe axis is > 1: the settings of the Pipeline that will train the model (TrainConfig's
    pipe_config). Only this rank's stages of that Pipeline's cut (engine.training.pipeline.own_stages) get storage
    and are read; the other stages' parameters stay on the meta device, as the Pipeline keeps them. Buffers (the
    rotary tables every stage uses) get storage on every rank. ValueError (one line) for a model the Pipeline
    refuses (tied embeddings across stages, a family it does not know).
    """
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    folder = Path(folder)
    files = safetensors_files(folder)
    config = AutoConfig.from_pretrained(folder, trust_remote_code=False)  # a folder's own Python never runs
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.enable_grad():  # the verification runs a miniature's backward (this function is under no_grad)
        parallelize(model, grid, overlap=overlap, vocab_parallel=vocab_parallel, verify=verify, report=report)
    if pipe is not None and grid.shape.pipe > 1:
        stages = own_stages(model, grid.group("pipe"), pipe)
        wanted: set[str] | None = {name for stage in stages for name in stage.names.values()}
        _stages_to_device(model, stages, grid.device)
    else:
        wanted = None
        _to_device(model, grid.device)
    _restore_buffers(model)
    names = stored_names(model, files)

    missing = []
    with ExitStack() as stack:
        handles: dict[Path, Any] = {}
        for key, p in plan_of(model).params.items():
            if wanted is not None and not wanted & {key, *p.aliases}:
                continue  # another pipe rank's stage: stays on the meta device, never read here
            found = next((k for k in [key, *p.aliases] if k in names), None)  # tied: either name
            if found is None:
                missing.append(key)
                continue
            stored, path = names[found]
            if path not in handles:
                handles[path] = stack.enter_context(safe_open(str(path), framework="pt", device="cpu"))
            sliced = handles[path].get_slice(stored)
            if tuple(sliced.get_shape()) != serial_shape(p):
                raise LoadingError(
                    f"{stored} in {path.name} has shape {sliced.get_shape()}, the model built from "
                    f"config.json expects {list(serial_shape(p))}"
                )
            if tuple(p.local.shape) != p.local_shape():
                raise ShardingError(
                    f"{key}: the layout gives a shard of {list(p.local_shape())}, the model holds {list(p.local.shape)}"
                )
            _read_local(sliced, p, p.local.detach())
    if missing:
        raise LoadingError(
            f"{folder}: the safetensors files lack {len(missing)} tensors of the model, e.g. "
            f"{missing[:5]}; the folder holds another model than its config.json describes"
        )
    if (folder / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(folder)
    return model.eval()
