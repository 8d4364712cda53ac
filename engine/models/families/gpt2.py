"""GPT-2 (transformers' GPT2Model): no declared tensor-parallel plan, Conv1D projections, a fused [q | k | v] c_attn,
learned positions; confirmed by tests/parallel/test_model_plans.py and tests/parallel/test_pipeline.py."""

from __future__ import annotations

from typing import Any

from engine.models.family import FamilyAdapter, StageRecipe


def _refusal(config: Any) -> str | None:
    if getattr(config, "add_cross_attention", False):
        return "GPT-2 with cross-attention: the engine's GPT-2 plan does not cover it"
    return None


ADAPTER = FamilyAdapter(
    model_type="gpt2",
    tp_plan={
        "h.*.attn.c_attn": "colwise",
        "h.*.attn.c_proj": "rowwise",
        "h.*.mlp.c_fc": "colwise",
        "h.*.mlp.c_proj": "rowwise",
    },
    fused={"c_attn": "blocks"},
    stages=StageRecipe(embed="wte", norm="ln_f", table="wpe", dropout="drop"),
    tensor_parallel_refusal=_refusal,
)
