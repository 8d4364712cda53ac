"""Vocabulary-parallel embeddings, lm_head and a chunked cross-entropy that never builds full-vocabulary logits.

Layout. The vocabulary rows of the input embedding and of the lm_head (both (V, H)) are split evenly over the
tensor-parallel group T = x*y*z (P ranks): the rank at (x, y, z) holds block b = x*Y*Z + y*Z + z, rows
[b V/P, (b+1) V/P) (`vocab_block`: mesh order, x outermost, so that the table is a DTensor with Shard(0) on each split
dim of Grid.device_mesh(); T's own group order, x + X*y + X*Y*z, differs when two or more of x, y, z exceed 1, and
gathers of the slices over T put them in block order with `to_block_order`). Shards are replicated over `data`. A
tied lm_head shares the embedding's shard. Every rank of T feeds its own rows (same shapes on every rank of T, as in
training and in engine.core.sharding's evaluation blocks):

    embedding      token ids of T's rows are gathered (integers, no autograd); each rank looks up the ids of its
                   vocabulary slice (zeros elsewhere) and the partial embeddings are reduce-scattered back to the
                   rows' owners. Backward: the gradients of all T rows reach every shard (all-gather).
    lm_head        hidden states of T's rows are gathered (gather_sharded: backward reduce-scatters the partial
                   input gradients); each rank multiplies its vocabulary slice. As a module (model(...).logits, for
                   evaluation and generation) the slices are then gathered to full logits of the rank's own rows.
    loss           `token_losses`: per-token cross-entropy from the hidden states and the lm_head shard, in chunks
                   of tokens: each rank computes a chunk's logits for its slice, keeps only their log-sum-exp and
                   the target's logit, and one all-gather of those two numbers per token combines the ranks. The
                   chunk's logits are dropped and recomputed in backward. Peak extra memory: one chunk of logits,
                   (chunk, V/P), instead of (tokens, V). With P = 1 it is the chunked loss of a serial model.

In the "shared" rows layout (engine/models/parallelize.py) the x*y ranks of T hold the SAME rows, so only the z ranks of
T hold different ones: ids and hidden states are gathered over z only (the row group), the embedding's partial lookups
are reduce-scattered over z and summed over x*y (the replica group), and the hidden states' gradient is summed over x*y
as well (copy_to_group) so that every replica gets the full one. The vocabulary split itself is unchanged.

Gradients of the vocabulary shards cover the rows of the whole T group, so engine.training.state.sync_gradients sums
them over `data` only (region "tensor").
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from conventions import IGNORE_INDEX
from engine.core import comm
from engine.core.functional import (
    copy_to_group,
    gather_from_group,
    gather_sharded,
    reduce_from_group,
    reduce_scatter_to_group,
    split_to_group,
)
from engine.core.grid import AxisGroup, Grid
from engine.core.linear import ShardingError
from engine.core.placement import local_shard
from engine.spec import OWN, RowsLayout, row_replica_axes, vocab_row_axes

DEFAULT_CHUNK_TOKENS = 1024
VOCAB_AXES = ("x", "y", "z")  # the split of the vocabulary, outermost first (the order of Grid.device_mesh's dims)


def vocab_block(coords: dict[str, int], grid: Grid) -> int:
    """The block of the vocabulary the rank at `coords` holds: its (x, y, z) read in mesh order, x outermost
    (x*Y*Z + y*Z + z), which is where a DTensor with Shard(0) on Grid.device_mesh()'s x, y and z dims puts it."""
    block = 0
    for axis in VOCAB_AXES:
        block = block * grid.size(axis) + coords[axis]
    return block


def block_order(grid: Grid) -> torch.Tensor | None:
    """(P,) the positions in the x*y*z group (its rank order, x fastest) of the ranks holding vocabulary blocks 0..P-1,
    or None when the two orders agree (at most one of x, y, z exceeds 1)."""
    group = grid.group(*VOCAB_AXES)
    blocks = [vocab_block(grid.shape.coords(rank), grid) for rank in group.ranks]
    if blocks == sorted(blocks):
        return None
    return torch.tensor(sorted(range(len(blocks)), key=blocks.__getitem__))


