"""Models: named configurations built at random init (tiny ones for a CPU, and the goldfish paper's TinyLlama-1.1B),
any HF causal LM by name or folder, or a GGUF file; and loading one sharded for parallel evaluation (on a pipe grid,
each rank reading only its own stage's tensors from a folder of safetensors)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, GPT2Config, LlamaConfig, PretrainedConfig, PreTrainedModel

from engine import Grid
from eval.parallel import parallelize_for_eval
from goldfish.app import paper
from goldfish.app.pretrained import DEFAULT_MODEL_CACHE, load_pretrained, load_pretrained_model, resolve_gguf
from goldfish.app.weights_folder import local_weights_folder, rank0_first


@dataclass(frozen=True)
class TinyModel:
    """A named architecture built at random init: small enough to train on a laptop CPU in minutes, except the
    paper's TinyLlama-1.1B (a GPU cluster's model, named here so `--model` builds it from scratch the same way)."""

    description: str
    make_config: Callable[[int, int], PretrainedConfig]  # (vocab_size, max_positions) -> config


def _tiny_llama(
    hidden: int, layers: int, heads: int, kv_heads: int, mlp: int
) -> Callable[[int, int], PretrainedConfig]:
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


def _tinyllama_1b(vocab_size: int, max_positions: int) -> PretrainedConfig:
    """TinyLlama-1.1B's sizes (goldfish.app.paper.TINYLLAMA) over the run's tokenizer; at least its 2,048 positions."""
    sizes = paper.TINYLLAMA
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=sizes["hidden"],
        num_hidden_layers=sizes["layers"],
        num_attention_heads=sizes["heads"],
        num_key_value_heads=sizes["kv_heads"],
        intermediate_size=sizes["intermediate"],
        max_position_embeddings=max(max_positions, sizes["max_positions"]),
        rms_norm_eps=sizes["rms_norm_eps"],
        rope_theta=sizes["rope_theta"],
        tie_word_embeddings=False,
    )


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
    "tiny-llama": TinyModel(
        "Llama, hidden 256, 4 layers, 4 heads, MLP 688 (about 2.6M + embeddings)", _tiny_llama(256, 4, 4, 4, 688)
    ),
    "tiny-llama-gqa": TinyModel(
        "Llama with grouped-query attention, hidden 256, 4 layers, 8 heads, 4 kv heads", _tiny_llama(256, 4, 8, 4, 688)
    ),
    "small-llama": TinyModel(
        "Llama, hidden 512, 4 layers, 8 heads, MLP 1376 (about 12.6M + embeddings)", _tiny_llama(512, 4, 8, 8, 1376)
    ),
    "micro-llama": TinyModel("Llama, hidden 64, 2 layers, 4 heads, 2 kv heads (tests)", _tiny_llama(64, 2, 4, 2, 128)),
    "tiny-gpt2": TinyModel("GPT-2, hidden 256, 4 layers, 4 heads, no dropout", _tiny_gpt2),
    paper.MODEL: TinyModel(
        "TinyLlama-1.1B (the goldfish paper's model): hidden 2048, 22 layers, 32 heads, 4 kv heads, MLP 5632",
        _tinyllama_1b,
    ),
}


def is_tiny_model(name: str) -> bool:
    return name in TINY_MODELS


def local_config(name: str, *, vocab_size: int, max_positions: int) -> PretrainedConfig | None:
    """The config of `--model name` when it can be read here without the network: a named tiny model's, or a local
    folder's config.json; None otherwise (a hub name, a GGUF file), for the workers to check."""
    if name in TINY_MODELS:
        return TINY_MODELS[name].make_config(vocab_size, max_positions)
    if (Path(name) / "config.json").is_file():
        return AutoConfig.from_pretrained(name, trust_remote_code=False)
    return None


def build_tiny_model(
    name: str,
    *,
    vocab_size: int,
    max_positions: int,
    seed: int,
    bos_token_id: int | None,
    eos_token_id: int | None,
    pad_token_id: int | None,
) -> PreTrainedModel:
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


def load_parallel_model(
    source: str | Path | nn.Module,
    grid: Grid | None,
    *,
    dtype: torch.dtype = torch.float32,
    cache_dir: str | Path | None = None,
) -> nn.Module:
    """Load a model and parallelize it for evaluation (`parallelize_for_eval`).

    source: an HF folder (e.g. a goldfish run's model/ folder) or hub name, a GGUF file or alias such as
    ``smollm2-135m``, or an already built model (e.g. a named tiny model from goldfish.app.models.build_tiny_model).
    A GGUF model is converted once to an HF folder under `cache_dir` (default ~/.cache/goldfish/models) by rank 0
    while the other ranks wait, then loaded from there by them. Every rank holds the full weights for a moment
    before sharding, except on a pipe grid, where each rank reads only its own stage (`load_pipeline_stage`) from the
    model's local folder of safetensors weights: the folder itself, a GGUF file's export, a hub model's snapshot
    (goldfish.app.weights_folder.local_weights_folder).
    """
    if not isinstance(source, nn.Module):
        name = str(source)
        if is_tiny_model(name):
            raise ValueError(
                f"{name!r} is a tiny model built at random init, not a checkpoint: build it with "
                "goldfish.app.models.build_tiny_model (it needs the tokenizer's sizes) and pass the model"
            )
        cache = Path(cache_dir) if cache_dir is not None else DEFAULT_MODEL_CACHE
        if grid is not None and grid.size("pipe") > 1:
            folder = local_weights_folder(name, grid, cache_dir=cache)
            if folder is not None:
                return load_pipeline_stage(folder, grid, dtype=dtype)
        if resolve_gguf(name) is not None:
            source = rank0_first(grid, lambda: load_pretrained(name, dtype=dtype, cache_dir=cache)[0])
        else:
            source = load_pretrained_model(name, dtype=dtype)
    return parallelize_for_eval(source, grid)


def load_pipeline_stage(folder: Path, grid: Grid, *, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The model of an HF folder of safetensors weights (e.g. a goldfish checkpoint) cut into one stage per pipe rank
    (eval.parallel.parallelize_for_eval), this rank reading only its own stage's tensors: engine.load_sharded builds
    the model on the meta device and gives storage to, and reads, only the stage this rank holds in a one-stage-per-
    rank cut (PipeConfig's default, the cut PipelineEvalModel takes). ValueError (one line) when the files lack one
    of its tensors or hold it in another shape. The stages' logits equal those of the model load_pretrained_model
    loads."""
    from engine import PipeConfig, check_model_folder, load_sharded
    from goldfish.app.model_config_check import check_config_file

    check_config_file(folder)
    check_model_folder(folder, fix="copy the folder again from where it came from, or re-create it")
    try:
        model = load_sharded(folder, grid, dtype=dtype, pipe=PipeConfig())
    except ValueError as error:
        raise ValueError(f"cannot load model {str(folder)!r}: {error}") from None
    return parallelize_for_eval(model, grid)
