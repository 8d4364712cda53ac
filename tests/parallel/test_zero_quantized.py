"""ZeRO++'s quantized collectives (qwZ, qgZ) and the level-by-level ones, against exact arithmetic.

1. Block quantization (engine/core/quantize.py): every element comes back within half a step of its block,
   max|block| / (2 qmax), for int8 and int4, any length and block size.
2. The collectives on 4 gloo ranks, flat and on two levels (engine.core.comm.fsdp_comms):
   - unquantized, the level-by-level all-gather equals the flat one bit for bit and the level-by-level
     reduce-scatter equals the flat one up to float summation order;
   - qwZ's all-gather: every element within its sender's block bound;
   - qgZ's reduction: within the bound derived level by level from the partial sums each level quantizes.
3. Training the tiny model on data=4 (ZeRO 3, SGD) with each quantization setting stays within a derived tolerance
   of the unquantized run's loss at every step, with finite gradient norms, and qwZ + qgZ sends at most 0.3x the
   data-axis bytes.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from distributed import run_distributed
from tiny_models import tiny_llama

from engine.core import comm
from engine.core.grid import init
from engine.core.quantize import dequantize, error_bound, quantize
from engine.models.parallelize import parallelize
from engine.spec import BlockFormat, ZeroConfig, ZeroError
from engine.training.train import StepLoss, TrainConfig, train

FLOAT_SLACK = 1e-6  # relative: x / scale and codes * scale each round once in float32


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("block", [2, 64, 256])
def test_every_element_is_within_half_a_step_of_its_block(bits: int, block: int) -> None:
    fmt = BlockFormat(bits, block)
    generator = torch.Generator().manual_seed(bits * 1000 + block)
    for numel in (1, 7, block - 1, block, block + 1, 1000):
        x = torch.randn(numel, generator=generator) * torch.rand(numel, generator=generator) * 3
        x[: min(numel, block)] *= 50  # a block of large values beside ordinary ones: scales are per block
        payload = quantize(x, fmt)
        assert payload.dtype == torch.uint8 and payload.numel() == fmt.payload_bytes(numel)
        back = dequantize(payload, numel, fmt, torch.float32)
        bound = error_bound(x, fmt)
        assert bool(((back - x).abs() <= bound * (1 + FLOAT_SLACK) + 1e-30).all()), (bits, block, numel)
        # the bound is the format's half step of the block's largest magnitude, computed here independently
        blocks = torch.nn.functional.pad(x, (0, fmt.blocks(numel) * block - numel)).view(-1, block)
        half_step = blocks.abs().amax(dim=1) / (2 * (2 ** (bits - 1) - 1))
        assert torch.equal(bound, half_step.repeat_interleave(block)[:numel])
    zeros = torch.zeros(3 * block)
    assert torch.equal(dequantize(quantize(zeros, fmt), zeros.numel(), fmt, torch.float32), zeros)
    with pytest.raises(ValueError, match="does not hold"):
        dequantize(quantize(zeros, fmt)[:-1], zeros.numel(), fmt, torch.float32)


def test_formats_and_settings_are_checked() -> None:
    assert BlockFormat(8, 256).payload_bytes(1000) == 4 * 256 + 4 * 4
    assert BlockFormat(4, 256).payload_bytes(1000) == 4 * 128 + 4 * 4
    with pytest.raises(ZeroError, match="8, 4"):
        BlockFormat(2, 256)
    with pytest.raises(ZeroError, match="even"):
        BlockFormat(8, 7)
    with pytest.raises(ZeroError, match="stage 2 or 3"):
        ZeroConfig(stage=1, quantize_gradients=True)
    with pytest.raises(ZeroError, match="smaller than the next and divide it"):
        ZeroConfig(stage=3, node_size=8, inner_levels=(3,))
    assert ZeroConfig(stage=3, node_size=8, inner_levels=(2,)).level_sizes(32) == (2, 4, 4)
    assert ZeroConfig(stage=3, node_size=4).level_sizes(4) == (4,)  # one node holds the axis: one level
    assert ZeroConfig(stage=3).level_sizes(8) == (8,)


# ----- the collectives on 4 ranks ----------------------------------------------------------------------------------

N = 300  # elements per rank's shard (not a multiple of the blocks: the padding is exercised)


def _inputs(rank: int, D: int) -> torch.Tensor:
    """Rank `rank`'s reduce-scatter input: D rows (one per destination) with magnitudes varying by block."""
    generator = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(D, N, generator=generator)
    return x * torch.linspace(0.01, 5.0, N) * (1 + rank)


