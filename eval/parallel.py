"""Memorization evaluation over ranks: documents sharded over the data axis, generation on an engine-parallel model.

Under torchrun, with a grid of data x (x * y * z) ranks:

    documents   split once, identically on every rank (too-short ones skipped, too-long ones rejected before any
                communication); the evaluable documents are cut into contiguous, balanced blocks, one per data
                index. Every rank of a tensor-parallel group (the x*y*z ranks that share a data index) gets the
                same block, because those ranks must run the same forward passes (their collectives pair up).
    model       an engine-parallelized model (`parallelize_for_eval`; the application's
                goldfish.app.models.load_parallel_model loads a checkpoint sharded) wrapped in `ParallelEvalModel`:
                every rank of a tensor-parallel group passes the same full batch and gets the full batch's logits
                back, so the unchanged functions of eval/ (greedy decoding with a KV cache, teacher-forced passes,
                beam search, sampling) run on it as on the serial model.
    rows        each tensor-parallel group's first rank holds its block's rows; engine.core.sharding.gather_rows
                brings them to rank 0 in document order, where the summary is recomputed from rows (eval's
                summarize_* functions).

A data group may hold more documents than another (or none): tensor-parallel groups are independent, so they only
meet in the final world-wide gather. Before it, every rank reports whether its block succeeded, so an error on one
rank is raised on all of them instead of leaving the others waiting. (An error in the middle of a forward pass can
still leave the peers of its tensor-parallel group waiting inside a collective until torch.distributed's timeout.)

Which decoding works how (x*y is the size of the group that shares a decoder's rows, see engine/models/parallelize.py):
    greedy decoding, teacher-forced passes, log-probabilities: the batch's rows are split over the x*y*z ranks of
        the tensor-parallel group inside each forward (each decoder layer then sees every row once) and the logits
        are all-gathered back.
    beam search and sampling (HF ``generate``): every rank of the group runs ``generate`` on the whole batch, so
        the decoder sees each row x*y times (correct, not faster than one rank). Beam search reorders its KV cache
        between steps; the engine's cache holds the rows of the whole x*y group, so `ParallelEvalModel.generate`
        hands ``generate`` a `GroupBeamCache` that reorders those rows with every rank's beam indices. Generation
        must have a fixed length (``eos_token_id=[]``, as eval/ always asks): ranks that stopped at different steps
        would leave each other waiting.
On a grid with a pipe axis (pipe x data; x, y and z are refused), `parallelize_for_eval` cuts the model into one
stage per pipe rank once (engine.training.pipeline_eval.PipelineEvalModel): each rank keeps its own stage, every
forward is one pass through the stages' ranks with a KV cache per stage, and every rank of the pipeline gets the
logits. Greedy decoding, teacher-forced passes, log-probabilities, beam search and sampling (the model's own HF
``generate``, each forward through the stages) run on it as on the serial model; the gradient-norm attack runs its
backward through the stages (`PipelineEvalModel.gradient_norm`).
Results equal one process's up to the order of floating-point sums (tensor parallelism adds partial products in
another order): generated ids agree unless two logits are within rounding of each other.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn
from transformers import DynamicCache

import engine
from conventions import IGNORE_INDEX
from engine.core import comm
from engine.core.grid import AxisGroup, Grid, is_main_process
from engine.core.sharding import TENSOR_AXES, run_sharded
from engine.core.vocab_parallel import causal_lm_token_losses
from engine.memory.zero import zero_state
from engine.models.adapter import CACHE_KEYWORDS, cache_keyword
from engine.models.layout import parallel_grid
from engine.models.parallelize import rows_layout
from engine.training.pipeline_eval import PipelineEvalModel
from eval.adaptive import (
    DEFAULT_BUDGETS,
    DEFAULT_CONFIDENCES,
    SamplingConfig,
    beam_extract,
    probabilistic_extract,
    sampling_extract,
    summarize_beam,
    summarize_probabilistic,
    summarize_sampling,
)
from eval.batching import evaluating
from eval.extraction import ExtractionConfig, check_fits_context, extract, split_documents, summarize_extraction
from eval.intervals import DEFAULT_RESAMPLES
from eval.membership import (
    DEFAULT_MIN_K,
    DEFAULT_RECALL_PREFIX_DOCS,
    DEFAULT_TARGET_FPRS,
    membership_rows,
    membership_summary,
    recall_prefix,
)

log = logging.getLogger(__name__)

ROW_AXES = ("x", "y")  # the axes over which a parallelized decoder gathers its rows (engine/models/parallelize.py)
PIPE_GRID_REFUSAL = (
    "evaluation on a pipe grid runs on pipe and data axes only: drop x, y and z, or evaluate on a grid without pipe"
)


# ----- the model as eval/ sees it ---------------------------------------------------------------------------------


def _parallel_grid(model: nn.Module) -> Grid | None:
    """The grid `model`'s decoder stack was parallelized on, or None for a plain model."""
    return parallel_grid(model)


