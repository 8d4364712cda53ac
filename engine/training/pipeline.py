"""Pipeline parallelism: a transformers causal LM cut into stages, run by torch.distributed.pipelining's schedules.

    pipe = Pipeline(model, grid.group("x", "y", "z", "data"), loss_fn=loss_sum, schedule="1f1b", microbatches=8)
    loss = pipe.step(ids, labels)          # (B, T) each, on every rank; the sum of the M micro-batch losses
    torch.optim.SGD(pipe.parameters(), lr=0.1).step()

The decoder layers are cut into S = P * V contiguous stages (P ranks of the group, V stages per rank for the
interleaved schedules, stage s on rank s % P as torch places them): the input embeddings (and GPT-2's position table)
sit in front of the first stage's layers, the final norm and lm_head behind the last one's, and the loss runs on the
last stage. The cut balances the layers' parameter counts, or follows explicit `splits` (the first layer index of
stages 1..S-1). Every stage sends its hidden states (B/M, T, H) forward and receives their gradient back.

What each stage sets up itself, exactly as the base model's forward does, from the shape of what it receives:
positions 0..T-1, the causal mask (transformers' create_causal_mask) and, for rotary families, the cos/sin of the
base model's rotary module. Hence the inputs are full-length sequences without padding mask, cache or token types.

Confirmed families (stages composed on one process give the model's logits bit for bit, and loss, gradients and SGD
weights equal one process's at world 2 and 4, tests/parallel/test_pipeline.py): Llama, Qwen2 (full attention) and
GPT-2. Any other family, Qwen2 with sliding-window layers, GPT-2 with cross-attention, and input embeddings tied to
lm_head across stages are refused with one line. Each rank builds the whole model and its stages hold references to
its own modules: drop the model and the rest is freed.

Gradients: the losses are summed (scale_grads=False), so after a step every stage parameter holds the gradient of
the SUM of the micro-batch losses, the engine's convention (engine/training/state.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
)

from engine.core import comm
from engine.core.grid import AxisGroup
from engine.models.adapter import find_planned

# name -> (torch schedule, takes several stages per rank)
SCHEDULES = {
    "gpipe": (ScheduleGPipe, False),
    "1f1b": (Schedule1F1B, False),
    "interleaved-1f1b": (ScheduleInterleaved1F1B, True),
    "zero-bubble": (ScheduleInterleavedZeroBubble, True),
}


@dataclass(frozen=True)
class _Recipe:
    """Where a family keeps the pieces around its layers (attribute names on the base model) and how positions enter:
    a learned `table` added to the embeddings on the first stage, or a `rotary` module read by every layer."""

    embed: str
    norm: str
    table: str | None = None
    dropout: str | None = None
    rotary: str | None = None


# config.model_type -> recipe; each read off the family's modeling code and confirmed by tests/parallel/test_pipeline.py
RECIPES = {
    "llama": _Recipe(embed="embed_tokens", norm="norm", rotary="rotary_emb"),
    "qwen2": _Recipe(embed="embed_tokens", norm="norm", rotary="rotary_emb"),
    "gpt2": _Recipe(embed="wte", norm="ln_f", table="wpe", dropout="drop"),
}


class StageModule(nn.Module):
    """Stage `index`: decoder layers [start, stop) of the base model, with the embeddings in front on the first stage
    and the final norm and lm_head behind on the last.

    forward(x): x is token ids (B, T) int64 on the first stage, hidden states (B, T, H) on the others; returns hidden
    states (B, T, H), or logits (B, T, V) on the last stage. `names` maps each local parameter name to its name in the
    whole model.
    """

    def __init__(self, model: nn.Module, index: int, start: int, stop: int, last: bool) -> None:
        super().__init__()
        _, base, plan = find_planned(model)[0]
        recipe = RECIPES[plan.family]
        self.index, self.start, self.stop, self.config = index, start, stop, base.config
        self.layers = nn.ModuleList(getattr(base, plan.layers)[start:stop])
        self.embed = getattr(base, recipe.embed) if index == 0 else None
        self.table = getattr(base, recipe.table) if index == 0 and recipe.table else None
        self.dropout = getattr(base, recipe.dropout) if index == 0 and recipe.dropout else None
        self.rotary = getattr(base, recipe.rotary) if recipe.rotary else None  # buffers only (inv_freq)
        self.norm = getattr(base, recipe.norm) if last else None
        self.lm_head = model.get_output_embeddings() if last else None
        full = {id(p): name for name, p in model.named_parameters()}
        self.names = {name: full[id(p)] for name, p in self.named_parameters()}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from transformers.masking_utils import create_causal_mask

        positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0)  # (1, T), as the base model builds them
        h = x
        if self.embed is not None:
            h = self.embed(x)  # (B, T, H)
            if self.table is not None:
                h = h + self.table(positions)
            if self.dropout is not None:
                h = self.dropout(h)
        extra = {"position_embeddings": self.rotary(h, position_ids=positions)} if self.rotary is not None else {}
        mask = create_causal_mask(
            config=self.config, inputs_embeds=h, attention_mask=None, cache=None, position_ids=positions
        )
        for layer in self.layers:
            h = layer(h, attention_mask=mask, position_ids=positions, **extra)
        if self.lm_head is not None:
            h = self.lm_head(self.norm(h))  # (B, T, V)
        return h


def check_model(model: nn.Module) -> int:
    """The number of decoder layers of a causal LM whose pipeline set-up is confirmed; ValueError otherwise."""
    found = find_planned(model)
    if len(found) != 1:
        raise ValueError(f"{type(model).__name__}: the pipeline needs one base model with known decoder layers")
    _, base, plan = found[0]
    config = base.config
    if plan.family not in RECIPES:
        raise ValueError(f"{plan.family}: the pipeline's stage set-up is confirmed for {', '.join(RECIPES)} only")
    if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        raise ValueError(f"{plan.family} with sliding-window layers: not confirmed for pipelines; use full attention")
    if getattr(config, "add_cross_attention", False):
        raise ValueError(f"{plan.family} with cross-attention: not confirmed for the pipeline")
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear):
        raise ValueError(f"{type(model).__name__}: the pipeline needs an lm_head Linear behind the base model")
    if head.weight is getattr(base, RECIPES[plan.family].embed).weight:
        raise ValueError("input embeddings tied to lm_head sit on different stages; untie them (tie_word_embeddings)")
    return len(getattr(base, plan.layers))


def balanced_splits(costs: list[int], n_stages: int) -> list[int]:
    """The first layer index of stages 1..n_stages-1 cutting `costs` (one per layer, e.g. parameter counts) into
    contiguous runs of about equal sums, each at least one layer."""
    if not 1 <= n_stages <= len(costs):
        raise ValueError(f"{n_stages} stages for {len(costs)} layers: choose at most one stage per layer")
    total, prefix, splits = sum(costs), 0, []
    for index, cost in enumerate(costs):
        stage = len(splits) + 1
        if stage == n_stages:
            break
        # cut before `index` when its middle lies past the stage's share, or when later stages need the layers left
        past_share = prefix + cost / 2 > total * stage / n_stages
        if index > (splits[-1] if splits else 0) and (past_share or len(costs) - index == n_stages - stage):
            splits.append(index)
        prefix += cost
    return splits


def split_model(model: nn.Module, n_stages: int, splits: list[int] | None = None) -> list[StageModule]:
    """All `n_stages` stages of `model` (balanced by parameter count, or cut at `splits`: the first layer index of
    stages 1..n_stages-1, increasing). Every parameter lands in exactly one stage."""
    n_layers = check_model(model)
    if n_stages > n_layers:
        raise ValueError(f"{n_stages} stages for {n_layers} decoder layers: choose at most {n_layers} stages")
    _, base, plan = find_planned(model)[0]
    layers = getattr(base, plan.layers)
    if splits is None:
        splits = balanced_splits([sum(p.numel() for p in layer.parameters()) for layer in layers], n_stages)
    bounds = [0, *splits, n_layers]
    if len(splits) != n_stages - 1 or any(a >= b for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"splits {splits}: give {n_stages - 1} increasing layer indices in 1..{n_layers - 1}")
    stages = [StageModule(model, s, bounds[s], bounds[s + 1], s == n_stages - 1) for s in range(n_stages)]
    owned = [name for stage in stages for name in stage.names.values()]
    missing = sorted(set(dict(model.named_parameters())) - set(owned))
    if missing or len(owned) != len(set(owned)):
        raise ValueError(f"parameters outside exactly one stage ({missing[:3]}...): the set-up is not understood")
    return stages


def check_schedule(schedule: str, n_ranks: int, virtual: int, microbatches: int) -> None:
    """ValueError (one line) for settings the schedule cannot run on `n_ranks` ranks: unknown name, V > 1 on a
    one-stage-per-rank schedule, or fewer micro-batches than it needs (or a count its rounds do not divide)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    if virtual < 1 or (virtual > 1 and not SCHEDULES[schedule][1]):
        raise ValueError(f"{schedule} runs one stage per rank, not {virtual}; use interleaved-1f1b or zero-bubble")
    if microbatches < 1 or (schedule == "1f1b" and microbatches < n_ranks):
        raise ValueError(f"{schedule} needs at least {n_ranks} micro-batches on {n_ranks} ranks, not {microbatches}")
    rounds = max(1, microbatches // n_ranks)  # torch's interleaved schedules run M in rounds of about P
    if SCHEDULES[schedule][1] and microbatches % rounds:
        raise ValueError(f"{schedule} runs {microbatches} micro-batches in {rounds} rounds; choose M dividing evenly")


@dataclass
class PipelineStats:
    """What this rank did in the steps since `reset`: seconds in its stages' forward, backward and loss compute
    (wall clock, measured inside the stage calls, so waiting for neighbours is not counted), and the bytes of
    activations and activation gradients it sent to other stages."""

    compute_s: float = 0.0
    sent_bytes: int = 0

    def reset(self) -> None:
        self.compute_s, self.sent_bytes = 0.0, 0


class _MeasuredStage(PipelineStage):
    """torch's PipelineStage, timing its compute and counting the tensors of its point-to-point sends."""

    def __init__(self, *args, stats: PipelineStats, group: AxisGroup, **kwargs) -> None:
        super().__init__(*args, group=group.group, **kwargs)
        self.stats, self.axis_group = stats, group

    def _timed(self, run: Callable[[], object]) -> object:
        started = time.perf_counter()
        try:
            return run()
        finally:
            self.stats.compute_s += time.perf_counter() - started

    def forward_one_chunk(self, *args, **kwargs):
        return self._timed(lambda: super(_MeasuredStage, self).forward_one_chunk(*args, **kwargs))

    def backward_one_chunk(self, *args, **kwargs):
        return self._timed(lambda: super(_MeasuredStage, self).backward_one_chunk(*args, **kwargs))

    def backward_weight_one_chunk(self, *args, **kwargs):
        return self._timed(lambda: super(_MeasuredStage, self).backward_weight_one_chunk(*args, **kwargs))

    def _count(self, ops: list) -> list:
        sent = sum(op.tensor.numel() * op.tensor.element_size() for op in ops)
        self.stats.sent_bytes += sent
        self.axis_group.counter.add("pipe", sent)  # the grid's traffic log, when enabled
        return ops

    def get_fwd_send_ops(self, fwd_chunk_id: int) -> list:
        return self._count(super().get_fwd_send_ops(fwd_chunk_id))

    def get_bwd_send_ops(self, bwd_chunk_id: int) -> list:
        return self._count(super().get_bwd_send_ops(bwd_chunk_id))


class Pipeline:
    """`model` cut into P * `virtual` stages over the P ranks of `group`, run by `schedule` on `microbatches`
    micro-batches per step. Every rank of the group builds it with the same arguments and the same model.

    loss_fn(logits (B/M, T, V), labels (B/M, T)) -> a scalar: the SUM of the micro-batch's token losses.
    """

    def __init__(
        self,
        model: nn.Module,
        group: AxisGroup,
        *,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        schedule: str = "1f1b",
        microbatches: int,
        virtual: int = 1,
        splits: list[int] | None = None,
    ) -> None:
        if group.size < 2:
            raise ValueError("a pipeline needs a group of at least 2 ranks")
        check_schedule(schedule, group.size, virtual, microbatches)
        n_stages = group.size * virtual
        self.group, self.microbatches, self.stats = group, microbatches, PipelineStats()
        everything = split_model(model, n_stages, splits)
        self.stages = [everything[s] for s in range(group.rank, n_stages, group.size)]  # stage s on rank s % P
        device = next(model.parameters()).device
        stages = [_MeasuredStage(m, m.index, n_stages, device, stats=self.stats, group=group) for m in self.stages]

        def timed_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            started = time.perf_counter()
            loss = loss_fn(logits, labels)
            self.stats.compute_s += time.perf_counter() - started
            return loss

        kind, multi = SCHEDULES[schedule]
        self.schedule = kind(
            stages if multi else stages[0], n_microbatches=microbatches, loss_fn=timed_loss, scale_grads=False
        )

    def parameters(self) -> list[nn.Parameter]:
        """This rank's parameters (those of its stages), for its optimizer."""
        return [p for stage in self.stages for p in stage.parameters()]

    def named_parameters(self) -> dict[str, nn.Parameter]:
        """This rank's parameters under their names in the whole model."""
        return {stage.names[n]: p for stage in self.stages for n, p in stage.named_parameters()}

    def step(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Forward and backward of one batch, ids and labels (B, T) on every rank; gradients accumulate into the
        stage parameters. Returns the sum of the M micro-batch losses (detached, float64) on every rank."""
        rows, m = ids.shape[0], self.microbatches
        if rows % m:  # torch would cut unequal micro-batches
            raise ValueError(f"a batch of {rows} sequences does not split into {m} micro-batches; choose M dividing it")
        losses: list[torch.Tensor] = []
        self.schedule.step(ids, target=labels, losses=losses, return_outputs=False)
        total = torch.zeros((), dtype=torch.float64, device=ids.device)
        for loss in losses:  # only the rank of the last stage has them
            total += loss.detach().double()
        return comm.sum_control(total, self.group)