def _qgz_bound(D: int, sizes: tuple[int, ...], fmt: BlockFormat) -> float:
    """The most qgZ's reduction can be off, per element, for the inputs of `_inputs`, derived level by level.

    At level i each rank quantizes the partial sums it holds (sums over the ranks of the levels inside it), so each
    of the g_i rows a rank receives is off by the error it already carried plus half a step of the largest partial
    sum (bounded by the sum of the |inputs| over those ranks, plus the carried error)."""
    largest = max(float(_inputs(r, D).abs().max()) for r in range(D))
    error, ranks_inside = 0.0, 1
    for g in sizes:
        partial = ranks_inside * largest + error
        error = g * (error + partial / (2 * fmt.qmax))
        ranks_inside *= g
    return error


def _collectives_worker(cases: list[tuple[dict, str]]) -> int:
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather  # noqa: F401 - FSDP2 present

    for zero_args, fmt_name in cases:
        zero = ZeroConfig(**zero_args)
        grid = init(data=4)
        try:
            data = grid.group("data")
            D = data.size
            levels = grid.data_levels(zero.level_sizes(D))
            fmt = BlockFormat(8 if fmt_name == "int8" else 4, 64)
            shard = _inputs(grid.rank, D)[0] * 0.1
            exact_gather = comm.all_gather(shard.unsqueeze(0), data)  # (D, N)
            # level-by-level, unquantized: bit for bit the flat all-gather
            assert torch.equal(comm.gather_levels(shard, levels), exact_gather), zero
            # qwZ: FSDP's hook fills FSDP's output buffer
            all_gather, reduce_scatter = comm.fsdp_comms(data, levels, weights=fmt, gradients=fmt)
            out = torch.empty(D * N)
            assert all_gather(out, shard, data.group) is None
            bound = torch.stack([error_bound(row, fmt) for row in exact_gather])
            error = (out.view(D, N) - exact_gather).abs()
            assert bool((error <= bound * (1 + FLOAT_SLACK)).all()), f"{zero} qwZ error {float(error.max())}"
            assert float(error.max()) > 0  # it did quantize
            # reduction: level by level unquantized equals the flat reduce-scatter; qgZ within the derived bound
            blocks = _inputs(grid.rank, D)
            exact = comm.reduce_scatter(blocks.reshape(-1), data)
            torch.testing.assert_close(comm.reduce_levels(blocks, levels), exact, rtol=1e-6, atol=1e-5)
            mine = torch.empty(N)
            assert reduce_scatter(mine, blocks.reshape(-1), data.group, torch.distributed.ReduceOp.SUM) is None
            limit = _qgz_bound(D, tuple(g.size for g in levels), fmt)
            worst = float((mine - exact).abs().max())
            assert 0 < worst <= limit * (1 + FLOAT_SLACK), f"{zero} {fmt}: qgZ error {worst} > bound {limit}"
        finally:
            grid.close()
    return len(cases)


def test_quantized_and_level_collectives_on_4_ranks() -> None:
    cases = [
        ({"stage": 3}, "int8"),
        ({"stage": 3, "node_size": 2}, "int8"),
        ({"stage": 2, "node_size": 2}, "int4"),
    ]
    assert run_distributed(4, _collectives_worker, cases) == [len(cases)] * 4


# ----- training on data=4 ----------------------------------------------------------------------------------------

VOCAB, SEQ, ROWS, STEPS, LR = 96, 16, 8, 4, 0.05
SIGMAS = 6.0  # a 6-sigma deviation of the rounding model below has probability < 2e-9


def _model():
    return tiny_llama(vocab=VOCAB, hidden=32, heads=4, kv_heads=2, positions=32)


def _examples():
    generator = torch.Generator().manual_seed(3)
    out = []
    for _ in range(ROWS):
        ids = torch.randint(0, VOCAB, (SEQ,), generator=generator)
        out.append({"input_ids": ids, "targets": torch.cat([ids[1:], torch.tensor([-100])])})
    return out


def _loss(model, batch) -> StepLoss:
    logits = model(input_ids=batch["input_ids"]).logits
    flat = F.cross_entropy(logits.flatten(0, 1).float(), batch["targets"].flatten(), reduction="sum")
    return StepLoss(loss_sum=flat, n_tokens=int((batch["targets"] != -100).sum()))


def _config(**zero: object) -> TrainConfig:
    # one step is the whole set, so every step sees the same rows in any order; SGD without clipping, so the
    # derivation below follows each update exactly
    return TrainConfig(
        epochs=STEPS, batch_size=ROWS, lr=LR, optimizer="sgd", max_grad_norm=None, progress=False, zero=3, **zero
    )


