"""The tiny random-init models the tests build, in one place: each test file picks its sizes, the builders are shared.

Plain functions rather than fixtures, because the multi-process tests build their models inside spawned workers;
tests/conftest.py hands the same builders to single-process tests as fixtures.
"""

from __future__ import annotations

from typing import Any

import torch


def tiny_llama(*, vocab: int, seed: int = 0, hidden: int = 64, layers: int = 2, heads: int = 8, kv_heads: int = 4,
               mlp: int | None = None, positions: int = 64, attention_bias: bool = True, mlp_bias: bool = False,
               tied: bool = False, dtype: torch.dtype | None = None, **config: Any) -> torch.nn.Module:
    """A LlamaForCausalLM drawn from `seed`: `hidden` wide (MLP `mlp`, default 2 x hidden), `layers` deep, `heads`
    query and `kv_heads` key/value heads; `dtype` float64 for gradients compared to ~1e-12; `config`: any other
    LlamaConfig field (e.g. attn_implementation, pad_token_id)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    settings = LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                           num_key_value_heads=kv_heads, intermediate_size=mlp or 2 * hidden,
                           max_position_embeddings=positions, attention_bias=attention_bias, mlp_bias=mlp_bias,
                           tie_word_embeddings=tied, **config)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(settings)
    return model if dtype is None else model.to(dtype)


def tiny_gpt2(*, vocab: int, seed: int = 0, hidden: int = 64, layers: int = 2, heads: int = 4, positions: int = 32,
              dropout: float = 0.0, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """A GPT2LMHeadModel drawn from `seed` (its Conv1D layers are what the engine's GPT-2 plan handles); dropout 0 by
    default so two models compare without replaying RNG."""
    from transformers import GPT2Config, GPT2LMHeadModel

    settings = GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads, n_positions=positions,
                          resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout)
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(settings)
    return model if dtype is None else model.to(dtype)
