"""The planner's shape of `goldfish plan --model`: a named size (NAMED_SHAPES) or a transformers config.

A config (a folder holding config.json, a config.json file, or a cached hub name) is read here and handed to
engine.planner_shape, which builds its causal LM on the meta device and reads it as engine.parallelize shards it
(engine/models/shape.py); the engine's refusals come with it. Named sizes need no torch.
"""

from __future__ import annotations

from pathlib import Path

import engine
from engine import NAMED_SHAPES, TransformerShape


def resolve_shape(model: str) -> TransformerShape:
    """A named size (NAMED_SHAPES) or the shape of a transformers config: a folder holding config.json, a
    config.json file, or a hub name (read offline when cached). ValueError (one line) when it cannot be read or
    the engine cannot shard it."""
    if model.upper() in NAMED_SHAPES:
        return NAMED_SHAPES[model.upper()]
    from goldfish.app.model_config_check import check_config_file

    check_config_file(model)  # sizes no model has: one line before transformers builds anything
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model, trust_remote_code=False)
    except (OSError, ValueError) as error:
        first = " ".join(str(error).split())[:200]
        raise ValueError(
            f"cannot read a model config from {model!r} ({first}); give a named size "
            f"({', '.join(NAMED_SHAPES)}) or a folder holding config.json"
        ) from error
    return engine.planner_shape(config, name=Path(model).name or model)
