"""Pipeline parallelism: a transformers causal LM cut into stages, run by torch.distributed.pipelining's schedules.

    pipe = Pipeline(model, grid.group("pipe"), loss_fn=loss_sum, schedule="1f1b", microbatches=8)
    loss = pipe.step(ids, labels)          # (B, T) each, on every rank; the sum of the M micro-batch losses
    torch.optim.SGD(pipe.parameters(), lr=0.1).step()  # this rank's stages (DTensors on a tensor grid)

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
lm_head across stages are refused with one line (torch's pipelining has no tie across stages either).

Each rank holds only its own stages' parameters. Every rank builds the whole model (its weights are then exactly
those of the serial initialization or checkpoint: transformers draws a model's weights from one random stream in
module order, which a stage built alone would not reproduce), or, from a folder of safetensors weights, only its own
stages of this cut (`own_stages`; engine.training.loading.load_sharded(pipe=...)), and the Pipeline moves the other
stages' parameters to the meta device (same objects, shapes and dtypes, no storage) before ZeRO partitions anything.
So the whole model's parameters exist only while the model is built, if at all; from the first step on a rank holds
its stages' share (about 1/P of the decoder layers, plus the embeddings on the first stage and the final norm and
lm_head on the last). Whatever reads the whole model reads it through the owners: engine.full_state_dict and
checkpoints (each rank writes its own stages' tensors), `token_losses` (an evaluation, one pass through the stages'
ranks), `whole_model()` for code that must run the whole model on every rank, and engine/training/pipeline_eval.py
for eval/'s decoding (one pass through the stages per forward, a KV cache per stage).

Gradients: the losses are summed (scale_grads=False), so after a step every stage parameter holds the gradient of
the SUM of the micro-batch losses, the engine's convention (engine/training/state.py).
"""

from __future__ import annotations

import inspect
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

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
from engine.core.functional import gather_from_group, split_to_group
from engine.core.grid import AxisGroup
from engine.core.placement import local_shard
from engine.core.vocab_parallel import head_token_losses
from engine.memory.zero import local
from engine.models.adapter import CACHE_KEYWORDS, causal_mask, find_planned
from engine.models.layout import parallel_grid, running_rows
from engine.models.stages import check_model, stage_recipe
from engine.spec import PIPE_SCHEDULES, PipeConfig, row_gather_axes

# name -> (torch schedule, takes several stages per rank)
SCHEDULES = {
    name: (torch_class, PIPE_SCHEDULES[name])
    for name, torch_class in (
        ("gpipe", ScheduleGPipe),
        ("1f1b", Schedule1F1B),
        ("interleaved-1f1b", ScheduleInterleaved1F1B),
        ("zero-bubble", ScheduleInterleavedZeroBubble),
    )
}


