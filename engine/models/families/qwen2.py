"""Qwen2 (transformers' Qwen2Model): its declared plan needs nothing more; the pipeline's stages are confirmed with
full attention (tests/parallel/test_pipeline.py)."""

from __future__ import annotations

from engine.models.family import FamilyAdapter, StageRecipe

ADAPTER = FamilyAdapter(model_type="qwen2", stages=StageRecipe(embed="embed_tokens", norm="norm", rotary="rotary_emb"))
