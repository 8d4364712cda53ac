"""Activation checkpointing of decoder layers: keep only each layer's inputs, recompute the rest in backward.

Built on torch's composable, non-reentrant `torch.distributed._composable.checkpoint`: it installs hooks on the
layer (no wrapper module, so parameter names, state dicts, engine checkpoints and the engine's layer detection are
unchanged) and composes with FSDP2's `fully_shard` (engine/memory/zero.py) when applied first. The collectives inside a
parallelized decoder layer (ParallelLinear's gathers and reductions) simply run again during the recomputation, in
the same order on every rank, so gradients are those of the run without checkpointing (tests compare them on every
grid). `early_stop` is off: the recomputation runs each layer to its end on every rank, so no rank leaves a
collective of the layer unmatched by stopping at a different point than its peers.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn
from torch.distributed._composable import checkpoint

from engine.core.linear import ShardingError
from engine.models.adapter import LAYER_CACHE_ARGUMENTS
from engine.models.parallelize import decoder_stacks


def checkpoint_decoder_layers(model: nn.Module) -> int:
    """Recompute the activations of every decoder layer of `model` in backward instead of keeping them.

    Works on a plain or a parallelized transformers model whose plan names its decoder layers (engine/models/adapter.py:
    the declared tensor-parallel or pipeline plan, or the engine's own for GPT-2), in place; applying it twice
    changes nothing. Saved activations per layer drop to its input hidden states (plus what the layer's callers
    keep); each layer's forward runs twice per step. Random ops (dropout) draw the same numbers in the
    recomputation (the RNG state is saved). Returns how many layers are checkpointed. Raises
    ShardingError for a model without known decoder layers.
    """
    stacks = decoder_stacks(model)
    if not stacks:
        raise ShardingError(
            f"activation checkpointing found no decoder layers in {type(model).__name__} (it finds "
            "them through the tensor-parallel or pipeline plan of transformers models); train without "
            "--activation-checkpointing"
        )
    count = 0
    for *_, layers in stacks:
        for layer in layers:
            if checkpoint.state(layer) is None:  # torch's own record of the layers it checkpoints
                _drop_cache_while_training(layer)  # registered first: checkpoint's hook sees the cleaned inputs
                checkpoint(layer, early_stop=False)
            count += 1
    return count


def _drop_cache_while_training(layer: nn.Module) -> None:
    """A training forward with grad through a checkpointed layer runs without a KV cache.

    The recomputation would append the layer's keys and values to the cache a second time (HF's own gradient
    checkpointing clears the same arguments, with a warning). Generation and evaluation (no grad) keep the cache.
    """
    signature = inspect.signature(layer.forward)
    names = [n for n in LAYER_CACHE_ARGUMENTS if n in signature.parameters]
    if not names:
        return

    def clear(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict[str, Any]] | None:
        if not (module.training and torch.is_grad_enabled()):
            return None
        bound = signature.bind(*args, **kwargs)
        for name in names:
            if name in bound.arguments:
                bound.arguments[name] = LAYER_CACHE_ARGUMENTS[name]
        return bound.args, bound.kwargs

    layer.register_forward_pre_hook(clear, with_kwargs=True)


def is_checkpointed(model: nn.Module) -> bool:
    """True when `model` has decoder layers with activation checkpointing."""
    return any(checkpoint.state(m) is not None for m in model.modules())