def to_block_order(gathered: torch.Tensor, order: torch.Tensor | None, dim: int) -> torch.Tensor:
    """`gathered` (the P vocabulary slices of the x*y*z group concatenated along `dim` in group rank order, as an
    all-gather over the group gives them) with its slices in vocabulary order (differentiable; itself when the orders
    agree). order: the group's `block_order(grid)`, on any device."""
    if order is None:
        return gathered
    dim = dim % gathered.dim()
    slices = gathered.unflatten(dim, (len(order), -1))
    return slices.index_select(dim, order.to(gathered.device)).flatten(dim, dim + 1)


# ----- the loss -------------------------------------------------------------------------------------------------


def _compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return torch.promote_types(hidden.dtype, weight.dtype)


class _ChunkedVocabCE(torch.autograd.Function):
    """Per-token cross-entropy of logits = hidden @ weight.T over a vocabulary split across `group`.

    hidden (N, H), weight (V_local, H) rows [vocab_start, vocab_start + V_local) of the full vocabulary, targets (N,)
    full-vocabulary ids or IGNORE_INDEX. Returns (N,) losses (0 at ignored targets) in float32 (float64 for float64
    inputs), identical on every rank of `group`. The gradient of `hidden` it returns is this rank's vocabulary
    slice's part only (the caller sums it over the group); that of `weight` covers all N rows.
    """

    @staticmethod
    def forward(
        ctx,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        vocab_start: int,
        chunk: int,
        group: AxisGroup | None,
    ) -> torch.Tensor:
        compute = _compute_dtype(hidden, weight)
        stats_dtype = torch.promote_types(compute, torch.float32)
        n, local_vocab = hidden.shape[0], weight.shape[0]
        local_targets = targets - vocab_start
        mine = (local_targets >= 0) & (local_targets < local_vocab)
        picked_index = torch.where(mine, local_targets, 0).unsqueeze(1)
        stats = torch.empty(2, n, dtype=stats_dtype, device=hidden.device)  # local log-sum-exp, target logit
        w = weight.to(compute)
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, n, chunk):
                end = min(start + chunk, n)
                logits = torch.matmul(hidden[start:end].to(compute), w.t()).to(stats_dtype)  # (C, V_local)
                picked = logits.gather(1, picked_index[start:end]).squeeze(1)
                stats[1, start:end] = torch.where(mine[start:end], picked, torch.zeros_like(picked))
                top = logits.amax(dim=-1, keepdim=True)  # log-sum-exp in place: one (C, V_local) tensor alive
                stats[0, start:end] = logits.sub_(top).exp_().sum(-1).log_().add_(top.squeeze(-1))
                del logits
        if group is not None and group.size > 1:
            everyone = comm.all_gather(stats.unsqueeze(0), group, 0)  # (P, 2, N)
            lse, target_logit = torch.logsumexp(everyone[:, 0], dim=0), everyone[:, 1].sum(0)
        else:
            lse, target_logit = stats[0], stats[1]
        valid = targets != IGNORE_INDEX
        losses = torch.where(valid, lse - target_logit, torch.zeros_like(lse))
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.vocab_start, ctx.chunk, ctx.compute = vocab_start, chunk, compute
        return losses

    @staticmethod
    def backward(ctx, grad_losses: torch.Tensor):
        hidden, weight, targets, lse = ctx.saved_tensors
        compute, chunk = ctx.compute, ctx.chunk
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        n, local_vocab = hidden.shape[0], weight.shape[0]
        local_targets = targets - ctx.vocab_start
        mine = (local_targets >= 0) & (local_targets < local_vocab)
        scale = torch.where(targets != IGNORE_INDEX, grad_losses.to(lse.dtype), torch.zeros_like(lse))
        w = weight.to(compute)
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = (
            torch.zeros(weight.shape, dtype=torch.promote_types(weight.dtype, torch.float32), device=weight.device)
            if need_weight
            else None
        )
        rows = torch.arange(n, device=hidden.device)
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, n, chunk):
                end = min(start + chunk, n)
                h = hidden[start:end].to(compute)
                # d loss / d logits = softmax - one_hot(target), times the incoming gradient of each token's loss;
                # in place, so that one (C, V_local) tensor is alive at a time
                grad_logits = torch.matmul(h, w.t()).to(lse.dtype).sub_(lse[start:end, None]).exp_()
                hit = mine[start:end]
                grad_logits[rows[: end - start][hit], local_targets[start:end][hit]] -= 1
                grad_logits = grad_logits.mul_(scale[start:end, None]).to(compute)
                if need_hidden:
                    grad_hidden[start:end] = torch.matmul(grad_logits, w).to(hidden.dtype)
                if need_weight:
                    if grad_logits.dtype == grad_weight.dtype:
                        grad_weight.addmm_(grad_logits.t(), h)  # no (V_local, H) temporary per chunk
                    else:
                        grad_weight += torch.matmul(grad_logits.t(), h).to(grad_weight.dtype)
                del grad_logits
        return (grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype), None, None, None, None)


