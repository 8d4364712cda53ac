"""--compile (engine/models/compile.py): decoder layers through torch.compile (inductor) equal the eager model.

Tolerance, derived. Inductor fuses each layer's pointwise ops and reductions (RMSNorm's mean of squares, softmax, SiLU
times the up projection) into generated C++ loops, which may add a reduction's terms in another order (vectorised
partial sums) than ATen does; the matmuls stay ATen calls. A float32 sum of n terms taken in two orders differs by at
most about n * eps * sum|terms| (eps = 2**-23, the usual bound on recursive summation), and the longest reduction in a
layer is over the hidden features (HIDDEN = 64; a sequence of 16 for softmax). Forward and backward through LAYERS
layers each add such an error relative to the tensors' scale, so every loss and gradient is compared at

    2 * LAYERS * HIDDEN * eps  (about 3e-5) times the largest magnitude of the quantity: the loss's own, and for
    gradients the largest of any parameter's,

because the errors enter at the scale of the activations and gradients flowing through the layers, and a parameter's
gradient that is small by cancellation (q and k at random init, whose attention is nearly uniform) keeps the absolute
error of the larger terms it sums. Measured: 6e-7 at the largest gradient's scale here, 2.3e-5 of q_proj's own on
data=2,x=2 (tests/parallel); a missing term or a wrong sign in any gradient is O(1e-2) or more of that scale.

Fast here: one tiny Llama, compiled once (the second layer, the checkpointed recomputation, the second step and the
offloaded run reuse the first layer's graph). The compiled training loop through the goldfish command is
tests/e2e/test_compile_cli.py (slow), the parallel grids tests/parallel/test_compile_parallel.py (slow).
Needs a C++ compiler (g++: inductor compiles its CPU kernels with it). About 3-8 s with inductor's on-disk cache
(TORCHINDUCTOR_CACHE_DIR, default /tmp/torchinductor_$USER) warm, about 30 s the first time on a machine.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from tiny_models import tiny_llama

from engine.core.linear import ShardingError
from engine.memory.activation import checkpoint_decoder_layers
from engine.memory.offload import ActivationOffload
from engine.models.compile import compiled_decoder_layers, eager_stance, is_compiled
from engine.spec import GridShape
from engine.training.config import TrainConfig

VOCAB, HIDDEN, LAYERS, ROWS, SEQ = 128, 64, 2, 2, 16
EPS = torch.finfo(torch.float32).eps
SCALE_TOL = 2 * LAYERS * HIDDEN * EPS  # see the module docstring


def model_of(seed: int = 0) -> torch.nn.Module:
    return tiny_llama(vocab=VOCAB, seed=seed, hidden=HIDDEN, layers=LAYERS, dtype=torch.float32)


def close(actual: torch.Tensor, expected: torch.Tensor, what: str, scale: float | None = None) -> None:
    """|actual - expected| <= SCALE_TOL * scale elementwise (default scale: max|expected|): the derived bound."""
    bound = SCALE_TOL * (expected.abs().max().item() if scale is None else scale)
    error = (actual - expected).abs().max().item()
    assert error <= bound, f"{what}: max error {error:.3g} > bound {bound:.3g}"


def sgd_steps(model: torch.nn.Module, ids: torch.Tensor, steps: int = 2, lr: float = 0.5) -> list:
    """`steps` SGD steps on the summed next-token loss; each step's (loss, gradients by name)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    out = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        logits = model(input_ids=ids, use_cache=False).logits
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1), reduction="sum")
        loss.backward()
        out.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
        optimizer.step()
    return out


@pytest.mark.parametrize("path", ["plain", "checkpointed", "offloaded"])
def test_compiled_layers_equal_eager_on_losses_and_gradients(path: str) -> None:
    ids = torch.randint(0, VOCAB, (ROWS, SEQ), generator=torch.Generator().manual_seed(1))
    eager = model_of()
    compiled = copy.deepcopy(eager)
    if path == "checkpointed":
        checkpoint_decoder_layers(compiled)  # before compile, as the training loop applies them
    # activation offload: the compiled graph's saved tensors go through the same saved-tensor hooks (a real copy)
    offload = ActivationOffload(path == "offloaded", torch.device("cpu"), host_copy=True)
    reference = sgd_steps(eager, ids)
    with compiled_decoder_layers(compiled) as count, offload:
        assert count == LAYERS and is_compiled(compiled)
        result = sgd_steps(compiled, ids)
        with eager_stance(), torch.no_grad():  # a generation inside the block runs eagerly: no compilation
            compiled.eval()
            assert compiled.generate(ids[:1, :4], max_new_tokens=3, do_sample=False).shape == (1, 7)
            compiled.train()
    assert not is_compiled(compiled)  # the block restores the layers' own forward
    for step, ((loss, grads), (loss_c, grads_c)) in enumerate(zip(reference, result)):
        close(loss_c, loss, f"step {step} loss")
        scale = max(grad.abs().max().item() for grad in grads.values())
        for name in grads:
            close(grads_c[name], grads[name], f"step {step} {name}", scale)


def test_refusals() -> None:
    with pytest.raises(ShardingError, match="none were found"):
        with compiled_decoder_layers(torch.nn.Sequential(torch.nn.Linear(2, 2))):
            pass
    model = model_of()
    with compiled_decoder_layers(model):
        with pytest.raises(ValueError, match="replaced already"):
            with compiled_decoder_layers(model):
                pass
    with pytest.raises(ValueError, match="zero-bubble with --compile is not supported"):
        TrainConfig(compile=True, batch_size=4, pipe_schedule="zero-bubble").check_pipeline(GridShape(pipe=2))
    assert TrainConfig(compile=True, batch_size=4).check_pipeline(GridShape(pipe=2))  # 1f1b: micro-batches chosen
