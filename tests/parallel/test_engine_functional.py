"""Adjoint tests for every autograd pair of engine.core.functional, and the raw collectives of engine.core.comm.

For a linear map F distributed over a group, backward must be F's adjoint: with the global inner product
(summed over ranks for split/partial spaces, counted once for a replicated space),
<F(x), y> = <x, F^T(y)>. Float64 values; the two sides sum the same products in different orders, so
they agree to ~1e-15 relative; rtol=1e-10 catches any missing or doubled term (an O(1) relative error).
"""

from __future__ import annotations

import pytest
import torch
from distributed import run_distributed

from engine.core import comm
from engine.core.functional import (
    copy_to_group,
    gather_from_group,
    gather_sharded,
    reduce_from_group,
    reduce_scatter_to_group,
    split_to_group,
    tensor_parallel_matmul,
)
from engine.core.grid import init

REPLICATED, SPLIT = "replicated", "split"


def _random(shape: tuple[int, ...], kind: str, group, seed: int) -> torch.Tensor:
    """The same values on every rank of `group` when replicated, different values per rank otherwise."""
    gen = torch.Generator().manual_seed(seed if kind == REPLICATED else seed * 1000 + group.rank + 1)
    return torch.randn(shape, generator=gen, dtype=torch.float64)


def _inner(a: torch.Tensor, b: torch.Tensor, kind: str, group) -> float:
    local = torch.sum(a * b).reshape(1)
    total = comm.all_reduce(local, group).item()
    return total / group.size if kind == REPLICATED else total


def _adjoint(op, in_kind: str, out_kind: str, in_shape, out_shape, group, seed: int) -> tuple[float, float]:
    x = _random(in_shape, in_kind, group, seed).requires_grad_()
    y = _random(out_shape, out_kind, group, seed + 1)
    out = op(x)
    assert tuple(out.shape) == tuple(out_shape), (tuple(out.shape), out_shape)
    out.backward(y)
    return _inner(out.detach(), y, out_kind, group), _inner(x.detach(), x.grad, in_kind, group)


