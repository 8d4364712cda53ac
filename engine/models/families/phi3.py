"""Phi-3 (transformers' Phi3Model): fused qkv_proj ([q | k | v]) and gate_up_proj ([gate | up]), read off its modeling
code and confirmed by tests/parallel/test_every_family.py."""

from __future__ import annotations

from engine.models.family import FamilyAdapter

ADAPTER = FamilyAdapter(model_type="phi3", fused={"qkv_proj": "blocks", "gate_up_proj": "halves"})
