"""The analytic byte model (engine.planner.cost_model) against the engine's own byte counters, exactly.

For every ordered grid of world sizes 4 and 8, each rank enables its grid's ByteCounter, runs a step
(forward, backward, sync_gradients, clip_grad_norm_) and compares the bytes counted per group and per phase
with the prediction: they must be EQUAL (no tolerance: both are sums of integer byte counts computed with
the same ring-model arithmetic). Levels: one default-mode ParallelLinear (with and without bias, overlap
on and off, input with and without gradient), a normal->transposed chain, and a tiny parallelized HF Llama
(grouped-query attention, attention biases; 1 or 2 rows per rank, with an int64 padding mask or none, fp32
or bf16 autocast, overlap and weight prefetch on or off), with its embeddings and lm_head whole (the
loss from model(...).logits) or split by vocabulary over x*y*z (engine.parallelize's default, with the
training loss of `goldfish train`, causal_lm_token_losses). GPT-NeoX, Phi-3, OLMo2 and GPT-2 are planned from the
shape engine.models.shape reads off each model (its declared plan), on x=y=z=2 and on data=2 grids under ZeRO.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from distributed import run_distributed
from torch import nn

from engine.core.grid import GridShape, init
from engine.core.linear import ParallelLinear
from engine.core.placement import local_shard
from engine.models.parallelize import parallelize, rows_layout
from engine.models.shape import planner_shape
from engine.planner.cost_model import (
    PHASES,
    StepSettings,
    bytes_by_group,
    chained_linear_collectives,
    clip_collectives,
    count_grids,
    default_linear_collectives,
    grid_fits_shape,
    llama_step_collectives,
    memory_per_rank,
    ordered_grids,
    sync_collectives,
)
from engine.training.state import clip_grad_norm_, sync_gradients

IN, HID, OUT, ROWS, POS = 16, 24, 32, 2, 3  # divisible by every axis size (and product of two) up to 8
VOCAB, SEQ = 128, 8


def _grid_tuples(world: int) -> list[tuple[int, int, int, int]]:
    return [(g.data, g.x, g.y, g.z) for g in ordered_grids(world)]


def _measure_step(grid, run_forward, module: nn.Module) -> dict[str, dict[str, int]]:
    """Counted bytes per phase: forward (returns a scalar loss), backward, sync_gradients, clip_grad_norm_."""
    traffic = grid.traffic
    traffic.reset()
    traffic.enabled = True
    try:
        loss = run_forward()
        measured = {"forward": traffic.reset()}
        loss.backward()
        measured["backward"] = traffic.reset()
        sync_gradients(module, grid)
        measured["sync"] = traffic.reset()
        clip_grad_norm_(module, 1.0, grid)
        measured["clip"] = traffic.reset()
    finally:
        traffic.enabled = False
    return {phase: {k: v for k, v in counts.items() if v} for phase, counts in measured.items()}


def _compare(measured: dict[str, dict[str, int]], predicted: list, what: str) -> None:
    expected = {phase: bytes_by_group(predicted, phase) for phase in PHASES if phase in measured}
    assert all(c.phase in measured for c in predicted), f"{what}: predicted traffic in a phase not measured"
    assert measured == expected, f"{what}: measured {measured} != predicted {expected}"


def _shard_sizes(layer: ParallelLinear) -> list[tuple[int, tuple[str, ...]]]:
    return [(p.numel(), ("data",)) for p in layer.parameters()]


def _linear_worker(shapes: list[tuple[int, int, int, int]]) -> int:
    checked = 0
    for data, x, y, z in shapes:
        grid = init(data=data, x=x, y=y, z=z)
        shape = GridShape(data=data, x=x, y=y, z=z)
        try:
            for bias in (True, False):
                for overlap in (True, False):
                    torch.manual_seed(0)
                    layer = ParallelLinear(IN, OUT, bias, grid=grid, overlap=overlap)
                    inp = torch.randn(ROWS, POS, IN, requires_grad=True)
                    measured = _measure_step(grid, lambda: layer(inp).square().sum(), layer)
                    predicted = (
                        default_linear_collectives(IN, OUT, shape, tokens_per_rank=ROWS * POS, bias=bias)
                        + sync_collectives(_shard_sizes(layer), shape, 4)
                        + clip_collectives(shape)
                    )
                    _compare(measured, predicted, f"default linear bias={bias} overlap={overlap} grid {shape}")
                    checked += 1
            # input without a gradient: the backward input collectives disappear
            layer = ParallelLinear(IN, OUT, True, grid=grid)
            measured = _measure_step(grid, lambda: layer(torch.randn(ROWS, POS, IN)).square().sum(), layer)
            predicted = (
                default_linear_collectives(IN, OUT, shape, tokens_per_rank=ROWS * POS, input_grad=False)
                + sync_collectives(_shard_sizes(layer), shape, 4)
                + clip_collectives(shape)
            )
            _compare(measured, predicted, f"default linear, input without grad, grid {shape}")
            # chained: normal (IN -> HID), tanh, transposed (HID -> OUT) on the rows of the x*y group
            torch.manual_seed(0)
            chain = nn.ModuleList(
                [
                    ParallelLinear(IN, HID, True, grid=grid, mode="normal"),
                    ParallelLinear(HID, OUT, True, grid=grid, mode="transposed"),
                ]
            )
            inp = torch.randn(ROWS, POS, IN, requires_grad=True)
            measured = _measure_step(grid, lambda: chain[1](torch.tanh(chain[0](inp))).square().sum(), chain)
            sizes = _shard_sizes(chain[0]) + _shard_sizes(chain[1])
            predicted = (
                chained_linear_collectives(IN, HID, OUT, shape, tokens_per_group=ROWS * POS)
                + sync_collectives(sizes, shape, 4)
                + clip_collectives(shape)
            )
            _compare(measured, predicted, f"chained linears grid {shape}")
            checked += 1
        finally:
            grid.close()
    return checked


def tiny_llama_config():
    from transformers import LlamaConfig

    # 16 heads of 4 over 8 kv heads (grouped-query), biases on the attention projections
    return LlamaConfig(
        hidden_size=64,
        num_attention_heads=16,
        num_key_value_heads=8,
        num_hidden_layers=2,
        vocab_size=VOCAB,
        intermediate_size=128,
        max_position_embeddings=64,
        attention_bias=True,
        attn_implementation="sdpa",
    )


# (rows per rank, bytes per attention-mask element (0 = no mask; the engine gathers masks as int64), per-row
# position ids passed, bf16 autocast over fp32 weights)
LLAMA_CASES = ((2, 8, False, False), (1, 8, True, False), (2, 0, True, False), (2, 0, False, True))


def _llama_worker(
    shapes: list[tuple[int, int, int, int]], every_case: bool, vocab_split: bool = False, rows_layout_name: str = "own"
) -> int:
    """every_case: run all LLAMA_CASES on each grid, else one case per grid in turn (keeps world 8 fast).
    vocab_split: embeddings and lm_head split by vocabulary (parallelize's default) and the loss of
    causal_lm_token_losses (which takes no position ids: those cases run without them); else whole
    embeddings and the loss from model(...).logits. rows_layout_name "shared": the ranks of each x*y group read the
    same rows (engine.models.parallelize.rows_layout) and the prediction is the shared layout's."""
    from transformers import LlamaForCausalLM

    from conventions import IGNORE_INDEX
    from engine.core.vocab_parallel import causal_lm_token_losses
    from engine.memory.activation import checkpoint_decoder_layers

    config = tiny_llama_config()
    model_shape = planner_shape(config)
    torch.manual_seed(0)
    serial = LlamaForCausalLM(config)
    checked = 0
    for index, (data, x, y, z) in enumerate(shapes):
        grid = init(data=data, x=x, y=y, z=z)
        shape = GridShape(data=data, x=x, y=y, z=z)
        try:
            overlap = index % 2 == 0  # the schedule (and weight prefetch) must not change the bytes
            model = parallelize(
                copy.deepcopy(serial), grid, overlap=overlap, vocab_parallel=None if vocab_split else False
            )
            recompute = vocab_split and index % 2 == 1  # activation checkpointing: each layer's forward again
            if recompute:
                checkpoint_decoder_layers(model)
            # the memory model's parameter count per rank is exactly what the rank holds
            step = StepSettings(rows_per_rank=1, seq=SEQ, vocab_parallel=vocab_split)
            memory = memory_per_rank(model_shape, shape, step)
            held = sum(local_shard(p).numel() for p in model.parameters())
            assert held == sum(memory.detail[k] for k in ("sharded_params", "replicated_params", "vocab_params")), (
                f"grid {shape}"
            )
            reader = grid.rank if rows_layout_name == "own" else grid.coords["z"] + z * grid.coords["data"]
            gen = torch.Generator().manual_seed(reader)
            cases = LLAMA_CASES if every_case else [LLAMA_CASES[index % len(LLAMA_CASES)]]
            for rows, mask_bytes, positions, autocast in cases:
                positions = positions and not vocab_split
                ids = torch.randint(0, VOCAB, (rows, SEQ), generator=gen)
                targets = torch.full_like(ids, IGNORE_INDEX)
                targets[:, :-1] = ids[:, 1:]
                mask = None
                if mask_bytes:
                    mask = torch.ones(rows, SEQ, dtype=torch.long)
                    mask[0, SEQ - 3 :] = 0
                    if rows == 1:
                        mask = mask.bool()  # gathered as int64 all the same
                position_ids = torch.arange(SEQ).expand(rows, SEQ) if positions else None

                def forward():
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                        if vocab_split:
                            return causal_lm_token_losses(model, ids, targets, attention_mask=mask).sum()
                        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits
                    return F.cross_entropy(logits[:, :-1].float().reshape(-1, VOCAB), ids[:, 1:].reshape(-1))

                with rows_layout(model, rows_layout_name):
                    measured = _measure_step(grid, forward, model)
                model.zero_grad(set_to_none=True)
                # fp32 model: 4-byte elements everywhere; under autocast the matrix products are bf16 (2 bytes)
                # while weights and the residual stream stay fp32
                step = StepSettings(
                    rows_per_rank=rows,
                    seq=SEQ,
                    param_bytes=4,
                    act_bytes=2 if autocast else 4,
                    stream_bytes=4,
                    mask_bytes=mask_bytes,
                    position_ids=positions,
                    vocab_parallel=vocab_split,
                    recompute=recompute,
                    rows=rows_layout_name,
                )
                predicted = llama_step_collectives(model_shape, shape, step)
                _compare(
                    measured,
                    predicted,
                    f"llama rows={rows} mask bytes={mask_bytes} autocast={autocast} "
                    f"overlap={overlap} vocab split={vocab_split} recompute={recompute} "
                    f"grid {shape}",
                )
                checked += 1
        finally:
            grid.close()
    return checked


@pytest.mark.parametrize("world", [4, 8])
def test_linear_bytes_equal_prediction_on_every_grid(world: int) -> None:
    shapes = _grid_tuples(world)
    assert len(shapes) == count_grids(world) == {4: 10, 8: 20}[world]
    assert run_distributed(world, _linear_worker, shapes) == [5 * len(shapes)] * world


@pytest.mark.parametrize("world", [4, 8])
def test_llama_bytes_equal_prediction_on_every_grid(world: int) -> None:
    shapes = _grid_tuples(world)
    model_shape = planner_shape(tiny_llama_config())
    assert all(grid_fits_shape(model_shape, GridShape(*s)) is None for s in shapes)
    every_case = world == 4
    expected = len(shapes) * (len(LLAMA_CASES) if every_case else 1)
    assert run_distributed(world, _llama_worker, shapes, every_case) == [expected] * world


@pytest.mark.parametrize("world", [4, 8])
def test_llama_bytes_equal_prediction_with_vocab_split(world: int) -> None:
    """Embeddings and lm_head split by vocabulary over x*y*z with the chunked vocabulary-parallel loss: the
    counted bytes (embedding ids and partial embeddings, the loss's gathers, data-only gradient sync of the
    shards) equal the prediction on every grid; parameters held equal the memory model's count. Every other grid
    runs with activation checkpointing (each decoder layer's forward collectives once more in backward)."""
    shapes = _grid_tuples(world)
    every_case = world == 4
    expected = len(shapes) * (len(LLAMA_CASES) if every_case else 1)
    assert run_distributed(world, _llama_worker, shapes, every_case, True) == [expected] * world


@pytest.mark.parametrize("vocab_split", [False, True])
def test_llama_bytes_equal_prediction_in_the_shared_rows_layout(vocab_split: bool) -> None:
    """Shared rows layout (every rank of an x*y group reads the group's rows): no row gathers around the decoder,
    ids and hidden states of the vocabulary-parallel loss exchanged over z only plus x+y all-reduces, outside
    gradients summed over z+data: the counted bytes equal the prediction on every grid of world 4."""
    shapes = _grid_tuples(4)
    assert run_distributed(4, _llama_worker, shapes, False, vocab_split, "shared") == [len(shapes)] * 4


# ----- every family through the plan the engine shards by (engine.models.shape reads it) ---------------------------

# GPT-NeoX (per-head fused qkv, biases, LayerNorms with bias, a non-gated MLP), Phi-3 (fused [q|k|v] and [gate|up]),
# OLMo2 (q_norm/k_norm over the whole projection width: their statistics all-reduced over y) and GPT-2 (Conv1D layers
# through the engine's own plan, a learned position table, an lm_head tied to the embeddings)
FAMILIES = ("gpt_neox", "phi3", "olmo2", "gpt2")
# (grid (data, x, y, z), ZeRO stage or 0, embeddings split by vocabulary, activation checkpointing, attention mask)
FAMILY_CASES = {
    8: [((1, 2, 2, 2), 0, True, True, False), ((1, 2, 2, 2), 0, False, False, True)],
    4: [
        ((2, 1, 2, 1), 3, True, False, False),
        ((2, 2, 1, 1), 1, True, False, True),
        ((2, 1, 1, 2), 2, False, False, False),
    ],
}


def _family_worker(world: int, families: tuple[str, ...] = FAMILIES, cases: int | None = None) -> int:
    """Each family on each case of FAMILY_CASES[world]: the bytes counted per group and phase (forward, backward,
    sync, clip and, under ZeRO, the optimizer step) equal the planner's prediction from the shape read off the model,
    and the parameters (and, under ZeRO, the bytes) each rank holds equal the memory model's."""
    from tiny_models import tiny_family, tiny_gpt2

    from conventions import IGNORE_INDEX
    from engine.core.vocab_parallel import causal_lm_token_losses
    from engine.memory.activation import checkpoint_decoder_layers
    from engine.memory.zero import held_bytes, make_adamw, shard_data_axis
    from engine.models.shape import model_planner_shape
    from engine.planner.cost_model import zero_held_bytes
    from engine.spec import ZeroConfig

    checked = 0
    for family in families:
        serial = tiny_gpt2(vocab=VOCAB) if family == "gpt2" else tiny_family(family, vocab=VOCAB, seed=0)
        model_shape = model_planner_shape(serial)
        for dims, stage, vocab_split, recompute, masked in FAMILY_CASES[world][:cases]:
            grid = init(data=dims[0], x=dims[1], y=dims[2], z=dims[3])
            shape, zero = GridShape(*dims), ZeroConfig(stage=stage) if stage else None
            what = f"{family} grid {shape} zero {stage} vocab split {vocab_split} recompute {recompute}"
            split = None if vocab_split else False  # as parallelize: split wherever the engine splits
            try:
                assert grid_fits_shape(model_shape, shape) is None, what
                # overlap off with checkpointing, as in _llama_worker: a weight prefetch started before a recomputed
                # layer is gathered again (one more z all-gather per step, which the planner does not count)
                overlap = not recompute
                model = parallelize(copy.deepcopy(serial), grid, overlap=overlap, vocab_parallel=split)
                if recompute:
                    checkpoint_decoder_layers(model)
                if zero is None:
                    step = StepSettings(rows_per_rank=2, seq=SEQ, vocab_parallel=split)
                    memory = memory_per_rank(model_shape, shape, step)
                    held = sum(local_shard(p).numel() for p in model.parameters())
                    assert held == sum(
                        memory.detail[k] for k in ("sharded_params", "replicated_params", "vocab_params")
                    )
                else:
                    model = shard_data_axis(model, grid, zero)
                optimizer = make_adamw(model, [{"params": list(model.parameters())}], lr=1e-3)
                if model_shape.logits_loss and vocab_split:  # the loss's first call finds the logits path: untimed
                    with torch.no_grad():
                        causal_lm_token_losses(model, torch.zeros(2, SEQ, dtype=torch.long), torch.zeros(2, SEQ).long())
                gen = torch.Generator().manual_seed(grid.rank)
                ids = torch.randint(0, VOCAB, (2, SEQ), generator=gen)
                mask = None
                if masked:
                    mask = torch.ones(2, SEQ, dtype=torch.long)
                    mask[0, SEQ - 3 :] = 0

                def forward():
                    if vocab_split:
                        targets = torch.full_like(ids, IGNORE_INDEX)
                        targets[:, :-1] = ids[:, 1:]
                        return causal_lm_token_losses(model, ids, targets, attention_mask=mask).sum()
                    logits = model(input_ids=ids, attention_mask=mask).logits
                    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))

                measured = _measure_step(grid, forward, model)
                if zero is not None:  # the optimizer step: ZeRO-1 all-gathers the updated chunks
                    traffic = grid.traffic
                    traffic.enabled = True
                    try:
                        optimizer.step()
                        measured["optimizer"] = {k: v for k, v in traffic.reset().items() if v}
                    finally:
                        traffic.enabled = False
                step = StepSettings(
                    rows_per_rank=2,
                    seq=SEQ,
                    param_bytes=4,
                    act_bytes=4,
                    mask_bytes=8 if masked else 0,
                    recompute=recompute,
                    vocab_parallel=split,
                )
                predicted = llama_step_collectives(model_shape, shape, step, zero=zero, data_rank=grid.coord("data"))
                _compare(measured, predicted, what)
                if zero is not None:
                    expected = zero_held_bytes(
                        model_shape,
                        shape,
                        zero,
                        data_rank=grid.coord("data"),
                        vocab_parallel=split,
                    )
                    assert held_bytes(model, optimizer) == expected, what
                checked += 1
            finally:
                grid.close()
    return checked


