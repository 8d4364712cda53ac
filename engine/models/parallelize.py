"""The seam between a plain model and the engine: parallelize() and auto_parallelize().

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

import inspect
from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch import nn
from torch.nn.modules.linear import Linear as _TorchLinear  # the real class, even while auto_parallelize runs

from engine.core import comm
from engine.core.functional import gather_from_group, split_to_group
from engine.core.grid import Grid
from engine.core.linear import ROWS_ATTR, ParallelLinear, ShardingError, current_rows_layout
from engine.core.vocab_parallel import can_shard_vocab, is_vocab_parallel, shard_vocab
from engine.spec import check_rows_layout, row_gather_axes

# Attention classes whose forward works with a local (per-y-slice) number of heads: they reshape with
# view(*input_shape, -1, head_dim) and take the grouping from num_key_value_groups (checked by tests for
# Llama, Mistral, Qwen2 and Qwen3).
LLAMA_FAMILY_ATTENTION = ("LlamaAttention", "MistralAttention", "Qwen2Attention", "Qwen3Attention")

# On module objects: which rows a module's parameters see (engine.training.state.sync_gradients reads it):
# "layer" = the rows of its x*y group, replicated over x and y; "heads" = the same rows but this y rank's
# heads only; "rows" = this rank's own rows. Modules without it inherit their parent's.
REGION_ATTR = "_engine_region"

@contextmanager
def rows_layout(model: nn.Module, layout: str) -> Iterator[None]:
    """Run a parallelized `model` in the rows `layout` ("own" or "shared", see the module doc) inside the block,
    then restore the layout it had. Every rank must use the same layout. Nothing else changes (parameters, state
    dicts, checkpoints). Raises ValueError for an unknown layout."""
    check_rows_layout(layout)
    touched = [m for m in model.modules() if m is model or hasattr(m, "_engine_stack_grid")
               or isinstance(m, ParallelLinear) or is_vocab_parallel(m)]
    before = [m.__dict__.get(ROWS_ATTR) for m in touched]
    for module in touched:
        setattr(module, ROWS_ATTR, layout)
    try:
        yield
    finally:
        for module, old in zip(touched, before):
            if old is None:
                module.__dict__.pop(ROWS_ATTR, None)
            else:
                setattr(module, ROWS_ATTR, old)


# ----- decoder layers ---------------------------------------------------------------------------------

def _is_llama_layer(module: nn.Module) -> bool:
    attn, mlp = getattr(module, "self_attn", None), getattr(module, "mlp", None)
    return (attn is not None and mlp is not None
            and all(isinstance(getattr(attn, n, None), nn.Linear) for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
            and all(isinstance(getattr(mlp, n, None), nn.Linear) for n in ("gate_proj", "up_proj", "down_proj")))


def _is_gpt2_layer(module: nn.Module) -> bool:
    return type(module).__name__ == "GPT2Block"


def _fresh_param(old: nn.Parameter, data: torch.Tensor) -> nn.Parameter:
    new = nn.Parameter(data, requires_grad=old.requires_grad)
    new.__dict__.update({k: v for k, v in old.__dict__.items() if not k.startswith("_engine")})
    return new


def _to_parallel(parent: nn.Module, attr: str, mode: str, grid: Grid, overlap: bool, name: str,
                 out_order: torch.Tensor | None = None) -> ParallelLinear:
    """Replace parent.<attr> (nn.Linear, GPT-2 Conv1D or ParallelLinear) by a ParallelLinear in `mode`.

    `out_order` regroups the output features of a fused projection before sharding (see ParallelLinear).
    """
    module = getattr(parent, attr)
    if isinstance(module, ParallelLinear):  # built by auto_parallelize: move to the chained layout
        if module.grid is not grid:
            raise ShardingError(f"{name} is already sharded on another grid; build the model again for this grid")
        module.name, module.overlap = name, overlap
        if out_order is not None:  # through the full tensors, one layer at a time
            weight, bias = module.full_weight(), module.full_bias()
            module.out_order = out_order
            module.weight = _fresh_param(module.weight, module.shard_weight(weight).clone())
            if bias is not None:
                module.bias = _fresh_param(module.bias, module.shard_bias(bias).clone())
        return module.reshard_(mode)
    if isinstance(module, nn.Linear):
        weight, layout = module.weight, "linear"
    elif type(module).__name__ == "Conv1D":  # GPT-2 stores its weight as (in, out)
        weight, layout = module.weight.t(), "conv1d"
    else:
        raise ShardingError(f"{name}: cannot shard a {type(module).__name__}; expected nn.Linear or Conv1D")
    bias = module.bias
    layer = ParallelLinear.__new__(ParallelLinear)
    layer._setup(weight.shape[1], weight.shape[0], bias is not None, grid=grid, mode=mode, overlap=overlap,
                 name=name, device=weight.device, dtype=weight.dtype)
    layer.serial_layout, layer.out_order = layout, out_order
    layer.load_full_(weight.detach(), None if bias is None else bias.detach())
    layer.weight.requires_grad_(module.weight.requires_grad)
    if bias is not None:
        layer.bias.requires_grad_(bias.requires_grad)
    layer.train(module.training)
    setattr(parent, attr, layer)
    return layer


def _check_heads(name: str, heads: int, kind: str, grid: Grid) -> None:
    if heads % grid.size("y"):
        raise ShardingError(f"{name}: {heads} {kind} are not divisible by y={grid.size('y')} (each y rank runs "
                            f"an equal share of the heads); choose y dividing {heads}")


def _plan_llama_layer(layer: nn.Module, name: str, grid: Grid, overlap: bool) -> None:
    attn, mlp = layer.self_attn, layer.mlp
    if type(attn).__name__ not in LLAMA_FAMILY_ATTENTION:
        raise ShardingError(f"{name}.self_attn: {type(attn).__name__} is not an attention the engine knows how to "
                            f"split by heads (supported: {', '.join(LLAMA_FAMILY_ATTENTION)})")
    head_dim = attn.head_dim
    _check_heads(name, attn.q_proj.out_features // head_dim, "attention heads", grid)
    _check_heads(name, attn.k_proj.out_features // head_dim, "key/value heads", grid)
    for child_name, child in attn.named_children():
        if child_name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            continue
        params = list(child.parameters())
        if child_name in ("q_norm", "k_norm") and all(p.numel() == head_dim for p in params):
            setattr(child, REGION_ATTR, "heads")  # per-head norm: runs on this rank's heads only
        elif params:
            raise ShardingError(f"{name}.self_attn.{child_name} ({type(child).__name__}) has parameters the engine "
                                "cannot shard by heads")
    if list(attn.parameters(recurse=False)) or list(mlp.parameters(recurse=False)):
        raise ShardingError(f"{name}: attention or MLP holds its own parameters; the engine cannot shard them")
    for child_name, child in mlp.named_children():
        if child_name not in ("gate_proj", "up_proj", "down_proj") and list(child.parameters()):
            raise ShardingError(f"{name}.mlp.{child_name} has parameters the engine cannot shard")
    for proj in ("q_proj", "k_proj", "v_proj"):
        _to_parallel(attn, proj, "normal", grid, overlap, f"{name}.self_attn.{proj}")
    _to_parallel(attn, "o_proj", "transposed", grid, overlap, f"{name}.self_attn.o_proj")
    _to_parallel(mlp, "gate_proj", "normal", grid, overlap, f"{name}.mlp.gate_proj")
    _to_parallel(mlp, "up_proj", "normal", grid, overlap, f"{name}.mlp.up_proj")
    _to_parallel(mlp, "down_proj", "transposed", grid, overlap, f"{name}.mlp.down_proj")


def _plan_gpt2_layer(layer: nn.Module, name: str, grid: Grid, overlap: bool) -> None:
    if hasattr(layer, "crossattention"):
        raise ShardingError(f"{name}: GPT-2 cross-attention is not supported by the engine")
    attn, mlp = layer.attn, layer.mlp
    n_y = grid.size("y")
    hidden = attn.embed_dim
    heads = attn.num_heads
    _check_heads(name, heads, "attention heads", grid)
    # c_attn's outputs are [q | k | v]; regroup them so that y-slice i holds [q_i | k_i | v_i]
    share = hidden // n_y
    order = torch.cat([torch.arange(part * hidden + i * share, part * hidden + (i + 1) * share)
                       for i in range(n_y) for part in range(3)])
    _to_parallel(attn, "c_attn", "normal", grid, overlap, f"{name}.attn.c_attn", None if n_y == 1 else order)
    _to_parallel(attn, "c_proj", "transposed", grid, overlap, f"{name}.attn.c_proj")
    _to_parallel(mlp, "c_fc", "normal", grid, overlap, f"{name}.mlp.c_fc")
    _to_parallel(mlp, "c_proj", "transposed", grid, overlap, f"{name}.mlp.c_proj")
    attn.num_heads = heads // n_y
    attn.split_size = hidden // n_y


def _rows_of(value: Any, n_rows: int, name: str, group) -> Any:
    """Gather `value` over the x*y group when its batch dim holds this rank's rows (dim 0 of size 1 with
    more rows is a broadcast and stays)."""
    if value is None:
        return None
    if not isinstance(value, torch.Tensor):
        raise ShardingError(f"input {name} of a parallelized model is a {type(value).__name__}; the engine "
                            "only distributes tensors")
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
    cache = arguments.get("past_key_values")
    past = cache.get_seq_length() if cache is not None and hasattr(cache, "get_seq_length") else 0
    mine = [n_rows, seq_len, int(mask is not None), mask.dim() if mask is not None else 0,
            mask.shape[-1] if mask is not None else 0, mask.shape[0] if mask is not None else 0,
            int(positions is not None), positions.shape[0] if positions is not None else 0]
    everyone = comm.exchange_ints(mine, group, device)
    if any(r[:2] != [n_rows, seq_len] for r in everyone):
        raise ShardingError(f"every rank of an x*y group must feed the same number of rows and tokens; got "
                            f"(rows, tokens) {[tuple(r[:2]) for r in everyone]} on ranks {list(group.ranks)}")
    if any(r[2] for r in everyone):
        if not all(r[2] for r in everyone) and any(r[2] and r[3] != 2 for r in everyone):
            raise ShardingError("some ranks of an x*y group pass a 4-D attention mask and others none; pass "
                                "masks on every rank")
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


_STACK_ROW_INPUTS = ("attention_mask", "position_ids")
_STACK_PASS_THROUGH = ("past_key_values", "use_cache", "cache_position", "kwargs", "return_dict",
                       "output_attentions", "output_hidden_states")


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
        if not row_gather_axes(current_rows_layout(module)):
            return None  # the inputs already hold the group's rows, the same on every rank of x*y
        bound = signature.bind(*args, **kwargs)
        arguments = bound.arguments
        input_ids, embeds = arguments.get("input_ids"), arguments.get("inputs_embeds")
        if (input_ids is None) == (embeds is None):
            raise ShardingError("a parallelized model needs exactly one of input_ids and inputs_embeds")
        source = input_ids if embeds is None else embeds
        n_rows = source.shape[0]
        module._engine_rows = n_rows
        # before the lookup: a vocabulary-parallel embedding gathers the ids, which needs equal shapes
        _agree_on_row_inputs(arguments, n_rows, source.shape[1], group, source.device)
        if embeds is None:
            embeds = module.get_input_embeddings()(input_ids)  # `module`, not a captured one: deepcopy-safe
            arguments["input_ids"] = None
        arguments["inputs_embeds"] = gather_from_group(embeds, group, 0)
        for key, value in list(arguments.items()):
            if key in ("input_ids", "inputs_embeds"):
                continue
            if key in _STACK_ROW_INPUTS:
                arguments[key] = _rows_of(value, n_rows, key, group)
            elif key == "kwargs":
                for k, v in value.items():
                    if isinstance(v, torch.Tensor) and k not in _STACK_PASS_THROUGH:
                        raise ShardingError(f"input {k} of a parallelized model is a tensor the engine does "
                                            "not know how to distribute")
            elif isinstance(value, torch.Tensor) and key not in _STACK_PASS_THROUGH:
                raise ShardingError(f"input {key} of a parallelized model is a tensor the engine does not "
                                    "know how to distribute")
        # call by keyword: decorators around HF forwards may add keywords of their own
        extra = arguments.pop("kwargs", {})
        return (), {**arguments, **extra}

    def leave(module: nn.Module, args: tuple, output: Any) -> Any:
        if not row_gather_axes(current_rows_layout(module)):
            return None
        n_rows = module._engine_rows
        if isinstance(output, torch.Tensor):
            return _own_rows(output, n_rows, group)
        if isinstance(output, tuple):  # return_dict=False
            return (_own_rows(output[0], n_rows, group), *output[1:])
        for key in ("last_hidden_state", "hidden_states"):  # a ModelOutput
            if output.get(key) is not None:
                output[key] = _own_rows(output[key], n_rows, group)
        return output

    stack._engine_hooks = (stack.register_forward_pre_hook(enter, with_kwargs=True),
                           stack.register_forward_hook(leave))


def decoder_stacks(model: nn.Module) -> list[tuple[str, nn.Module, str, nn.ModuleList]]:
    """(name, module, list name, list) for every module holding a ModuleList of known decoder layers."""
    stacks = []
    for name, module in model.named_modules():
        for child_name, child in module.named_children():
            if isinstance(child, nn.ModuleList) and len(child) and \
                    all(_is_llama_layer(m) or _is_gpt2_layer(m) for m in child):
                stacks.append((name, module, child_name, child))
    return stacks


def parallelize(model: nn.Module, grid: Grid, *, overlap: bool = True, vocab_parallel: bool | None = None) -> nn.Module:
    """Shard `model` in place for `grid` and return it; the weights are kept exactly.

    Decoder layers of HF Llama-family models (Llama, Mistral, Qwen2, Qwen3) and GPT-2 get chained
    ParallelLinears (attention heads and MLP split over y); the module owning them (LlamaModel,
    GPT2Model) runs on the rows of the x*y group (see the module doc); lm_head stays unsharded and sees
    each rank's own rows, as do the input embeddings. A model built under auto_parallelize is re-planned
    the same way. `vocab_parallel` splits the input embeddings and lm_head by vocabulary rows over x*y*z
    (engine/core/vocab_parallel.py); None (default) does so whenever the grid has tensor parallelism and the split is
    exact (vocabulary divisible by x*y*z, plain nn.Embedding and bias-free lm_head), True insists (ShardingError
    with the reason otherwise), False keeps them whole on every rank. Raises ShardingError for dimensions that do
    not divide, for modules the engine cannot shard, and for a model without decoder layers when the grid has
    tensor-parallel axes.
    """
    stacks = decoder_stacks(model)
    in_stacks = {id(layer) for *_, layers in stacks for layer in layers}
    for name, module in model.named_modules():
        if (_is_llama_layer(module) or _is_gpt2_layer(module)) and id(module) not in in_stacks:
            raise ShardingError(f"{name}: a decoder layer outside a model the engine recognises (a module "
                                "holding a ModuleList of decoder layers, such as LlamaModel or GPT2Model)")
    for stack_name, stack, list_name, layers in stacks:
        planned = getattr(stack, "_engine_stack_grid", None)
        if planned is grid:
            continue
        if planned is not None:
            raise ShardingError(f"{stack_name or type(stack).__name__} is already parallelized on another grid")
        if not hasattr(stack, "get_input_embeddings"):
            raise ShardingError(f"{stack_name}: {type(stack).__name__} has no get_input_embeddings()")
        prefix = f"{stack_name}.{list_name}" if stack_name else list_name
        order: list[ParallelLinear] = []  # the sharded linears in the order a forward calls them
        for index, layer in enumerate(layers):
            if _is_llama_layer(layer):
                _plan_llama_layer(layer, f"{prefix}.{index}", grid, overlap)
                attn, mlp = layer.self_attn, layer.mlp
                order += [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj,
                          mlp.down_proj]
            else:
                _plan_gpt2_layer(layer, f"{prefix}.{index}", grid, overlap)
                order += [layer.attn.c_attn, layer.attn.c_proj, layer.mlp.c_fc, layer.mlp.c_proj]
            layer._engine_grid = grid
        for current, following in zip(order, order[1:]):
            current.prefetch_before(following)
        setattr(stack, REGION_ATTR, "layer")
        setattr(stack.get_input_embeddings(), REGION_ATTR, "rows")
        stack._engine_stack_grid = grid
        if grid.size("x", "y") > 1:
            _install_stack_hooks(stack, grid)
    if not stacks and grid.size("x", "y", "z") > 1:
        raise ShardingError(f"parallelize found no decoder layers it can shard in {type(model).__name__} (it knows "
                            "HF Llama-family and GPT-2 models); build other models from engine.ParallelLinear")
    _unshard_outside_layers(model)
    already = hasattr(model, "get_input_embeddings") and is_vocab_parallel(model.get_input_embeddings())
    if stacks and vocab_parallel is not False and not already:  # a wrapper (e.g. a LightningModule): can_shard_vocab says why not
        if vocab_parallel or can_shard_vocab(model, grid) is None:
            for module in shard_vocab(model, grid):
                setattr(module, REGION_ATTR, "tensor")  # gradients cover the rows of x*y*z: summed over data only
    return model


def _unshard_outside_layers(model: nn.Module) -> None:
    """Turn the ParallelLinears that auto_parallelize made outside decoder layers back into plain Linears."""
    def visit(module: nn.Module) -> None:
        for child_name, child in module.named_children():
            if getattr(child, "_engine_grid", None) is not None:
                continue  # a planned decoder layer
            if isinstance(child, ParallelLinear) and getattr(child, "_engine_auto", False):
                setattr(module, child_name, _plain_linear(child))
            else:
                visit(child)
    visit(model)


def _plain_linear(layer: ParallelLinear) -> nn.Linear:
    """A torch.nn.Linear with the layer's full weights (collective over x*y*z unless already full)."""
    plain = torch.nn.utils.skip_init(_TorchLinear, layer.in_features, layer.out_features,
                                     bias=layer.bias is not None, device=layer.weight.device,
                                     dtype=layer.weight.dtype)
    if tuple(layer.weight.shape) == (layer.out_features, layer.in_features):
        plain.weight = layer.weight  # nothing was sharded, or tied to a full tensor (e.g. input embeddings)
    else:
        plain.weight = _fresh_param(layer.weight, layer.full_weight())
    if layer.bias is not None:
        full = layer.grid.size("x", "y", "z") == 1
        plain.bias = layer.bias if full else _fresh_param(layer.bias, layer.full_bias())
    plain.train(layer.training)
    return plain


