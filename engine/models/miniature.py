"""A miniature of a transformers model config: the same architecture, two layers deep and a few hundred features wide.

Sharding verification (engine.training.verify) builds the model class from it and compares the sharded miniature
with the serial one; the family check in the tests builds every causal LM of the installed transformers from one.

    config = miniature_config(model.config, shards=grid.size("x", "y", "z"))
    mini = type(model)(config)

What shrinks: the layer count (to 2, with every per-layer list cut to the layers kept, keeping one layer of each kind
where a list says which layers are of which kind), every width (hidden size, MLP and expert widths, head dims, low
ranks, rotary dims) by one factor that brings the head dim to about MINI_HEAD_DIM, and the vocabulary (to a few
hundred ids, divisible by the tensor-parallel shards when the real one is, so the same vocabulary split is taken).
What stays: head counts (so divisibility by the grid's y is the real model's), every switch, norm, scale and
mask setting, except dropout probabilities, set to 0 so that two runs of the miniature compare exactly. Token ids
beyond the small vocabulary are folded into it.
"""

from __future__ import annotations

import copy
import math
from typing import Any

MINI_HEAD_DIM = 16  # features per head in the miniature: partial rotary factors of 1/4 still leave 4 features
MINI_LAYERS = 2
MINI_VOCAB_UNIT = 64  # the miniature's vocabulary is a small multiple of this (times the shards when divisible)

# Integer settings that are a width (features), scaled together; names as transformers' configs spell them.
_WIDTH_KEYS = frozenset(
    {
        "hidden_size",
        "n_embd",
        "d_model",
        "intermediate_size",
        "n_inner",
        "ffn_dim",
        "ffn_hidden_size",
        "d_ff",
        "dff",
        "feed_forward_size",
        "dense_intermediate_size",
        "intermediate_size_mlp",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "shared_experts_intermediate_size",
        "shared_intermediate_size",
        "moe_shared_expert_intermediate_size",
        "expert_ffn_hidden_size",
        "head_dim",
        "d_head",
        "kv_channels",
        "attention_head_dim",
        "attention_head_size",
        "rotary_dim",
        "qk_nope_head_dim",
        "qk_rope_head_dim",
        "qk_head_dim",
        "v_head_dim",
        "q_lora_rank",
        "kv_lora_rank",
        "o_lora_rank",
        "hidden_size_per_layer_input",
        "laurel_rank",
        "lru_width",
        "attention_hidden_size",
        "embedding_size",
        "word_embed_proj_dim",
        "input_embedding_size",
        "output_embedding_size",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_head_dim",
        "swa_head_dim",
        "index_head_dim",
        "router_hidden_size",
        "query_pre_attn_scalar",
    }
)
_LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_VOCAB_KEYS = ("vocab_size", "vocab_size_per_layer_input")


def _real_layers(settings: dict[str, Any]) -> int | None:
    for key in _LAYER_COUNT_KEYS:
        value = settings.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _head_dim(settings: dict[str, Any]) -> int | None:
    explicit = settings.get("head_dim")
    if isinstance(explicit, int) and explicit > 0:
        return explicit
    heads = settings.get("num_attention_heads", settings.get("n_head", settings.get("num_heads")))
    hidden = settings.get("hidden_size", settings.get("n_embd", settings.get("d_model")))
    if isinstance(heads, int) and isinstance(hidden, int) and heads > 0 and hidden % heads == 0:
        return hidden // heads
    return None


def _kept_layers(settings: dict[str, Any], layers: int) -> list[int]:
    """Indices of the real layers the miniature keeps: one of each kind named by `layer_types` when there is one."""
    kinds = settings.get("layer_types")
    if isinstance(kinds, list) and len(kinds) == layers:
        first_of_each: dict[Any, int] = {}
        for index, kind in enumerate(kinds):
            first_of_each.setdefault(str(kind), index)
        kept = sorted(first_of_each.values())[:MINI_LAYERS]
        kept += [i for i in range(layers) if i not in kept][: MINI_LAYERS - len(kept)]
        return sorted(kept)
    return list(range(min(layers, MINI_LAYERS)))


