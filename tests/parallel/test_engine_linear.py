"""The 3D tensor-parallel Linear against torch.nn.Linear on all 35 grids of world sizes 1, 2, 4 and 8.

Every check runs in float64: the parallel layer sums the same products in a different order (partial
matrix products over x, reduce-scatters over z, gathers of rows), so results differ from the serial layer
only by float64 rounding (~1e-16 relative on O(1) values summed over <= 24 terms); rtol=atol=1e-10
leaves a wide margin while catching any wrong or missing term (which shows up at O(1e-2) or more).
"""

from __future__ import annotations

from itertools import product

import pytest
import torch
import torch.nn.functional as F
from distributed import run_distributed
from torch import nn

from engine.core import comm
from engine.core.grid import init
from engine.core.linear import ParallelLinear

TOL = {"rtol": 1e-10, "atol": 1e-10}
IN, HID, OUT = 16, 24, 16  # divisible by every axis size and product of two axes up to 8
ROWS = 2  # rows (samples) per rank; each sample is a (3, features) sequence


def grids_of(world: int) -> list[tuple[int, int, int, int]]:
    return [g for g in product(range(1, world + 1), repeat=4) if g[0] * g[1] * g[2] * g[3] == world]


def _close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(a, b, **TOL, msg=lambda m: f"{what}: {m}")


def _data_sum(t: torch.Tensor, grid) -> torch.Tensor:
    return comm.all_reduce(t, grid.group("data"))


def _default_case(grid, bias: bool, overlap: bool) -> dict[str, torch.Tensor]:
    """One default-mode layer; every rank feeds its own ROWS samples. Returns the parallel results."""
    torch.manual_seed(1)
    serial = nn.Linear(IN, OUT, bias=bias).double()
    x_full = torch.randn(grid.world_size * ROWS, 3, IN, dtype=torch.float64, requires_grad=True)
    g_full = torch.randn(grid.world_size * ROWS, 3, OUT, dtype=torch.float64)
    (serial(x_full) * g_full).sum().backward()

    layer = ParallelLinear.from_linear(serial, grid, mode="default", overlap=overlap, name="probe")
    mine = slice(grid.rank * ROWS, (grid.rank + 1) * ROWS)
    x = x_full.detach()[mine].clone().requires_grad_()
    out = layer(x)
    (out * g_full[mine]).sum().backward()

    _close(out, serial(x_full)[mine].detach(), "default output")
    _close(x.grad, x_full.grad[mine], "default input grad")
    w_grad = layer.gather_weight(_data_sum(layer.weight.grad, grid))
    _close(w_grad, serial.weight.grad, "default weight grad")
    results = {"out": out.detach(), "x_grad": x.grad, "w_grad": w_grad}
    if bias:
        b_grad = layer.gather_bias(_data_sum(layer.bias.grad, grid))
        _close(b_grad, serial.bias.grad, "default bias grad")
        results["b_grad"] = b_grad
    return results


def _chained_case(grid, bias: bool, overlap: bool) -> dict[str, torch.Tensor]:
    """normal (IN->HID), tanh on the y-sharded hidden, transposed (HID->OUT). The ranks of one x*y group
    share their rows; groups that differ in z or data feed different rows."""
    torch.manual_seed(2)
    first, second = nn.Linear(IN, HID, bias=bias).double(), nn.Linear(HID, OUT, bias=bias).double()
    blocks = grid.size("z", "data")
    x_full = torch.randn(blocks * ROWS, 3, IN, dtype=torch.float64, requires_grad=True)
    g_full = torch.randn(blocks * ROWS, 3, OUT, dtype=torch.float64)
    (second(torch.tanh(first(x_full))) * g_full).sum().backward()

    p1 = ParallelLinear.from_linear(first, grid, mode="normal", overlap=overlap, name="first")
    p2 = ParallelLinear.from_linear(second, grid, mode="transposed", overlap=overlap, name="second")
    p1.prefetch_before(p2)  # with overlap, p2's weight gather starts before p1's product
    block = grid.coord("z") + grid.size("z") * grid.coord("data")
    mine = slice(block * ROWS, (block + 1) * ROWS)
    x = x_full.detach()[mine].clone().requires_grad_()
    hidden = p1(x)
    assert hidden.shape[-1] == HID // grid.size("y")
    prefetching = overlap and grid.size("z") > 1
    assert (p2._prefetch.pending is not None) == prefetching
    out = p2(torch.tanh(hidden))
    assert p2._prefetch.pending is None  # used
    (out * g_full[mine]).sum().backward()
    if prefetching:  # a prefetched weight that changes before use is gathered again
        hidden = p1(x.detach())
        with torch.no_grad():
            p2.weight.mul_(2.0)
        stale = p2(torch.tanh(hidden))
        expected = F.linear(torch.tanh(first(x_full.detach())), 2.0 * second.weight, second.bias)[mine]
        _close(stale, expected.detach(), "chained output after a weight change")
        with torch.no_grad():
            p2.weight.mul_(0.5)

    _close(out, second(torch.tanh(first(x_full)))[mine].detach(), "chained output")
    _close(x.grad, x_full.grad[mine], "chained input grad")
    results = {"out": out.detach(), "x_grad": x.grad}
    for name, p, s in (("first", p1, first), ("second", p2, second)):
        w_grad = p.gather_weight(_data_sum(p.weight.grad, grid))
        _close(w_grad, s.weight.grad, f"chained {name} weight grad")
        results[f"{name}_w"] = w_grad
        if bias:
            b_grad = p.gather_bias(_data_sum(p.bias.grad, grid))
            _close(b_grad, s.bias.grad, f"chained {name} bias grad")
            results[f"{name}_b"] = b_grad
    return results