class GroupBeamCache(DynamicCache):
    """A KV cache for HF beam search on a parallelized decoder whose rows are gathered over an x*y group.

    The decoder layers cache the keys and values of every rank's rows, in group-rank order; beam search reorders
    the cache with indices into this rank's own rows only. Reordering therefore all-gathers the indices of every
    rank of the group and shifts each by the rank's offset, so every rank's rows follow their own beams. Every rank
    of the group must reorder at the same steps (they do when generation has a fixed length).
    """

    def __init__(self, group: AxisGroup, config: Any = None) -> None:
        super().__init__(config=config)
        self.row_group = group

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        local = beam_idx.reshape(-1).to(torch.long)  # (R,) indices into this rank's R rows
        everyone = comm.all_gather(local, self.row_group, 0)  # (G * R,)
        offsets = torch.arange(self.row_group.size, device=local.device).repeat_interleave(local.numel())
        super().reorder_cache(everyone + offsets * local.numel())


class ParallelEvalModel(nn.Module):
    """An engine-parallelized causal LM as the functions of eval/ use it: every rank of a tensor-parallel group
    calls it with the SAME full batch and gets the full batch's results, as from the serial model.

    ``forward`` splits the batch's rows over the x*y*z ranks of the group (blocks of ceil(B / G) rows; the last
    blocks are filled up with copies of the last row so that every rank feeds the same number of rows), runs the
    parallel model on this rank's rows and all-gathers the logits: ``logits`` are (B, T, V) on every rank. The
    returned KV cache belongs to this rank's rows; pass it back with the same batch. Other
    outputs (hidden states, attentions) are this rank's rows only.

    ``generate`` runs HF generate on the whole batch on every rank of the group (see the module doc), with a
    `GroupBeamCache` for beam search; it needs a ``generation_config`` with ``eos_token_id=[]`` (fixed length).
    """

    def __init__(self, model: nn.Module, grid: Grid) -> None:
        super().__init__()
        planned = _parallel_grid(model)
        if planned is not grid and grid.size(*TENSOR_AXES) > 1:
            raise ValueError(
                "ParallelEvalModel needs a model parallelized on this grid (engine.parallelize(model, "
                "grid), or parallelize_for_eval); got "
                + ("a plain model" if planned is None else "a model parallelized on another grid")
            )
        self.model = model
        self.grid = grid
        self.train(model.training)  # a new Module starts in training mode; keep the model's

    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def generation_config(self) -> Any:
        return self.model.generation_config

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> Any:
        """input_ids (B, T), attention_mask (B, T_past + T), position_ids (B, T), all alike on every rank of the
        tensor-parallel group; other keywords go to the model. Returns the model's output with logits (B, T', V).
        Inference only (no gradients: the logits gather is not differentiable)."""
        group = self.grid.group(*TENSOR_AXES)
        if group.size == 1:
            return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)
        if "inputs_embeds" in kwargs:
            raise ValueError("ParallelEvalModel splits rows of input_ids; pass input_ids, not inputs_embeds")
        n_rows = input_ids.shape[0]
        per_rank = math.ceil(n_rows / group.size)
        rows = torch.arange(group.rank * per_rank, (group.rank + 1) * per_rank, device=input_ids.device)
        rows = rows.clamp(max=n_rows - 1)  # blocks past the end: copies of the last row, dropped after the gather

        def mine(t: torch.Tensor | None) -> torch.Tensor | None:
            if t is None or (t.shape[0] == 1 and n_rows != 1):  # absent, or broadcast over the rows
                return t
            return t.index_select(0, rows.to(t.device))

        out = self.model(
            input_ids=mine(input_ids), attention_mask=mine(attention_mask), position_ids=mine(position_ids), **kwargs
        )
        out.logits = comm.all_gather(out.logits.contiguous(), group, 0)[:n_rows]
        return out

    def generate(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """HF generate on every rank of the group with the same inputs (fixed-length generation only)."""
        if self.grid.size(*TENSOR_AXES) == 1:
            return self.model.generate(*args, **kwargs)
        config = kwargs.get("generation_config")
        if config is None or not (isinstance(config.eos_token_id, (list, tuple)) and len(config.eos_token_id) == 0):
            raise ValueError(
                "generation on a tensor-parallel model must have a fixed length: pass a "
                "generation_config with eos_token_id=[] (every rank of a tensor-parallel group has to "
                "take the same number of steps)"
            )
        num_beams = kwargs.get("num_beams", config.num_beams) or 1
        if num_beams > 1 and self.grid.size(*ROW_AXES) > 1:
            keyword = cache_keyword(self.model)
            if any(kwargs.get(k) is not None for k in CACHE_KEYWORDS):
                raise ValueError(
                    "beam search on a model whose rows are gathered over x*y needs the GroupBeamCache "
                    f"that ParallelEvalModel.generate makes; do not pass {keyword}"
                )
            kwargs[keyword] = GroupBeamCache(self.grid.group(*ROW_AXES), config=self.model.config)
        return self.model.generate(*args, **kwargs)


def eval_model(model: nn.Module, grid: Grid | None) -> nn.Module:
    """The model to hand to eval/'s functions on this rank: `model` itself for one process, a data-parallel-only
    grid, a plain (replicated) model or a model already cut into pipeline stages (`parallelize_for_eval`); a
    `ParallelEvalModel` for a model parallelized with tensor-parallel axes."""
    if grid is None or grid.size(*TENSOR_AXES) == 1 or isinstance(model, (ParallelEvalModel, PipelineEvalModel)):
        return model
    planned = _parallel_grid(model)
    if planned is None:
        return model  # a plain model on every rank: each computes the whole batch (e.g. a small reference model)
    return ParallelEvalModel(model, grid)


def parallelize_for_eval(model: nn.Module, grid: Grid | None) -> nn.Module:
    """`model` on the grid's device, sharded by engine.parallelize (no-op for grid None), in eval mode. On a grid
    with a pipe axis: cut into one stage per pipe rank (`PipelineEvalModel`), only this rank's stage moved to the
    device (the others' parameters freed); ValueError (one line) when the grid has x, y or z as well."""
    if grid is None:
        return model.eval()
    if grid.size("pipe") > 1:
        if grid.size(*TENSOR_AXES) > 1:
            raise ValueError(PIPE_GRID_REFUSAL)
        return PipelineEvalModel(model, grid.group("pipe")).to(grid.device).eval()
    model = engine.parallelize(model.to(grid.device), grid)
    return model.eval()


# ----- the instruments, sharded -----------------------------------------------------------------------------------


def _evaluable(
    documents: Sequence[Any], config: ExtractionConfig, model: nn.Module, grid: Grid | None
) -> tuple[list[Any], list[str]]:
    """(documents long enough for `config`, ids of the too-short ones); raises for documents beyond the context.
    Runs identically on every rank before any communication, so a bad document fails everywhere at once."""
    kept, skipped = split_documents(documents, config)
    evaluable = [doc for doc, _, _ in kept]
    check_fits_context(model, evaluable)
    if skipped and is_main_process(grid):
        log.warning("skipped %d document(s) shorter than %d tokens", len(skipped), config.min_tokens())
    return evaluable, skipped


def _sharded_instrument(
    model: nn.Module,
    documents: Sequence[Any],
    config: ExtractionConfig,
    grid: Grid | None,
    rows_of: Callable[[nn.Module, list[Any]], list[dict[str, Any]]],
    summarize: Callable[[list[dict[str, Any]], list[str]], dict[str, Any]],
) -> tuple[list[dict[str, Any]], dict[str, Any]] | tuple[None, None]:
    """The pattern of every per-document instrument: keep the evaluable documents, let each tensor-parallel group
    compute `rows_of(model_for_this_rank, block)` on its block, gather on rank 0, summarize from the rows there."""
    evaluable, skipped = _evaluable(documents, config, model, grid)
    runner = eval_model(model, grid)
    rows = run_sharded(lambda block: rows_of(runner, block), evaluable, grid)
    if rows is None:
        return None, None
    return rows, summarize(rows, skipped)


def evaluate_parallel(
    model: nn.Module,
    documents: Sequence[Any],
    config: ExtractionConfig,
    grid: Grid | None,
    *,
    decode: Callable[[list[int]], str],
    pad_token_id: int,
    drop_mask_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
    progress: bool = False,
) -> tuple[list[dict[str, Any]], dict[str, Any]] | tuple[None, None]:
    """Greedy extraction (eval.extraction.extract) with documents sharded over the data axis.

    Returns (rows, summary) on rank 0, the same rows (document order) and summary as ``extract`` in one process;
    (None, None) on the other ranks. Every rank must call it with the same arguments. ``progress`` shows rank 0's
    bar (its own block only).
    """
    return _sharded_instrument(
        model,
        documents,
        config,
        grid,
        lambda runner, block: extract(
            runner,
            block,
            config,
            decode=decode,
            pad_token_id=pad_token_id,
            drop_mask_fn=drop_mask_fn,
            progress=progress and is_main_process(grid),
        )[0],
        lambda rows, skipped: summarize_extraction(rows, skipped, config),
    )


def prefix_length_parallel(
    model: nn.Module,
    documents: Sequence[Any],
    prefix_lengths: Sequence[int],
    grid: Grid | None,
    *,
    suffix_len: int = 50,
    batch_size: int = 32,
    decode: Callable[[list[int]], str],
    pad_token_id: int,
) -> list[dict[str, Any]] | None:
    """eval.breakdown.extract_by_prefix_length, sharded: rows of every fixed prefix length P tagged with
    ``prefix_len`` on rank 0, None elsewhere."""
    rows: list[dict[str, Any]] = []
    for prefix_len in prefix_lengths:
        config = ExtractionConfig(suffix_len=suffix_len, prefix_len=int(prefix_len), batch_size=batch_size)
        part, _ = evaluate_parallel(model, documents, config, grid, decode=decode, pad_token_id=pad_token_id)
        if part is not None:
            rows.extend(dict(row, prefix_len=int(prefix_len)) for row in part)
    return rows if is_main_process(grid) else None


def probabilistic_parallel(
    model: nn.Module,
    documents: Sequence[Any],
    config: ExtractionConfig,
    grid: Grid | None,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    pad_token_id: int,
    confidences: Sequence[float] = DEFAULT_CONFIDENCES,
    budgets: Sequence[int] = DEFAULT_BUDGETS,
) -> tuple[list[dict[str, Any]], dict[str, Any]] | tuple[None, None]:
    """eval.adaptive.probabilistic_extract with documents sharded over the data axis: (rows, summary) on rank 0,
    (None, None) elsewhere."""
    SamplingConfig(temperature=temperature, top_p=top_p)  # validates on every rank before any communication
    return _sharded_instrument(
        model,
        documents,
        config,
        grid,
        lambda runner, block: probabilistic_extract(
            runner,
            block,
            config,
            temperature=temperature,
            top_p=top_p,
            pad_token_id=pad_token_id,
            confidences=confidences,
            budgets=budgets,
        )[0],
        lambda rows, skipped: summarize_probabilistic(rows, skipped, config, temperature, top_p, confidences, budgets),
    )


def beam_parallel(
    model: nn.Module,
    documents: Sequence[Any],
    config: ExtractionConfig,
    grid: Grid | None,
    *,
    num_beams: int = 30,
    pad_token_id: int,
    decode: Callable[[list[int]], str] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]] | tuple[None, None]:
    """eval.adaptive.beam_extract with documents sharded over the data axis: (rows, summary) on rank 0, (None,
    None) elsewhere. On a tensor-parallel group every rank searches the whole block (see the module doc)."""
    if num_beams < 1:
        raise ValueError(f"num_beams must be >= 1, got {num_beams}")
    return _sharded_instrument(
        model,
        documents,
        config,
        grid,
        lambda runner, block: beam_extract(
            runner, block, config, num_beams=num_beams, pad_token_id=pad_token_id, decode=decode
        )[0],
        lambda rows, skipped: summarize_beam(rows, skipped, config, num_beams),
    )