def _scaled(value: int, factor: float) -> int:
    """`value` times `factor`, rounded to an even number of at least 2 (rotary halves need even widths)."""
    return max(2, 2 * round(value * factor / 2))


def miniature_config(config: Any, *, shards: int = 1) -> Any:
    """A copy of transformers `config` for a model of the same class two layers deep and narrow (see the module doc).

    `shards`: the tensor-parallel size x*y*z of the grid the real model runs on; the miniature's vocabulary is then
    divisible by it exactly when the real one is. The real config is not changed.
    """
    settings = config.to_dict()
    mini = copy.deepcopy(config)
    layers = _real_layers(settings)
    head_dim = _head_dim(settings)
    factor = min(1.0, MINI_HEAD_DIM / head_dim) if head_dim else 1.0
    changes: dict[str, Any] = {}
    kept = _kept_layers(settings, layers) if layers else []
    for key, value in settings.items():
        if isinstance(value, bool) or key.startswith("_"):
            continue
        if key in _LAYER_COUNT_KEYS and isinstance(value, int):
            changes[key] = len(kept)
        elif key in _WIDTH_KEYS and isinstance(value, int) and factor < 1.0:
            changes[key] = _scaled(value, factor)
        elif key in _WIDTH_KEYS and isinstance(value, list) and all(isinstance(v, int) for v in value) and factor < 1:
            changes[key] = [_scaled(v, factor) for v in value]
        elif isinstance(value, list) and layers and len(value) == layers and layers > len(kept):
            changes[key] = [value[i] for i in kept]
        elif isinstance(value, float) and ("dropout" in key or "pdrop" in key):
            changes[key] = 0.0  # both sides of a comparison must draw no random masks
        elif "layers" in key and isinstance(value, int) and layers and len(kept) <= value < layers:
            changes[key] = 0  # e.g. how many of the last layers share an earlier layer's cache: none of two
    real_vocab = settings.get("vocab_size")
    if isinstance(real_vocab, int) and real_vocab > 0:
        unit = MINI_VOCAB_UNIT * shards
        vocab = 2 * unit if real_vocab % shards == 0 else 2 * unit + 1
        vocab = min(vocab, real_vocab)
        for key in _VOCAB_KEYS:
            if isinstance(settings.get(key), int):
                changes[key] = vocab
        for key, value in settings.items():
            if key.endswith(("_token_id", "_token_index")) and isinstance(value, int) and value >= vocab:
                changes[key] = value % vocab
            elif key.endswith("_token_id") and isinstance(value, list):
                changes[key] = [v % vocab if isinstance(v, int) else v for v in value]
    # The new head dim must hold explicit head counts times it when the config derives one from the other.
    hidden_key = next((k for k in ("hidden_size", "n_embd", "d_model") if k in changes), None)
    if hidden_key and "head_dim" not in settings and head_dim:
        heads = settings.get("num_attention_heads", settings.get("n_head", settings.get("num_heads")))
        if isinstance(heads, int) and settings[hidden_key] == heads * head_dim:
            changes[hidden_key] = heads * max(2, 2 * round(head_dim * factor / 2))
    for key, value in changes.items():
        setattr(mini, key, value)
    sub_configs = getattr(mini, "sub_configs", None) or {}
    for name in sub_configs:  # e.g. a text config inside a wrapper config: shrink it the same way
        inner = getattr(mini, name, None)
        if inner is not None and hasattr(inner, "to_dict") and inner is not config:
            setattr(mini, name, miniature_config(inner, shards=shards))
    return mini


def parameter_count(model: Any) -> int:
    """Number of parameter elements of a torch module (for progress lines)."""
    return sum(math.prod(p.shape) for p in model.parameters())
