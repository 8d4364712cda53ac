"""The seam between a plain model and the engine: parallelize().

Layout of a parallelized transformer (U = the rows of this rank's x*y group):

    outside the decoder      lm_head and the loss: unsharded, applied to each rank's OWN rows with all
                             features; seen from outside, the world does data parallelism
    input embeddings         looked up for own rows, then gathered over x*y together with the attention
                             mask and position ids: the module that owns the decoder layers (LlamaModel,
                             GPT2Model) runs on U rows, replicated over x and y, so every rank of the
                             group builds the same masks and rotary tables
    decoder layers           attention q/k/v and MLP gate/up (GPT-2 c_attn/c_fc) are "normal"
                             ParallelLinears whose outputs are split over y: each rank runs the attention
                             of its y-slice of heads and kv heads; o_proj/down (c_proj) are "transposed"
                             and bring back all features; norms run replicated
    leaving                  each rank keeps its own rows of the final hidden states

That is the "own" rows layout, the default: every rank reads its own rows of a step. In the "shared" layout (after
AxoNN), selected at run time by `rows_layout(model, "shared")` (engine.training.train does it for TrainConfig.rows),
every rank of an x*y group reads the SAME rows U: the stack neither gathers on entry nor splits on exit, and embeddings,
lm_head and loss run on U replicated over x and y (a vocabulary-parallel embedding and lm_head then exchange rows
over z only, engine/core/vocab_parallel.py). Rows are split over data and z only. A default-mode ParallelLinear skips
its row gather likewise. Models are parallelized the same way for both layouts; only the hooks' behaviour changes.

Gradients of parameters therefore mean different things (see engine.training.state.sync_gradients): ParallelLinear
shards sum the rows of their x*y*z group, modules inside the decoder the rows of their x*y group, and
the embeddings and everything outside the rows of one rank (in the shared layout: the rows of its x*y group,
replicated over x and y, like the decoder modules).
"""

from __future__ import annotations

import functools
import inspect
import types
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Iterator

import torch
from torch import nn

from engine.core import comm
from engine.core.functional import copy_to_group, gather_from_group, reduce_from_group, split_to_group
from engine.core.grid import Grid
from engine.core.linear import ParallelLinear, ShardingError
from engine.core.vocab_parallel import can_shard_vocab, is_vocab_parallel, shard_vocab
from engine.models.adapter import (
    FUSED_NAMES,
    POSITION_TABLE_KEYS,
    STACK_PASS_THROUGH,
    STACK_ROW_INPUTS,
    ModelPlan,
    cache_argument,
    check_stack_supported,
    find_planned,
    head_counts,
    is_conv1d,
    localize_heads,
    rms_norm_eps,
)
from engine.models.family import FamilyAdapter
from engine.models.layout import (
    PLAN_ATTR,
    ROWS_MODE,
    describe,
    place_parameters,
    planned_stacks,
    recorded,
)
from engine.spec import OWN, RowsLayout, check_rows_layout, row_gather_axes

# What parallelize records, by module path, of the rows a module's parameters see (the layout's regions, read by
# engine.training.state.sync_gradients): "layer" = the rows of its x*y group, replicated over x and y; "heads" = the
# same rows but this y rank's heads only; "rows" = this rank's own rows. Modules without one inherit their parent's.
Regions = dict[str, str]


@contextmanager
def rows_layout(model: nn.Module, layout: RowsLayout) -> Iterator[None]:
    """Run a parallelized `model` in the rows `layout` ("own" or "shared", see the module doc) inside the block,
    then restore the layout it had. Every rank must use the same layout. Nothing else changes (parameters, state
    dicts, checkpoints). Raises ValueError for an unknown layout.

    The model's plan (and that of each parallelized model inside it) is recorded again with `layout`, and the modules
    whose forward reads it (ParallelLinear, the vocabulary-parallel tables, the row hooks of planned base models) run
    in it, as a mode like `training`; the grid, which other models share, holds no layout."""
    check_rows_layout(layout)
    plans = [(module, module.__dict__[PLAN_ATTR]) for module in model.modules() if PLAN_ATTR in module.__dict__]
    modes = [(module, module.__dict__[ROWS_MODE]) for module in model.modules() if ROWS_MODE in module.__dict__]
    try:
        for module, plan in plans:
            module.__dict__[PLAN_ATTR] = replace(plan, rows=layout)
        for module, _ in modes:
            module.__dict__[ROWS_MODE] = layout
        yield
    finally:
        for module, plan in plans:
            module.__dict__[PLAN_ATTR] = plan
        for module, mode in modes:
            module.__dict__[ROWS_MODE] = mode