def _weights_case(grid) -> None:
    """Construction: a ParallelLinear drawn from a seed equals nn.Linear drawn from that seed, and the
    random state afterwards is the same; from_linear keeps weights exactly; reshard_ keeps them too."""
    for mode in ("default", "normal", "transposed"):
        torch.manual_seed(3)
        serial = nn.Linear(IN, HID)
        after_serial = torch.rand(1)
        torch.manual_seed(3)
        layer = ParallelLinear(IN, HID, grid=grid, mode=mode)
        assert torch.equal(torch.rand(1), after_serial)
        assert isinstance(layer, nn.Linear) and layer.weight.dim() == 2
        assert torch.equal(layer.full_weight(), serial.weight) and torch.equal(layer.full_bias(), serial.bias)
        copy = ParallelLinear.from_linear(serial, grid, mode=mode)
        assert torch.equal(copy.weight, layer.weight) and torch.equal(copy.bias, layer.bias)
        other = "transposed" if mode != "transposed" else "normal"
        if HID % (grid.size("x") * grid.size("z")) == 0:
            copy.reshard_(other)
            assert torch.equal(copy.full_weight(), serial.weight) and torch.equal(copy.full_bias(), serial.bias)


def _all_grids(world: int) -> int:
    n = 0
    for data, x, y, z in grids_of(world):
        grid = init(data=data, x=x, y=y, z=z)
        try:
            _weights_case(grid)
            for bias in (True, False):
                for case in (_default_case, _chained_case):
                    on, off = case(grid, bias, True), case(grid, bias, False)
                    for key in on:  # overlap only reorders the same collectives: bit-identical numbers
                        assert torch.equal(on[key], off[key]), f"{case.__name__} {key}: overlap changed numbers"
        except AssertionError as error:
            raise AssertionError(f"grid data={data} x={x} y={y} z={z}: {error}") from error
        finally:
            grid.close()
        n += 1
    return n


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_linear_matches_serial_on_every_grid(world: int) -> None:
    assert run_distributed(world, _all_grids, world)[0] == len(grids_of(world))


def _errors() -> list[str]:
    grid = init(x=2)
    messages = []
    for make in (
        lambda: ParallelLinear(3, 4, grid=grid, name="model.layers.0.mlp.up_proj"),
        lambda: ParallelLinear(4, 3, grid=grid, mode="transposed", name="o_proj"),
        lambda: ParallelLinear(4, 4, grid=grid, mode="sideways"),
    ):
        try:
            make()
        except ValueError as error:
            messages.append(str(error))
    grid.close()
    return messages


def test_clear_errors() -> None:
    messages = run_distributed(2, _errors)[0]
    assert len(messages) == 3
    assert "model.layers.0.mlp.up_proj: in_features 3 is not divisible by x=2" in messages[0]
    assert "o_proj: out_features 3 is not divisible by x*z=2*1" in messages[1]
    assert "mode must be one of" in messages[2]


def _autocast_case(shape: tuple[int, int, int, int]) -> None:
    """Under CPU bf16 autocast the parallel layers follow F.linear: bf16 products, float32 gradients. bf16
    keeps 8 bits of mantissa (relative step 2^-8 = 0.4%) and the parallel layer rounds partial sums over x
    and y to bf16 too, so outputs and gradients agree with the serial autocast run to ~1%: rtol=atol=3e-2
    (a missing term would be off by far more)."""
    grid = init(*shape)
    torch.manual_seed(4)
    first, second = nn.Linear(IN, HID), nn.Linear(HID, OUT)
    x_full = torch.randn(grid.size("z", "data") * ROWS, IN, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        serial_out = second(torch.tanh(first(x_full)))
    serial_out.float().square().sum().backward()
    p1 = ParallelLinear.from_linear(first, grid, mode="normal")
    p2 = ParallelLinear.from_linear(second, grid, mode="transposed")
    block = grid.coord("z") + grid.size("z") * grid.coord("data")
    mine = slice(block * ROWS, (block + 1) * ROWS)
    x = x_full.detach()[mine].clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = p2(torch.tanh(p1(x)))
    assert out.dtype == torch.bfloat16
    out.float().square().sum().backward()
    assert x.grad.dtype == torch.float32 and p1.weight.grad.dtype == torch.float32
    loose = {"rtol": 3e-2, "atol": 3e-2}
    torch.testing.assert_close(out.float(), serial_out[mine].detach().float(), **loose)
    torch.testing.assert_close(x.grad, x_full.grad[mine], **loose)
    torch.testing.assert_close(p1.gather_weight(_data_sum(p1.weight.grad, grid)), first.weight.grad, **loose)
    torch.testing.assert_close(p2.gather_bias(_data_sum(p2.bias.grad, grid)), second.bias.grad, **loose)
    grid.close()


@pytest.mark.parametrize("shape", [(1, 2, 2, 1), (2, 1, 1, 2)])
def test_autocast_bf16(shape) -> None:
    run_distributed(4, _autocast_case, shape)
