"""Analytic model of what one training step of the engine communicates, computes and keeps in memory.

The byte model lists every collective the engine issues for a layer or a whole model (TransformerShape): its
process group (named as engine.core.grid names it: "x", "y", "z", "data", "x+y", "x+y+z", "z+data", "world"), its
kind, the bytes of its full tensor and the bytes this rank sends under the ring model that
engine.core.comm's counters use:

    all-reduce of n bytes over p ranks      sends 2 n (p-1)/p
    all-gather whose OUTPUT has n bytes     sends   n (p-1)/p
    reduce-scatter whose INPUT has n bytes  sends   n (p-1)/p

Summed per group, the predictions equal the engine's counters exactly (tests/parallel/test_comm_model.py checks
every grid of world sizes 4 and 8 for Llama, and GPT-NeoX, Phi-3, OLMo2, GPT-2 on x=y=z=2 and under ZeRO). Per
ParallelLinear (weight out x in = N x K, T tokens through it):

    normal      forward   z: all-gather weight block (N/Y)(K/X)   x: all-reduce output T N/Y
                          z: all-gather bias N/Y
                backward  z: all-gather weight again              y: all-reduce input grad T K/X
                          z: reduce-scatter weight grad (N/Y)(K/X) and bias grad N/Y
                          x: all-gather input grad T K (leaving the x split of the input)
    transposed  the roles of X and Y swapped (input T K/Y, output all-gathered over x to T N)
    default     x+y: all-gather the rows in (T_rank K XY) and the output gradient (T_rank N XY),
                y: all-gather the output T_rank XY N, around a normal layer on the XY T_rank tokens

A parallelized model runs the module that owns its decoder layers on the U = X*Y*R rows of each x*y group: it
all-gathers the input embeddings (and the caller's attention mask, if any) over x+y on entry and the gradient of the
final hidden states on exit; inside, every layer runs the projections of its plan (q/k/v/gate/up, fused or not, as
normal and o/down as transposed layers) on U rows, and an RMSNorm over a whole projection (OLMo2's q_norm) sums its
mean square over y. After backward, engine.training.state.sync_gradients all-reduces shard gradients over "data",
the norms of the layers and the final norm over "z+data" (per-head norms over "y+z+data") and the embeddings and
lm_head over "world" (or, split by vocabulary over x*y*z as engine.parallelize does by default when the
vocabulary divides, over "data": see vocab_collectives for the embedding's and the loss's collectives), in
flat buckets of at most 2**24 elements; clip_grad_norm_ all-reduces one float64 over "x+y+z".

The functions that model a whole step take its settings as one StepSettings (rows per rank and micro-batch, sequence
length, element sizes, micro-batches, activation checkpointing, attention mask and position ids, vocabulary split,
rows layout, bytes per parameter).

Rows layouts (engine/models/parallelize.py, TrainConfig.rows; StepSettings.rows): StepSettings.rows_per_rank is the
rows each rank reads per micro-batch. In the "own" layout (default) that is R, the group runs on U = X*Y*R rows; in the
"shared" layout (rows="shared", after AxoNN) every rank of the x*y group reads the group's U rows itself: there is no
gather of embeddings and no scatter of the final hidden states' gradient around the decoder, the embeddings, lm_head
and loss run on U rows replicated over x and y (compute and memory X*Y times those of the own layout) unless split by
vocabulary, where ids and hidden states are exchanged over z only (and summed over x+y), and outside gradients are
summed over "z+data" instead of "world".

A pipeline (grid.pipe > 1; the section at the end) is modelled per pipe rank: stage_shape / pipe_rank_shape give the
part of the model a rank holds (its layers, the embeddings on the first stage, the head on the last), which every
function here takes with the stage's grid; pipeline_bubble, pipeline_in_flight and pipeline_p2p_bytes add what the
schedule costs. On pipe=2, x=2 the predicted bytes per rank and group equal the engine's counters
(tests/parallel/test_plan_pipe_bytes.py).

The FLOP model counts matrix products (on a serial step it equals torch's FlopCounterMode, see
tests/parallel/test_plan.py); the memory model is an estimate whose assumptions its docstring states (its parameter
part is exact: tests/parallel/test_comm_model.py checks it against what each rank holds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Iterable

from engine.spec import (
    AXES,
    BUCKET_ELEMENTS,
    PIPE_SCHEDULES,
    ROWS_LAYOUTS,  # (the planner's readers also take the layouts from here)
    GridShape,
    PipeConfig,
    RowsLayout,
    ZeroConfig,
    gradient_axes,
    row_gather_axes,
    row_replica_axes,
    row_split_axes,
    vocab_row_axes,
)

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
PHASES = ("forward", "backward", "sync", "clip", "optimizer")
SYNC_BUCKET_ELEMENTS = BUCKET_ELEMENTS  # gradients are all-reduced in buckets this large (engine.core.comm)
# The families whose stage set-up engine/training/pipeline.py confirms (adapters with stages, engine/models/families/):
# named shapes of others refuse pipelining; shapes read from a config carry the engine's own refusal.
PIPELINE_FAMILIES = ("llama", "qwen2", "gpt2")


def group_name(axes: Iterable[str]) -> str:
    """The name engine.core.grid gives the group of `axes` (and under which comm counts its bytes)."""
    ordered = tuple(a for a in AXES if a in tuple(axes))
    return "world" if ordered == AXES else "+".join(ordered)


def group_axes(name: str) -> tuple[str, ...]:
    """Inverse of group_name: "z+data" -> ("z", "data"), "world" -> AXES; ZeRO's node groups of the data axis
    ("data.level1", ..., "data.node": engine.core.grid.Grid.data_levels and data_node) -> ("data",)."""
    if name == "world":
        return AXES
    if name.startswith("data."):
        return ("data",)
    axes = tuple(name.split("+"))
    if any(a not in AXES for a in axes):
        raise ValueError(f"unknown group {name!r}; groups are named by grid axes {AXES} joined with '+'")
    return axes


@dataclass(frozen=True)
class Collective:
    """One collective (repeated `count` times, e.g. once per layer) as seen by one rank.

    full_bytes: the all-reduce operand, the all-gather OUTPUT, the reduce-scatter or all-to-all INPUT, in bytes.
    """

    group: str
    kind: str
    ranks: int
    full_bytes: int
    phase: str
    what: str
    count: int = 1

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"collective kind must be one of {KINDS}, got {self.kind!r}")
        if self.phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, got {self.phase!r}")

    @property
    def sent_per_call(self) -> int:
        """Bytes this rank sends in one call, with the same arithmetic (and truncation) as engine.core.comm."""
        factor = 2 if self.kind == "all_reduce" else 1
        return int(factor * self.full_bytes * (self.ranks - 1) / self.ranks)

    @property
    def sent_bytes(self) -> int:
        """Bytes this rank sends over all `count` calls."""
        return self.count * self.sent_per_call

    @property
    def ring_steps(self) -> int:
        """Latency-bound steps of one call under the ring algorithm (2(p-1) for all-reduce, p-1 otherwise)."""
        return (2 if self.kind == "all_reduce" else 1) * (self.ranks - 1)


def bytes_by_group(collectives: Iterable[Collective], phase: str | None = None) -> dict[str, int]:
    """Bytes sent per group name (optionally of one phase only); groups with no traffic are left out."""
    out: dict[str, int] = {}
    for c in collectives:
        if phase is None or c.phase == phase:
            out[c.group] = out.get(c.group, 0) + c.sent_bytes
    return {k: v for k, v in out.items() if v}


def scale_count(collectives: Iterable[Collective], factor: int) -> list[Collective]:
    """The same collectives repeated `factor` times (layers, micro-batches)."""
    return [replace(c, count=c.count * factor) for c in collectives]


class _Builder:
    """Collects collectives for one grid; calls on groups of one rank add nothing (the engine skips them)."""

    def __init__(self, grid: GridShape) -> None:
        self.grid = grid
        self.items: list[Collective] = []

    def add(self, axes: tuple[str, ...], kind: str, n_bytes: int, phase: str, what: str, count: int = 1) -> None:
        self.add_group(group_name(axes), self.grid.size(*axes), kind, n_bytes, phase, what, count)

    def add_group(self, name: str, ranks: int, kind: str, n_bytes: int, phase: str, what: str, count: int = 1) -> None:
        if ranks > 1 and count > 0:
            self.items.append(Collective(name, kind, ranks, int(n_bytes), phase, what, count))


def group_rows(grid: GridShape, rows_per_rank: int, rows: RowsLayout = "own") -> int:
    """Rows an x*y group's decoder runs on per micro-batch when each rank reads `rows_per_rank`: X*Y times them in
    the own layout, the same rows in the shared one."""
    return rows_per_rank * grid.size(*row_gather_axes(rows))


def linear_axes(transposed: bool) -> tuple[str, str]:
    """(axis splitting a ParallelLinear's input features, axis splitting its output features): x and y in the normal
    mode, swapped in the transposed one, so that consecutive layers chain (engine.core.linear.mode_axes)."""
    return ("y", "x") if transposed else ("x", "y")


def zero_stage(zero: ZeroConfig | None, grid: GridShape) -> int:
    """The ZeRO stage that runs on `grid`: `zero`'s, or 0 without ZeRO or without a data axis to partition over."""
    return 0 if zero is None or grid.data == 1 else zero.stage


def _check_divides(what: str, value: int, by: int, hint: str) -> int:
    if value % by:
        raise ValueError(f"{what}: {value} is not divisible by {by} ({hint})")
    return value // by


def _tp_linear(
    b: _Builder,
    name: str,
    k: int,
    n: int,
    *,
    transposed: bool,
    bias: bool,
    tokens: int,
    param_bytes: int,
    act_bytes: int,
    input_grad: bool,
    in_bytes: int | None = None,
) -> None:
    """A normal or transposed ParallelLinear (k -> n) on `tokens` tokens of its x*y group.

    param_bytes: weights, biases and their gradients; act_bytes: what the matrix product produces (its
    output and partial output); in_bytes: the layer's input and its gradient (default act_bytes; under
    torch.autocast with fp32 weights a layer fed by the fp32 residual stream gets 4 while its products are
    bf16).
    """
    in_bytes = act_bytes if in_bytes is None else in_bytes
    g = b.grid
    in_axis, out_axis = linear_axes(transposed)
    k_local = _check_divides(f"{name} in_features", k, g.size(in_axis), f"split over {in_axis}")
    n_block = _check_divides(f"{name} out_features", n, g.size(out_axis), f"split over {out_axis}")
    _check_divides(f"{name} out_features", n, g.size(out_axis, "z"), f"split over {out_axis} and z")
    block = n_block * k_local
    # forward
    b.add(("z",), "all_gather", block * param_bytes, "forward", f"{name} weight")
    b.add((in_axis,), "all_reduce", tokens * n_block * act_bytes, "forward", f"{name} partial output")
    if bias:
        b.add(("z",), "all_gather", n_block * param_bytes, "forward", f"{name} bias")
    if transposed:
        b.add(("x",), "all_gather", tokens * n * act_bytes, "forward", f"{name} output features")
    # backward
    if bias:
        b.add(("z",), "reduce_scatter", n_block * param_bytes, "backward", f"{name} bias grad")
    if input_grad:
        b.add(("z",), "all_gather", block * param_bytes, "backward", f"{name} weight (again)")
        b.add((out_axis,), "all_reduce", tokens * k_local * in_bytes, "backward", f"{name} input grad")
    b.add(("z",), "reduce_scatter", block * param_bytes, "backward", f"{name} weight grad")
    if input_grad and not transposed:
        b.add(("x",), "all_gather", tokens * k * in_bytes, "backward", f"{name} input grad features")


def default_linear_collectives(
    in_features: int,
    out_features: int,
    grid: GridShape,
    *,
    tokens_per_rank: int,
    bias: bool = True,
    dtype_bytes: int = 4,
    input_grad: bool = True,
    name: str = "linear",
) -> list[Collective]:
    """Forward and backward of one default-mode ParallelLinear (nn.Linear semantics on each rank's rows).

    tokens_per_rank: rows x positions of the input each rank feeds, e.g. 2 x 3 for an input (2, 3, in).
    input_grad: whether the input requires a gradient (False skips the backward input collectives).
    """
    b = _Builder(grid)
    if grid.size("x", "y", "z") == 1:
        return []  # plain F.linear
    k, n, tokens = in_features, out_features, grid.size("x", "y") * tokens_per_rank
    b.add(("x", "y"), "all_gather", tokens * k * dtype_bytes, "forward", f"{name} rows in")
    _tp_linear(
        b,
        name,
        k,
        n,
        transposed=False,
        bias=bias,
        tokens=tokens,
        param_bytes=dtype_bytes,
        act_bytes=dtype_bytes,
        input_grad=input_grad,
    )
    b.add(("y",), "all_gather", tokens * n * dtype_bytes, "forward", f"{name} output features")
    b.add(("x", "y"), "all_gather", tokens * n * dtype_bytes, "backward", f"{name} output grad rows")
    return b.items


def chained_linear_collectives(
    in_features: int,
    hidden: int,
    out_features: int,
    grid: GridShape,
    *,
    tokens_per_group: int,
    bias: bool = True,
    dtype_bytes: int = 4,
    input_grad: bool = True,
) -> list[Collective]:
    """Forward and backward of a normal ParallelLinear (in -> hidden) followed by a transposed one
    (hidden -> out), with elementwise work in between; tokens_per_group = tokens of the x*y group's rows."""
    b = _Builder(grid)
    if grid.size("x", "y", "z") > 1:
        _tp_linear(
            b,
            "first",
            in_features,
            hidden,
            transposed=False,
            bias=bias,
            tokens=tokens_per_group,
            param_bytes=dtype_bytes,
            act_bytes=dtype_bytes,
            input_grad=input_grad,
        )
        _tp_linear(
            b,
            "second",
            hidden,
            out_features,
            transposed=True,
            bias=bias,
            tokens=tokens_per_group,
            param_bytes=dtype_bytes,
            act_bytes=dtype_bytes,
            input_grad=True,
        )
    return b.items


# ----- model shapes ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerParam:
    """One parameter of a model as engine.parallelize places it (a projection stands for its weight and bias).

    kind "projection": a ParallelLinear, weight (rows = out, cols = in) and a bias of `rows` when `bias`, in the
    normal or `transposed` mode; "replicated": a whole (rows, cols) tensor on every rank (norms, position tables)
    whose gradient is summed over the axes of `region` (engine.spec.gradient_axes); "y_norm": the same with region
    "heads", an RMSNorm over a normal projection's whole width that runs on its y slice (OLMo2's q_norm/k_norm:
    one fp32 per token all-reduced over y forward and backward); "vocab": the input embeddings or lm_head (rows =
    vocabulary, cols = hidden), split by vocabulary or whole.
    """

    kind: str
    rows: int
    cols: int = 1
    transposed: bool = False
    bias: bool = False
    region: str | None = "layer"
    name: str = ""

    @property
    def numel(self) -> int:
        """Elements of the full tensor (weight and bias of a projection)."""
        return self.rows * self.cols + (self.rows if self.bias else 0)


@dataclass(frozen=True)
class TransformerShape:
    """Sizes and parameter layout of a decoder-only model.

    Without `layer_layout`, the Llama layout of the fields (Llama, Mistral, Qwen2, Qwen3; with gated_mlp False and
    norm_bias the GPT layout of the AxoNN and GPT-NeoX sizes): projections q (hidden -> heads*head_dim), k and v
    (hidden -> kv_heads*head_dim), o (heads*head_dim -> hidden), gate and up (hidden -> intermediate), down
    (intermediate -> hidden); norms before attention and MLP (and per-head q/k norms when `qk_norm`), a final
    norm, embeddings and lm_head. With it (engine.models.shape reads it from a transformers model and the plan
    engine.parallelize shards it by), the parameters of one decoder layer and those before and after the layers,
    in module order; the fields then carry the sizes the FLOP and activation estimates use. `fused_blocks`: the
    feature blocks of each fused projection, which y must divide; `refusals`: (axes, reason) of grids the engine
    refuses (any of the axes larger than 1); `vocab_refusal`: why the vocabulary cannot be split (empty: it can);
    `logits_loss`: the training loss takes model(...).logits instead of the chunked loss (the model changes its logits
    after the head, or the head has a bias: engine.core.vocab_parallel.causal_lm_token_losses).
    """

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    head_dim: int = 0  # 0: hidden // heads
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    tie_embeddings: bool = False
    name: str = ""
    gated_mlp: bool = True  # Llama's gate/up/down; False: GPT's up (fc) and down (proj) with GELU between
    norm_bias: bool = False  # LayerNorm (weight and bias) instead of RMSNorm (weight only)
    layer_layout: tuple[LayerParam, ...] = ()
    before_layers: tuple[LayerParam, ...] = ()
    after_layers: tuple[LayerParam, ...] = ()
    fused_blocks: tuple[tuple[int, ...], ...] = ()
    refusals: tuple[tuple[tuple[str, ...], str], ...] = ()
    vocab_refusal: str = ""
    logits_loss: bool = False
    # A pipeline stage's part of the model (stage_shape builds them): whether it looks up the input embeddings (the
    # first stage) and runs the final norm, lm_head and the loss (the last one); a whole model does both.
    runs_embeddings: bool = True
    runs_head: bool = True
    pipeline_refusal: str = ""  # why the engine cannot cut this model into pipeline stages ("" when it can)

    def __post_init__(self) -> None:
        for f in ("hidden", "layers", "heads", "kv_heads", "intermediate", "vocab"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 1:
                raise ValueError(f"TransformerShape.{f} must be a positive integer, got {getattr(self, f)!r}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} must be a multiple of kv_heads {self.kv_heads}")
        if not self.head_dim:
            if self.hidden % self.heads:
                raise ValueError(f"hidden {self.hidden} is not divisible by heads {self.heads}; give head_dim")
            object.__setattr__(self, "head_dim", self.hidden // self.heads)

    @property
    def q_out(self) -> int:
        return self.heads * self.head_dim

    def layout(self) -> tuple[tuple[LayerParam, ...], tuple[LayerParam, ...], tuple[LayerParam, ...]]:
        """(before the layers, one decoder layer, after the layers): the given layout, or the Llama (GPT) one."""
        if self.layer_layout:
            return self.before_layers, self.layer_layout, self.after_layers
        h, i, kv = self.hidden, self.intermediate, self.kv_heads * self.head_dim
        gate = [("gate_proj", h, i, False, self.mlp_bias)] if self.gated_mlp else []
        projections = [
            ("q_proj", h, self.q_out, False, self.qkv_bias),
            ("k_proj", h, kv, False, self.qkv_bias),
            ("v_proj", h, kv, False, self.qkv_bias),
            ("o_proj", self.q_out, h, True, self.o_bias),
            *gate,
            ("up_proj", h, i, False, self.mlp_bias),
            ("down_proj", i, h, True, self.mlp_bias),
        ]
        norm = (LayerParam("replicated", h),) * (2 if self.norm_bias else 1)  # weight (and bias)
        vocab = LayerParam("vocab", self.vocab, h, region="rows")
        layer = [LayerParam("projection", n, k, t, b, name=name) for name, k, n, t, b in projections]
        layer += [LayerParam("replicated", self.head_dim, region="heads")] * (2 if self.qk_norm else 0)
        return (vocab,), (*layer, *norm, *norm), (*norm, *(() if self.tie_embeddings else (vocab,)))

    def projections(self) -> list[tuple[str, int, int, bool, bool]]:
        """(name, in, out, transposed, bias) of each decoder layer's linear, in module order."""
        return [(p.name, p.cols, p.rows, p.transposed, p.bias) for p in self.layout()[1] if p.kind == "projection"]

    @property
    def layer_linear_params(self) -> int:
        """Weights and biases of one decoder layer's linears."""
        return sum(p.numel for p in self.layout()[1] if p.kind == "projection")

    @property
    def vocab_params(self) -> int:
        """Embeddings and lm_head (one matrix when tied)."""
        before, _, after = self.layout()
        return sum(p.numel for p in before + after if p.kind == "vocab")

    @property
    def root_params(self) -> int:
        """Parameters outside the decoder layers other than embeddings and lm_head (final norm, position tables)."""
        before, _, after = self.layout()
        return sum(p.numel for p in before + after if p.kind != "vocab")

    @property
    def layer_norm_params(self) -> int:
        """Parameters of one decoder layer replicated on every rank (its norms)."""
        return sum(p.numel for p in self.layout()[1] if p.kind != "projection")

    @property
    def n_params(self) -> int:
        """Total parameters."""
        return self.layers * (self.layer_linear_params + self.layer_norm_params) + self.vocab_params + self.root_params


# Named sizes (shapes from the models' published config.json files on the Hugging Face hub).
NAMED_SHAPES: dict[str, TransformerShape] = {
    # meta-llama/Llama-2-7b-hf config.json
    "7B": TransformerShape(
        hidden=4096, layers=32, heads=32, kv_heads=32, intermediate=11008, vocab=32000, name="Llama-2-7B"
    ),
    # meta-llama/Llama-3.1-8B config.json
    "8B": TransformerShape(
        hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336, vocab=128256, name="Llama-3.1-8B"
    ),
    # meta-llama/Llama-2-70b-hf config.json
    "70B": TransformerShape(
        hidden=8192, layers=80, heads=64, kv_heads=8, intermediate=28672, vocab=32000, name="Llama-2-70B"
    ),
    # meta-llama/Llama-3.1-405B config.json
    "405B": TransformerShape(
        hidden=16384, layers=126, heads=128, kv_heads=8, intermediate=53248, vocab=128256, name="Llama-3.1-405B"
    ),
}


def _axonn_gpt(layers: int, hidden: int, heads: int, name: str) -> TransformerShape:
    """A GPT-style model of the AxoNN paper's runs (Singh et al., "Democratizing AI: Open-source Scalable LLM
    Training on GPU-based Supercomputers", SC'24, arXiv 2502.08145), as Megatron-LM builds it: multi-head
    attention, a 4 x hidden GELU MLP (no gate), biases on every linear, LayerNorm, the GPT-2 vocabulary
    (50,257 padded to 50,304, a multiple of 128, as Megatron pads it) and an lm_head tied to the embeddings.
    Learned position embeddings (seq x hidden, < 0.03% of any of these models) are left out."""
    return TransformerShape(
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=heads,
        intermediate=4 * hidden,
        vocab=50304,
        qkv_bias=True,
        o_bias=True,
        mlp_bias=True,
        tie_embeddings=True,
        gated_mlp=False,
        norm_bias=True,
        name=name,
    )


# Layers, hidden size and heads of the paper's GPT models as its authors list them in their Megatron-AxoNN
# repository (github.com/axonn-ai/Megatron-AxoNN: model-table.md, and the same numbers in
# examples/run_axonn_amd.sh). The nominal size names the model; n_params counts what the shape holds.
NAMED_SHAPES.update(
    {
        "5B": _axonn_gpt(24, 4096, 32, "GPT-5B"),
        "10B": _axonn_gpt(32, 5120, 40, "GPT-10B"),
        "20B": _axonn_gpt(32, 7168, 56, "GPT-20B"),
        "40B": _axonn_gpt(38, 9216, 72, "GPT-40B"),
        "60B": _axonn_gpt(56, 9216, 72, "GPT-60B"),
        "80B": _axonn_gpt(42, 12288, 96, "GPT-80B"),
        "160B": _axonn_gpt(84, 12288, 96, "GPT-160B"),
        "320B": _axonn_gpt(96, 16384, 128, "GPT-320B"),
        "640B": _axonn_gpt(192, 16384, 128, "GPT-640B"),
    }
)
# EleutherAI's GPT-NeoX-20B (Black et al. 2022; the defaults of transformers' GPTNeoXConfig and the released
# config.json): 44 layers, hidden 6,144, 64 heads, a 4 x hidden GELU MLP with biases, LayerNorm, rotary positions
# (no parameters), untied 50,432-row embeddings and lm_head. The 20B GPT of the Frontier ZeRO++ study (seed 001),
# whose exact shape we could not read, planned with these published sizes.
NAMED_SHAPES["NEOX-20B"] = replace(
    _axonn_gpt(44, 6144, 64, "GPT-NeoX-20B"),
    vocab=50432,
    tie_embeddings=False,
    pipeline_refusal=f"gpt_neox: the pipeline's stage set-up is confirmed for {', '.join(PIPELINE_FAMILIES)} only",
)


def vocab_parts(shape: TransformerShape, grid: GridShape, vocab_parallel: bool | None = None) -> int:
    """Ranks the embeddings and lm_head are split over by vocabulary rows (engine/core/vocab_parallel.py): x*y*z
    when the grid has tensor parallelism and the vocabulary divides (engine.parallelize's default, None), else
    1 (replicated). vocab_parallel=False forces 1; True requires the split (ValueError when it cannot be)."""
    parts = grid.size("x", "y", "z")
    if vocab_parallel is False or parts == 1:
        return 1
    reason = shape.vocab_refusal
    if not reason and shape.vocab % parts:
        reason = f"vocabulary {shape.vocab} is not divisible by x*y*z={parts}"
    if reason:
        if vocab_parallel:
            raise ValueError(reason)
        return 1
    return parts


def layer_shard_params(shape: TransformerShape, grid: GridShape) -> int:
    """Parameters of one decoder layer's ParallelLinear shards on one rank: weights are 1/(X Y Z) of the
    full ones, a bias is split over the output axis and z but replicated over the input axis."""
    total = 0
    for _, k, n, transposed, bias in shape.projections():
        in_axis, out_axis = linear_axes(transposed)
        rows = n // grid.size(out_axis, "z")
        total += rows * (k // grid.size(in_axis)) + (rows if bias else 0)
    return total


def grid_fits_shape(shape: TransformerShape, grid: GridShape) -> str | None:
    """None when parallelize can shard `shape` on `grid`, else the reason (as the engine would raise it)."""
    for axes, reason in shape.refusals:
        if grid.size(*axes) > 1:
            return reason
    y = grid.size("y")
    if shape.heads % y:
        return f"{shape.heads} attention heads not divisible by y={y}"
    if shape.kv_heads % y:
        return f"{shape.kv_heads} key/value heads not divisible by y={y}"
    for name, k, n, transposed, _ in shape.projections():
        in_axis, out_axis = linear_axes(transposed)
        if k % grid.size(in_axis):
            return f"{name} in_features {k} not divisible by {in_axis}={grid.size(in_axis)}"
        if n % grid.size(out_axis, "z"):
            return f"{name} out_features {n} not divisible by {out_axis}*z={grid.size(out_axis, 'z')}"
    for blocks in shape.fused_blocks:  # each y rank holds a slice of every block of a fused projection
        if any(size % y for size in blocks):
            return f"fused projection blocks {list(blocks)} not divisible by y={y}"
    return None


# ----- a whole training step ------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepSettings:
    """How each rank runs the forward and backward passes of one training step: what the functions below that model
    a step (its collectives, FLOPs, memory traffic, memory and pipeline messages) take besides the model's shape and
    the grid. engine.planner.plan builds one per prediction (PlanRequest.step_settings). Frozen and hashable, so a
    cache can be keyed by it; variants come from dataclasses.replace (e.g. grad_accum=0: the optimizer's share of the
    memory traffic alone).

    rows_per_rank: rows (sequences) each rank reads per micro-batch. In the "own" rows layout the x*y group's
        decoder runs on X*Y times them; in the "shared" layout every rank of the group reads the group's rows itself.
    seq: tokens per row.
    param_bytes: bytes per element of the weights and their gradients.
    act_bytes: bytes per element of what the matrix products produce (their outputs and partial outputs).
    stream_bytes: bytes per element of the residual stream (hidden states between layers and the q/k/v/gate/up
        inputs); None: act_bytes (resolved here, so a replace() of act_bytes alone keeps the resolved value). The
        three sizes all equal the model's dtype, except under torch.autocast(bf16) with fp32 weights: 4, 2 and 4.
    grad_accum: forward and backward passes (micro-batches, a pipeline's M) per optimizer step; 0: none, the
        optimizer's part alone.
    mask_bytes: bytes per token of the attention mask the ranks pass: 0 when no rank passes one, else 8 (the engine
        gathers 2-D masks as int64).
    recompute: activation checkpointing of the decoder layers (engine/memory/activation.py).
    position_ids: whether per-row (R, S) position ids are passed (int64).
    vocab_parallel: the embeddings and lm_head split by vocabulary (vocab_parts): None is engine.parallelize's default
        (split when the grid has tensor parallelism and the vocabulary divides), False forces them whole, True
        requires the split.
    rows: the rows layout, "own" or "shared" (engine.spec.ROWS_LAYOUTS; see the module doc).
    bytes_per_param: bytes of device memory per parameter for its weight, gradient and optimizer state (16 = fp32
        weight and gradient + AdamW's m and v, what `goldfish train` keeps under either precision).
    """

    rows_per_rank: int
    seq: int
    param_bytes: int = 2
    act_bytes: int = 2
    stream_bytes: int | None = None
    grad_accum: int = 1
    mask_bytes: int = 0
    recompute: bool = False
    position_ids: bool = False
    vocab_parallel: bool | None = None
    rows: RowsLayout = "own"
    bytes_per_param: float = 16.0

    def __post_init__(self) -> None:
        if self.stream_bytes is None:
            object.__setattr__(self, "stream_bytes", self.act_bytes)
        for name in ("rows_per_rank", "seq", "param_bytes", "act_bytes", "stream_bytes", "grad_accum", "mask_bytes"):
            value, least = getattr(self, name), 0 if name in ("grad_accum", "mask_bytes") else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"StepSettings.{name} must be an integer >= {least}, got {value!r}")
        if self.vocab_parallel not in (None, True, False):
            raise ValueError(f"StepSettings.vocab_parallel must be None, True or False, got {self.vocab_parallel!r}")
        if self.rows not in ROWS_LAYOUTS:
            raise ValueError(f"StepSettings.rows must be a rows layout of {ROWS_LAYOUTS}, got {self.rows!r}")
        size = self.bytes_per_param
        if isinstance(size, bool) or not isinstance(size, (int, float)) or not size > 0:
            raise ValueError(f"StepSettings.bytes_per_param must be a positive number, got {size!r}")

    def decoder_tokens(self, grid: GridShape) -> int:
        """Tokens the decoder of an x*y group of `grid` runs on per micro-batch (group_rows x seq): X*Y*R*S in the
        own rows layout, the R*S tokens every rank reads in the shared one."""
        return group_rows(grid, self.rows_per_rank, self.rows) * self.seq


@dataclass(frozen=True)
class LocalParam:
    """One parameter as a rank holds it after engine.parallelize: its tensor-parallel shard has `rows` rows
    of `row_elements` elements; `unit` is the FSDP unit it belongs to (0: the root's embeddings, final norm
    and lm_head; i >= 1: decoder layer i) and `axes` the grid axes sync_gradients sums it over (no ZeRO)."""

    unit: int
    rows: int
    row_elements: int
    axes: tuple[str, ...]

    @property
    def numel(self) -> int:
        return self.rows * self.row_elements

    def padded_chunk(self, parts: int) -> int:
        """Elements of one chunk when dim 0 is split into `parts` padded to equal size (FSDP2, ZeroAdamW)."""
        return -(-self.rows // parts) * self.row_elements

    def chunk(self, parts: int, index: int) -> int:
        """Elements of chunk `index` of `parts` (torch.chunk / DTensor Shard(0) split, unpadded)."""
        size = -(-self.rows // parts)
        return max(0, min(self.rows, (index + 1) * size) - min(self.rows, index * size)) * self.row_elements


def local_params(
    shape: TransformerShape, grid: GridShape, vocab_parallel: bool | None = None, rows: RowsLayout = "own"
) -> list[LocalParam]:
    """Every distinct parameter of a parallelized model, in module order. The embeddings and lm_head are whole and
    summed over every axis (over z and data in the shared rows layout), or (vocab_parts > 1) V/P rows each whose
    gradients already cover the rows of x*y*z and are summed over data only."""
    parts = vocab_parts(shape, grid, vocab_parallel)

    def place(p: LayerParam, unit: int) -> list[LocalParam]:
        if p.kind == "projection":
            in_axis, out_axis = linear_axes(p.transposed)
            n = p.rows // grid.size(out_axis, "z")
            return [LocalParam(unit, n, p.cols // grid.size(in_axis), ("data",))] + (
                [LocalParam(unit, n, 1, ("data",))] if p.bias else []
            )
        if p.kind == "vocab":
            return [LocalParam(unit, p.rows // parts, p.cols, row_split_axes(rows) if parts == 1 else ("data",))]
        return [LocalParam(unit, p.rows, p.cols, gradient_axes(rows, p.region))]

    before, layer, after = shape.layout()
    out = [q for p in before for q in place(p, 0)]
    one = [q for p in layer for q in place(p, 1)]  # every layer is placed alike (the planner plans often: place once)
    for index in range(1, shape.layers + 1):
        out += [LocalParam(index, q.rows, q.row_elements, q.axes) for q in one] if index > 1 else one
    return out + [q for p in after for q in place(p, 0)]


def zero_collectives(
    shape: TransformerShape, grid: GridShape, step: StepSettings, zero: ZeroConfig
) -> list[Collective]:
    """The data-axis collectives of ZeRO (engine/memory/zero.py) for one optimizer step of `step.grad_accum`
    micro-batches, per rank, in elements of step.param_bytes.

    Stage 1 (ZeroAdamW): after backward, the gradients are reduce-scattered over data in buckets (each
    parameter's dim 0 padded to a multiple of D, flushed at SYNC_BUCKET_ELEMENTS), and after the update the
    chunks are all-gathered in the same buckets (phase "optimizer").
    Stages 2 and 3 (FSDP2, one unit per decoder layer plus the root), per micro-batch and unit
    (engine.core.comm.fsdp_comms):
    - an all-gather of the padded parameters in forward, again in backward for stage 3's layers; with a
      hierarchy level by level, outermost first; with qwZ each rank's shard travels as int8 blocks
      (BlockFormat.payload_bytes). Stage 3's backward gather comes from the secondary partition over the node
      when the hierarchy has one (hpZ: over the node's levels, padded to a multiple of the node size, in full
      precision);
    - a reduce-scatter of the padded gradients in backward, level by level innermost first (each level passes
      on 1/g of what it received); with qgZ an all-to-all of quantized rows at each level instead.
    """
    b = _Builder(grid)
    D, param_bytes = grid.data, step.param_bytes
    params = local_params(shape, grid, step.vocab_parallel)
    if zero.stage == 0 or D == 1:
        return []
    if zero.stage == 1:
        count = 0
        for index, p in enumerate(params):
            count += D * p.padded_chunk(D)
            if count >= SYNC_BUCKET_ELEMENTS or index == len(params) - 1:
                b.add(("data",), "reduce_scatter", count * param_bytes, "sync", "ZeRO-1 gradient bucket")
                b.add(("data",), "all_gather", count * param_bytes, "optimizer", "ZeRO-1 updated chunks")
                count = 0
        return b.items
    levels = zero_levels(zero, D)
    node_levels = levels[:-1] if zero.stage == 3 and 1 < zero.node_size < D else None
    weights = zero.weight_format if zero.quantize_weights else None
    gradients = zero.gradient_format if zero.quantize_gradients else None

    def gather(payload: int, path: list[tuple[str, int]], phase: str, what: str, calls: int) -> None:
        for name, g in reversed(path):  # outermost level first (engine.core.comm.gather_levels)
            b.add_group(name, g, "all_gather", payload * g, phase, what, calls)
            payload *= g

    for unit_params, units, is_layer in (
        ([p for p in params if p.unit == 0], 1, False),
        ([p for p in params if p.unit == 1], shape.layers, True),
    ):
        if not unit_params:
            continue
        chunk = sum(p.padded_chunk(D) for p in unit_params)  # elements of this rank's shard of the unit
        primary = weights.payload_bytes(chunk) if weights else chunk * param_bytes
        what = "decoder layer" if is_layer else "root (embeddings, final norm, lm_head)"
        calls = units * step.grad_accum
        gather(primary, levels, "forward", f"FSDP gather {what}", calls)
        if zero.stage == 3 and is_layer:
            if node_levels:  # hpZ: the secondary partition over the node, full precision
                secondary = sum(p.padded_chunk(zero.node_size) for p in unit_params) * param_bytes
                gather(secondary, node_levels, "backward", f"FSDP re-gather {what} in node", calls)
            else:
                gather(primary, levels, "backward", f"FSDP re-gather {what}", calls)
        elements = D * chunk  # the reduce-scatter's input, level by level innermost first
        for name, g in levels:
            if gradients:
                sent = g * gradients.payload_bytes(elements // g)
                b.add_group(name, g, "all_to_all", sent, "backward", f"qgZ gradients {what}", calls)
            else:
                b.add_group(
                    name, g, "reduce_scatter", elements * param_bytes, "backward", f"FSDP gradients {what}", calls
                )
            elements //= g
    return b.items


def zero_levels(zero: ZeroConfig, data: int) -> list[tuple[str, int]]:
    """(group name, ranks) of each level of the data axis ZeRO's collectives run over, innermost first, as
    engine.core.grid.Grid.data_levels names them: ("data", D) alone without a hierarchy."""
    sizes = zero.level_sizes(data)
    if len(sizes) == 1:
        return [("data", data)]
    return [(f"data.level{i}", g) for i, g in enumerate(sizes, start=1)]


def sync_collectives(
    params: list[tuple[int, tuple[str, ...]]],
    grid: GridShape,
    grad_bytes: int,
    bucket_elements: int = SYNC_BUCKET_ELEMENTS,
) -> list[Collective]:
    """The all-reduces of engine.training.state.sync_gradients for parameters given as (elements, axes) in order:
    one flat buffer per group, flushed whenever it reaches `bucket_elements`."""
    b = _Builder(grid)
    if grid.world_size == 1:
        return []
    buckets: dict[tuple[str, ...], list[int]] = {}
    for numel, axes in params:
        if grid.size(*axes) > 1:
            buckets.setdefault(tuple(a for a in AXES if a in axes), []).append(numel)
    for axes, sizes in buckets.items():
        count = 0
        for numel in sizes:
            count += numel
            if count >= bucket_elements:
                b.add(axes, "all_reduce", count * grad_bytes, "sync", "gradient bucket")
                count = 0
        if count:
            b.add(axes, "all_reduce", count * grad_bytes, "sync", "gradient bucket")
    return b.items


def clip_collectives(grid: GridShape, zero_stage: int = 0) -> list[Collective]:
    """engine.training.state.clip_grad_norm_: one float64 sum of squares over the tensor-parallel group (and, under
    ZeRO, two over the data axis first: the squares of the data-chunked gradients)."""
    b = _Builder(grid)
    if zero_stage > 0:
        b.add(("data",), "all_reduce", 16, "clip", "squared norms of gradient chunks")
    if grid.size("x", "y", "z") > 1:
        b.add(("x", "y", "z"), "all_reduce", 8, "clip", "squared gradient norm")
    return b.items


def stack_collectives(shape: TransformerShape, grid: GridShape, step: StepSettings) -> list[Collective]:
    """Rows moving into and out of the grid for one micro-batch: the module owning the decoder layers
    (LlamaModel) runs on the U = X*Y*R rows of the x*y group, so on entry it all-gathers the input embeddings
    (R, S, hidden), the caller's (R, S) attention mask and position ids if given, and on exit the gradient
    of its own rows of the final hidden states (embeddings and gradient in the residual stream's dtype,
    step.stream_bytes).

    step.mask_bytes: 0 when no rank passes an attention mask, else 8 (the engine gathers 2-D masks as int64).
    step.position_ids: whether per-row (R, S) position ids are passed (int64). Inputs whose batch dim is 1 on
    every rank broadcast and are not gathered when a rank holds more than one row.
    (The ranks' one small exchange of shapes before the gathers is a control message engine.core.comm does
    not count, and neither does this model.) None in the shared rows layout: the ranks read the group's rows."""
    b = _Builder(grid)
    if group_rows(grid, step.rows_per_rank, step.rows) == step.rows_per_rank:
        return []
    xy = grid.size("x", "y")
    r, s, h, stream_bytes = step.rows_per_rank, step.seq, shape.hidden, step.stream_bytes
    if shape.runs_embeddings:  # in a pipeline: on the first stage; the last one leaves the rows
        b.add(("x", "y"), "all_gather", xy * r * s * h * stream_bytes, "forward", "embeddings rows in")
        if step.mask_bytes:
            b.add(("x", "y"), "all_gather", xy * r * s * step.mask_bytes, "forward", "attention mask rows in")
        if step.position_ids:
            b.add(("x", "y"), "all_gather", xy * r * s * 8, "forward", "position ids rows in")
    if shape.runs_head:
        b.add(("x", "y"), "all_gather", xy * r * s * h * stream_bytes, "backward", "final hidden grad rows")
    return b.items


def vocab_collectives(
    shape: TransformerShape, grid: GridShape, step: StepSettings, *, chunked_loss: bool = True
) -> list[Collective]:
    """Collectives of the vocabulary-parallel embedding and training loss (engine/core/vocab_parallel.py) for one
    micro-batch, over the P = x*y*z ranks the vocabulary is split over (none when vocab_parts is 1: the
    replicated embedding is a local lookup and the chunked loss a local product). N = R S tokens per rank.

    embedding   forward: all-gather the int64 token ids (P N x 8 bytes), reduce-scatter the partial
                embeddings (P N hidden, in the weights' dtype); backward: all-gather their gradient.
    loss        (causal_lm_token_losses, what `goldfish train` runs) forward: all-gather the final hidden
                states (P N hidden, residual-stream dtype) and the int64 targets, then one all-gather of
                two fp32 statistics (log-sum-exp, target logit) per token of the group from every rank
                (P x 2 x P N x 4 bytes); backward: all-gather the per-token loss gradient (P N x 4 bytes)
                and reduce-scatter the partial gradients of the hidden states.
    logits      (chunked_loss False: the loss from model(...).logits, a model that transforms its logits) forward:
                all-gather the hidden states as above and the (P N, V/P) logits of every slice to full
                rows (P N V, product dtype step.act_bytes); backward: all-gather the logits' gradient of the
                rank's rows back to the group and reduce-scatter the hidden states' gradient.
    Shared rows layout: the rows are exchanged over z only (the x*y ranks already hold the same rows: tokens
    = Z N), the partial embeddings are then all-reduced over x+y (N hidden), and the hidden states' gradient is
    all-reduced over x+y as well (N hidden, before the loss's gather); the statistics and the logits are still
    gathered over x*y*z (every vocabulary slice).
    """
    b = _Builder(grid)
    parts = vocab_parts(shape, grid, step.vocab_parallel)
    if parts == 1:
        return []
    axes = ("x", "y", "z")
    row_axes = vocab_row_axes(step.rows)
    own_tokens = step.rows_per_rank * step.seq
    # the tokens of the ranks whose rows differ: the whole x*y*z group, or its z ranks when x*y share rows
    tokens = grid.size(*row_axes) * own_tokens
    h, param_bytes, stream_bytes = shape.hidden, step.param_bytes, step.stream_bytes
    replicas = row_replica_axes(step.rows)
    if shape.runs_embeddings:  # a pipeline's first stage (the whole model without a pipeline)
        b.add(row_axes, "all_gather", tokens * 8, "forward", "embedding token ids")
        b.add(row_axes, "reduce_scatter", tokens * h * param_bytes, "forward", "partial embeddings")
        if replicas:
            b.add(replicas, "all_reduce", own_tokens * h * param_bytes, "forward", "embeddings of the replicas")
        b.add(row_axes, "all_gather", tokens * h * param_bytes, "backward", "embedding output grad")
    if not shape.runs_head:
        return b.items
    if replicas:
        b.add(
            replicas, "all_reduce", own_tokens * h * stream_bytes, "backward", "loss hidden-state grad of the replicas"
        )
    b.add(row_axes, "all_gather", tokens * h * stream_bytes, "forward", "loss hidden states")
    b.add(row_axes, "reduce_scatter", tokens * h * stream_bytes, "backward", "loss hidden-state grad")
    if chunked_loss:
        b.add(row_axes, "all_gather", tokens * 8, "forward", "loss targets")
        b.add(axes, "all_gather", parts * 2 * tokens * 4, "forward", "loss log-sum-exp and target logit")
        b.add(row_axes, "all_gather", tokens * 4, "backward", "per-token loss grad")
    else:
        act = step.act_bytes
        b.add(axes, "all_gather", tokens * shape.vocab * act, "forward", "lm_head logits of every slice")
        b.add(row_axes, "all_gather", tokens * shape.vocab * act, "backward", "logits grad of the group's rows")
    return b.items


def layer_collectives(shape: TransformerShape, grid: GridShape, step: StepSettings) -> list[Collective]:
    """Forward and backward collectives of ONE parallelized decoder layer on one micro-batch: its normal and
    transposed ParallelLinears (and y-split RMSNorms) on the X*Y*R*S tokens of the x*y group. The normal layers read
    the residual stream (step.stream_bytes); the transposed ones read products (step.act_bytes)."""
    b = _Builder(grid)
    if grid.size("x", "y", "z") > 1:
        tokens = step.decoder_tokens(grid)
        for name, k, n, transposed, bias in shape.projections():
            _tp_linear(
                b,
                name,
                k,
                n,
                transposed=transposed,
                bias=bias,
                tokens=tokens,
                param_bytes=step.param_bytes,
                act_bytes=step.act_bytes,
                input_grad=True,
                in_bytes=step.act_bytes if transposed else step.stream_bytes,
            )
        for p in shape.layout()[1]:
            if p.kind == "y_norm":  # its mean square summed over y (fp32), and the gradient of that sum
                b.add(("y",), "all_reduce", tokens * 4, "forward", f"{p.name} mean square over y")
                b.add(("y",), "all_reduce", tokens * 4, "backward", f"{p.name} mean square grad over y")
    return b.items


def llama_step_collectives(
    shape: TransformerShape,
    grid: GridShape,
    step: StepSettings,
    *,
    zero: ZeroConfig | None = None,
    data_rank: int = 0,
) -> list[Collective]:
    """Every collective of one optimizer step: `step.grad_accum` forward/backward passes of `step.rows_per_rank` rows
    of `step.seq` tokens on each rank, then sync_gradients and clip_grad_norm_. Bytes are per rank.

    Element sizes (StepSettings): param_bytes for weights and gradients, act_bytes for what the matrix products
    produce, stream_bytes for the residual stream (hidden states between layers and the q/k/v/gate/up inputs):
    all equal to the model's dtype, except under torch.autocast(bf16) with fp32 weights: 4, 2 and 4.

    step.recompute: activation checkpointing of the decoder layers (engine/memory/activation.py): each layer's forward
    collectives issued once more during backward. Exact, because the engine turns torch's early stop off
    and every layer's recomputation runs to its end (tests/parallel/test_comm_model.py measures it).
    zero: partitioning over the data axis (zero_collectives; sync_gradients then reduces only the chunks of
    the rank at data index `data_rank` over the other axes, whose sizes differ by rank when dim 0 does not
    divide by the data size).
    step.vocab_parallel: the embeddings and lm_head split by vocabulary (vocab_parts; None: engine.parallelize's
    default), with the training loss of engine.core.vocab_parallel.causal_lm_token_losses (vocab_collectives: the
    chunked loss, which runs at every ZeRO stage).
    step.rows: the rows layout ("own" or "shared", see the module doc); step.rows_per_rank counts the rows a rank
    reads.
    """
    return pass_collectives(shape, grid, step) + update_collectives(shape, grid, step, zero=zero, data_rank=data_rank)


def pass_collectives(shape: TransformerShape, grid: GridShape, step: StepSettings) -> list[Collective]:
    """The collectives of the `step.grad_accum` forward and backward passes of a step (llama_step_collectives without
    update_collectives): the decoder layers', the rows' around the decoder and the vocabulary split's."""
    layer = layer_collectives(shape, grid, step)
    if step.recompute:
        layer = layer + [
            replace(c, phase="backward", what=f"{c.what} (recomputed)") for c in layer if c.phase == "forward"
        ]
    stack = stack_collectives(shape, grid, step)
    vocab = vocab_collectives(shape, grid, step, chunked_loss=not shape.logits_loss)
    return scale_count(layer, shape.layers * step.grad_accum) + scale_count(stack + vocab, step.grad_accum)


def update_collectives(
    shape: TransformerShape,
    grid: GridShape,
    step: StepSettings,
    *,
    zero: ZeroConfig | None = None,
    data_rank: int = 0,
) -> list[Collective]:
    """The collectives of a step that depend on how gradients are reduced and parameters kept (llama_step_collectives
    without those of the forward and backward passes themselves): sync_gradients' buckets, ZeRO's (its stage 2 and 3
    gathers and reductions run per micro-batch, phases "forward" and "backward") and clip_grad_norm_'s."""
    out: list[Collective] = []
    # under ZeRO the data axis belongs to the partitioning: each rank sums its own chunk over the other axes
    partitioned = zero is not None and zero.stage > 0
    sync = [
        (p.chunk(grid.data, data_rank), tuple(a for a in p.axes if a != "data")) if partitioned else (p.numel, p.axes)
        for p in local_params(shape, grid, step.vocab_parallel, step.rows)
    ]
    out += sync_collectives(sync, grid, step.param_bytes)
    stage = zero_stage(zero, grid)
    if stage:
        out += zero_collectives(shape, grid, step, zero)
    out += clip_collectives(grid, stage)
    return out


# ----- compute and memory ---------------------------------------------------------------------------------


def model_flops_per_token(shape: TransformerShape, seq: int) -> float:
    """Training FLOPs per token that MFU counts (no recomputation, no redundancy): 6 x matmul weights
    (decoder linears and lm_head) plus 12 x layers x seq x heads x head_dim for attention scores and values
    (forward + backward, no causal discount, the PaLM convention)."""
    matmul = shape.layers * shape.layer_linear_params + shape.vocab * shape.hidden
    return 6.0 * matmul + 12.0 * shape.layers * seq * shape.q_out


def rank_flops_per_step(
    shape: TransformerShape, grid: GridShape, step: StepSettings, *, chunked_loss: bool = True
) -> float:
    """FLOPs one rank executes per step. Linear work divides evenly over the grid (each rank multiplies
    the X*Y*R rows of its group by a 1/(X*Y) block: the work of its own R rows); attention runs on those
    rows for the rank's y-share of heads, i.e. X times its fair share (the engine replicates it over x).
    With `step.recompute` (activation checkpointing) the decoder layers run their forward twice. The lm_head:
    `chunked_loss` (engine.core.vocab_parallel.token_losses, what `goldfish train` runs) drops each chunk's
    logits and recomputes them in backward, 8 x tokens x vocab x hidden; a loss from model(...).logits
    costs 6 x. Split by vocabulary, each rank multiplies the P x R x S tokens of its x*y*z group by V/P
    rows: the same count. Norms and elementwise work are left out. In the shared rows layout (rows_per_rank = the
    U rows of the group) the decoder work is that of U / (X Y) rows per rank, and so is the lm_head's when split by
    vocabulary (Z U S tokens by V/P rows); a whole lm_head runs on all U rows on every rank of x*y."""
    xy, seq = grid.size("x", "y"), step.seq
    tokens = step.decoder_tokens(grid) / xy  # a rank's share of its group's tokens
    layer_linear = 2.0 * tokens * shape.layers * shape.layer_linear_params
    attention = 4.0 * tokens * seq * shape.layers * shape.q_out * grid.size("x")
    shares = bool(row_replica_axes(step.rows))
    split = shares and vocab_parts(shape, grid, step.vocab_parallel) > 1  # (asked only when the rows are shared)
    head_tokens = tokens if not shares or split else step.rows_per_rank * seq
    head = (8.0 if chunked_loss and not shape.logits_loss else 6.0) * head_tokens * shape.vocab * shape.hidden
    head *= shape.runs_head  # a pipeline stage without the lm_head
    passes = 4.0 if step.recompute else 3.0  # forward + backward (2x forward), plus the recomputed forward
    return step.grad_accum * (passes * (layer_linear + attention) + head)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU: parameters with gradients and optimizer state, saved activations, transient buffers."""

    params: float
    activations: float
    transient: float
    detail: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return self.params + self.activations + self.transient


def layer_activation_bytes(shape: TransformerShape, grid: GridShape, *, tokens: int, act_bytes: int) -> float:
    """Bytes one decoder layer keeps for backward on the `tokens` tokens of its x*y group (estimate).

    Counted: each RMSNorm's fp32 copy of its input and its normalised output (T x hidden each); the inputs
    the projections save: the norm output itself when X = 1, else the x-split copies of q/k/v and gate/up
    (T x hidden/X each); q, k, v, the attention output and the o_proj input (T x (3 heads + 2 kv_heads)
    head_dim / Y); gate, SiLU, up and product in the MLP (T x intermediate / Y each). A fused attention
    kernel keeps no S x S scores.
    """
    h, x, y = shape.hidden, grid.size("x"), grid.size("y")
    norms = 2 * (4 + act_bytes) * h
    normal = sum(1 for p in shape.projections() if not p[3])  # q, k, v (gate), up: each saves an x-split input
    inputs = act_bytes * (2 * h if x == 1 else normal * h / x)
    attention = act_bytes * (3 * shape.heads + 2 * shape.kv_heads) * shape.head_dim / y
    mlp = act_bytes * (4 if shape.gated_mlp else 2) * shape.intermediate / y  # (gate, SiLU,) up, product / fc, GELU
    return tokens * (norms + inputs + attention + mlp)


def zero_held_bytes(
    shape: TransformerShape,
    grid: GridShape,
    zero: ZeroConfig | None = None,
    *,
    data_rank: int = 0,
    param_bytes: int = 4,
    state_bytes: int = 8,
    vocab_parallel: bool | None = None,
) -> dict[str, int]:
    """Bytes the rank at data index `data_rank` holds between steps (after a step, gradients still allocated):
    parameters, gradients and optimizer state (`state_bytes` per element: AdamW's two fp32 moments = 8),
    exactly as engine.memory.zero.held_bytes counts them on a parallelized model.

    stage 0: all full; 1: optimizer state of this rank's dim-0 chunks (the gradient buffer stays full);
    2 and 3: parameters, gradients and state all chunks (FSDP reshards after backward). Offload moves the
    chunks to host memory but they are still held by the rank (see memory_per_rank for the device's share).
    """
    params = local_params(shape, grid, vocab_parallel)
    full = sum(p.numel for p in params)
    stage = zero_stage(zero, grid)
    chunks = sum(p.chunk(grid.data, data_rank) for p in params) if stage else full
    return {
        "params": (chunks if stage >= 2 else full) * param_bytes,
        "grads": (chunks if stage >= 2 else full) * param_bytes,
        "optimizer": chunks * state_bytes,
    }


def memory_per_rank(
    shape: TransformerShape,
    grid: GridShape,
    step: StepSettings,
    *,
    zero: ZeroConfig | None = None,
    in_flight: float = 1.0,
    whole_gradients: bool = False,
) -> MemoryEstimate:
    """Estimated peak memory of one rank for one micro-batch of `step.rows_per_rank` rows (or, in a pipeline,
    `in_flight` micro-batches whose activations a stage holds at once: pipeline_in_flight); step.grad_accum does not
    change it.

    Parameters: each ParallelLinear weight shard is 1/(X Y Z) of the full weight (layer_shard_params);
    norms are replicated; embeddings and lm_head are split by vocabulary over the P = vocab_parts ranks
    of x*y*z (V/P rows each, detail "vocab_params"), or whole on every rank when P = 1 (then counted in
    "replicated_params"). step.bytes_per_param covers weight, gradient and AdamW state (16 = fp32 weight and
    grad + m, v, what `goldfish train` keeps under either precision).
    Activations: what the forward keeps for backward (detail "kept"): layer_activation_bytes for every layer on
    the T = X Y R S tokens of the x*y group, or with `step.recompute` (activation checkpointing) each layer's input
    (T x hidden); the gathered embeddings and the final norm on T tokens; the final hidden states of the P R S
    tokens of the x*y*z group that the chunked loss (token_losses) gathers and saves (residual-stream dtype,
    step.stream_bytes). On top of it, the larger of two working sets that never coexist: the loss's
    chunk of min(1024, P R S) tokens' logits over V/P columns (detail "loss_chunk": fp32 statistics and gradient
    updated in place, plus the product-dtype copy when act_bytes is not 4) at the start of backward, and with
    `recompute` one decoder layer recomputed; a model whose loss takes its logits (shape.logits_loss) instead keeps
    its R S tokens' whole logits in the product dtype, their fp32 copy and its gradient. Transient: the larger of the
    loss's lm_head-gradient buffer (detail "head_grad": V/P x hidden in fp32, plus the product-dtype and fp32
    per-chunk products when they differ; added to the gradient after the loss's backward) and the largest gathered
    weight block with its gradient block and two T x hidden gradient buffers of a decoder layer. The chunked loss runs
    at every ZeRO stage (inside the FSDP root's forward). bench/memory.py --table options measures kept and the peak
    from the CPU allocator.

    zero (engine/memory/zero.py; D = data size, P = the parameters above, w = param_bytes, o = bytes_per_param - 2 w
    for the optimizer state and master weights): stage 1 keeps P (2 w) + P o / D; stage 2 the full
    parameters during forward and backward, P w, plus chunks P (w + o) / D; stage 3 chunks P (2 w + o) / D
    plus two decoder layers (or the root) gathered and one layer's full gradient, and with a hierarchy of
    node size L the secondary partition of every layer, P_layers w / L. Offload moves the chunks of
    parameters, gradients and state to host memory (detail "host").

    Shared rows layout (rows_per_rank = the group's U rows, T = U S): the same layer activations on T tokens; the
    loss on the Z U S tokens of the z ranks when split by vocabulary, else whole logits of all U rows on every rank.

    whole_gradients (ZeRO stage 2 in a pipeline): torch's PipelineStage turns FSDP's gradient reduction off until the
    step's last micro-batch, so the whole gradients P w are held through the step beside the whole parameters.
    """
    # the settings under the names of the formulas below
    rows_per_rank, seq, rows, recompute = step.rows_per_rank, step.seq, step.rows, step.recompute
    param_bytes, act_bytes, stream_bytes = step.param_bytes, step.act_bytes, step.stream_bytes
    bytes_per_param = step.bytes_per_param
    parts = vocab_parts(shape, grid, step.vocab_parallel)
    sharded = shape.layers * layer_shard_params(shape, grid)
    vocab = shape.vocab_params // parts if parts > 1 else 0
    replicated = shape.root_params + shape.layers * shape.layer_norm_params + (shape.vocab_params if parts == 1 else 0)
    root = shape.vocab_params // parts + shape.root_params  # embeddings, final norm, lm_head as this rank holds them
    params = (sharded + replicated + vocab) * bytes_per_param
    stage = zero_stage(zero, grid)
    host = 0.0
    if stage:
        D, P = grid.data, sharded + replicated + vocab
        w, o = param_bytes, max(bytes_per_param - 2 * param_bytes, 0.0)
        layer = layer_shard_params(shape, grid) + shape.layer_norm_params
        if stage == 1:
            params = P * 2 * w + P * o / D
        else:
            chunks = P * (2 * w + o) / D
            if stage == 2:
                device = P * w + layer * w  # whole parameters through forward and backward, one layer's gradient
                if whole_gradients:
                    device = 2 * P * w
            else:
                device = 2 * max(layer, root) * w + layer * w
                if 1 < zero.node_size < D:  # hpZ's secondary partition, kept from forward to backward
                    device += shape.layers * layer * w / zero.node_size
            if zero.offload:
                host = chunks
                params = device
            else:
                params = device + chunks
    t = step.decoder_tokens(grid)
    h = shape.hidden
    per_layer = layer_activation_bytes(shape, grid, tokens=t, act_bytes=act_bytes)
    layers = shape.layers * t * h * act_bytes if recompute else shape.layers * per_layer
    # tokens the loss gathers: those of the ranks of x*y*z whose rows differ
    group_tokens = min(parts, grid.size(*vocab_row_axes(rows))) * rows_per_rank * seq
    # the gathered embeddings (first stage) and the final norm's input and output (last stage)
    stack = t * h * (act_bytes * shape.runs_embeddings + (act_bytes + 4) * shape.runs_head)
    kept = (layers + stack + group_tokens * h * stream_bytes * shape.runs_head) * in_flight
    stats = max(act_bytes, 4)  # the loss's statistics and logits gradient: fp32, or the product dtype if wider
    loss_chunk = min(1024, group_tokens) * (shape.vocab // parts) * (stats + (act_bytes if act_bytes < stats else 0))
    if shape.logits_loss:  # model(...).logits and F.cross_entropy on the rank's rows: whole logits, no chunks
        loss_chunk = rows_per_rank * seq * shape.vocab * (act_bytes + 8)
    loss_chunk *= shape.runs_head
    activations = kept + max(loss_chunk, per_layer if recompute else 0)
    grad = max(param_bytes, 4)  # the lm_head gradient the loss accumulates: fp32, or the weights' dtype if wider
    head_grad = (shape.vocab // parts) * h * (grad + (act_bytes + grad if act_bytes != grad else 0)) * shape.runs_head
    blocks = []
    for _, k, n, transposed, _ in shape.projections():
        in_axis, out_axis = linear_axes(transposed)
        blocks.append((n // grid.size(out_axis)) * (k // grid.size(in_axis)))
    transient = max(head_grad, 2 * max(blocks) * param_bytes + 2 * t * h * act_bytes)
    return MemoryEstimate(
        params,
        activations,
        transient,
        {
            "sharded_params": sharded,
            "replicated_params": replicated,
            "vocab_params": vocab,
            "vocab_parts": parts,
            "layer_activations": per_layer,
            "kept": kept,
            "loss_chunk": loss_chunk,
            "head_grad": head_grad,
            "host": host,
        },
    )


def rank_memory_traffic_per_step(shape: TransformerShape, grid: GridShape, step: StepSettings) -> float:
    """Bytes one rank moves through device memory per step in memory-bound (non-matmul) work: norms,
    rotary, softmax, SiLU, residual adds, the loss, and the optimizer.

    Estimate: every activation byte a layer keeps for backward (layer_activation_bytes, on the X*Y*R*S
    tokens of the x*y group, so replicated work over x and y costs X*Y times) is written and read once in
    forward and its gradient written and read, and the value read again, in backward: 5 passes (7 with
    recomputation); the logits likewise. AdamW reads weight, gradient and both moments and writes three
    of them: 7/4 x step.bytes_per_param per parameter this rank holds (embeddings and lm_head split by
    vocabulary when vocab_parts > 1; the logits' bytes are the same either way: P R S tokens x V/P). Shared rows
    layout: the group's U rows on every rank of x*y (logits U S V, or U S V / (X Y) split by vocabulary).
    """
    act_bytes = step.act_bytes
    per_layer = layer_activation_bytes(shape, grid, tokens=step.decoder_tokens(grid), act_bytes=act_bytes)
    parts = vocab_parts(shape, grid, step.vocab_parallel)
    logit_rows = step.rows_per_rank / (grid.size(*row_replica_axes(step.rows)) if parts > 1 else 1)
    logits = logit_rows * step.seq * shape.vocab * (act_bytes + 8) * shape.runs_head
    passes = 7 if step.recompute else 5
    activations = step.grad_accum * passes * (shape.layers * per_layer + logits)
    held = (
        shape.layers * (layer_shard_params(shape, grid) + shape.layer_norm_params)
        + shape.root_params
        + shape.vocab_params // parts
    )
    return activations + 1.75 * step.bytes_per_param * held


def ordered_grids(world: int) -> list[GridShape]:
    """Every ordered factorisation world = data * x * y * z, as GridShapes (data slowest in the order)."""
    if world < 1:
        raise ValueError(f"world size must be >= 1, got {world}")
    divisors = [d for d in range(1, world + 1) if world % d == 0]
    out = []
    for d in divisors:
        for x in divisors:
            if (world // d) % x:
                continue
            for yv in divisors:
                rest = world // (d * x)
                if rest % yv:
                    continue
                out.append(GridShape(data=d, x=x, y=yv, z=rest // yv))
    return out


def count_grids(world: int) -> int:
    """Number of ordered 4-factor grids of `world` (product over prime powers p^e of C(e+3, 3))."""
    n, out, p = world, 1, 2
    while p * p <= n:
        e = 0
        while n % p == 0:
            n //= p
            e += 1
        out *= math.comb(e + 3, 3)
        p += 1
    if n > 1:
        out *= 4
    return out


# ----- pipeline -------------------------------------------------------------------------------------------------------
#
# A grid with pipe = P cuts the decoder layers into S = P V contiguous stages (V stages per rank for the interleaved
# schedules, stage s on pipe rank s mod P), as engine/training/pipeline.py does: the input embeddings on the first
# stage, the final norm, lm_head and the loss on the last. Each stage is a data x X x Y x Z grid of its own (the pipe
# axis is the slowest in rank order), so every function above applies to one pipe rank with the stage grid
# (pipe = 1) and the shape of that rank's layers (pipe_rank_shape).

INTERLEAVED = tuple(name for name, several in PIPE_SCHEDULES.items() if several)  # several stages per rank


def pipeline_check(schedule: str, pipe: int, microbatches: int, virtual: int = 1) -> str | None:
    """None when `schedule` runs `microbatches` micro-batches on `pipe` ranks with `virtual` stages each, else the
    reason, as the engine's PipeConfig refuses it (so the planner proposes nothing the engine refuses): V > 1 on a
    one-stage-per-rank schedule, 1F1B with M < P, an M the interleaved rounds do not divide."""
    if pipe < 2:
        return f"a pipeline needs at least 2 stages, not {pipe}"
    try:
        PipeConfig(schedule=schedule, virtual=virtual).check_microbatches(pipe, microbatches)
    except ValueError as error:
        return str(error)
    return None


def pipeline_bubble(schedule: str, pipe: int, microbatches: int, virtual: int = 1) -> float:
    """The idle share of each rank's step for stages of equal cost, a backward costing twice the forward and free
    messages: (P-1)/(M+P-1) for GPipe and 1F1B; (P-1)/(V M+P-1) for interleaved 1F1B (each of a rank's V stages is
    1/V as long, so the fill and drain shrink V times); (P-1)/(3 V M+P-1) for zero bubble (torch's
    ScheduleInterleavedZeroBubble, ZB-H1 of Qi et al. 2024: the weight-gradient third of each backward fills the
    cool-down). bench/pipeline.py measures them beside these forms (docs/pipeline.md)."""
    reason = pipeline_check(schedule, pipe, microbatches, virtual) if pipe > 1 else None
    if reason:
        raise ValueError(reason)
    per_rank = {"gpipe": 1, "1f1b": 1, "interleaved-1f1b": virtual, "zero-bubble": 3 * virtual}[schedule]
    return (pipe - 1) / (per_rank * microbatches + pipe - 1)


def pipeline_in_flight(schedule: str, pipe: int, microbatches: int, virtual: int = 1, rank: int = 0) -> float:
    """Micro-batches whose activations pipe rank `rank` holds at its peak, counted in whole micro-batches of all its
    layers (a chunk of one of its V stages counts 1/V), from the order torch's schedules run the actions in:

    GPipe: every forward before any backward, M. 1F1B: P - r warm-up forwards, then one forward per backward:
    min(M, P - r). Interleaved 1F1B: w = (V-1) m_r + 2 (P-1-r) warm-up chunks (m_r = the micro-batches of a round,
    M / max(1, M // P)), then one forward before each backward: min(w + 1, V M) chunks. Zero bubble: w = (V-1) m_r +
    (P-1-r) and each chunk stays until its deferred weight gradient, which trails the backwards by r actions:
    min(w + r + 1, V M) chunks. Rank 0 holds the most."""
    p, m, v = pipe, microbatches, virtual
    if schedule == "gpipe":
        return float(m)
    if schedule == "1f1b":
        return float(min(m, p - rank))
    per_round = m // max(1, m // p)
    if schedule == "interleaved-1f1b":
        chunks = min((v - 1) * per_round + 2 * (p - 1 - rank), v * m) + 1
    elif schedule == "zero-bubble":
        chunks = min((v - 1) * per_round + (p - 1 - rank), v * m) + rank + 1
    else:
        raise ValueError(f"unknown pipeline schedule {schedule!r}; choose one of {', '.join(PIPE_SCHEDULES)}")
    return min(chunks, v * m) / v


def stage_layer_counts(layers: int, stages: int) -> list[int]:
    """Decoder layers of each of `stages` stages, cut as engine.training.pipeline.balanced_splits cuts layers of equal
    parameter counts (a stage's layers are contiguous; every stage gets at least one)."""
    if not 1 <= stages <= layers:
        raise ValueError(f"{stages} stages for {layers} decoder layers: choose at most one stage per layer")
    splits: list[int] = []
    for index in range(layers):
        stage = len(splits) + 1
        if stage == stages:
            break
        # cut before `index` when its middle lies past the stage's share, or when later stages need the rest
        past_share = index + 0.5 > layers * stage / stages
        if index > (splits[-1] if splits else 0) and (past_share or layers - index == stages - stage):
            splits.append(index)
    bounds = [0, *splits, layers]
    return [b - a for a, b in zip(bounds, bounds[1:])]


def stage_shape(shape: TransformerShape, layers: int, *, first: bool, last: bool) -> TransformerShape:
    """The part of `shape` one pipeline rank holds: `layers` decoder layers, with the input embeddings (and what else
    precedes the layers) when `first`, and the final norm, lm_head and the loss when `last`."""
    before, layer, after = shape.layout()
    return replace(
        shape,
        layers=layers,
        layer_layout=layer,
        before_layers=before if first else (),
        after_layers=after if last else (),
        runs_embeddings=first,
        runs_head=last,
    )


def pipe_rank_shape(shape: TransformerShape, pipe: int, virtual: int, rank: int) -> TransformerShape:
    """What pipe rank `rank` of `pipe` runs when the layers are cut into pipe * virtual stages (stage s on rank
    s mod P): the layers of its V stages, the embeddings on rank 0 (stage 0), the head on rank P-1 (stage S-1)."""
    counts = stage_layer_counts(shape.layers, pipe * virtual)
    layers = sum(counts[rank + pipe * i] for i in range(virtual))
    return stage_shape(shape, layers, first=rank == 0, last=rank == pipe - 1)


def pipeline_message_bytes(shape: TransformerShape, grid: GridShape, step: StepSettings) -> int:
    """Bytes of one message between pipeline stages: what a rank holds between two decoder layers for one
    micro-batch, the hidden states of its x*y group's rows, group_rows(grid, step.rows_per_rank, step.rows) x seq x
    hidden in the residual stream's dtype (step.stream_bytes: 4 under --precision bf16, whose autocast keeps the
    stream in fp32). In the own rows layout that is X*Y times the rank's own rows (the decoder runs on the rows of
    the whole x*y group, replicated over x and y); in the shared layout the rows the rank reads. Without tensor
    parallelism: (B/M, T, H), the figure bench/pipeline.py checks."""
    return step.decoder_tokens(grid) * shape.hidden * step.stream_bytes


def pipeline_p2p_bytes(
    shape: TransformerShape, grid: GridShape, step: StepSettings, *, rank: int, virtual: int = 1
) -> int:
    """Bytes pipe rank `rank` of `grid` sends to other stages per step: for each of the M = step.grad_accum
    micro-batches, the hidden states forward from each of its stages but the last, and their gradient back from each
    but the first.

    Each rank sends to the rank of the same data, x, y and z indices in the next (previous) stage one message of
    pipeline_message_bytes per micro-batch and crossing."""
    stages = [rank + grid.pipe * i for i in range(virtual)]
    last = grid.pipe * virtual - 1
    crossings = sum(s != last for s in stages) + sum(s != 0 for s in stages)
    return crossings * step.grad_accum * pipeline_message_bytes(shape, grid, step)