# ----- auto_parallelize ---------------------------------------------------------------------------------

_INIT_FUNCTIONS = ("uniform_", "normal_", "trunc_normal_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
                   "kaiming_normal_", "orthogonal_", "sparse_", "eye_", "dirac_")
_INIT_MODULES = ("torch.nn.init", "transformers.initialization")
_RANDOM_FILLS = tuple(getattr(torch.Tensor, n) for n in ("normal_", "uniform_", "random_", "bernoulli_",
                                                          "exponential_", "log_normal_", "cauchy_", "geometric_"))


class _FullInitShard(nn.Parameter):
    """A weight shard that, while a model is built, initialises like its full tensor.

    torch.nn.init functions and random in-place fills applied to it run on a full-size temporary and
    the shard keeps its slice: the same random numbers are drawn as for the serial model (identical
    values under the same seed) and different shards never repeat each other's values.
    """

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        # torch.nn.init functions, or wrappers with the same names (transformers swaps its guarded
        # versions into torch.nn.init while it initialises a model)
        is_init = getattr(func, "__module__", None) in _INIT_MODULES and getattr(func, "__name__", "") in _INIT_FUNCTIONS
        if is_init or func in _RANDOM_FILLS:
            target = kwargs.get("tensor", args[0] if args else None)
            if getattr(target, "_is_hf_initialized", False):
                return target  # transformers' guard: this tensor was loaded or initialised already
            if isinstance(target, _FullInitShard) and "_engine_take_shard" in target.__dict__:
                with torch._C.DisableTorchFunctionSubclass():
                    full = torch.empty(target._engine_full_shape, dtype=target.dtype, device=target.device)
                    if "tensor" in kwargs:
                        kwargs["tensor"] = full
                    else:
                        args = (full, *args[1:])
                    with torch.no_grad():
                        func(*args, **kwargs)
                        target.copy_(target._engine_take_shard(full))
                return target
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


