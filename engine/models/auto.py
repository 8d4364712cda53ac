"""auto_parallelize(): models built inside the block come out parallelized (see engine/models/parallelize.py)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch import nn

from engine.core.grid import Grid
from engine.core.linear import ParallelLinear
from engine.models.parallelize import parallelize

# ----- auto_parallelize ---------------------------------------------------------------------------------

_INIT_FUNCTIONS = (
    "uniform_",
    "normal_",
    "trunc_normal_",
    "xavier_uniform_",
    "xavier_normal_",
    "kaiming_uniform_",
    "kaiming_normal_",
    "orthogonal_",
    "sparse_",
    "eye_",
    "dirac_",
)
_INIT_MODULES = ("torch.nn.init", "transformers.initialization")
_RANDOM_FILLS = tuple(
    getattr(torch.Tensor, n)
    for n in ("normal_", "uniform_", "random_", "bernoulli_", "exponential_", "log_normal_", "cauchy_", "geometric_")
)


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
        is_init = (
            getattr(func, "__module__", None) in _INIT_MODULES and getattr(func, "__name__", "") in _INIT_FUNCTIONS
        )
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
    for attr, full_shape, take in (
        ("weight", (layer.out_features, layer.in_features), layer.shard_weight),
        ("bias", (layer.out_features,), layer.shard_bias),
    ):
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
        def __init__(
            self, in_features: int, out_features: int, bias: bool = True, device: Any = None, dtype: Any = None
        ) -> None:
            super().__init__(
                in_features, out_features, bias, grid=grid, mode="default", overlap=overlap, device=device, dtype=dtype
            )
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