def sampling_parallel(
    model: nn.Module,
    documents: Sequence[Any],
    config: ExtractionConfig,
    sampling: SamplingConfig,
    grid: Grid | None,
    *,
    pad_token_id: int,
    keep_samples: bool = False,
) -> tuple[list[dict[str, Any]], dict[str, Any]] | tuple[None, None]:
    """eval.adaptive.sampling_extract with documents sharded over the data axis: (rows, summary) on rank 0, (None,
    None) elsewhere. Samples are seeded per document (document_seed), so they do not depend on the sharding."""
    return _sharded_instrument(
        model,
        documents,
        config,
        grid,
        lambda runner, block: sampling_extract(
            runner, block, config, sampling, pad_token_id=pad_token_id, keep_samples=keep_samples
        )[0],
        lambda rows, skipped: summarize_sampling(rows, skipped, config, sampling),
    )


def membership_rows_parallel(
    model: nn.Module,
    documents: Sequence[Any],
    grid: Grid | None,
    *,
    decode: Callable[[list[int]], str],
    pad_token_id: int,
    reference_model: nn.Module | None = None,
    min_k: float = DEFAULT_MIN_K,
    batch_size: int = 8,
    member: bool | None = None,
    recall_prefix_ids: Sequence[int] | None = None,
    frequencies: np.ndarray | None = None,
    grad_norm: bool = True,
) -> list[dict[str, Any]] | None:
    """eval.membership.membership_rows with documents sharded over the data axis: the rows on rank 0 (document
    order), None elsewhere. ``reference_model`` may be parallelized on the same grid or a plain model. On a grid
    with tensor-parallel axes the gradient norm is `tensor_parallel_gradient_norm` (see `grad_norm_available`)."""
    return _membership_rows(
        model,
        [(doc, member) for doc in documents],
        grid,
        decode=decode,
        pad_token_id=pad_token_id,
        reference_model=reference_model,
        min_k=min_k,
        batch_size=batch_size,
        recall_prefix_ids=recall_prefix_ids,
        frequencies=frequencies,
        grad_norm=grad_norm,
    )


