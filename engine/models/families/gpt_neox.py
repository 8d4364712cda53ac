"""GPT-NeoX (transformers' GPTNeoXModel): query_key_value fused head after head ([q_h k_h v_h]: every contiguous slice
of whole heads is a y rank's), confirmed by tests/parallel/test_every_family.py."""

from __future__ import annotations

from engine.models.family import FamilyAdapter

ADAPTER = FamilyAdapter(model_type="gpt_neox", fused={"query_key_value": "per_head"})
