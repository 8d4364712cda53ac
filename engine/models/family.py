"""What the engine knows of one model family beyond the tensor-parallel plan its config declares: a FamilyAdapter.

Each supported family keeps its adapter in a module of its own under engine/models/families/ (gpt2.py, llama.py, ...),
and `engine.models.families.known_families()` returns them; nothing registers itself. A family is looked up by its
`config.model_type`; callers that add one (a test's toy family, a family being confirmed) pass a tuple of adapters
to parallelize(families=...) instead of changing a table.

What an adapter holds (every field optional, each read off the family's modeling code and confirmed by a test):

    tp_plan          the tensor-parallel plan, when the config declares none (GPT-2): module patterns relative to the
                     base model -> transformers' styles ("colwise", "rowwise")
    fused            how a fused projection orders its output features, by attribute name: "blocks" = [q | k | v]
                     (GPT-2 c_attn, Phi-3 qkv_proj), "per_head" = [q_h k_h v_h] head after head (GPT-NeoX),
                     "halves" = [gate | up]. The same name means another order in other families (CodeGen's qkv_proj
                     interleaves groups of [q | v | k]), so a fused projection without an entry is refused on y > 1
    stages           where the pipeline finds the pieces around the decoder layers (engine/training/pipeline.py);
                     None: the family is not confirmed for pipelines
    tensor_parallel_refusal
                     a config check: the reason (one line) a config of the family cannot be sharded over x, y and z
                     (GPT-2 with cross-attention), or None

The rest of what the engine and the planner know of a family is derived, not tabled: head counts from the config
(adapter.head_counts), the miniature from the config's own sizes (miniature.py), the planner's shape by building the
model on the meta device and reading it as parallelize would shard it (engine.models.shape.planner_shape).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

FusedOrder = Literal["blocks", "per_head", "halves"]
FUSED_ORDERS: tuple[FusedOrder, ...] = ("blocks", "per_head", "halves")


@dataclass(frozen=True)
class StageRecipe:
    """Where a family keeps the pieces around its decoder layers (attribute names on the base model) and how positions
    enter: a learned `table` added to the embeddings on the first stage, or a `rotary` module read by every layer."""

    embed: str
    norm: str
    table: str | None = None
    dropout: str | None = None
    rotary: str | None = None


@dataclass(frozen=True)
class FamilyAdapter:
    """One model family (config.model_type) as the engine knows it; see the module doc for each field."""

    model_type: str
    tp_plan: Mapping[str, str] = field(default_factory=dict)
    fused: Mapping[str, FusedOrder] = field(default_factory=dict)
    stages: StageRecipe | None = None
    tensor_parallel_refusal: Callable[[Any], str | None] | None = None

    def __post_init__(self) -> None:
        bad = {attr: order for attr, order in self.fused.items() if order not in FUSED_ORDERS}
        if bad:
            raise ValueError(f"{self.model_type}: fused orders {bad} are not among {FUSED_ORDERS}")

    def refusal(self, config: Any) -> str | None:
        """Why a config of this family cannot be sharded over x, y and z, or None."""
        return None if self.tensor_parallel_refusal is None else self.tensor_parallel_refusal(config)


def family_adapter(model_type: str, families: tuple[FamilyAdapter, ...]) -> FamilyAdapter | None:
    """The adapter of `model_type` among `families` (the last one wins, so a caller may replace a known family), or
    None for a family the engine knows only through its declared plan."""
    return next((f for f in reversed(families) if f.model_type == model_type), None)