def grad_norm_available(model: nn.Module, grid: Grid | None) -> bool:
    """Whether the gradient-norm attack runs on this rank's model: always, except for a model partitioned by ZeRO
    over a grid with tensor-parallel axes (its gradient chunks are summed over data, whose groups score other
    documents)."""
    if not isinstance(eval_model(model, grid), ParallelEvalModel):
        return True
    return zero_state(model) is None


def tensor_parallel_gradient_norm(model: nn.Module, grid: Grid, token_ids: Sequence[int]) -> float:
    """eval.membership.gradient_norm for a model sharded over x, y or z: ||grad_theta L||_2 of the serial model's mean
    next-token loss L of one sequence, over every floating-point parameter.

    Collective over this rank's tensor-parallel group: every rank of it passes the same ids. Each rank feeds the
    sequence (ranks read their own rows), only the group's first rank with its targets, the others with every
    target ignored, so the gradients summed within the group (not over data: data groups score other documents)
    are those of this sequence's loss alone; the norm counts shards and replicated parameters as
    engine.clip_grad_norm_ does. The model's ``.grad`` fields and requires_grad flags are restored.
    """
    params = [p for p in model.parameters() if p.is_floating_point()]
    flags, saved = [p.requires_grad for p in params], [p.grad for p in params]
    ids = torch.tensor([[int(t) for t in token_ids]], device=grid.device)  # (1, T)
    targets = torch.full_like(ids, IGNORE_INDEX)
    if all(grid.coord(axis) == 0 for axis in TENSOR_AXES):
        targets[0, :-1] = ids[0, 1:]  # position t predicts token t + 1
    try:
        for p in params:
            p.requires_grad_(True)
            p.grad = None
        # "own" rows (the layout eval runs in): each rank's row is its own, so only the first rank's loss counts
        with evaluating(model), rows_layout(model, "own"), torch.enable_grad():
            losses = causal_lm_token_losses(model, ids, targets)  # (1, T), 0 at ignored targets
            (losses.sum() / max(ids.shape[1] - 1, 1)).backward()
        engine.sync_gradients(model, grid, over=TENSOR_AXES)
        norm = float(engine.clip_grad_norm_(model, math.inf, grid))  # max_norm inf: the norm, nothing scaled
    finally:
        for p, flag, grad in zip(params, flags, saved):
            p.requires_grad_(flag)
            p.grad = grad
    return norm


