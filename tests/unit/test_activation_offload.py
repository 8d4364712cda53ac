"""Activation offload (engine/memory/offload.py) in one process, on CPU.

- A Sequential of Linears and ReLUs: the saved-activation counts equal the figures computed by hand from what
  autograd saves (each Linear its input when its weight needs a gradient, each ReLU its output, the weights not
  counted), with and without offload; with offload nothing of the forward stays on the device and the backward holds
  one restored storage at a time.
- A tiny float32 Llama: gradients bit for bit equal without hooks, counting only, offloaded without a copy and with
  a real host copy, alone and under activation checkpointing (torch's non-reentrant checkpoint), and through a
  retained graph unpacked twice (what the zero-bubble pipeline's split backward does).
- enabled=False pushes no saved-tensor hook; a graph never run backward is freed with everything the hooks hold.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_llama
from torch import nn

from engine.memory.activation import checkpoint_decoder_layers
from engine.memory.offload import ActivationOffload, OffloadStats, SavedActivations

CPU = torch.device("cpu")
ROWS, WIDTH_IN, WIDTH, WIDTH_OUT = 4, 16, 32, 8
F32 = 4  # bytes


def _sequential() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(WIDTH_IN, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH_OUT)
    )


def _hooks_installed() -> bool:
    return torch._C._autograd._top_saved_tensors_default_hooks(False) is not None


def test_sequential_counts_equal_the_hand_figures() -> None:
    model, x = _sequential(), torch.randn(ROWS, WIDTH_IN)
    input_bytes = ROWS * WIDTH_IN * F32  # saved by the first Linear for its weight's gradient
    relu_bytes = ROWS * WIDTH * F32  # each ReLU's output, saved by the ReLU and by the Linear after it: one storage
    saved = input_bytes + 2 * relu_bytes  # 1280

    counter = SavedActivations(CPU)
    with counter:
        model(x).sum().backward()
    assert counter.stats == OffloadStats(saved_peak_bytes=saved, device_peak_bytes=saved, saved_tensors=5)

    reference = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    offload = ActivationOffload(True, CPU, host_copy=True)
    with offload:
        out = model(x).sum()
        assert offload.stats.device_peak_bytes == 0  # the forward kept nothing on the device
        assert offload.stats.host_peak_bytes == saved
        out.backward()
    # backward brings each storage back once and frees it after its last saver: one ReLU output at a time at most
    assert offload.stats == OffloadStats(
        saved_peak_bytes=saved,
        device_peak_bytes=relu_bytes,
        host_peak_bytes=saved,
        offloaded_bytes=saved,
        restored_bytes=saved,
        saved_tensors=5,
    )
    assert offload.stats.device_bytes_saved == saved - relu_bytes
    for p, expected in zip(model.parameters(), reference):
        assert torch.equal(p.grad, expected)
    offload.reset()  # the last backward freed every copy: a new step starts from nothing
    assert offload.stats == OffloadStats()


def test_disabled_offload_installs_no_hook() -> None:
    model, x = _sequential(), torch.randn(ROWS, WIDTH_IN)
    offload = ActivationOffload(False, CPU)
    with offload:
        assert not _hooks_installed()
        model(x).sum().backward()
    assert offload.stats == OffloadStats()
    with ActivationOffload(True, CPU), ActivationOffload(True, CPU):  # re-entrant, and popped on exit
        assert _hooks_installed()
    assert not _hooks_installed()


def _llama_gradients(block, checkpointed: bool = False, retain: bool = False) -> dict[str, torch.Tensor]:
    model = tiny_llama(vocab=64, hidden=32, layers=3, heads=4, kv_heads=2, positions=16)  # float32
    if checkpointed:
        checkpoint_decoder_layers(model)
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    with block:
        loss = model(input_ids=ids, labels=ids).loss
        if retain:  # the input gradient first, keeping the graph, then the weights' (a split backward)
            torch.autograd.grad(loss, model.model.embed_tokens.weight, retain_graph=True)
        loss.backward()
    return {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("checkpointed", [False, True], ids=["plain", "checkpointed"])
def test_llama_gradients_are_bitwise_equal(checkpointed: bool) -> None:
    reference = _llama_gradients(ActivationOffload(False, CPU), checkpointed)
    counter = SavedActivations(CPU)
    blocks = {
        "counted": counter,
        "offloaded": ActivationOffload(True, CPU),
        "copied": ActivationOffload(True, CPU, host_copy=True),
    }
    for name, block in blocks.items():
        got = _llama_gradients(block, checkpointed)
        for n, expected in reference.items():
            assert torch.equal(got[n], expected), f"{name}: {n}"
    copied = blocks["copied"].stats
    assert copied.saved_peak_bytes == counter.stats.saved_peak_bytes > 0  # the same storages, counted alike
    assert copied.offloaded_bytes == copied.restored_bytes == copied.saved_peak_bytes  # each storage once each way
    assert copied.device_peak_bytes < copied.saved_peak_bytes / 2  # backward holds a few storages at a time


def test_checkpointing_leaves_only_the_layer_inputs_to_offload() -> None:
    plain, checkpointed = SavedActivations(CPU), SavedActivations(CPU)
    _llama_gradients(plain)
    _llama_gradients(checkpointed, checkpointed=True)
    # inside a checkpointed layer checkpoint's own hooks keep nothing; its inputs (2 x 16 x 32 floats per layer)
    # and what lies outside the layers (embedding, final norm, lm_head, loss) reach ours
    assert checkpointed.stats.saved_peak_bytes < plain.stats.saved_peak_bytes / 3
    assert checkpointed.stats.saved_peak_bytes >= 3 * 2 * 16 * 32 * F32


def test_a_retained_graph_is_unpacked_twice() -> None:
    reference = _llama_gradients(ActivationOffload(False, CPU), retain=True)
    offload = ActivationOffload(True, CPU, host_copy=True)
    got = _llama_gradients(offload, retain=True)
    for n, expected in reference.items():
        assert torch.equal(got[n], expected), n
    offload.reset()
    assert offload.stats == OffloadStats()  # nothing left behind once the graph is freed


def test_a_graph_never_run_backward_is_freed() -> None:
    # where the hooks keep a tensor (counting, or offload with the host being the device) they keep a detached
    # alias: the tensor itself would make a cycle through its grad_fn that Python's collector cannot free
    model, x = _sequential(), torch.randn(ROWS, WIDTH_IN)
    for block in (SavedActivations(CPU), ActivationOffload(True, CPU), ActivationOffload(True, CPU, host_copy=True)):
        with block:
            out = model(x)  # the ReLU outputs are saved by their own nodes
        assert block.stats.saved_peak_bytes == ROWS * WIDTH_IN * F32 + 2 * ROWS * WIDTH * F32
        del out
        block.reset()
        assert block.stats == OffloadStats(), type(block).__name__


def test_an_inplace_change_of_a_saved_tensor_is_still_refused() -> None:
    # autograd skips its own version check for hooked tensors; where the tensor itself is kept, unpack checks
    for block in (SavedActivations(CPU), ActivationOffload(True, CPU)):
        a = torch.randn(3, requires_grad=True)
        with block:
            b = a * 2
            c = b.sin()
            b.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            c.sum().backward()