def token_losses(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    group: AxisGroup | None = None,
    vocab_start: int = 0,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    row_group: AxisGroup | None = None,
    replica_group: AxisGroup | None = None,
) -> torch.Tensor:
    """Per-token cross-entropy of `logits = hidden @ weight.T` without materialising the logits.

    hidden: (..., H) this rank's rows of final hidden states. weight: (V_local, H), the lm_head rows
    [vocab_start, vocab_start + V_local) of the full vocabulary (all of it for group None). targets: (...) next-token
    ids in the full vocabulary, IGNORE_INDEX (-100) where there is none. group: the ranks the vocabulary is split
    over (every rank of it calls this with the same shapes), or None. chunk_tokens: tokens per chunk of logits.
    row_group / replica_group (the "shared" rows layout): the ranks of `group` that hold different rows, and those
    that hold the same rows as this rank (row_group x replica_group = group); default: every rank its own rows.
    Returns (...) float32 losses (float64 for float64 inputs; computed like F.cross_entropy on float32 logits under
    bf16 autocast), 0 at ignored targets, with gradients to `hidden` and `weight`.
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(
            f"hidden states {tuple(hidden.shape)} and targets {tuple(targets.shape)} must agree on every "
            "dimension but the last"
        )
    if hidden.shape[-1] != weight.shape[-1]:
        raise ValueError(f"hidden size {hidden.shape[-1]} differs from the lm_head's {weight.shape[-1]}")
    flat_hidden, flat_targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    if group is None or group.size == 1:
        return _ChunkedVocabCE.apply(flat_hidden, weight, flat_targets, vocab_start, chunk_tokens, None).reshape(
            targets.shape
        )
    rows = group if row_group is None else row_group
    if replica_group is not None:  # replicas hold the same rows: their partial input gradients are summed too
        flat_hidden = copy_to_group(flat_hidden, replica_group)
    all_hidden = gather_sharded(flat_hidden, rows, 0)  # backward: sum the ranks' partial input gradients
    all_targets = comm.all_gather(flat_targets.contiguous(), rows, 0)
    losses = _ChunkedVocabCE.apply(all_hidden, weight, all_targets, vocab_start, chunk_tokens, group)
    return split_to_group(losses, rows, 0).reshape(targets.shape)


# ----- modules --------------------------------------------------------------------------------------------------


class _VocabShard:
    """What the vocabulary-parallel embedding and lm_head share: the group, the slice, the full size."""

    grid: Grid
    full_vocab: int
    vocab_start: int
    _block_order: torch.Tensor | None  # block_order(grid) on the CPU, computed once
    _block_order_on: dict[torch.device, torch.Tensor]  # its copy on each device gathers ran on, made once

    def _init_shard(self, grid: Grid, full_vocab: int) -> None:
        group = grid.group(*VOCAB_AXES)
        if full_vocab % group.size:
            raise ShardingError(
                f"vocabulary {full_vocab} is not divisible by x*y*z={group.size}; keep the embeddings "
                "replicated (vocab_parallel=False) or choose x*y*z dividing it"
            )
        self.grid, self.full_vocab = grid, full_vocab
        self.vocab_start = vocab_block(grid.coords, grid) * (full_vocab // group.size)
        self._block_order = block_order(grid)  # once: the module's grid and so the order never change
        self._block_order_on = {}
        self.rows_layout: RowsLayout = OWN  # a mode like ParallelLinear.rows_layout, set by parallelize.rows_layout

    @property
    def group(self) -> AxisGroup:
        return self.grid.group(*VOCAB_AXES)

    @property
    def row_group(self) -> AxisGroup:
        """The ranks of `group` that hold different rows: all of them, or z only in the "shared" rows layout."""
        return self.grid.group(*vocab_row_axes(self.rows_layout))

    @property
    def replica_group(self) -> AxisGroup | None:
        """The ranks of `group` that hold this rank's rows too: x*y in the "shared" rows layout, else None."""
        axes = row_replica_axes(self.rows_layout)
        return self.grid.group(*axes) if axes else None

    def shard_rows(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a full (V, ...) tensor (e.g. the serial weight)."""
        rows = self.full_vocab // self.group.size
        return full[self.vocab_start : self.vocab_start + rows]

    def in_block_order(self, gathered: torch.Tensor, dim: int) -> torch.Tensor:
        """`to_block_order` of `gathered` (an all-gather over `group` along `dim`) with the module's order."""
        order = self._block_order
        if order is not None and order.device != gathered.device:  # one host-to-device copy, not one per call
            if gathered.device not in self._block_order_on:
                self._block_order_on[gathered.device] = order.to(gathered.device)
            order = self._block_order_on[gathered.device]
        return to_block_order(gathered, order, dim)

    def gather_rows(self, shard: torch.Tensor) -> torch.Tensor:
        """The full (V, ...) tensor from every rank's shard-shaped `shard` (collective over x*y*z)."""
        return self.in_block_order(comm.all_gather(local_shard(shard).detach().contiguous(), self.group, 0), 0)


def _new_weight(old: nn.Parameter, data: torch.Tensor) -> nn.Parameter:
    new = nn.Parameter(data.detach().clone(), requires_grad=old.requires_grad)
    new.__dict__.update(old.__dict__)  # flags such as transformers' _is_hf_initialized
    return new


class VocabParallelEmbedding(nn.Embedding, _VocabShard):
    """nn.Embedding(V, H) whose rows are split over the grid's x*y*z ranks (see the module doc); `num_embeddings`
    stays the full V, `weight` is this rank's (V/P, H) shard."""

    @classmethod
    def from_embedding(cls, embedding: nn.Embedding, grid: Grid) -> "VocabParallelEmbedding":
        if embedding.max_norm is not None or embedding.scale_grad_by_freq or embedding.sparse:
            raise ShardingError(
                "a vocabulary-parallel embedding supports neither max_norm, scale_grad_by_freq nor sparse gradients"
            )
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module.num_embeddings, module.embedding_dim = embedding.num_embeddings, embedding.embedding_dim
        module.padding_idx, module.max_norm, module.norm_type = embedding.padding_idx, None, embedding.norm_type
        module.scale_grad_by_freq, module.sparse = False, False
        module._init_shard(grid, embedding.num_embeddings)
        module.weight = _new_weight(embedding.weight, module.shard_rows(local_shard(embedding.weight)))
        module.train(embedding.training)
        return module

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows, replicas = self.row_group, self.replica_group
        all_ids = comm.all_gather(ids.contiguous(), rows, 0)
        local = all_ids - self.vocab_start
        weight = local_shard(self.weight)  # this rank's rows
        inside = (local >= 0) & (local < weight.shape[0])
        pad = None
        if self.padding_idx is not None and 0 <= self.padding_idx - self.vocab_start < weight.shape[0]:
            pad = self.padding_idx - self.vocab_start  # no gradient to the padding row, as in nn.Embedding
        partial = F.embedding(torch.where(inside, local, 0), weight, pad)
        partial = partial * inside.unsqueeze(-1).to(partial.dtype)
        mine = reduce_scatter_to_group(partial, rows, 0)
        return mine if replicas is None else reduce_from_group(mine, replicas)  # replicas: the other vocab slices

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, shard={tuple(local_shard(self.weight).shape)}"


class VocabParallelLMHead(nn.Linear, _VocabShard):
    """nn.Linear(H, V, bias=False) whose output rows are split over the grid's x*y*z ranks; `out_features` stays V.

    Called as a module it returns full logits (..., V) of this rank's own rows (for evaluation and generation; it
    holds P times those for a moment). Training losses should use `token_losses` on its weight instead
    (`causal_lm_token_losses` does), which never builds them.
    """

    @classmethod
    def from_linear(cls, linear: nn.Linear, grid: Grid) -> "VocabParallelLMHead":
        if linear.bias is not None:
            raise ShardingError("a vocabulary-parallel lm_head has no bias; keep this lm_head replicated")
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module.in_features, module.out_features = linear.in_features, linear.out_features
        module._init_shard(grid, linear.out_features)
        module.weight = _new_weight(linear.weight, module.shard_rows(local_shard(linear.weight)))
        module.register_parameter("bias", None)
        module.train(linear.training)
        return module

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        group, rows, replicas = self.group, self.row_group, self.replica_group
        if replicas is not None:  # the replicas' partial gradients of the same rows are summed in backward
            hidden = copy_to_group(hidden, replicas)
        all_rows = gather_sharded(hidden, rows, 0)
        local_logits = F.linear(all_rows, local_shard(self.weight))
        logits = self.in_block_order(gather_from_group(local_logits, group, -1), -1)
        return split_to_group(logits, rows, 0)

    def extra_repr(self) -> str:
        shard = tuple(local_shard(self.weight).shape)
        return f"in_features={self.in_features}, out_features={self.out_features}, shard={shard}"


def is_vocab_parallel(module: nn.Module) -> bool:
    """True for a vocabulary-parallel embedding or lm_head (also once ZeRO gives it its FSDP subclass)."""
    return isinstance(module, _VocabShard)


def can_shard_vocab(model: nn.Module, grid: Grid) -> str | None:
    """None when `model`'s embeddings and lm_head can be split over x*y*z exactly, else the reason why not."""
    size = grid.size(*VOCAB_AXES)
    if size == 1:
        return "the grid has no tensor parallelism"
    if not (hasattr(model, "get_input_embeddings") and hasattr(model, "get_output_embeddings")):
        return f"{type(model).__name__} has no get_input_embeddings / get_output_embeddings"
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    if type(embedding) is not nn.Embedding:
        return f"the input embedding is a {type(embedding).__name__}, not an nn.Embedding"
    if embedding.num_embeddings % size:
        return f"vocabulary {embedding.num_embeddings} is not divisible by x*y*z={size}"
    if embedding.max_norm is not None or embedding.scale_grad_by_freq or embedding.sparse:
        return "the embedding uses max_norm, scale_grad_by_freq or sparse gradients"
    if head is not None:
        if type(head) not in (nn.Linear, TokenLossLinear) or head.bias is not None:  # (a loss ran on it: same layer)
            return f"the lm_head is a {type(head).__name__}{' with a bias' if head.bias is not None else ''}"
        if head.out_features != embedding.num_embeddings:
            return f"the lm_head has {head.out_features} outputs, the embedding {embedding.num_embeddings} rows"
    return None


def shard_vocab(model: nn.Module, grid: Grid) -> list[nn.Module]:
    """Split `model`'s input embedding and lm_head over the grid's x*y*z ranks, in place (a tied lm_head keeps
    sharing the embedding's shard), and return the new modules. `engine.parallelize(..., vocab_parallel=True)` calls
    it and marks their gradient region. Raises ShardingError when `can_shard_vocab` gives a reason."""
    reason = can_shard_vocab(model, grid)
    if reason is not None:
        raise ShardingError(f"cannot split the vocabulary of {type(model).__name__}: {reason}")
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = head is not None and head.weight is embedding.weight
    new_embedding = VocabParallelEmbedding.from_embedding(embedding, grid)
    model.set_input_embeddings(new_embedding)
    if head is None:
        return [new_embedding]
    new_head = VocabParallelLMHead.from_linear(head, grid)
    if tied:
        new_head.weight = new_embedding.weight
    model.set_output_embeddings(new_head)
    return [new_embedding, new_head]


# ----- the loss of a causal LM -----------------------------------------------------------------------------------


def own_class(model: nn.Module) -> type:
    """The model's own class: FSDP2's fully_shard (ZeRO 2 and 3) swaps in a dynamic subclass FSDP<class> whose MRO
    is (FSDP<class>, FSDPModule, <class>, ...); the first class that is no FSDPModule is the model's."""
    from torch.distributed.fsdp import FSDPModule

    return next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))


