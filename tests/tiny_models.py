"""The tiny random-init models the tests build, in one place: each test file picks its sizes, the builders are shared.

Plain functions rather than fixtures, because the multi-process tests build their models inside spawned workers;
single-process tests call them directly too.
"""

from __future__ import annotations

from typing import Any

import torch


def tiny_llama(
    *,
    vocab: int,
    seed: int = 0,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 8,
    kv_heads: int = 4,
    mlp: int | None = None,
    positions: int = 64,
    attention_bias: bool = True,
    mlp_bias: bool = False,
    tied: bool = False,
    dtype: torch.dtype | None = None,
    **config: Any,
) -> torch.nn.Module:
    """A LlamaForCausalLM drawn from `seed`: `hidden` wide (MLP `mlp`, default 2 x hidden), `layers` deep, `heads`
    query and `kv_heads` key/value heads; `dtype` float64 for gradients compared to ~1e-12; `config`: any other
    LlamaConfig field (e.g. attn_implementation, pad_token_id)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    settings = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=mlp or 2 * hidden,
        max_position_embeddings=positions,
        attention_bias=attention_bias,
        mlp_bias=mlp_bias,
        tie_word_embeddings=tied,
        **config,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(settings)
    return model if dtype is None else model.to(dtype)


def tiny_gpt2(
    *,
    vocab: int,
    seed: int = 0,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    positions: int = 32,
    dropout: float = 0.0,
    dtype: torch.dtype | None = None,
) -> torch.nn.Module:
    """A GPT2LMHeadModel drawn from `seed` (its Conv1D layers are what the engine's GPT-2 plan handles); dropout 0 by
    default so two models compare without replaying RNG."""
    from transformers import GPT2Config, GPT2LMHeadModel

    settings = GPT2Config(
        vocab_size=vocab,
        n_embd=hidden,
        n_layer=layers,
        n_head=heads,
        n_positions=positions,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
    )
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(settings)
    return model if dtype is None else model.to(dtype)


# Tiny configs of the families the engine shards through their declared tensor-parallel plans
# (tests/parallel/test_model_plans.py): hidden 32, 2 layers, 4 query heads and 2 key/value heads where the family has
# them; dropout off; pad id 0 (some families default to an id beyond a tiny vocabulary). Multipliers and scales are set
# away from 1 so that a parallel path that dropped them would show.
_FAMILY_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {"num_key_value_heads": 2, "attention_bias": True}),
    "gpt_neox": (
        "GPTNeoXConfig",
        {"rotary_pct": 0.5, "hidden_dropout": 0.0, "attention_dropout": 0.0, "tie_word_embeddings": False},
    ),
    "olmo2": ("Olmo2Config", {"num_key_value_heads": 2}),
    "gemma2": (
        "Gemma2Config",
        {
            "num_key_value_heads": 2,
            "head_dim": 8,
            "query_pre_attn_scalar": 8,
            "sliding_window": 6,
            "attn_implementation": "eager",
        },
    ),
    "phi3": ("Phi3Config", {"num_key_value_heads": 2, "resid_pdrop": 0.0, "embd_pdrop": 0.0}),
    "cohere": ("CohereConfig", {"num_key_value_heads": 2, "logit_scale": 0.5}),
    "cohere_qk_norm": ("CohereConfig", {"num_key_value_heads": 2, "logit_scale": 0.5, "use_qk_norm": True}),
    "granite": (
        "GraniteConfig",
        {
            "num_key_value_heads": 2,
            "embedding_multiplier": 2.0,
            "residual_multiplier": 0.5,
            "attention_multiplier": 0.3,
            "logits_scaling": 4.0,
        },
    ),
    "mistral": ("MistralConfig", {"num_key_value_heads": 2}),
    "qwen2": ("Qwen2Config", {"num_key_value_heads": 2}),
    "qwen3": ("Qwen3Config", {"num_key_value_heads": 2, "head_dim": 8}),
    "olmo": ("OlmoConfig", {"num_key_value_heads": 2, "clip_qkv": 4.0}),
    "gemma": ("GemmaConfig", {"num_key_value_heads": 2, "head_dim": 8}),
    "gemma3_text": (
        "Gemma3TextConfig",
        {
            "num_key_value_heads": 2,
            "head_dim": 8,
            "query_pre_attn_scalar": 8,
            "sliding_window": 6,
            "attn_implementation": "eager",
        },
    ),
    "phi": (
        "PhiConfig",
        {"num_key_value_heads": 2, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "partial_rotary_factor": 0.5},
    ),
    "starcoder2": ("Starcoder2Config", {"num_key_value_heads": 2, "residual_dropout": 0.0, "embedding_dropout": 0.0}),
    "mixtral": ("MixtralConfig", {"num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        {
            "num_key_value_heads": 2,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32,
        },
    ),
}
PLANNED_FAMILIES = (
    "llama",
    "gpt_neox",
    "olmo2",
    "gemma2",
    "phi3",
    "cohere",
    "granite",
    "mistral",
    "qwen2",
    "qwen3",
    "olmo",
    "gemma",
    "gemma3_text",
    "phi",
    "starcoder2",
    "cohere_qk_norm",
)
MOE_FAMILIES = ("mixtral", "qwen2_moe")


def tiny_family(
    family: str,
    *,
    vocab: int,
    seed: int = 0,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 4,
    dtype: torch.dtype | None = None,
) -> torch.nn.Module:
    """A random-init causal LM of `family` (a key of _FAMILY_CONFIGS, transformers' model_type) drawn from `seed`."""
    import transformers

    class_name, extra = _FAMILY_CONFIGS[family]
    config = getattr(transformers, class_name)(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=2 * hidden,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        **extra,
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    return model if dtype is None else model.to(dtype)
