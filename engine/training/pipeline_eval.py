"""Evaluation through pipeline stages: a transformers causal LM cut into P stages over a pipe group, called as the
serial model is, with a KV cache kept per stage.

    model = PipelineEvalModel(model, grid.group("pipe"))   # on every rank of the group, the same model
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True)
    out.logits                                             # (B, T, V) on every rank; out.cache: this rank's layers

Every rank of the group passes the same inputs. One forward is ONE pass through the stages: stage s runs on rank s
and hands its hidden states (B, T, H) to rank s + 1 (`hand_over`); the last stage's logits are broadcast over the
group. Each rank holds and runs only its own stage (the others' parameters are on the meta device, as in training,
engine/training/pipeline.py), so a rank's KV cache fills only its own layers: transformers' caches are indexed by the
decoder layers' layer_idx, which the layers keep in the stage. Greedy decoding runs in lockstep: each decoding step
is one forward on every rank.

Each stage sets up what the serial base model's forward sets up, from the same inputs: positions (those given, or
0..T-1 after the tokens its cache has seen), the attention mask (transformers' create_causal_mask with the padding
mask and the cache, sized against the stage's first layer, whose cache holds what layer 0's holds serially) and the
rotary cos/sin. The operations are those of the serial forward on the same shapes, so on one device the logits are
the serial model's bit for bit (tests/parallel/test_pipeline_eval.py).

`gradient_norm` is the membership attack's gradient norm (eval.membership.gradient_norm) with its backward through
the stages. `generate` is the model's own HF generate (beam search, sampling) with each forward run through the
stages: every rank gets the same logits, so with the same seed every rank chooses the same tokens (and stops at the
same step), and beam search reorders each rank's cache, which holds its own layers.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch
from torch import nn
from transformers import DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from engine.core import comm
from engine.core.grid import AxisGroup
from engine.models.adapter import CACHE_KEYWORDS
from engine.models.layout import parallel_grid
from engine.training.pipeline import StageModule, announced, hand_over, header_of, split_model, stage_to_device

# forward keywords HF generate passes that change nothing here (the output is always a ModelOutput; positions come
# from position_ids or the cache)
PASSED_OVER = ("return_dict", "cache_position")


class PipelineEvalModel(nn.Module):
    """`model` cut into `group.size` stages, stage s held and run by group rank s, called like the serial causal LM.

    forward(input_ids (B, T), attention_mask (B, T_past + T) or None, position_ids (B, T) or None, cache or
    past_key_values, use_cache, logits_to_keep) with the same values on every rank of the group returns a
    CausalLMOutputWithPast whose logits (B, T', V) are the whole model's on every rank and whose cache holds this
    rank's layers only (pass it back on this rank). splits: the first layer index of stages 1..P-1 (None: balanced
    by parameter count; every cut gives the same logits). Inference only (no gradients cross the stages).
    """

    def __init__(self, model: nn.Module, group: AxisGroup, splits: list[int] | None = None) -> None:
        super().__init__()
        if group.size < 2:
            raise ValueError("a pipeline evaluation needs a group of at least 2 ranks")
        grid = parallel_grid(model)
        if grid is not None and grid.size("x", "y", "z") > 1:
            raise ValueError(
                "evaluation through pipeline stages runs on grids of pipe and data only: drop x, y and z, or the "
                "pipe axis"
            )
        self.group = group
        self._config = model.config
        self._generation_config = getattr(model, "generation_config", None)
        stages = split_model(model, group.size, splits)
        for stage in stages:
            if stage.index != group.rank:
                stage_to_device(stage, "meta")  # another rank's stage: its weights are freed here
        self._all = tuple(stages)  # every stage's module (shapes and names), not registered: others' are meta
        self.stage = stages[group.rank]  # this rank's, registered: its parameters are the module's
        object.__setattr__(self, "_whole", model)  # for HF generate; not a submodule (its other stages are meta)
        self.train(model.training)

    @property
    def config(self) -> Any:
        return self._config

    @property
    def generation_config(self) -> Any:
        return self._generation_config

    @property
    def device(self) -> torch.device:
        """Where this rank's stage is (`.to(device)` moves it: the other stages are on the meta device)."""
        return next(self.stage.parameters()).device

    @property
    def all_stages(self) -> tuple[StageModule, ...]:
        """Every stage's module in order (another rank's on the meta device)."""
        return self._all

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Any = None,
        past_key_values: Any = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        """The serial model's forward, stage by stage over the group's ranks (see the class doc)."""
        asked = sorted(k for k, v in kwargs.items() if k not in PASSED_OVER and v not in (None, False))
        if asked:
            raise ValueError(f"a pipeline evaluation takes ids, masks, positions and a cache; not {asked}")
        cache = cache if cache is not None else past_key_values
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        first = self.stage.start  # the cache layer that has seen what layer 0 has seen serially
        if position_ids is None:  # as the base model: 0..T-1 after the tokens the cache holds
            past = cache.get_seq_length(first) if cache is not None else 0
            position_ids = (torch.arange(input_ids.shape[1], device=input_ids.device) + past).unsqueeze(0)
        rank, hidden = self.group.rank, input_ids
        for stage in self._all:
            if stage.index > 0:
                hidden = hand_over(hidden, self.group, stage.index - 1, stage.index, self.device)
            if stage.index == rank:
                hidden = self._run_stage(hidden, attention_mask, position_ids, cache, bool(use_cache), logits_to_keep)
        last = len(self._all) - 1
        logits = _broadcast(hidden if rank == last else None, self.group, last, self.device)
        return CausalLMOutputWithPast(logits=logits, **{_output_cache_field(): cache if use_cache else None})

    def _run_stage(
        self,
        x: torch.Tensor,
        attention_mask: torch.Tensor | None,
        positions: torch.Tensor,
        cache: Any,
        use_cache: bool,
        logits_to_keep: int | torch.Tensor,
    ) -> torch.Tensor:
        """This rank's stage, as the serial base model runs those layers: ids (B, T) on the first stage, hidden states
        (B, T, H) on the others; returns hidden states, or the logits (B, T', V) on the last stage."""
        self.stage.positions = positions
        try:
            return self.stage(
                x, attention_mask=attention_mask, cache=cache, use_cache=use_cache, logits_to_keep=logits_to_keep
            )
        finally:
            self.stage.positions = None

    def generate(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The model's own HF generate, each of its forwards run through the stages (this module's forward). Every
        rank of the group calls it with the same inputs and seeds, and gets the same ids."""
        whole = self._whole
        whole.forward = self.forward  # an instance attribute: nn.Module's call finds it before the class's forward
        try:
            return whole.generate(*args, **kwargs)
        finally:
            del whole.forward

    def gradient_norm(self, token_ids: Sequence[int]) -> float:
        """||grad_theta L||_2 of the mean next-token cross-entropy L of one sequence over every floating-point
        parameter of the whole model, as eval.membership.gradient_norm computes it on the serial model: a forward
        through the stages, then the backward through them in reverse (each stage's rank hands the gradient of its
        input hidden states to the previous stage's rank). Every rank of the group passes the same ids and gets the
        norm; the squares of each parameter's gradient are summed in the model's parameter order. The requires_grad
        flags are restored and no .grad field is written (torch.autograd.grad)."""
        ids = torch.tensor([[int(t) for t in token_ids]], device=self.device)  # (1, T)
        positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        params = [p for p in self.stage.parameters() if p.is_floating_point()]
        flags, training = [p.requires_grad for p in params], self.training
        rank, last = self.group.rank, len(self._all) - 1
        self.eval()  # no dropout, as the serial computation
        try:
            for p in params:
                p.requires_grad_(True)
            with torch.enable_grad():
                hidden, inputs, output = ids, None, None
                for stage in self._all:  # forward: each stage's output handed on, detached
                    if stage.index > 0:
                        hidden = hand_over(hidden.detach(), self.group, stage.index - 1, stage.index, self.device)
                    if stage.index == rank:
                        inputs = hidden.requires_grad_(True) if rank > 0 else hidden
                        output = hidden = self._run_stage(inputs, None, positions, None, False, 0)
                wrt = [inputs, *params] if rank > 0 else params
                if rank == last:
                    loss = torch.nn.functional.cross_entropy(output[0, :-1].float(), ids[0, 1:])
                    grads = torch.autograd.grad(loss, wrt, allow_unused=True)
                upstream = None
                for stage in reversed(self._all[1:]):  # backward: the gradient of stage s's input to rank s - 1
                    if stage.index == rank:
                        upstream = grads[0]
                    upstream = hand_over(upstream, self.group, stage.index, stage.index - 1, self.device)
                    if stage.index - 1 == rank:
                        grads = torch.autograd.grad(output, wrt, grad_outputs=upstream, allow_unused=True)
        finally:
            self.train(training)
            for p, flag in zip(params, flags):
                p.requires_grad_(flag)
        own = grads[1:] if rank > 0 else grads
        squares = [float(g.double().pow(2).sum()) for g in own if g is not None]  # in this stage's parameter order
        return math.sqrt(sum(x for part in comm.all_gather_objects(squares, self.group) for x in part))


def _output_cache_field() -> str:
    """The name of CausalLMOutputWithPast's cache field in the installed transformers."""
    fields = CausalLMOutputWithPast.__dataclass_fields__
    return next(k for k in CACHE_KEYWORDS if k in fields)


def _broadcast(tensor: torch.Tensor | None, group: AxisGroup, owner: int, device: torch.device) -> torch.Tensor:
    """Group rank `owner`'s `tensor` (up to 7 dims) on every rank of the group: a header (dtype code, dims), then the
    tensor. The other ranks pass None."""
    header = comm.broadcast_(header_of(tensor if group.rank == owner else None, device), group, owner)
    if group.rank != owner:
        tensor = announced(header, device)
    return comm.broadcast_(tensor.contiguous(), group, owner)


__all__ = ["PipelineEvalModel"]