def _all_pairs(world: int) -> list[tuple[str, float, float]]:
    grid = init(x=world)
    group = grid.group("x")
    p = group.size
    rows, feats = 2 * p, 3
    cases = [
        ("copy_to_group", lambda t: copy_to_group(t, group), REPLICATED, SPLIT, (rows, feats), (rows, feats)),
        ("reduce_from_group", lambda t: reduce_from_group(t, group), SPLIT, REPLICATED, (rows, feats), (rows, feats)),
        ("split_to_group", lambda t: split_to_group(t, group, 0), REPLICATED, SPLIT, (rows, feats), (rows // p, feats)),
        (
            "split_to_group dim -1",
            lambda t: split_to_group(t, group, -1),
            REPLICATED,
            SPLIT,
            (feats, rows),
            (feats, rows // p),
        ),
        (
            "gather_from_group",
            lambda t: gather_from_group(t, group, 0),
            SPLIT,
            REPLICATED,
            (rows, feats),
            (rows * p, feats),
        ),
        (
            "gather_from_group dim 1",
            lambda t: gather_from_group(t, group, 1),
            SPLIT,
            REPLICATED,
            (feats, rows, 2),
            (feats, rows * p, 2),
        ),
        ("gather_sharded", lambda t: gather_sharded(t, group, 0), SPLIT, SPLIT, (rows, feats), (rows * p, feats)),
        (
            "reduce_scatter_to_group",
            lambda t: reduce_scatter_to_group(t, group, 0),
            SPLIT,
            SPLIT,
            (rows, feats),
            (rows // p, feats),
        ),
        (
            "reduce_scatter_to_group dim -1",
            lambda t: reduce_scatter_to_group(t, group, -1),
            SPLIT,
            SPLIT,
            (feats, rows),
            (feats, rows // p),
        ),
    ]
    one = grid.group("y")  # size 1: the matmul's other group is trivial in each of the two checks below
    weight = _random((4, rows), SPLIT, group, 99)
    x_fixed = _random((5, rows), SPLIT, group, 98)
    for overlap in (True, False):
        # as a map of x: x replicated over the ranks that produce other output slices (input_grad_group)
        cases.append(
            (
                f"tensor_parallel_matmul(x) overlap={overlap}",
                lambda t, o=overlap: tensor_parallel_matmul(t, weight, one, group, o),
                REPLICATED,
                SPLIT,
                (5, rows),
                (5, 4),
            )
        )
        # as a map of the weight shard: the full weight is gathered over shard_group and used on own rows
        cases.append(
            (
                f"tensor_parallel_matmul(w) overlap={overlap}",
                lambda w, o=overlap: tensor_parallel_matmul(x_fixed, w, group, one, o),
                SPLIT,
                SPLIT,
                (4, rows),
                (5, 4 * p),
            )
        )
    results = []
    for i, (name, op, ik, ok, ishape, oshape) in enumerate(cases):
        lhs, rhs = _adjoint(op, ik, ok, ishape, oshape, group, seed=10 * i)
        results.append((name, lhs, rhs))
    grid.close()
    return results


@pytest.mark.parametrize("world", [1, 2, 4])
def test_every_pair_is_adjoint(world: int) -> None:
    for name, lhs, rhs in run_distributed(world, _all_pairs, world)[0]:
        assert lhs == pytest.approx(rhs, rel=1e-10), f"{name}: <F x, y> = {lhs} but <x, F^T y> = {rhs}"


def _collectives() -> dict:
    grid = init(x=2, y=2)
    xy, x = grid.group("x", "y"), grid.group("x")
    r = float(grid.rank)
    t = torch.full((2, 3), r)
    out = {
        "all_reduce": comm.all_reduce(t, xy)[0, 0].item(),
        "unchanged": t[0, 0].item(),
        "gather_dim1": comm.all_gather(torch.full((2, 1), r), x, 1).tolist(),
        "reduce_scatter": comm.reduce_scatter(torch.arange(4.0).reshape(4, 1) + r, x, 0).flatten().tolist(),
        "async": comm.all_gather_async(torch.tensor([r]), xy).wait().tolist(),
    }
    grid.traffic.enabled = True
    comm.all_reduce(torch.zeros(100, dtype=torch.float32), x)  # 2 * 400 * (1/2) = 400 bytes
    comm.all_gather(torch.zeros(10, dtype=torch.float64), xy)  # 320 * 3/4 = 240 bytes
    comm.all_reduce(torch.zeros(10), grid.group("z"))  # size 1: free, not counted
    out["bytes"] = grid.traffic.reset()
    out["after_reset"] = dict(grid.traffic.sent)
    grid.traffic.enabled = False
    comm.all_reduce(torch.zeros(100), x)
    out["disabled"] = dict(grid.traffic.sent)
    grid.close()
    return out


def test_collectives_and_byte_counts() -> None:
    results = run_distributed(4, _collectives)
    for rank, out in enumerate(results):
        x_pair = [rank - rank % 2, rank - rank % 2 + 1]  # the two ranks of this rank's x group
        assert out["all_reduce"] == 0 + 1 + 2 + 3
        assert out["unchanged"] == rank
        assert out["gather_dim1"] == [[float(x_pair[0]), float(x_pair[1])]] * 2
        # rows 0..3 plus each rank's id, summed over the pair, this rank keeps rows 2*(rank%2)...
        full = [2 * i + sum(x_pair) for i in range(4)]
        assert out["reduce_scatter"] == full[2 * (rank % 2) : 2 * (rank % 2) + 2]
        assert out["async"] == [0.0, 1.0, 2.0, 3.0]
        assert out["bytes"] == {"x": 400, "x+y": 240}
        assert out["after_reset"] == {} and out["disabled"] == {}