def _wrap_for_full_init(layer: ParallelLinear) -> None:
    for attr, full_shape, take in (("weight", (layer.out_features, layer.in_features), layer.shard_weight),
                                   ("bias", (layer.out_features,), layer.shard_bias)):
        param = getattr(layer, attr)
        if param is None:
            continue
        wrapped = _FullInitShard(param.data, requires_grad=param.requires_grad)
        wrapped._engine_full_shape = full_shape
        wrapped._engine_take_shard = take
        setattr(layer, attr, wrapped)


def _unwrap(layer: nn.Module) -> None:
    for param in layer.parameters(recurse=False):
        if isinstance(param, _FullInitShard):
            param.__dict__.pop("_engine_full_shape", None)
            param.__dict__.pop("_engine_take_shard", None)
            param.__class__ = nn.Parameter


@contextmanager
def auto_parallelize(grid: Grid, *, overlap: bool = True) -> Iterator[None]:
    """Models built inside this block get ParallelLinear layers instead of torch.nn.Linear.

    Each Linear is created as a default-mode ParallelLinear holding only its shard; initialisation
    (its own and the model's, e.g. HF _init_weights) is drawn for the full tensor and sliced, so at most
    one full layer exists at a time and, with the same seed, the values equal the serial model's.
    When a HF model finishes building (post_init) it is planned with `parallelize` (chained decoder
    layers, unsharded lm_head and embeddings; call parallelize(model, grid) after the block to split their
    vocabulary over x*y*z as well). Create optimizers after the block. Not thread-safe: it
    swaps torch.nn.Linear (and PreTrainedModel.post_init) for the duration of the block.
    GPT-2's Conv1D layers are built full and sharded when the model is planned.
    """
    built: list[ParallelLinear] = []

    class AutoParallelLinear(ParallelLinear):
        def __init__(self, in_features: int, out_features: int, bias: bool = True, device: Any = None,
                     dtype: Any = None) -> None:
            super().__init__(in_features, out_features, bias, grid=grid, mode="default", overlap=overlap,
                             device=device, dtype=dtype)
            _wrap_for_full_init(self)
            self._engine_auto = True
            built.append(self)

    restore: list[tuple[Any, str, Any]] = [(torch.nn, "Linear", torch.nn.Linear)]
    try:
        from transformers.modeling_utils import PreTrainedModel
    except ImportError:  # no transformers: plain torch models only
        PreTrainedModel = None
    if PreTrainedModel is not None:
        original_post_init = PreTrainedModel.post_init

        def post_init(self: Any) -> None:
            original_post_init(self)
            # HF may initialise weights after post_init: the embeddings must still be whole then (full-size
            # draws); parallelize(model, grid) after the block splits the vocabulary.
            parallelize(self, grid, overlap=overlap, vocab_parallel=False)

        restore.append((PreTrainedModel, "post_init", original_post_init))
        PreTrainedModel.post_init = post_init
    torch.nn.Linear = AutoParallelLinear
    try:
        yield
    finally:
        for owner, attr, value in restore:
            setattr(owner, attr, value)
        for layer in built:
            layer.__class__ = ParallelLinear
            _unwrap(layer)
