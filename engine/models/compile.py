"""Regional compilation: `torch.compile` of each decoder layer's forward, the rest of the model eager.

    with compiled_decoder_layers(model):      # every decoder layer's forward compiled in place (inductor)
        loss = loss_fn(model, batch)          # embeddings, lm_head and the loss run eagerly
        loss.backward()
        with eager_stance():                  # e.g. an evaluation or generation inside the block
            model.generate(...)

Only the decoder layers are compiled, as torchtitan compiles per transformer block: identical layers share one compiled
graph (dynamo inlines nn.Modules and takes their parameters as graph inputs, so the second layer is a cache hit, not a
recompilation), compile time is that of one layer, and the vocabulary-parallel loss, the goldfish mask and the
engine's hooks between layers stay the code they are. On a tensor-parallel grid the sharded products
(engine.core.linear.ParallelLinear: collectives, the z prefetch's pending handles, DTensor shards placed on several
axes) run eagerly between the compiled pieces of a layer (norms, rotary embeddings, attention, the MLP's activation):
`torch.compiler.disable` on their sharded forward.

Each layer's bound `forward` is replaced, for the duration of the block, by its compiled version held in the
instance's attribute, and removed at the end, so the model leaves the block as it entered. The forward, not the
module's `__call__` (`nn.Module.compile`), is compiled so that the hooks on the layer stay eager Python: activation
checkpointing's (engine/memory/activation.py: a generator per call driving saved-tensor hooks), FSDP2's (ZeRO,
engine/memory/zero.py: gathers and reshards around the layer) and the cache-dropping pre-hook; the saved-tensor hooks
of activation offload (engine/memory/offload.py) see the compiled graph's saved tensors. The tests compare every
composed path with eager (tests/unit/test_compile.py,
tests/parallel/test_compile_parallel.py).

Generation and evaluation with a KV cache would recompile per layer index and sequence length: run them under
`eager_stance()` (torch's `set_stance("force_eager")`, scoped to the block), as the training loop does.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, contextmanager
from typing import Iterator

import torch
from torch import nn

from engine.core.linear import ShardingError
from engine.models.parallelize import decoder_layers

DEFAULT_BACKEND = "inductor"


@contextmanager
def compiled_decoder_layers(model: nn.Module, *, backend: str = DEFAULT_BACKEND) -> Iterator[int]:
    """Within the block, every decoder layer of `model` runs its forward through `torch.compile(backend=backend)`;
    yields the number of layers compiled. Compilation happens at each layer's first call (the first one pays it, the
    others with the same structure reuse its graph). Plain, parallelized, ZeRO-partitioned or checkpointed models
    alike: apply it after the other transformations or before, the hooks they install stay outside the graph.

    Raises ShardingError for a model without known decoder layers and ValueError for a layer whose forward is already
    replaced (compiled twice, or by someone else).
    """
    layers = decoder_layers(model)
    if not layers:
        raise ShardingError(
            f"--compile compiles decoder layers, and none were found in {type(model).__name__} (they are found "
            "through the tensor-parallel or pipeline plan of transformers models); train without --compile"
        )
    for index, layer in enumerate(layers):
        if "forward" in vars(layer):  # an instance attribute: compiled already, or replaced by another tool
            raise ValueError(f"decoder layer {index} of {type(model).__name__} has its forward replaced already")
    compiled: list[nn.Module] = []
    try:
        for layer in layers:
            layer.forward = torch.compile(layer.forward, backend=backend)  # the class's forward, bound to this layer
            compiled.append(layer)
        yield len(compiled)
    finally:
        for layer in compiled:
            del layer.forward  # back to the class's forward


def is_compiled(model: nn.Module) -> bool:
    """True while `model`'s decoder layers run compiled (inside compiled_decoder_layers)."""
    return any("forward" in vars(layer) for layer in decoder_layers(model))


def eager_stance() -> AbstractContextManager[None]:
    """A block in which every compiled function runs its original Python instead (nothing is compiled or looked up):
    for evaluation and generation, whose shapes (KV cache, prefix lengths) would each cost a compilation."""
    return torch.compiler.set_stance("force_eager")