def causal_lm_token_losses(
    model: nn.Module,
    input_ids: torch.Tensor,
    targets: torch.Tensor,
    *,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> torch.Tensor:
    """Per-token cross-entropy (B, T) of a causal LM on this rank's rows, float32, 0 where targets are IGNORE_INDEX.

    For HF models whose logits are lm_head(final hidden states) (plain, parallelized or partitioned by
    engine.memory.zero), the loss runs from the hidden states through `token_losses`: full-vocabulary logits are never
    built (vocabulary-parallel over x*y*z when the lm_head is). For that the lm_head becomes, on the first call, a
    loss head (TokenLossLinear or TokenLossVocabParallelLMHead: the same object, parameters and state-dict keys, its
    class changed once). A model that changes the logits after its head (Gemma 2's soft-capping, Cohere's and
    Granite's logit scales) is recognised on its first call, because the tensor its forward returns is not the one
    the head produced; that call and every later one take model(...).logits and F.cross_entropy instead, as does a
    model whose head has a bias.

    position_ids: (B, T) passed to the model, e.g. restarting at each packed document (transformers then makes the
    attention block-causal when no attention_mask is given); None: 0..T-1.
    """
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "use_cache": False}
    if position_ids is not None:  # only when given: models without the argument still work without it
        inputs["position_ids"] = position_ids
    head = _loss_head(model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None)
    if head is not None:
        losses = _fused_token_losses(model, head, inputs, targets, chunk_tokens)
        if losses is not None:
            return losses
        head.transforms_logits = True  # seen once: the logits path from now on
    logits = model(**inputs).logits
    return F.cross_entropy(
        logits.float().flatten(0, 1), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="none"
    ).reshape(targets.shape)


