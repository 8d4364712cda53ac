"""Models: named tiny configurations built at random init, or any HF causal LM by name or folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, PretrainedConfig, PreTrainedModel


@dataclass(frozen=True)
class TinyModel:
    """A named architecture small enough to train on a laptop CPU in minutes."""

    description: str
    make_config: Callable[[int, int], PretrainedConfig]  # (vocab_size, max_positions) -> config


def _tiny_llama(hidden: int, layers: int, heads: int, kv_heads: int, mlp: int) -> Callable[[int, int], PretrainedConfig]:
    def make(vocab_size: int, max_positions: int) -> PretrainedConfig:
        return LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            intermediate_size=mlp,
            max_position_embeddings=max_positions,
            tie_word_embeddings=False,
        )

    return make


def _tiny_gpt2(vocab_size: int, max_positions: int) -> PretrainedConfig:
    return GPT2Config(
        vocab_size=vocab_size,
        n_embd=256,
        n_layer=4,
        n_head=4,
        n_positions=max_positions,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )


TINY_MODELS: dict[str, TinyModel] = {
    "tiny-llama": TinyModel("Llama, hidden 256, 4 layers, 4 heads, MLP 688 (about 2.6M + embeddings)",
                            _tiny_llama(256, 4, 4, 4, 688)),
    "tiny-llama-gqa": TinyModel("Llama with grouped-query attention, hidden 256, 4 layers, 8 heads, 4 kv heads",
                                _tiny_llama(256, 4, 8, 4, 688)),
    "micro-llama": TinyModel("Llama, hidden 64, 2 layers, 4 heads, 2 kv heads (tests)", _tiny_llama(64, 2, 4, 2, 128)),
    "tiny-gpt2": TinyModel("GPT-2, hidden 256, 4 layers, 4 heads, no dropout", _tiny_gpt2),
}


def is_tiny_model(name: str) -> bool:
    return name in TINY_MODELS


def build_tiny_model(name: str, *, vocab_size: int, max_positions: int, seed: int,
                     bos_token_id: int | None, eos_token_id: int | None, pad_token_id: int | None) -> PreTrainedModel:
    """Random-init a named tiny model; the same seed gives the same weights on every machine."""
    if name not in TINY_MODELS:
        raise ValueError(f"unknown tiny model {name!r}; choose one of {sorted(TINY_MODELS)} or give an HF name/folder")
    config = TINY_MODELS[name].make_config(vocab_size, max_positions)
    # Small vocabularies: the special ids must be ours, not the architecture's defaults (which may exceed the vocab).
    config.bos_token_id, config.eos_token_id, config.pad_token_id = bos_token_id, eos_token_id, pad_token_id
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = AutoModelForCausalLM.from_config(config)
    finally:
        torch.random.set_rng_state(generator_state)
    return model


def load_pretrained_model(name_or_path: str | Path, *, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """Load an HF causal LM from a hub name or a local folder, with a clear error when it cannot be found."""
    try:
        return AutoModelForCausalLM.from_pretrained(str(name_or_path), dtype=dtype)
    except (OSError, ValueError) as error:
        hint = ("the folder has no config.json/weights" if Path(name_or_path).exists() else
                "it is not a local folder and the model hub may be unreachable (offline machine?)")
        raise ValueError(f"cannot load model {str(name_or_path)!r}: {hint}. Give a folder written by save_pretrained "
                         f"(e.g. a goldfish run's model/ folder) or one of the tiny models {sorted(TINY_MODELS)}. "
                         f"Cause: {error}") from error