def membership_parallel(
    model: nn.Module,
    members: Sequence[Any],
    nonmembers: Sequence[Any],
    grid: Grid | None,
    *,
    decode: Callable[[list[int]], str],
    pad_token_id: int,
    reference_model: nn.Module | None = None,
    min_k: float = DEFAULT_MIN_K,
    batch_size: int = 8,
    target_fprs: Sequence[float] = DEFAULT_TARGET_FPRS,
    recall_prefix_docs: int = DEFAULT_RECALL_PREFIX_DOCS,
    frequencies: np.ndarray | None = None,
    grad_norm: bool = True,
    n_resamples: int = DEFAULT_RESAMPLES,
    notes: dict[str, Any] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]] | tuple[None, None]:
    """Membership inference with members and non-members sharded together over the data axis.

    Returns (rows, summary) on rank 0: the rows of ``membership_rows(model, members, member=True)`` followed by
    those of the non-members (member=False), and ``membership_summary`` of the two; (None, None) elsewhere.
    ReCaLL's prefix is made of the first ``recall_prefix_docs`` non-members (`eval.membership.recall_prefix`; 0
    leaves ReCaLL out), whose rows carry ``recall_prefix: true`` and no ReCaLL score. DC-PDD runs when
    ``frequencies`` are given, the gradient-norm attack when ``grad_norm`` and `grad_norm_available`.
    """
    prefix, prefix_ids = recall_prefix(nonmembers, recall_prefix_docs) if recall_prefix_docs else (None, [])
    with_grad_norm = grad_norm and grad_norm_available(model, grid)
    items = [(doc, True) for doc in members] + [(doc, False) for doc in nonmembers]
    rows = _membership_rows(
        model,
        items,
        grid,
        decode=decode,
        pad_token_id=pad_token_id,
        reference_model=reference_model,
        min_k=min_k,
        batch_size=batch_size,
        recall_prefix_ids=prefix,
        frequencies=frequencies,
        grad_norm=with_grad_norm,
    )
    if rows is None:
        return None, None
    for row in rows:
        if row["id"] in prefix_ids and not row["member"]:
            row.pop("score_recall"), row.pop("recall_loss"), row.pop("recall_n_scored")
            row["recall_prefix"] = True
    member_rows = [r for r in rows if r["member"]]
    nonmember_rows = [r for r in rows if not r["member"]]
    notes = dict(notes or {})
    if prefix is not None:
        notes["recall"] = {
            "prefix_documents": prefix_ids,
            "prefix_tokens": len(prefix),
            "note": "the non-member prefix is these held-out documents' tokens, concatenated; they "
            "are not scored by ReCaLL",
        }
    if grad_norm and not with_grad_norm:
        notes["grad_norm"] = "not computed: the model is partitioned by ZeRO over a tensor-parallel grid"
    return rows, membership_summary(
        member_rows, nonmember_rows, target_fprs, min_k=min_k, n_resamples=n_resamples, notes=notes
    )