def head_token_losses(
    head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, *, chunk_tokens: int = DEFAULT_CHUNK_TOKENS
) -> torch.Tensor:
    """Per-token cross-entropy (B, T) float32 of `targets` (B, T) from the final hidden states (B, T, H) through
    `head` (an lm_head, plain or vocabulary-parallel), as causal_lm_token_losses computes it after the base model:
    chunked, without full-vocabulary logits, where the head allows it; else from head(hidden)'s logits."""
    loss_head = _loss_head(head)
    if loss_head is not None:
        with loss_head.returning_losses(targets, chunk_tokens):
            return loss_head(hidden)
    logits = head(hidden)
    return F.cross_entropy(
        logits.float().flatten(0, 1), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="none"
    ).reshape(targets.shape)


class _LossHead:
    """What the loss heads add to their lm_head class: inside `with head.returning_losses(targets, chunk_tokens)`
    the head's forward returns the per-token losses of `targets` (token_losses on its weight) instead of logits, and
    records them; outside it, the forward of the class it extends (logits).

    Why the loss runs INSIDE the model's own forward, as its lm_head: under ZeRO 2/3 (engine.memory.zero: FSDP2 over
    the data axis, the model the root unit holding embeddings, final norm and lm_head), only the root's forward
    pre-hook all-gathers those parameters (calling model.base_model directly leaves them data-sharded DTensors), and
    head.weight is the unsharded parameter exactly while that forward runs; the losses are then the root's output,
    on which FSDP registers its pre-backward hook, so its backward (root unshard check, prefetch of the last layer) and
    the post-backward reduce-scatter of the head's and embedding's gradients run as for model(...).logits. Without
    ZeRO it is the same computation as base_model + token_losses.
    """

    _loss_request: tuple[torch.Tensor, int, list[torch.Tensor]] | None = None  # set only inside returning_losses
    transforms_logits = False  # True once its model was seen to change the logits after the head

    @contextmanager
    def returning_losses(self, targets: torch.Tensor, chunk_tokens: int) -> Iterator[list[torch.Tensor]]:
        """Inside the block the forward returns per-token losses of `targets`; yields the list of what it returned."""
        produced: list[torch.Tensor] = []
        self._loss_request = (targets, chunk_tokens, produced)
        try:
            yield produced
        finally:
            self._loss_request = None

    def _losses(self, hidden: torch.Tensor, **split: Any) -> torch.Tensor:
        targets, chunk_tokens, produced = self._loss_request
        losses = token_losses(hidden, local_shard(self.weight), targets, chunk_tokens=chunk_tokens, **split)
        # a fresh tensor, not a view: FSDP hooks the root's outputs for backward and warns on views
        produced.append(losses.float().clone() if losses._base is not None else losses.float())
        return produced[-1]