class StageModule(nn.Module):
    """Stage `index`: decoder layers [start, stop) of the base model, with the embeddings in front on the first stage
    and the final norm and lm_head behind on the last.

    forward(x): x is token ids (B, T) int64 on the first stage, hidden states (B', T, H) on the others; returns hidden
    states (B', T, H), or on the last stage logits (B, T, V), or the per-token losses (B, T) float32 of `targets`
    when the stage is given them (set_targets). `names` maps each local parameter name to its name in the whole model.

    On a model parallelized with x*y > 1 in the "own" rows layout, the decoder layers run on the rows of the x*y group
    (B' = B * x * y), as engine.parallelize's stack hooks arrange for the base model's forward: the first stage
    gathers its embedded rows over x*y and the last keeps its own rows of the final hidden states.
    """

    def __init__(self, model: nn.Module, index: int, start: int, stop: int, last: bool) -> None:
        super().__init__()
        _, base, plan = find_planned(model)[0]
        recipe = stage_recipe(plan.family)
        self.index, self.start, self.stop, self.config = index, start, stop, base.config
        self.layers = nn.ModuleList(getattr(base, plan.layers)[start:stop])
        self.embed = getattr(base, recipe.embed) if index == 0 else None
        self.table = getattr(base, recipe.table) if index == 0 and recipe.table else None
        self.dropout = getattr(base, recipe.dropout) if index == 0 and recipe.dropout else None
        self.rotary = getattr(base, recipe.rotary) if recipe.rotary else None  # buffers only (inv_freq)
        self.norm = getattr(base, recipe.norm) if last else None
        self.lm_head = model.get_output_embeddings() if last else None
        self.grid = parallel_grid(model)  # None for a model engine.parallelize did not shard
        self.targets: torch.Tensor | None = None  # (B, T) next-token targets of the micro-batch in flight
        self.positions: torch.Tensor | None = None  # (B, T) its position ids, when rows have their own (packed rows)
        full = {id(p): name for name, p in model.named_parameters()}
        self.names = {name: full[id(p)] for name, p in self.named_parameters()}
        # the keyword the decoder layers take their KV cache by in the installed transformers (GPT-2's: layer_past)
        parameters = inspect.signature(self.layers[0].forward).parameters
        self.cache_keyword = next((k for k in (*CACHE_KEYWORDS, "layer_past") if k in parameters), CACHE_KEYWORDS[0])

    def embed_tokens(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The first stage's input: ids (B, T) embedded (B, T, H), plus the position table at `positions` (B, T) or
        (1, T) where the family has one, through the embedding dropout where it has one, as the base model does."""
        h = self.embed(ids)
        if self.table is not None:
            h = h + self.table(positions)
        if self.dropout is not None:
            h = self.dropout(h)
        return h

    def _row_group(self) -> AxisGroup | None:
        """The x*y group whose rows the decoder layers run on together, when its ranks read different rows."""
        if self.grid is None or not row_gather_axes(running_rows(self.layers)) or self.grid.size("x", "y") == 1:
            return None
        return self.grid.group("x", "y")

    def forward(
        self,
        x: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        cache: Any = None,
        use_cache: bool = False,
        logits_to_keep: int | torch.Tensor = 0,
    ) -> torch.Tensor:
        """The keywords are the serial causal LM's, for an evaluation through the stages
        (engine/training/pipeline_eval.py): the padding mask (B, T_past + T), the KV cache (this stage's layers fill
        theirs), and the positions whose logits the last stage returns; training passes none of them."""
        group = self._row_group()
        if self.positions is None:
            positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0)  # (1, T), as the base model builds them
        else:  # (B, T) restarting at each packed document: transformers then makes the mask block-causal
            positions = self.positions if group is None else comm.all_gather(self.positions.contiguous(), group, 0)
        h = x
        if self.embed is not None:
            h = self.embed_tokens(x, positions)
            if group is not None:
                h = gather_from_group(h, group, 0)  # (B', T, H): the rows of the x*y group
        extra = {"position_embeddings": self.rotary(h, position_ids=positions)} if self.rotary is not None else {}
        mask = causal_mask(self.config, h, positions, attention_mask, cache, self.start)  # cache layer: the first's
        if cache is not None or use_cache:  # an evaluation's KV cache (training keeps the layers' defaults)
            extra.update({"use_cache": use_cache, self.cache_keyword: cache})
        for layer in self.layers:
            h = layer(h, attention_mask=mask, position_ids=positions, **extra)
        if self.lm_head is None:
            return h
        h = self.norm(h)
        if group is not None:
            h = split_to_group(h, group, 0)  # this rank's own rows (B, T, H)
        if self.targets is None:
            if not isinstance(logits_to_keep, int) or logits_to_keep:  # only the positions an evaluation asks for
                h = h[:, slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep, :]
            return self.lm_head(h)  # (B, T', V)
        return head_token_losses(self.lm_head, h, self.targets)  # (B, T)


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
        sizes = [sum(local_shard(p).numel() for p in layer.parameters()) for layer in layers]  # what a rank holds
        splits = balanced_splits(sizes, n_stages)
    bounds = [0, *splits, n_layers]
    if len(splits) != n_stages - 1 or any(a >= b for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"splits {splits}: give {n_stages - 1} increasing layer indices in 1..{n_layers - 1}")
    stages = [StageModule(model, s, bounds[s], bounds[s + 1], s == n_stages - 1) for s in range(n_stages)]
    owned = [name for stage in stages for name in stage.names.values()]
    missing = sorted(set(dict(model.named_parameters())) - set(owned))
    if missing or len(owned) != len(set(owned)):
        raise ValueError(f"parameters outside exactly one stage ({missing[:3]}...): the set-up is not understood")
    return stages


def own_stages(model: nn.Module, group: AxisGroup, pipe: PipeConfig) -> list[StageModule]:
    """The stages of `model` that rank `group.rank` runs in the cut a Pipeline over `group` with the settings `pipe`
    takes (split_model of S = P * pipe.virtual stages at pipe.splits, stage s on rank s % P), e.g. to give only their
    parameters storage before the Pipeline is built (engine.training.loading.load_sharded(pipe=...)). Works on a
    model on the meta device; ValueError (one line) for a model the Pipeline refuses (tied embeddings, a family it
    does not know, more stages than layers)."""
    stages = split_model(model, group.size * pipe.virtual, list(pipe.splits) or None)
    return [stage for stage in stages if stage.index % group.size == group.rank]


def check_schedule(schedule: str, n_ranks: int, virtual: int, microbatches: int) -> None:
    """ValueError (one line) for settings the schedule cannot run on `n_ranks` ranks: unknown name, V > 1 on a
    one-stage-per-rank schedule, or fewer micro-batches than it needs (or a count its rounds do not divide)."""
    PipeConfig(schedule=schedule, virtual=virtual).check_microbatches(n_ranks, microbatches)


@dataclass
class PipelineStats:
    """What this rank did in the steps since `reset`: seconds in its stages' forward, backward and loss compute
    (wall clock, measured inside the stage calls, so waiting for neighbours is not counted), and the bytes of
    activations and activation gradients it sent to other stages."""

    compute_s: float = 0.0
    sent_bytes: int = 0
    losses_due: int = 0  # micro-batches the last stage forwarded whose loss is not computed yet

    def reset(self) -> None:
        self.compute_s, self.sent_bytes = 0.0, 0


class _MeasuredStage(PipelineStage):
    """torch's PipelineStage, timing its compute and counting the tensors of its point-to-point sends."""

    def __init__(self, *args, stats: PipelineStats, group: AxisGroup, **kwargs) -> None:
        super().__init__(*args, group=group.group, **kwargs)
        self.stats, self.axis_group = stats, group
        self.chunk_targets: list[torch.Tensor] | None = None  # per micro-batch (B/M, T), during step_token_losses
        self.chunk_positions: list[torch.Tensor] | None = None  # the same for rows' own position ids

    def _timed(self, run: Callable[[], object]) -> object:
        started = time.perf_counter()
        try:
            return run()
        finally:
            self.stats.compute_s += time.perf_counter() - started

    def forward_one_chunk(self, fwd_chunk_id: int, *args, **kwargs):
        module = self.submod
        if self.is_last:
            self.stats.losses_due += 1  # the schedule computes this micro-batch's loss next
            if self.chunk_targets is not None:  # the last stage computes this micro-batch's per-token losses
                module.targets = self.chunk_targets[fwd_chunk_id]
        if self.chunk_positions is not None:
            module.positions = self.chunk_positions[fwd_chunk_id]
        try:
            return self._timed(lambda: super(_MeasuredStage, self).forward_one_chunk(fwd_chunk_id, *args, **kwargs))
        finally:
            module.targets = module.positions = None

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

    Two ways to run a step: `step(ids, labels)` with loss_fn(logits (B/M, T, V), labels (B/M, T)) -> a scalar (the
    SUM of the micro-batch's token losses); or `step_token_losses(ids, targets, reduce)`, where the last stage computes
    the per-token cross-entropies of `targets` through lm_head without full-vocabulary logits (vocabulary-parallel on a
    tensor-parallel grid) and `reduce` turns them into the scalar to differentiate.
    """

    def __init__(
        self,
        model: nn.Module,
        group: AxisGroup,
        *,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        schedule: str = "1f1b",
        microbatches: int,
        virtual: int = 1,
        splits: list[int] | None = None,
        prepare: Callable[[list[StageModule]], None] | None = None,
        stages: list[StageModule] | None = None,
    ) -> None:
        """prepare(stages): runs on every stage module (all of them, on every rank) before torch's stages are built
        around them, e.g. ZeRO's fully_shard with each stage as a root (engine.memory.zero.shard_data_axis).
        stages: the stage modules of another Pipeline of the same model and cut (`pipe.all_stages`), for a second
        micro-batch shape (torch's stages keep the shapes of their first step): nothing is cut or prepared again."""
        if group.size < 2:
            raise ValueError("a pipeline needs a group of at least 2 ranks")
        check_schedule(schedule, group.size, virtual, microbatches)
        n_stages = group.size * virtual
        self.group, self.microbatches, self.stats = group, microbatches, PipelineStats()
        self.device = device = next(p.device for p in model.parameters() if not p.is_meta)
        if stages is not None:
            if len(stages) != n_stages:
                raise ValueError(f"{len(stages)} stage modules given for {n_stages} stages")
            self.all_stages = stages
        else:
            self.all_stages = split_model(model, n_stages, splits)  # every rank knows every stage's parameters
            for stage in self.all_stages:
                if stage.index % group.size != group.rank:
                    stage_to_device(stage, "meta")  # another rank's stage: before ZeRO partitions (and allocates) it
                elif any(p.is_meta for p in stage.parameters()):  # a model built for another cut or rank
                    raise ValueError(
                        f"stage {stage.index} of this rank holds parameters on the meta device: the model was loaded "
                        "for another cut (give load_sharded the pipeline's own settings) or not loaded"
                    )
            if prepare is not None:
                prepare(self.all_stages)
        self.stages = [self.all_stages[s] for s in range(group.rank, n_stages, group.size)]  # stage s on rank s % P
        self._torch_stages = [
            _MeasuredStage(m, m.index, n_stages, device, stats=self.stats, group=group) for m in self.stages
        ]
        self._reduce: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None

        def timed_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            if not self.stats.losses_due:
                # torch's first step infers the backward's tensor shapes by calling the loss on an output of the
                # stage's forward outside any micro-batch: a differentiable stand-in, not a micro-batch's loss
                return output.float().sum() * 0.0
            self.stats.losses_due -= 1
            started = time.perf_counter()
            if self._reduce is not None:
                loss = self._reduce(output, target)
            elif loss_fn is not None:
                loss = loss_fn(output, target)
            else:
                raise ValueError("Pipeline.step needs the loss_fn the pipeline was built with; use step_token_losses")
            self.stats.compute_s += time.perf_counter() - started
            return loss

        kind, multi = SCHEDULES[schedule]
        self.schedule = kind(
            self._torch_stages if multi else self._torch_stages[0],
            n_microbatches=microbatches,
            loss_fn=timed_loss,
            scale_grads=False,
        )

    def parameters(self) -> list[nn.Parameter]:
        """This rank's parameters (those of its stages), for its optimizer."""
        return [p for stage in self.stages for p in stage.parameters()]

    def named_parameters(self) -> dict[str, nn.Parameter]:
        """This rank's parameters under their names in the whole model."""
        return {stage.names[n]: p for stage in self.stages for n, p in stage.named_parameters()}

    def _check_rows(self, rows: int) -> None:
        if rows % self.microbatches:  # torch would cut unequal micro-batches
            raise ValueError(
                f"a batch of {rows} sequences does not split into {self.microbatches} micro-batches; "
                "choose M dividing it"
            )

    def _run(self, ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        losses: list[torch.Tensor] = []
        self.schedule.step(ids, target=target, losses=losses, return_outputs=False)
        total = torch.zeros((), dtype=torch.float64, device=ids.device)
        for loss in losses:  # only the rank of the last stage has them
            total += loss.detach().double()
        return comm.sum_control(total, self.group)

    def step(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Forward and backward of one batch, ids and labels (B, T) on every rank; gradients accumulate into the
        stage parameters. Returns the sum of the M micro-batch losses (detached, float64) on every rank."""
        self._check_rows(ids.shape[0])
        return self._run(ids, labels)

    def step_token_losses(
        self,
        ids: torch.Tensor,
        targets: torch.Tensor,
        reduce: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Forward and backward of one batch: ids and next-token targets (B, T) int64 on every rank (IGNORE_INDEX
        where no loss is wanted). The last stage computes each micro-batch's per-token losses (B/M, T) float32 and
        calls reduce(token_losses, rows) with rows (B/M,) the micro-batch's row indices in the batch; the scalar it
        returns is differentiated (gradients accumulate into the stage parameters). Returns the sum of those scalars
        (detached, float64) on every rank. positions: the rows' own position ids (B, T), e.g. restarting at each
        packed document (None: 0..T-1)."""
        self._check_rows(ids.shape[0])
        chunks = list(targets.tensor_split(self.microbatches))  # torch splits the inputs alike (dim 0, equal parts)
        position_chunks = None if positions is None else list(positions.tensor_split(self.microbatches))
        for stage in self._torch_stages:
            stage.chunk_targets, stage.chunk_positions = chunks, position_chunks
            if stage.is_last:  # torch's first-step shape inference calls the module directly: per-token losses
                stage.submod.targets = chunks[0]  # then too, never full-vocabulary logits
        self._reduce = reduce
        try:
            return self._run(ids, torch.arange(ids.shape[0], device=ids.device))
        finally:
            self._reduce = None
            for stage in self._torch_stages:
                stage.chunk_targets = stage.chunk_positions = None
                stage.submod.targets = None

    def token_losses(
        self, ids: torch.Tensor, targets: torch.Tensor, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Per-token losses (B, T) float32 of `targets` for ids (B, T) (both on every rank of the group), in one pass
        through the stages: each runs on its own rank, in order, and hands its hidden states to the next stage's rank;
        the last stage's losses are then broadcast over the pipeline group. An evaluation (no schedule, no
        micro-batches): call it on every rank of the group, under torch.no_grad()."""
        n_ranks, rank, hidden = self.group.size, self.group.rank, ids
        for stage in self.all_stages:
            owner = stage.index % n_ranks
            if stage.index > 0:
                hidden = hand_over(hidden, self.group, (stage.index - 1) % n_ranks, owner, self.device)
            if owner != rank:
                continue
            last = stage is self.all_stages[-1]
            stage.positions, stage.targets = positions, (targets if last else None)
            try:
                hidden = stage(hidden)
            finally:
                stage.targets = stage.positions = None
        last_rank = (len(self.all_stages) - 1) % n_ranks
        losses = hidden if rank == last_rank else torch.empty(targets.shape, dtype=torch.float32, device=self.device)
        return comm.broadcast_(losses.float().contiguous(), self.group, last_rank)

    @contextmanager
    def whole_model(self) -> Iterator[None]:
        """Inside: every rank's model holds the whole model's current weights (each stage's rank broadcasts its
        stage's tensors over the pipeline group, one flat message per stage, into storage allocated for it); after:
        the other stages' parameters are on the meta device again. For code that runs the whole model on every rank
        (e.g. an epoch-end generation); the full state dict and checkpoints need none of it."""
        others = [stage for stage in self.all_stages if stage.index % self.group.size != self.group.rank]
        held_on = next(p.device for p in self.parameters())  # where this rank keeps its stages (host: ZeRO offload)
        for stage in others:
            stage_to_device(stage, held_on)
        try:
            with torch.no_grad():
                for stage in self.all_stages:
                    _broadcast_stage(stage, self.group, stage.index % self.group.size, self.device)
            yield
        finally:
            for stage in others:
                stage_to_device(stage, "meta")


def stage_to_device(stage: StageModule, device: torch.device | str) -> None:
    """Give `stage`'s parameters uninitialized storage on `device` ("meta": none), keeping the parameter objects (the
    optimizer's) and their placements; ZeRO's FSDP modules re-register their shards (torch's to_empty). Buffers stay
    as they are: the rotary tables are shared by every stage."""
    buffers = [(module, name, buffer) for module in stage.modules() for name, buffer in module._buffers.items()]
    # Between the meta device and another, torch's module conversion makes new Parameter objects unless it swaps
    # the tensors into the old ones: the optimizer (built from the whole model) would then hold stale ones.
    swapping = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        stage.to_empty(device=device)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swapping)
    for module, name, buffer in buffers:
        module._buffers[name] = buffer


def _broadcast_stage(stage: StageModule, group: AxisGroup, owner: int, device: torch.device) -> None:
    """Overwrite `stage`'s tensors on every rank of `group` with those of its rank `owner` (under ZeRO: this data
    rank's chunks, alike on every stage's ranks)."""
    tensors = [local(p.data) for p in stage.parameters()]
    if not tensors or group.group is None:
        return
    # on the compute device: ZeRO's optimizer offload keeps the chunks in host memory, NCCL sends from GPUs
    flat = comm.broadcast_(torch.cat([t.reshape(-1).to(device) for t in tensors]), group, owner)
    if owner != group.rank:
        for tensor, piece in zip(tensors, flat.split([t.numel() for t in tensors])):
            tensor.copy_(piece.view_as(tensor))


HIDDEN_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)  # what a stage hands on, by code
HEADER = 8  # int64s announcing a handed-over tensor: its dtype's code, then its dims padded with -1


def header_of(tensor: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """The (HEADER,) int64 header announcing `tensor` (up to 7 dims); None: an empty one to receive into."""
    if tensor is None:
        return torch.empty(HEADER, dtype=torch.int64, device=device)
    dims = [*tensor.shape, *[-1] * (HEADER - 1 - tensor.dim())]
    return torch.tensor([HIDDEN_DTYPES.index(tensor.dtype), *dims], dtype=torch.int64, device=device)


def announced(header: torch.Tensor, device: torch.device) -> torch.Tensor:
    """An uninitialized tensor of the dtype and shape `header` (header_of) announces, to receive into."""
    code, *dims = header.tolist()
    return torch.empty([n for n in dims if n >= 0], dtype=HIDDEN_DTYPES[code], device=device)


def hand_over(hidden: torch.Tensor, group: AxisGroup, sender: int, receiver: int, device: torch.device) -> torch.Tensor:
    """`hidden` of group rank `sender` (a stage's output, up to 7 dims) on group rank `receiver`: a header
    (header_of) then the tensor, point to point. Other ranks get back what they gave."""
    rank = group.rank
    if rank == sender:
        comm.send(header_of(hidden, device), group, receiver, counted=False)
        comm.send(hidden, group, receiver)
        return hidden
    if rank != receiver:
        return hidden
    received = announced(comm.recv(header_of(None, device), group, sender), device)
    comm.recv(received, group, sender)
    return received