# ----- decoder layers, through the model's plan (engine/models/adapter.py) --------------------------------------


def _to_parallel(
    parent: nn.Module, attr: str, mode: str, grid: Grid, overlap: bool, name: str, out_order: torch.Tensor | None = None
) -> ParallelLinear:
    """Replace parent.<attr> (nn.Linear or GPT-2 Conv1D) by a ParallelLinear in `mode`.

    `out_order` regroups the output features of a fused projection before sharding (see ParallelLinear).
    """
    module = getattr(parent, attr)
    if isinstance(module, ParallelLinear):
        raise ShardingError(f"{name} is sharded already; build the model again to parallelize it for this grid")
    if isinstance(module, nn.Linear):
        weight, layout = module.weight, "linear"
    elif is_conv1d(module):  # GPT-2 stores its weight as (in, out)
        weight, layout = module.weight.t(), "conv1d"
    else:
        raise ShardingError(f"{name}: cannot shard a {type(module).__name__}; expected nn.Linear or Conv1D")
    layer = ParallelLinear.from_weights(
        weight, module.bias, grid, mode=mode, overlap=overlap, name=name, out_order=out_order
    ).train(module.training)
    layer.serial_layout = layout
    layer.weight.requires_grad_(module.weight.requires_grad)  # a Conv1D's transposed view has none under no_grad
    setattr(parent, attr, layer)
    return layer


def _out_features(module: nn.Module) -> int:
    if isinstance(module, nn.Linear):
        return module.out_features
    return int(module.weight.shape[-1])  # GPT-2 Conv1D: (in, out)


