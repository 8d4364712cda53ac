"""auto_parallelize(): build a model on the meta device, parallelize it there, then initialise it shard by shard.

    model = auto_parallelize(grid, lambda: AutoModelForCausalLM.from_config(config))

The steps (the torchtitan recipe, with nothing of torch or transformers replaced):

    build        `build()` runs under `torch.device("meta")`: every tensor is shape and dtype only, no memory, no
                 random numbers drawn (transformers skips its weight initialisation on the meta device)
    parallelize  a transformers model goes through `parallelize` (its decoder layers become chained ParallelLinears,
                 on meta); in any other model every torch.nn.Linear becomes a default-mode ParallelLinear
    initialise   each rank materialises its own tensors (shard-sized) on `device`, then runs the model's own
                 initialisation in its own order. Inside a decoder layer the draws must be full-size to give the
                 serial values, so each layer is initialised as a full serial copy (one layer at a time), and this
                 rank's shards are cut out of it as the layer's layout says (engine/models/layout.py); modules
                 outside the layers are whole on every rank and are initialised in place.

What "the same initial weights as the serial model from the same seed" means here, precisely: from the same random
state, the full weights (engine.full_state_dict) equal, bit for bit, those of the serial model built on the meta device
and initialised the way transformers initialises a model built there (what from_pretrained does for the weights a
checkpoint lacks):

    with torch.device("meta"):
        serial = build()
    serial.to_empty(device=device)
    serial.tie_weights()             # to_empty unties tied weights
    serial.initialize_weights()      # transformers' own: post-order, each submodel with its own _init_weights

and the same random numbers are drawn. For a model that is not a transformers model, the initialisation is
`reset_parameters()` of every module that has one, in `model.modules()` order: for models made of torch.nn layers
that equals the ordinary `torch.manual_seed(s); build()`. A transformers model built the ordinary way draws other
numbers (its layers draw their torch defaults while being constructed, then transformers draws again), so its
weights differ from these; only the meta-device build can avoid materialising the whole model.

Every tensor must be written by that initialisation (a tensor left as materialised, or one an outer module's
initialisation rewrites after its decoder layer was cut into shards, raises ShardingError rather than train from
garbage).
"""

from __future__ import annotations

import copy
from typing import Callable

import torch
from torch import nn

from engine.core.grid import Grid
from engine.core.linear import ParallelLinear, ShardingError
from engine.core.placement import write_counts
from engine.models.adapter import Initialise, find_planned, transformers_init
from engine.models.layout import plan_of
from engine.models.parallelize import parallelize


def auto_parallelize(
    grid: Grid,
    build: Callable[[], nn.Module],
    *,
    overlap: bool = True,
    vocab_parallel: bool | None = None,
    device: torch.device | str | None = None,
) -> nn.Module:
    """The model `build()` returns, parallelized for `grid`, with the initial weights of the serial model built from
    the same random state (see the module doc for exactly which), without the whole full model ever existing on a rank
    (at most one full decoder layer at a time, besides the modules outside the layers that stay whole anyway).

    `device`: where the tensors live (default: torch's current default device). `overlap` and `vocab_parallel` mean
    what they mean for `parallelize`. Raises ShardingError as parallelize does, and when the model's initialisation
    leaves a tensor unwritten. Collective over the grid only where parallelize is.
    """
    device = torch.device(device) if device is not None else torch.get_default_device()
    with torch.device("meta"):  # a TorchFunctionMode for this block only: nothing is replaced process-wide
        model = build()
    if not isinstance(model, nn.Module):
        raise TypeError(f"auto_parallelize: build() must return a torch.nn.Module, got {type(model).__name__}")
    transformers_model = transformers_init(model) is not None
    # The decoder layers as serial copies (meta: no memory), taken before parallelize shards them.
    layers = [layer for _, stack, plan in find_planned(model) for layer in getattr(stack, plan.layers)]
    serial_layers = {id(layer): copy.deepcopy(layer) for layer in layers}
    if transformers_model:
        parallelize(model, grid, overlap=overlap, vocab_parallel=False)  # embeddings stay whole: initialised whole
    else:
        _refuse_tied(model)
        _linears_to_parallel(model, grid, overlap)
    _materialise(model, device)
    with torch.no_grad():
        written = _initialise(model, serial_layers, grid, device)
    _check_written(model, written)
    if transformers_model and vocab_parallel is not False:
        parallelize(model, grid, overlap=overlap, vocab_parallel=vocab_parallel)  # splits the vocabulary only
    return model