def _serial_statistics() -> list[dict[str, float]]:
    """Per step of the serial SGD run: the loss, the 2-norm of its gradient, the largest |weight| and the largest
    |gradient of one rank's loss sum| (what each rank hands the reduction: 2 of the 8 rows)."""
    model = _model()
    examples = _examples()
    ids = torch.stack([e["input_ids"] for e in examples])
    targets = torch.stack([e["targets"] for e in examples])
    tokens = int((targets != -100).sum())
    stats = []
    for _ in range(STEPS):
        rank_max = 0.0
        for r in range(4):
            model.zero_grad()
            part = slice(2 * r, 2 * r + 2)
            F.cross_entropy(
                model(input_ids=ids[part]).logits.flatten(0, 1), targets[part].flatten(), reduction="sum"
            ).backward()
            rank_max = max(rank_max, max(float(p.grad.abs().max()) for p in model.parameters()))
        model.zero_grad()
        total = F.cross_entropy(model(input_ids=ids).logits.flatten(0, 1), targets.flatten(), reduction="sum")
        (total / tokens).backward()
        stats.append(
            {
                "loss": float(total.detach()) / tokens,
                "grad_norm": math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters())),
                "max_weight": max(float(p.detach().abs().max()) for p in model.parameters()),
                "max_rank_grad": rank_max,
                "tokens": tokens,
            }
        )
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * p.grad
    return stats


def _tolerances(stats: list[dict[str, float]], zero: ZeroConfig, sizes: tuple[int, ...]) -> list[float]:
    """The loss tolerance at each step, derived from a rounding model (first order in the quantization errors).

    Round-to-nearest leaves each element off by an error uniform in half a step either side, independent across
    elements (standard deviation step / sqrt(12)); a first-order loss change sum_i g_i * e_i then has a standard
    deviation of at most |g|_2 * step / sqrt(12), with step the largest of any block.
    - qwZ: the forward and backward of step t see the weights off by at most half of max|w_t| / 127.
    - qgZ: each level of g ranks sums g rows, each rounded once with a step of at most (the largest partial sum it
      quantizes) / qmax; the update at step s is then off by lr / tokens times that sum of roundings, and the
      weights at step t carry every earlier update's error.
    The feedback of a weight difference on later gradients (relative size lr * steps * |Hessian|) is neglected: the
    tolerance is SIGMAS standard deviations of what remains."""
    out, update_var = [], 0.0
    for stat in stats:
        var = update_var
        if zero.quantize_weights:
            var += (stat["max_weight"] / 127) ** 2 / 12
        out.append(SIGMAS * stat["grad_norm"] * math.sqrt(var))
        if zero.quantize_gradients:
            qmax, inside, level_var = zero.gradient_format.qmax, 1, 0.0
            for g in sizes:
                level_var += g * (inside * stat["max_rank_grad"] / qmax) ** 2 / 12
                inside *= g
            update_var += (LR / stat["tokens"]) ** 2 * level_var
    return out


def _training_worker(cases: list[dict], stats: list[dict[str, float]]) -> list[list[float]]:
    grid = init(data=4)
    try:
        reference = train(parallelize(_model(), grid), _examples(), _loss, _config(), grid=grid).history
        for serial, step in zip(stats, reference, strict=True):  # the unquantized run is the serial one
            assert step["loss"] == pytest.approx(serial["loss"], rel=1e-5)
        exact_bytes = sum(reference[0]["bytes_sent"].values())
        gaps = []
        for zero_args in cases:
            config = _config(**zero_args)
            zero = config.zero_config
            history = train(parallelize(_model(), grid), _examples(), _loss, config, grid=grid).history
            sizes = zero.level_sizes(4)
            tolerances = _tolerances(stats, zero, sizes)
            for t, (step, ref, tol) in enumerate(zip(history, reference, tolerances, strict=True)):
                assert math.isfinite(step["grad_norm"]), (zero_args, t)
                gap = abs(step["loss"] - ref["loss"])
                assert gap <= tol, f"{zero_args} step {t}: |loss - unquantized| {gap:.3g} > tolerance {tol:.3g}"
            assert history[-1]["loss"] != reference[-1]["loss"]  # quantization took part
            gaps.append([(abs(s["loss"] - r["loss"]), tol) for s, r, tol in zip(history, reference, tolerances)])
            if zero.quantize_weights and zero.quantize_gradients and not zero.hierarchical:  # (hpZ's gather is not)
                sent = sum(history[0]["bytes_sent"].values())
                assert sent <= 0.3 * exact_bytes, f"{zero_args}: {sent} bytes vs {exact_bytes} unquantized"
        return gaps
    finally:
        grid.close()


def test_quantized_training_stays_within_the_derived_tolerance() -> None:
    cases = [
        {"zero_quantize": "weights"},
        {"zero_quantize": "gradients"},
        {"zero_quantize": "gradients", "zero_quantize_bits": 4},
        {"zero_quantize": "weights,gradients"},
        {"zero_quantize": "weights,gradients", "zero_node_size": 2},
    ]
    gaps = run_distributed(4, _training_worker, cases, _serial_statistics(), timeout=600)
    assert all(g == gaps[0] for g in gaps)  # every rank saw the same losses
    print("gap, tolerance per step:", gaps[0])