def _grouped_order(sizes: list[int], n_y: int, name: str) -> torch.Tensor | None:
    """Output order of a fused projection whose features are the blocks `sizes` in turn, regrouped so that y slice
    i holds slice i of every block ([q_i | k_i | v_i], [gate_i | up_i]); None when y is 1."""
    if n_y == 1:
        return None
    if any(size % n_y for size in sizes):
        raise ShardingError(
            f"{name}: its fused blocks of {sizes} features are not divisible by y={n_y}; choose y dividing each of them"
        )
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return torch.cat(
        [
            torch.arange(start + i * (size // n_y), start + (i + 1) * (size // n_y))
            for i in range(n_y)
            for start, size in zip(starts, sizes)
        ]
    )


def fused_sizes(fused: str, out: int, config: Any, name: str) -> list[int]:
    """The feature blocks of a fused projection of `out` output features (its family adapter's `fused`: "blocks"
    [q | k | v], "halves" [gate | up], "per_head" [q_h k_h v_h] head after head, whose contiguous slices are whole
    heads); ShardingError when `out` does not match the config's heads."""
    heads, kv_heads, head_dim = head_counts(config)
    if fused == "blocks":
        sizes = [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
    elif fused == "halves":
        sizes = [out // 2, out // 2]
    else:
        sizes = [3 * heads * head_dim]
    if sum(sizes) != out or (fused == "per_head" and kv_heads != heads):
        raise ShardingError(
            f"{name}: {out} output features do not match a fused {fused} projection of {heads} "
            f"heads, {kv_heads} key/value heads of {head_dim}"
        )
    return sizes


def _fused_order(module: nn.Module, fused: str, config: Any, n_y: int, name: str) -> torch.Tensor | None:
    """The out_order of a fused projection (its family adapter's `fused`), its shape checked."""
    sizes = fused_sizes(fused, _out_features(module), config, name)
    return None if fused == "per_head" else _grouped_order(sizes, n_y, name)


def _y_sharded_rms_norm(norm: nn.Module, hidden: torch.Tensor, *, grid: Grid, eps: float) -> torch.Tensor:
    """An RMSNorm over a projection's whole width, run on this y rank's slice of it (B, T, width/Y): the mean
    square is summed over y (its gradient too: every y rank's slice depends on it), the weight is the rank's slice
    of the full, replicated weight (whose gradient is therefore partial over y, the "heads" region)."""
    group = grid.group("y")
    local = hidden.shape[-1]
    start = grid.coord("y") * local
    dtype = hidden.dtype
    hidden = hidden.to(torch.float32)
    square_sum = reduce_from_group(copy_to_group(hidden.pow(2).sum(-1, keepdim=True), group), group)
    hidden = hidden * torch.rsqrt(square_sum / norm.weight.shape[0] + eps)
    return (norm.weight[start : start + local] * hidden).to(dtype)


def _head_rows_norm(norm: nn.Module, hidden: torch.Tensor, *, grid: Grid) -> torch.Tensor:
    """Run `norm`, whose weight holds one row per head (heads, head_dim), on this y rank's heads (..., heads/Y,
    head_dim): its own forward with the rows of those heads (a slice of the full, replicated weight, whose gradient
    is therefore partial over y, the "heads" region)."""
    full = norm._parameters["weight"]
    rows = full.shape[0] // grid.size("y")
    norm._parameters["weight"] = full[grid.coord("y") * rows : (grid.coord("y") + 1) * rows]
    try:
        return type(norm).forward(norm, hidden)
    finally:
        norm._parameters["weight"] = full


@torch.no_grad()
def _normalizes_each_head(norm: nn.Module, n_y: int) -> bool:
    """True when `norm` (weight (heads, head_dim)) treats each head on its own, as _head_rows_norm assumes: checked
    on random input, full against each y share of the heads with its rows of the weight."""
    full = norm._parameters["weight"]
    heads, head_dim = full.shape
    if heads % n_y:
        return False
    sample = torch.randn(1, 2, heads, head_dim, generator=torch.Generator().manual_seed(0)).to(full)
    try:
        expected = type(norm).forward(norm, sample)
        rows = heads // n_y
        for i in range(n_y):
            norm._parameters["weight"] = full[i * rows : (i + 1) * rows]
            part = type(norm).forward(norm, sample[:, :, i * rows : (i + 1) * rows])
            if part.shape != expected[:, :, i * rows : (i + 1) * rows].shape or not torch.allclose(
                part, expected[:, :, i * rows : (i + 1) * rows]
            ):
                return False
    except RuntimeError:  # shapes the norm does not accept
        return False
    finally:
        norm._parameters["weight"] = full
    return True


def _plan_block_children(
    parent: nn.Module, planned: set[str], widths: set[int], head_dim: int, grid: Grid, name: str, regions: Regions
) -> None:
    """Handle the modules with parameters beside the sharded projections of `parent` (an attention or an MLP),
    which run on this y rank's heads: norms per head (weight of head_dim) and RMSNorms over a whole projection
    (OLMo2's q_norm/k_norm). Raise ShardingError for anything else."""
    if list(parent.parameters(recurse=False)):
        raise ShardingError(f"{name}: {type(parent).__name__} holds its own parameters; the engine cannot shard them")
    for child_name, child in parent.named_children():
        if child_name in planned or not list(child.parameters()):
            continue
        kind = beside_kind(child, widths, head_dim, grid.size("y"))
        if kind is None:
            raise ShardingError(
                f"{name}.{child_name} ({type(child).__name__}) has parameters the engine cannot shard by heads"
            )
        if kind == "y_norm" and grid.size("y") > 1:
            eps = rms_norm_eps(child)
            child.forward = types.MethodType(functools.partial(_y_sharded_rms_norm, grid=grid, eps=eps), child)
        elif kind == "head_rows" and grid.size("y") > 1:  # each rank uses its heads' rows of the weight
            child.forward = types.MethodType(functools.partial(_head_rows_norm, grid=grid), child)
        regions[f"{name}.{child_name}"] = "heads"  # runs on this rank's heads: its gradient is partial over y


def beside_kind(child: nn.Module, widths: set[int], head_dim: int, n_y: int) -> str | None:
    """How parallelize runs a module with parameters beside an attention's or MLP's sharded projections: "per_head"
    (a norm of head_dim applied to each head), "y_norm" (an RMSNorm over a whole projection of one of `widths`
    features, OLMo2's q_norm/k_norm: its statistics summed over y), "head_rows" (a weight row per head, Cohere's
    q_norm/k_norm, confirmed on random input unless on the meta device); None when it cannot be sharded by heads."""
    params = dict(child.named_parameters())
    weight = params.get("weight")
    if set(params) != {"weight"}:
        return None
    if weight.dim() == 1 and weight.numel() == head_dim:
        return "per_head"
    if weight.dim() == 1 and weight.numel() in widths and rms_norm_eps(child) is not None:
        return "y_norm"
    if weight.dim() == 2 and weight.shape[1] == head_dim and (weight.is_meta or _normalizes_each_head(child, n_y)):
        return "head_rows"
    return None


def _check_heads(name: str, heads: int, kind: str, grid: Grid) -> None:
    if heads % grid.size("y"):
        raise ShardingError(
            f"{name}: {heads} {kind} are not divisible by y={grid.size('y')} (each y rank runs "
            f"an equal share of the heads); choose y dividing {heads}"
        )


def refuse_unconfirmed_fusion(module: nn.Module, attr: str, family: str, config: Any, name: str) -> None:
    """Raise ShardingError when a column-split projection looks fused ([q | k | v] or [gate | up] in one Linear, by
    its name or its width) but its family's feature order is not confirmed in its adapter (engine/models/families/):
    splitting it by contiguous slices would hand each y rank a mix of q, k and v features."""
    out = _out_features(module)
    heads, kv_heads, head_dim = head_counts(config)
    fused_widths = {heads * head_dim + 2 * kv_heads * head_dim, 3 * heads * head_dim} - {heads * head_dim}
    intermediate = getattr(config, "intermediate_size", None)
    # one MLP width for every layer (Gemma 3n lists one per layer: those widths are not fused candidates)
    widths = [intermediate] if isinstance(intermediate, int) and intermediate > 0 else []
    fused_widths.update(2 * width for width in widths)
    fused_widths -= {heads * head_dim, kv_heads * head_dim, *widths}
    named = any(part in attr.lower() for part in FUSED_NAMES)
    if named or out in fused_widths:
        raise ShardingError(
            f"{family}: {name} looks like a fused projection ({out} output features) whose feature order the "
            "engine has not confirmed for this family, so it cannot split its heads over y; use a grid with y=1 "
            "(x, z and data do not split heads)"
        )


def _plan_layer(
    layer: nn.Module, name: str, plan: ModelPlan, config: Any, grid: Grid, overlap: bool, regions: Regions
) -> list[ParallelLinear]:
    """Shard one decoder layer's projections as `plan` says; the ParallelLinears in forward order."""
    n_y = grid.size("y")
    heads, kv_heads, head_dim = head_counts(config)
    if n_y > 1 and any(p.mode == "normal" for p in plan.projections):
        _check_heads(name, heads, "attention heads", grid)
        _check_heads(name, kv_heads, "key/value heads", grid)
    built: list[ParallelLinear] = []
    parents: dict[int, tuple[nn.Module, str, set[str], set[int]]] = {}
    for projection in plan.projections:
        parent_path, _, attr = projection.path.rpartition(".")
        try:
            parent = layer.get_submodule(parent_path) if parent_path else layer
        except AttributeError:
            raise ShardingError(
                f"{plan.family}: {name} ({type(layer).__name__}) has no {parent_path} named in the family's "
                "tensor-parallel plan (its layers are not all of one kind); use a grid without x, y and z (data "
                "parallelism, optionally with ZeRO)"
            ) from None
        full_name = f"{name}.{projection.path}"
        module = getattr(parent, attr, None)
        if module is None:
            raise ShardingError(f"{full_name}: named in {plan.family}'s tensor-parallel plan but not in the model")
        order = None
        if projection.fused is not None and projection.mode == "normal":
            order = _fused_order(module, projection.fused, config, n_y, full_name)
        elif projection.mode == "normal" and n_y > 1:
            refuse_unconfirmed_fusion(module, attr, plan.family, config, full_name)
        parent_name = f"{name}.{parent_path}" if parent_path else name
        _, planned, widths = parents.setdefault(id(parent), (parent, parent_name, set(), set()))[1:]
        planned.add(attr)
        if projection.mode == "normal":
            widths.add(_out_features(module))
        if grid.size("x", "y", "z") == 1 and not (isinstance(module, nn.Linear) or is_conv1d(module)):
            continue  # a wrapper (peft's LoRA layer) on a grid without tensor parallelism: nothing to shard
        built.append(_to_parallel(parent, attr, projection.mode, grid, overlap, full_name, order))
    for parent, parent_name, planned, widths in parents.values():
        _plan_block_children(parent, planned, widths, head_dim, grid, parent_name, regions)
        localize_heads(parent, config, n_y, parent_name)
    return built


def decoder_stacks(model: nn.Module) -> list[tuple[str, nn.Module, str, nn.ModuleList]]:
    """(name, base model, list name, list) for every base model inside `model` whose plan names its ModuleList of
    decoder layers (engine/models/adapter.py)."""
    return [(name, base, plan.layers, getattr(base, plan.layers)) for name, base, plan in find_planned(model)]


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of `model` in order, as its plan names them (engine/models/adapter.py); [] if none."""
    return [layer for *_, layers in decoder_stacks(model) for layer in layers]


def _rows_of(value: Any, n_rows: int, name: str, group) -> Any:
    """Gather `value` over the x*y group when its batch dim holds this rank's rows (dim 0 of size 1 with
    more rows is a broadcast and stays)."""
    if value is None:
        return None
    if not isinstance(value, torch.Tensor):
        raise ShardingError(
            f"input {name} of a parallelized model is a {type(value).__name__}; the engine only distributes tensors"
        )
    if value.dim() == 0 or (value.shape[0] == 1 and n_rows != 1):
        return value
    if value.shape[0] != n_rows:
        raise ShardingError(f"input {name} has batch dim {value.shape[0]} but the model got {n_rows} rows")
    return gather_from_group(value, group, 0)


def _own_rows(value: Any, n_rows: int, group) -> Any:
    """This rank's rows of a replicated x*y-gathered output (tensors whose dim 0 has n_rows * group.size)."""
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == n_rows * group.size:
        return split_to_group(value, group, 0)
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_own_rows(v, n_rows, group) for v in value)
    return value


def _agree_on_row_inputs(arguments: dict, n_rows: int, seq_len: int, group, device: torch.device) -> None:
    """Make the attention mask and position ids distributable alike on every rank of the x*y group.

    Ranks may legitimately differ (HF generate drops an all-ones mask on one rank and keeps a padded
    one on another), but the row gathers are collectives: one small exchange of shapes decides for all.
    A rank without a 2-D mask uses all ones (what no mask means); without position ids, the default
    positions after the cache; broadcast (1, ...) tensors are expanded when another rank has per-row ones.
    """
    mask, positions = arguments.get("attention_mask"), arguments.get("position_ids")
    for key, value in (("attention_mask", mask), ("position_ids", positions)):
        if value is not None and not isinstance(value, torch.Tensor):
            raise ShardingError(
                f"input {key} of a parallelized model is a {type(value).__name__} (e.g. a multimodal wrapper's masks "
                "by layer type); the engine distributes tensors only: use a grid with x=1 and y=1"
            )
    cache = cache_argument(arguments)
    past = cache.get_seq_length() if cache is not None and hasattr(cache, "get_seq_length") else 0
    mine = [
        n_rows,
        seq_len,
        int(mask is not None),
        mask.dim() if mask is not None else 0,
        mask.shape[-1] if mask is not None else 0,
        mask.shape[0] if mask is not None else 0,
        int(positions is not None),
        positions.shape[0] if positions is not None else 0,
    ]
    everyone = comm.exchange_ints(mine, group, device)
    if any(r[:2] != [n_rows, seq_len] for r in everyone):
        raise ShardingError(
            f"every rank of an x*y group must feed the same number of rows and tokens; got "
            f"(rows, tokens) {[tuple(r[:2]) for r in everyone]} on ranks {list(group.ranks)}"
        )
    if any(r[2] for r in everyone):
        if not all(r[2] for r in everyone) and any(r[2] and r[3] != 2 for r in everyone):
            raise ShardingError(
                "some ranks of an x*y group pass a 4-D attention mask and others none; pass masks on every rank"
            )
        if mask is None:
            mask = torch.ones(n_rows, max(r[4] for r in everyone), dtype=torch.long, device=device)
        elif mask.dim() == 2:
            mask = mask.long()  # one dtype on every rank for the gather (HF accepts long 2-D masks)
        if not _broadcast_everywhere(everyone, 2, 5, n_rows):
            arguments["attention_mask"] = mask.expand(n_rows, *mask.shape[1:])
    if any(r[6] for r in everyone):
        if positions is None:
            positions = torch.arange(past, past + seq_len, device=device).unsqueeze(0)
        if not _broadcast_everywhere(everyone, 6, 7, n_rows):
            arguments["position_ids"] = positions.expand(n_rows, *positions.shape[1:])


def _broadcast_everywhere(everyone: list[list[int]], present: int, first_dim: int, n_rows: int) -> bool:
    """True when every rank passes the input with a batch dim of 1 that broadcasts over its rows."""
    return n_rows > 1 and all(r[present] and r[first_dim] == 1 for r in everyone)


def _install_stack_hooks(stack: nn.Module, grid: Grid) -> None:
    """Run `stack` (the module that owns the decoder layers) on the rows of the whole x*y group.

    On entry the input embeddings are looked up for this rank's own rows (so the embedding's gradient
    covers own rows, like an lm_head tied to it), then embeddings, attention mask and position ids are
    gathered over x*y: every rank of the group runs the same mask and rotary set-up on the same rows,
    so they all agree. On exit each rank keeps its own rows of the hidden states.
    """
    group = grid.group("x", "y")
    signature = inspect.signature(stack.forward)

    def enter(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        if not row_gather_axes(module.rows_layout):
            return None  # the inputs already hold the group's rows, the same on every rank of x*y
        bound = signature.bind(*args, **kwargs)
        arguments = bound.arguments
        input_ids, embeds = arguments.get("input_ids"), arguments.get("inputs_embeds")
        if (input_ids is None) == (embeds is None):
            raise ShardingError("a parallelized model needs exactly one of input_ids and inputs_embeds")
        source = input_ids if embeds is None else embeds
        n_rows = source.shape[0]
        # before the lookup: a vocabulary-parallel embedding gathers the ids, which needs equal shapes
        _agree_on_row_inputs(arguments, n_rows, source.shape[1], group, source.device)
        if embeds is None:
            embeds = module.get_input_embeddings()(input_ids)  # `module`, not a captured one: deepcopy-safe
            arguments["input_ids"] = None
        arguments["inputs_embeds"] = gather_from_group(embeds, group, 0)
        for key, value in list(arguments.items()):
            if key in ("input_ids", "inputs_embeds"):
                continue
            if key in STACK_ROW_INPUTS:
                arguments[key] = _rows_of(value, n_rows, key, group)
            elif key == "kwargs":
                for k, v in value.items():
                    if isinstance(v, torch.Tensor) and k not in STACK_PASS_THROUGH:
                        raise ShardingError(
                            f"input {k} of a parallelized model is a tensor the engine does not know how to distribute"
                        )
            elif isinstance(value, torch.Tensor) and key not in STACK_PASS_THROUGH:
                raise ShardingError(
                    f"input {key} of a parallelized model is a tensor the engine does not know how to distribute"
                )
        # call by keyword: decorators around HF forwards may add keywords of their own
        extra = arguments.pop("kwargs", {})
        return (), {**arguments, **extra}

    def leave(module: nn.Module, args: tuple, output: Any) -> Any:
        if not row_gather_axes(module.rows_layout):
            return None
        hidden = output if isinstance(output, torch.Tensor) else output[0]
        n_rows = hidden.shape[0] // group.size  # the rows each rank fed the stack (dim 0: rows * group.size)
        if isinstance(output, torch.Tensor):
            return _own_rows(output, n_rows, group)
        if isinstance(output, tuple):  # return_dict=False
            return (_own_rows(output[0], n_rows, group), *output[1:])
        for key in ("last_hidden_state", "hidden_states"):  # a ModelOutput
            if output.get(key) is not None:
                output[key] = _own_rows(output[key], n_rows, group)
        return output

    stack.rows_layout = OWN  # the hooks' mode (rows_layout sets it with the parallel modules')
    stack.register_forward_pre_hook(enter, with_kwargs=True)
    stack.register_forward_hook(leave)


def refuse_other_lookups(stack: nn.Module, plan: ModelPlan, stack_name: str) -> None:
    """Raise ShardingError when the base model `stack` holds an embedding table, outside its decoder layers, other than
    its input embeddings and a table of positions: the stack hooks hand the base model looked-up embeddings of the
    x*y group's rows and no token ids, so a second lookup of the ids (Gemma 3n's per-layer embeddings) would be
    skipped or run on other rows."""
    layers = getattr(stack, plan.layers)
    inside_layers = {id(m) for m in layers.modules()}
    positions = {getattr(stack.config, key, None) for key in POSITION_TABLE_KEYS} - {None}
    own = stack.get_input_embeddings()
    for name, module in stack.named_modules():
        if id(module) in inside_layers or module is own or not isinstance(module, nn.Embedding):
            continue
        if module.num_embeddings in positions and module.num_embeddings != getattr(stack.config, "vocab_size", None):
            continue  # read by position ids, which the hooks gather with the rows
        where = f"{stack_name}.{name}" if stack_name else name
        raise ShardingError(
            f"{plan.family}: {where} ({type(module).__name__}) is a second embedding table outside the decoder layers, "
            "which the engine's row exchange does not cover; use a grid with x=1 and y=1 (z and data only)"
        )


def _first_line(error: BaseException, limit: int = 160) -> str:
    """The start of an exception's message, on one line, for a refusal that must stay one line."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _plan_stack(
    stack_name: str, stack: nn.Module, plan: ModelPlan, grid: Grid, overlap: bool, regions: Regions
) -> None:
    """Shard the decoder layers of base model `stack` (named `stack_name` in the model) as `plan` says, install its
    row hooks and record its regions; raises ShardingError for what the engine cannot shard."""
    tensor_parallel = grid.size("x", "y", "z") > 1
    if not hasattr(stack, "get_input_embeddings"):
        raise ShardingError(f"{stack_name}: {type(stack).__name__} has no get_input_embeddings()")
    check_stack_supported(plan, stack.config, tensor_parallel)
    if grid.size("x", "y") > 1:
        refuse_other_lookups(stack, plan, stack_name)
    prefix = f"{stack_name}.{plan.layers}" if stack_name else plan.layers
    order: list[ParallelLinear] = []  # the sharded linears in the order a forward calls them
    for index, layer in enumerate(getattr(stack, plan.layers)):
        if not plan.unsupported:  # else a grid without tensor parallelism (checked above): nothing to shard
            order += _plan_layer(layer, f"{prefix}.{index}", plan, stack.config, grid, overlap, regions)
    for current, following in zip(order, order[1:]):
        current.prefetch_before(following)
    regions[stack_name] = "layer"
    embeddings = stack.get_input_embeddings()
    embeddings_path = next(path for path, module in stack.named_modules() if module is embeddings)
    regions[".".join(p for p in (stack_name, embeddings_path) if p)] = "rows"
    if grid.size("x", "y") > 1:
        _install_stack_hooks(stack, grid)


def parallelize(
    model: nn.Module,
    grid: Grid,
    *,
    overlap: bool = True,
    vocab_parallel: bool | None = None,
    families: tuple[FamilyAdapter, ...] | None = None,
) -> nn.Module:
    """Shard `model` in place for `grid` and return it; the weights are kept exactly.

    Every transformers base model inside `model` (LlamaModel, GPTNeoXModel, GPT2Model, ...) is sharded through its
    plan (engine/models/adapter.py: the tensor-parallel plan its config declares, or its family adapter's, e.g.
    engine/models/families/gpt2.py): the projections named there become chained ParallelLinears (attention heads and
    MLP split over y), the base model runs on the rows of the x*y group (see the module doc); lm_head stays unsharded
    and sees each rank's own rows, as do the input embeddings. Works on a model on the meta device too
    (engine.auto_parallelize). `vocab_parallel` splits the input embeddings and lm_head by vocabulary rows over x*y*z
    (engine/core/vocab_parallel.py); None (default) does so whenever the grid has tensor parallelism and the split is
    exact (vocabulary divisible by x*y*z, plain nn.Embedding and bias-free lm_head), True insists (ShardingError
    with the reason otherwise), False keeps them whole on every rank. Raises ShardingError for dimensions that do
    not divide, for modules or plan entries the engine cannot shard (e.g. mixture-of-experts layers), and for a
    model without a plan when the grid has tensor-parallel axes. `families`: the family adapters to look the model's
    family up in (engine/models/family.py; None: engine.models.families.known_families()), e.g. with one more.
    """
    tensor_parallel = grid.size("x", "y", "z") > 1
    found = find_planned(model, families)
    regions, stacks_done = recorded(model)  # of a model parallelized before, or a wrapper around one
    planned = {id(stack): stack_grid for _, stack, stack_grid in planned_stacks(model)}
    for stack_name, stack, plan in found:
        if planned.get(id(stack)) is grid:
            continue
        if id(stack) in planned:
            raise ShardingError(f"{stack_name or type(stack).__name__} is already parallelized on another grid")
        try:
            _plan_stack(stack_name, stack, plan, grid, overlap, regions)
            stacks_done.append(stack_name)
        except ShardingError:
            raise
        except Exception as error:  # noqa: BLE001 - the family's code did something the plan did not foresee
            where = stack_name or type(stack).__name__
            raise ShardingError(
                f"{plan.family}: the engine cannot shard {where} ({type(error).__name__} while planning it: "
                f"{_first_line(error)}); "
                "use a grid without x, y and z (data parallelism, optionally with ZeRO)"
            ) from error
    if not found and tensor_parallel:
        raise ShardingError(
            f"parallelize found no decoder layers it can shard in {type(model).__name__} (it reads "
            "the tensor-parallel plan of transformers models); build other models from "
            "engine.ParallelLinear"
        )
    already = hasattr(model, "get_input_embeddings") and is_vocab_parallel(model.get_input_embeddings())
    if (
        found and vocab_parallel is not False and not already
    ):  # a wrapper (e.g. a LightningModule): can_shard_vocab says why not
        if vocab_parallel or can_shard_vocab(model, grid) is None:
            shard_vocab(model, grid)  # the layout gives its tables the "tensor" region: summed over data only
    # the one record of what every rank holds (engine/models/layout.py), read by gradient sync, checkpoints and loading
    layout = describe(model, grid, regions, tuple(dict.fromkeys(stacks_done)))
    place_parameters(model, layout)
    model.__dict__[PLAN_ATTR] = layout.unbound()
    return model