class TokenLossLinear(_LossHead, nn.Linear):
    """A bias-free nn.Linear lm_head that can return per-token losses (see _LossHead)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self._loss_request is None:
            return super().forward(hidden)
        return self._losses(hidden)


class TokenLossVocabParallelLMHead(_LossHead, VocabParallelLMHead):
    """A VocabParallelLMHead that can return per-token losses (see _LossHead), combined over its vocabulary group."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self._loss_request is None:
            return super().forward(hidden)
        return self._losses(
            hidden,
            group=self.group,
            vocab_start=self.vocab_start,
            row_group=self.row_group,
            replica_group=self.replica_group,
        )


_LOSS_HEADS = {nn.Linear: TokenLossLinear, VocabParallelLMHead: TokenLossVocabParallelLMHead}


def _loss_head(head: nn.Module | None) -> _LossHead | None:
    """`head` as a loss head (its class changed in place the first time; same object, so FSDP's hold on its
    parameters and every reference to it stay valid), or None when the fused loss cannot be its output: no head, a
    bias, a model seen to transform its logits, or a head class of someone else's."""
    if head is None or getattr(head, "bias", None) is not None:
        return None
    if isinstance(head, _LossHead):
        return None if head.transforms_logits else head
    loss_class = _LOSS_HEADS.get(type(head))
    if loss_class is None:
        return None
    head.__class__ = loss_class
    return head


def _fused_token_losses(
    model: nn.Module, head: _LossHead, inputs: dict[str, Any], targets: torch.Tensor, chunk_tokens: int
) -> torch.Tensor | None:
    """The per-token losses computed as the model's lm_head (see _LossHead), or None when the model's forward
    returned something other than what the head produced (it transforms its logits). inputs: the model's keyword
    arguments."""
    with head.returning_losses(targets, chunk_tokens) as produced:
        out = model(**inputs)
    losses = out.logits if hasattr(out, "logits") else out[0]  # out[0]: a model configured with return_dict=False
    return losses if len(produced) == 1 and losses is produced[0] else None
