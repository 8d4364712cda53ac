"""Phi-4 multimodal's language model: Phi-3's fused qkv_proj ([q | k | v]) and gate_up_proj ([gate | up]), confirmed by
tests/parallel/test_every_family.py."""

from __future__ import annotations

from engine.models.family import FamilyAdapter

ADAPTER = FamilyAdapter(model_type="phi4_multimodal", fused={"qkv_proj": "blocks", "gate_up_proj": "halves"})
