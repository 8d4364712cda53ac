"""GLM (transformers' GlmModel): gate_up_proj fused as [gate | up], confirmed by tests/parallel/test_every_family.py."""

from __future__ import annotations

from engine.models.family import FamilyAdapter

ADAPTER = FamilyAdapter(model_type="glm", fused={"gate_up_proj": "halves"})
