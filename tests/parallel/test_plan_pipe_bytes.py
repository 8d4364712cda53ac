"""The planner's bytes of a pipelined step against the engine's counters: a tiny float32 Llama trained on pipe=2,
x=2 (4 gloo ranks; interleaved 1F1B with 2 stages per rank and 2 micro-batches) logs, per rank and step, the bytes
it sent per process group. On the second step they equal, for every group, what
engine.planner.plan.pipeline_step_prediction counts for that pipe rank: the point-to-point hidden states and
gradients (pipeline_p2p_bytes; in the own rows layout every rank of the x group sends both x ranks' rows) plus the
float64 all-reduce of the gradient norm over the stages on "pipe", and the collectives of the rank's part of the
model (its layers; the embeddings on the first stage, lm_head and the loss on the last) on its stage's grid. (The
first step moves more: torch's PipelineStage infers the stages' shapes with a real forward and backward.)"""

from __future__ import annotations

import torch
from distributed import run_distributed
from tiny_models import tiny_llama

import engine
from engine.core.grid import init
from engine.planner.cost_model import (
    Collective,
    StepSettings,
    TransformerShape,
    bytes_by_group,
    llama_step_collectives,
    pipe_rank_shape,
    pipeline_p2p_bytes,
)
from engine.spec import GridShape
from engine.training.train import StepLoss, TokenLossFn, TrainConfig, train

VOCAB, SEQ, ROWS, HIDDEN, LAYERS = 64, 8, 8, 32, 8
# interleaved: each rank holds a first or last stage and a middle one, and sends both ways (1F1B's ranks are the
# special case V = 1); 2 micro-batches
SETTINGS = ({"pipe_schedule": "interleaved-1f1b", "pipe_virtual": 2, "microbatches": 2},)


def _reduce(token_losses: torch.Tensor, batch: dict[str, torch.Tensor]) -> StepLoss:
    kept = batch["targets"] != -100
    return StepLoss(loss_sum=token_losses[kept].sum(), n_tokens=int(kept.sum()))


def _worker() -> list[dict[str, int]]:
    grid = init(pipe=2, x=2)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (ROWS, SEQ), generator=generator)
    targets = torch.cat([ids[:, 1:], torch.full((ROWS, 1), -100)], dim=1)
    rows = [{"input_ids": ids[i], "targets": targets[i]} for i in range(ROWS)]
    loss = TokenLossFn(targets=lambda batch: batch["targets"], reduce=_reduce)
    out = []
    for settings in SETTINGS:
        model = tiny_llama(vocab=VOCAB, hidden=HIDDEN, heads=4, kv_heads=2, layers=LAYERS, positions=32)
        net = engine.parallelize(model, grid)
        config = TrainConfig(batch_size=ROWS, optimizer="sgd", lr=0.1, progress=False, epochs=2, **settings)
        result = train(net, rows, loss, config, grid=grid)
        out.append({"pipe_rank": grid.coord("pipe"), **result.history[1]["bytes_sent"]})  # the second step
    return out


def test_pipelined_step_bytes_per_rank_equal_the_planners() -> None:
    shape = TransformerShape(hidden=HIDDEN, layers=LAYERS, heads=4, kv_heads=2, intermediate=64, vocab=VOCAB)
    norm = Collective("pipe", "all_reduce", 2, 8, "clip", "the gradient norm's sum over stages").sent_bytes
    for per_setting in run_distributed(4, _worker):
        for settings, sent in zip(SETTINGS, per_setting):
            m, v, rank = settings["microbatches"], settings.get("pipe_virtual", 1), sent.pop("pipe_rank")
            rows = ROWS // 2 // m  # the own layout: each x rank reads half of the step's rows
            step = StepSettings(rows_per_rank=rows, seq=SEQ, param_bytes=4, act_bytes=4, grad_accum=m)  # float32
            p2p = pipeline_p2p_bytes(shape, GridShape(pipe=2, x=2), step, rank=rank, virtual=v)
            stage = llama_step_collectives(pipe_rank_shape(shape, 2, v, rank), GridShape(x=2), step)
            assert sent == {**bytes_by_group(stage), "pipe": p2p + norm}, (settings, rank)