def _refuse_tied(model: nn.Module) -> None:
    """Raise ShardingError for a plain torch model with a tensor under two names: re-running every module's
    reset_parameters would let the later module overwrite the earlier one's draw (the serial model's value comes from
    the tie made after construction), and a Linear made parallel would untie it."""
    names: dict[int, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in names:
            raise ShardingError(
                f"{name} is tied to {names[id(param)]}: auto_parallelize cannot reproduce a plain torch model's "
                "tied initialisation; build the model, then engine.parallelize it"
            )
        names[id(param)] = name


def _linears_to_parallel(module: nn.Module, grid: Grid, overlap: bool, prefix: str = "") -> None:
    """Every torch.nn.Linear below `module` becomes a default-mode ParallelLinear (nn.Linear semantics per rank);
    subclasses of Linear stay as they are (their forward or parameters may differ)."""
    for name, child in module.named_children():
        path = f"{prefix}{name}"
        if type(child) is nn.Linear:
            setattr(module, name, ParallelLinear.from_linear(child, grid, mode="default", overlap=overlap, name=path))
        else:
            _linears_to_parallel(child, grid, overlap, f"{path}.")


def _materialise(module: nn.Module, device: torch.device) -> None:
    """Give every meta parameter and buffer below `module` uninitialised storage on `device` (same shape, dtype and
    flags), keeping tied tensors tied (Module.to_empty would untie them)."""
    done: dict[int, torch.Tensor] = {}
    for sub in module.modules():
        for name, param in sub.named_parameters(recurse=False):
            if id(param) not in done:
                fresh = nn.Parameter(torch.empty_like(param, device=device), requires_grad=param.requires_grad)
                fresh.__dict__.update(param.__dict__)
                done[id(param)] = fresh
            setattr(sub, name, done[id(param)])
        for name, buffer in sub.named_buffers(recurse=False):
            if id(buffer) not in done:
                done[id(buffer)] = torch.empty_like(buffer, device=device)
            sub._buffers[name] = done[id(buffer)]  # keeps the buffer's persistence


def _tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer below `module` by name (tied ones once)."""
    return {**dict(module.named_parameters()), **dict(module.named_buffers())}


def _check_written(module: nn.Module, written: dict[int, tuple[int, int]], where: str = "") -> None:
    """Refuse tensors the initialisation never wrote (version 0: as materialised) and, for tensors in `written`
    (id -> version once their layer was cut into shards), any write after that."""
    for name, tensor in _tensors(module).items():
        full_name = f"{where}{name}"
        if write_counts(tensor) == (0, 0):
            raise ShardingError(
                f"auto_parallelize: the model's initialisation never writes {full_name}; give its module an "
                "initialisation (transformers: _init_weights; torch: reset_parameters), or build the model serially "
                "and call engine.parallelize"
            )
        if id(tensor) in written and write_counts(tensor) != written[id(tensor)]:
            raise ShardingError(
                f"auto_parallelize: the model's initialisation writes {full_name} from outside its decoder layer, "
                "after the layer was sharded; build the model serially and call engine.parallelize"
            )


def _initialise(
    model: nn.Module, serial_layers: dict[int, nn.Module], grid: Grid, device: torch.device
) -> dict[int, tuple[int, int]]:
    """Run the model's own initialisation on the materialised parallel `model`, decoder layers through their serial
    copies; returns the versions of the sharded layers' tensors right after their shards were cut."""
    root_init = transformers_init(model)
    if root_init is None:  # torch modules: reset_parameters, ParallelLinear's drawing full-size and keeping its shard
        for module in model.modules():
            if callable(getattr(module, "reset_parameters", None)):
                module.reset_parameters()
        return {}
    written: dict[int, tuple[int, int]] = {}

    def visit(module: nn.Module, init: Initialise, where: str) -> None:
        # transformers' order (PreTrainedModel.initialize_weights): children first, then the module, each submodel
        # (a PreTrainedModel inside) with its own initialisation
        for name, child in module.named_children():
            child_init = transformers_init(child) or init
            if id(child) in serial_layers:
                _initialise_layer(serial_layers.pop(id(child)), child, child_init, grid, device, f"{where}{name}.")
                written.update((id(t), write_counts(t)) for t in _tensors(child).values())
            else:
                visit(child, child_init, f"{where}{name}.")
        init(module)

    visit(model, root_init, "")
    return written


def _initialise_layer(
    serial: nn.Module, layer: nn.Module, init: Initialise, grid: Grid, device: torch.device, where: str
) -> None:
    """Initialise the decoder layer `serial` (a full serial copy) in transformers' order, then load this rank's shards
    of it into the parallelized `layer`; the full copy is freed afterwards."""

    def visit(module: nn.Module) -> None:
        for child in module.children():
            visit(child)
        init(module)

    _materialise(serial, device)
    visit(serial)
    _check_written(serial, {}, where)
    full = serial.state_dict()
    with torch.no_grad():  # this rank's part of every tensor, as the layer's layout cuts it
        for p in plan_of(layer, grid).params.values():
            value = full[p.key].t() if p.serial_transposed else full[p.key]
            p.local.copy_(p.take_local(value) if p.split else value)
    for name, buffer in serial.named_buffers():  # non-persistent buffers are not in the state dict
        layer.get_buffer(name).copy_(buffer)
