"""What the engine knows of transformers models in general (each family's own knowledge: engine/models/families/).

Which Linears of a transformer's decoder layers the engine shards (read from the model's own plan), how fused
projections order their features, the attributes holding head counts, the KV-cache keywords, the base model's inputs,
how transformers initialises a module. A family is sharded only through its declared plan, confirmed by the family
checks, never because a name looks familiar.

transformers declares a tensor-parallel plan for most causal LMs (`config.base_model_tp_plan`): module patterns
relative to the base model (e.g. LlamaModel), each with a style. The engine maps the styles onto its grid:

    colwise, colwise_gather_output     -> a "normal" ParallelLinear: output features (heads, MLP width) split over y
    rowwise, rowwise_split_input       -> a "transposed" ParallelLinear: brings back all features
    embedding_colwise/_rowwise         -> ignored: the engine splits the vocabulary itself (engine/vocab_parallel.py)
    replicated_with_grad_allreduce     -> ignored: per-head norms, whose gradients engine.state sums over y
    anything else (MoE experts, ...)   -> refused on a grid with tensor parallelism (ShardingError naming it)

The `*_gather_output` / `*_split_input` variants exist in transformers because some module between the pair needs
all features: OLMo2's q_norm/k_norm (an RMSNorm over the whole projection width) and Phi-3's fused projections.
The engine keeps the pair sharded and handles those modules instead (engine.parallelize): the norm reduces its
statistics over y, and fused projections are regrouped so that each y rank holds whole heads ([q_i | k_i | v_i])
or matching gate and up halves ([gate_i | up_i]).

What the engine knows of a family beyond its declared plan (an explicit plan where it declares none, as for GPT-2;
the order of its fused projections; its pipeline stages; a config it refuses) sits in the family's adapter,
engine/models/families/<model_type>.py (engine/models/family.py). A base model without a tensor-parallel plan whose
pipeline plan names its ModuleList of layers still has known decoder layers (used by ZeRO and activation
checkpointing), with nothing to shard.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from engine.core.linear import ShardingError
from engine.models.families import known_families
from engine.models.family import FamilyAdapter, FusedOrder, family_adapter

# The family adapters a look-up searches: a tuple passed by the caller, or None for the engine's known families.
Families = tuple[FamilyAdapter, ...] | None

# transformers' style names -> the ParallelLinear mode the engine uses for them
STYLE_MODES = {
    "colwise": "normal",
    "colwise_gather_output": "normal",
    "rowwise": "transposed",
    "rowwise_split_input": "transposed",
}
# Ignored: the engine splits the vocabulary itself (engine/vocab_parallel.py), and modules beside the sharded
# projections (per-head q/k norms) are handled by engine.parallelize, which refuses those it cannot handle.
IGNORED_STYLES = ("embedding_colwise", "embedding_rowwise", "replicated_with_grad_allreduce")

# Attribute names that mean a fused projection in some family: outside its adapter's `fused` they are refused.
FUSED_NAMES = ("c_attn", "qkv", "query_key_value", "gate_up", "wqkv", "w1w3", "qkv_proj", "in_proj")


@dataclass(frozen=True)
class Projection:
    """One sharded Linear of a decoder layer: its dotted `path` inside the layer, the ParallelLinear `mode` and, for a
    fused projection, how its output features are grouped (its family adapter's `fused`)."""

    path: str
    mode: str
    fused: FusedOrder | None = None


@dataclass(frozen=True)
class ModelPlan:
    """What the engine knows of one base model (e.g. LlamaModel, GPT2Model).

    `layers`: the attribute holding its ModuleList of decoder layers; `projections`: the Linears to shard, in the
    order a layer's forward calls them; `unsupported`: (pattern, style) entries of the declared plan the engine cannot
    map (e.g. mixture-of-experts), refused on grids with tensor parallelism; `declared`: the plan came from the config;
    `adapter`: the family's adapter (engine/models/families/), None for a family known by its declared plan alone.
    """

    family: str
    layers: str
    projections: tuple[Projection, ...]
    unsupported: tuple[tuple[str, str], ...] = ()
    declared: bool = True
    adapter: FamilyAdapter | None = None


def is_base_model(module: nn.Module) -> bool:
    """True for a transformers base model (the module that owns the decoder layers, e.g. LlamaModel)."""
    return hasattr(module, "config") and getattr(module, "base_model", None) is module


def declared_tp_plan(config: Any, families: Families = None) -> dict[str, str]:
    """The model's declared tensor-parallel plan (pattern -> style), or its family adapter's; {} if none. `families`:
    the adapters to look the family up in (None: engine.models.families.known_families())."""
    plan = getattr(config, "base_model_tp_plan", None) or {}
    if plan:
        return dict(plan)
    adapter = family_adapter(getattr(config, "model_type", ""), _families(families))
    return dict(adapter.tp_plan) if adapter is not None else {}


def _families(families: Families) -> tuple[FamilyAdapter, ...]:
    return known_families() if families is None else families


def model_plan(base: nn.Module, families: Families = None) -> ModelPlan | None:
    """The plan of base model `base`, or None when it has no known ModuleList of decoder layers. `families`: the
    adapters to look its family up in (None: engine.models.families.known_families())."""
    config = base.config
    family = getattr(config, "model_type", type(base).__name__)
    adapter = family_adapter(family, _families(families))
    fused = adapter.fused if adapter is not None else {}
    declared = getattr(config, "base_model_tp_plan", None)
    layer_lists: list[str] = []
    projections: list[Projection] = []
    unsupported: list[tuple[str, str]] = []
    for pattern, style in declared_tp_plan(config, families).items():
        parts = pattern.split(".")
        if style in IGNORED_STYLES:
            continue
        if len(parts) < 3 or parts[1] != "*" or style not in STYLE_MODES:
            unsupported.append((pattern, style))
            continue
        if parts[0] not in layer_lists:
            layer_lists.append(parts[0])
        path = ".".join(parts[2:])
        projections.append(Projection(path, STYLE_MODES[style], fused.get(parts[-1])))
    if not layer_lists:  # no tensor-parallel plan: the pipeline plan may still name the layers
        for name in getattr(config, "base_model_pp_plan", None) or {}:
            if isinstance(getattr(base, name, None), nn.ModuleList):
                layer_lists.append(name)
    if len(layer_lists) != 1 or not isinstance(getattr(base, layer_lists[0], None), nn.ModuleList):
        return None
    return ModelPlan(
        family, layer_lists[0], tuple(projections), tuple(unsupported), declared=bool(declared), adapter=adapter
    )


def find_planned(model: nn.Module, families: Families = None) -> list[tuple[str, nn.Module, ModelPlan]]:
    """(name, base model, plan) for every base model inside `model` with known decoder layers (outermost first;
    a base model nested in another one's layers is not searched). `families`: as for model_plan."""
    found: list[tuple[str, nn.Module, ModelPlan]] = []
    families = _families(families)

    def visit(module: nn.Module, name: str) -> None:
        if is_base_model(module):
            plan = model_plan(module, families)
            if plan is not None:
                found.append((name, module, plan))
                return
        for child_name, child in module.named_children():
            visit(child, f"{name}.{child_name}" if name else child_name)

    visit(model, "")
    return found


def head_counts(config: Any) -> tuple[int, int, int]:
    """(query heads, key/value heads, head dim) of a model config."""
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return heads, kv_heads, int(head_dim)


def check_supported(plan: ModelPlan, tensor_parallel: bool) -> None:
    """Raise ShardingError when `plan` holds entries the engine cannot map and the grid has tensor parallelism."""
    if plan.unsupported and tensor_parallel:
        entries = ", ".join(f"{p} ({s})" for p, s in plan.unsupported)
        moe = any("moe" in s or "expert" in p or "packed" in s for p, s in plan.unsupported)
        why = (
            "its mixture-of-experts layers hold their experts as fused 3-D parameters, not Linears"
            if moe
            else "these styles have no engine equivalent"
        )
        raise ShardingError(
            f"{plan.family}: the engine cannot shard {entries}: {why}; use a grid without x, y and z "
            "(data parallelism, optionally with ZeRO)"
        )


# ----- the rest of what the engine reads of transformers modules -------------------------------------------------

# Attributes of an attention module holding a head count (or, for GPT-2, the width of one of q, k, v) that its
# forward reads: on a y rank they must hold that rank's share.
HEAD_COUNT_ATTRS = ("num_heads", "num_attention_heads", "num_key_value_heads", "num_kv_heads", "split_size")

# The keywords a model's forward takes its KV cache by: `cache` from transformers 5.24 on (which still accepts
# `past_key_values` with a FutureWarning until 5.40), `past_key_values` before; GPT-2's decoder layers: `layer_past`.
CACHE_KEYWORDS = ("cache", "past_key_values")
LAYER_CACHE_ARGUMENTS = {"past_key_values": None, "cache": None, "layer_past": None, "use_cache": False}

# Inputs of a base model's forward: those whose batch dim holds rows (gathered with them over x*y), and those passed
# through untouched (the cache and flags); any other tensor input is refused.
STACK_ROW_INPUTS = ("attention_mask", "position_ids")
STACK_PASS_THROUGH = (
    *CACHE_KEYWORDS,
    "use_cache",
    "cache_position",
    "kwargs",
    "return_dict",
    "output_attentions",
    "output_hidden_states",
)

# Config keys holding the size of a table of positions (read by position ids, not token ids).
POSITION_TABLE_KEYS = ("max_position_embeddings", "n_positions", "n_ctx")


class LocalHeadsConfig:
    """A view of a model config in which the head counts are one y rank's share (for attention modules that read
    config.num_attention_heads in their forward, e.g. Phi-3); every other attribute is read from, and written to,
    the model's own config, so later changes to it (e.g. the attention implementation) still reach the module."""

    def __init__(self, base: Any, **local: int) -> None:
        self.__dict__["_shared_config"] = base
        self.__dict__.update(local)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_shared_config":
            raise AttributeError(name)
        return getattr(self.__dict__["_shared_config"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.__dict__:
            self.__dict__[name] = value
        else:
            setattr(self.__dict__["_shared_config"], name, value)


def localize_heads(attention: nn.Module, config: Any, n_y: int, name: str) -> None:
    """Give an attention module this y rank's share of its head counts (its attributes and its config reads)."""
    if n_y == 1:
        return
    for attr in HEAD_COUNT_ATTRS:
        value = attention.__dict__.get(attr)
        if isinstance(value, int) and not isinstance(value, bool):
            if value % n_y:
                raise ShardingError(f"{name}.{attr} = {value} is not divisible by y={n_y}; choose y dividing it")
            setattr(attention, attr, value // n_y)
    if "config" in attention.__dict__ and attention.__dict__["config"] is config:
        heads, kv_heads, _ = head_counts(config)
        attention.config = LocalHeadsConfig(
            config, num_attention_heads=heads // n_y, num_key_value_heads=kv_heads // n_y
        )


def is_conv1d(module: nn.Module) -> bool:
    """True for GPT-2's Conv1D, a linear layer that stores its weight as (in, out)."""
    from transformers.pytorch_utils import Conv1D

    return isinstance(module, Conv1D)


def rms_norm_eps(module: nn.Module) -> float | None:
    """The epsilon of a transformers RMSNorm (a weight and `variance_epsilon` or `eps`), None for other modules."""
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    return eps if isinstance(eps, float) and "RMSNorm" in type(module).__name__ else None


Initialise = Callable[[nn.Module], None]


def transformers_init(module: nn.Module) -> Initialise | None:
    """The per-module initialisation of a transformers model (its `_initialize_weights`), or None for other modules."""
    if callable(getattr(module, "_initialize_weights", None)) and callable(getattr(module, "_init_weights", None)):
        return module._initialize_weights
    return None


def cache_argument(arguments: dict[str, Any]) -> Any:
    """The KV cache among a base model's bound forward arguments, under whichever keyword it came."""
    return next((arguments[k] for k in CACHE_KEYWORDS if arguments.get(k) is not None), None)


def cache_keyword(model: nn.Module) -> str:
    """The keyword `model`'s forward takes its KV cache by (a wrapper answers for the transformers model inside)."""
    from transformers import PreTrainedModel

    hf = next((m for m in model.modules() if isinstance(m, PreTrainedModel)), None)
    parameters = inspect.signature(hf.forward).parameters if hf is not None else {}
    return next((k for k in CACHE_KEYWORDS if k in parameters), CACHE_KEYWORDS[-1])


def causal_mask(
    config: Any,
    hidden: torch.Tensor,
    positions: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    cache: Any = None,
    layer: int | None = None,
) -> Any:
    """The causal attention mask a base model builds for `hidden` (B, T, H) at `positions` (B or 1, T), with the
    padding `attention_mask` and the KV `cache` when given, sized against the cache's layer `layer` (a pipeline
    stage's first layer, whose cache holds what layer 0's holds serially): transformers' create_causal_mask, whose
    cache keyword follows the installed release. ValueError for a cache and `layer` on a transformers without
    layer_idx."""
    from transformers.masking_utils import create_causal_mask

    parameters = inspect.signature(create_causal_mask).parameters
    sized = {}
    if layer is not None and cache is not None:  # transformers reads layer_idx only with a cache
        if "layer_idx" not in parameters:
            raise ValueError(
                "evaluation through pipeline stages needs a transformers whose create_causal_mask takes layer_idx "
                "(5.x): upgrade transformers"
            )
        sized = {"layer_idx": layer}
    keyword = next(k for k in CACHE_KEYWORDS if k in parameters)
    return create_causal_mask(
        config=config,
        inputs_embeds=hidden,
        attention_mask=attention_mask,
        position_ids=positions,
        **sized,
        **{keyword: cache},
    )


def returned_cache(out: Any) -> Any:
    """The KV cache a forward returned (`out.cache` from transformers 5.24 on, `out.past_key_values` before)."""
    return next((getattr(out, k) for k in CACHE_KEYWORDS if getattr(out, k, None) is not None), None)


def check_stack_supported(plan: ModelPlan, config: Any, tensor_parallel: bool) -> None:
    """Raise ShardingError for base models whose plan the engine knows not to cover on a tensor-parallel grid."""
    check_supported(plan, tensor_parallel)
    if tensor_parallel and not plan.projections:
        raise ShardingError(
            f"{plan.family}: the model declares no tensor-parallel plan the engine can use; use a "
            "grid without x, y and z (data parallelism, optionally with ZeRO)"
        )
    refusal = plan.adapter.refusal(config) if plan.adapter is not None else None
    if tensor_parallel and refusal:
        raise ShardingError(f"{refusal}; use a grid without x, y and z")
