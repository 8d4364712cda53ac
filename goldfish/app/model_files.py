"""A run's models and their files: the starting weights, the vocabulary check, and HF checkpoint folders written
and read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

import engine
from data.atomic import write_json_atomic
from engine import Grid
from goldfish.app.config import RUN_FILE
from goldfish.app.models import build_tiny_model, is_tiny_model
from goldfish.app.prepare import Prepared
from goldfish.app.pretrained import DEFAULT_MODEL_CACHE, load_pretrained, load_pretrained_model, resolve_gguf


def initial_model(model_name: str, prepared: Prepared, seed: int) -> nn.Module:
    """The starting weights: a named tiny model at random init (seeded) or a pretrained HF model."""
    tokenizer = prepared.tokenizer
    if is_tiny_model(model_name):
        return build_tiny_model(
            model_name,
            vocab_size=len(tokenizer),
            max_positions=max(prepared.max_positions, 64),
            seed=seed,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    if resolve_gguf(model_name) is not None:
        # Exported once to an ordinary HF folder in the user cache: later runs load in about a second.
        model, _ = load_pretrained(model_name, cache_dir=DEFAULT_MODEL_CACHE)
    else:
        model = load_pretrained_model(model_name)
    check_vocabulary(model, prepared, model_name)
    return model


def check_vocabulary(model: nn.Module, prepared: Prepared, model_name: str) -> None:
    """Refuse a tokenizer with more tokens than the model embeds."""
    vocab = model.get_input_embeddings().num_embeddings
    if vocab < len(prepared.tokenizer):
        raise ValueError(
            f"tokenizer has {len(prepared.tokenizer)} tokens but model {model_name!r} embeds only "
            f"{vocab}: use the model's own tokenizer"
        )


def save_hf_model(model: nn.Module, tokenizer: Any, run_record: dict[str, Any], directory: Path) -> None:
    """An ordinary HF checkpoint: weights (safetensors), config, tokenizer, and the run that produced it."""
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    write_json_atomic(directory / RUN_FILE, run_record)


def save_parallel_hf_model(
    model: nn.Module, grid: Grid, tokenizer: Any, run_record: dict[str, Any], directory: Path
) -> None:
    """Consolidate a parallel model into an ordinary HF checkpoint. Called on every rank (the gather is collective);
    rank 0 writes the files."""
    from transformers import AutoModelForCausalLM

    state = engine.full_state_dict(model, grid, rank0_only=True)
    if grid.rank != 0:
        return
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(model.config)
    plain.load_state_dict(state, assign=True)
    plain.tie_weights()
    save_hf_model(plain, tokenizer, run_record, directory)


def load_model_weights(model: nn.Module, directory: Path) -> None:
    """Load a checkpoint folder's weights into an already built model (for resume)."""
    loaded = load_pretrained_model(directory)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if missing or unexpected:
        raise ValueError(f"checkpoint {directory} does not match the model: missing {missing}, unexpected {unexpected}")
