"""Llama (transformers' LlamaModel): its declared plan needs nothing more; the pipeline's stages are confirmed
(tests/parallel/test_pipeline.py)."""

from __future__ import annotations

from engine.models.family import FamilyAdapter, StageRecipe

ADAPTER = FamilyAdapter(model_type="llama", stages=StageRecipe(embed="embed_tokens", norm="norm", rotary="rotary_emb"))
