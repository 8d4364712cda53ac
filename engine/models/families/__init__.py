"""The model families the engine knows beyond their declared plans, one module each (see engine/models/family.py)."""

from __future__ import annotations

from engine.models.families import glm, glm4, gpt2, gpt_neox, llama, phi3, phi4_multimodal, qwen2
from engine.models.family import FamilyAdapter


def known_families() -> tuple[FamilyAdapter, ...]:
    """Every family adapter the engine ships, the pipeline's confirmed ones first (the order messages name them)."""
    return tuple(m.ADAPTER for m in (llama, qwen2, gpt2, gpt_neox, phi3, phi4_multimodal, glm, glm4))