@pytest.mark.parametrize("world", [8, 4])
def test_family_bytes_equal_prediction_from_the_plan(world: int) -> None:
    """GPT-NeoX, Phi-3, OLMo2 and GPT-2, planned from the shape engine.models.shape reads off the model (the
    projections of its tensor-parallel plan, fused or not, the norms beside them, the y-split RMSNorms): the bytes
    counted equal the prediction on a grid with x, y and z > 1 (world 8: vocabulary split with activation
    checkpointing, and whole with an attention mask) and on data=2 grids under ZeRO 1, 2 and 3 (world 4)."""
    cases = len(FAMILIES) * len(FAMILY_CASES[world])
    assert run_distributed(world, _family_worker, world) == [cases] * world


@pytest.mark.slow
def test_every_planned_family_bytes_equal_prediction_from_the_plan() -> None:
    """Every family of tests/tiny_models.py that the engine shards through a plan, on x=y=z=2 with the loss of
    `goldfish train` (chunked, or from the logits where the model changes them after its head: Gemma 2, Cohere,
    Granite, Phi; the vocabulary split wherever the engine splits it): the bytes counted equal the prediction."""
    from tiny_models import PLANNED_FAMILIES

    assert run_distributed(8, _family_worker, 8, PLANNED_FAMILIES, 1) == [len(PLANNED_FAMILIES)] * 8