def _membership_rows(
    model: nn.Module,
    items: list[tuple[Any, bool | None]],
    grid: Grid | None,
    *,
    decode: Callable[[list[int]], str],
    pad_token_id: int,
    reference_model: nn.Module | None,
    min_k: float,
    batch_size: int,
    recall_prefix_ids: Sequence[int] | None,
    frequencies: np.ndarray | None,
    grad_norm: bool,
) -> list[dict[str, Any]] | None:
    """Rows of (document, member flag or None) items, sharded; each row laid out as membership_rows makes it."""
    runner = eval_model(model, grid)
    reference = eval_model(reference_model, grid) if reference_model is not None else None
    grad_norm = grad_norm and grad_norm_available(model, grid)
    norm_of = None
    if isinstance(runner, ParallelEvalModel):
        norm_of = lambda _runner, ids: tensor_parallel_gradient_norm(model, grid, ids)  # noqa: E731
    elif isinstance(runner, PipelineEvalModel):  # forward and backward through the stages
        norm_of = lambda _runner, ids: runner.gradient_norm(ids)  # noqa: E731

    def work(block: list[tuple[Any, bool | None]]) -> list[dict[str, Any]]:
        scored = membership_rows(
            runner,
            [doc for doc, _ in block],
            decode=decode,
            pad_token_id=pad_token_id,
            reference_model=reference,
            min_k=min_k,
            batch_size=batch_size,
            recall_prefix_ids=recall_prefix_ids,
            frequencies=frequencies,
            grad_norm=grad_norm,
            grad_norm_fn=norm_of,
        )
        out = []
        for (_, member), row in zip(block, scored):
            flag = {} if member is None else {"member": bool(member)}
            out.append({"id": row.pop("id"), **flag, **row})
        return out

    return run_sharded(work, items, grid)


__all__ = [
    "GroupBeamCache",
    "ParallelEvalModel",
    "beam_parallel",
    "eval_model",
    "grad_norm_available",
    "PIPE_GRID_REFUSAL",
    "tensor_parallel_gradient_norm",
    "evaluate_parallel",
    "membership_parallel",
    "membership_rows_parallel",
    "parallelize_for_eval",
    "prefix_length_parallel",
    "probabilistic_parallel",
    "sampling_parallel",
]
