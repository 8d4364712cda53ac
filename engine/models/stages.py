"""The pipeline's confirmed stage set-ups (each family adapter's `stages`, engine/models/families/) and the checks a
model or a config passes before engine/training/pipeline.py cuts it: launchers and the planner ask them without
building a pipeline."""

from __future__ import annotations

from typing import Any, Sequence

from torch import nn

from engine.models.adapter import find_planned
from engine.models.families import known_families
from engine.models.family import StageRecipe, family_adapter


def pipeline_families() -> tuple[str, ...]:
    """The families whose stage set-up is confirmed: those whose adapter has `stages` (engine/models/families/)."""
    return tuple(f.model_type for f in known_families() if f.stages is not None)


def stage_recipe(family: str) -> StageRecipe:
    """The confirmed stage set-up of `family`; ValueError (one line) naming the confirmed ones otherwise."""
    adapter = family_adapter(family, known_families())
    if adapter is None or adapter.stages is None:
        confirmed = ", ".join(pipeline_families())
        raise ValueError(f"{family}: the pipeline's stage set-up is confirmed for {confirmed} only")
    return adapter.stages


def check_pipeline_config(config: Any, n_stages: int, splits: Sequence[int] = ()) -> None:
    """ValueError (one line) for a transformers config whose model a pipeline of `n_stages` stages cut at `splits`
    (the first layer of stages 1..S-1; empty: balanced) cannot run: a family whose stages are not confirmed,
    sliding-window or cross-attention layers, input embeddings tied to lm_head, more stages than decoder layers, or
    splits outside them. Needs only the config: launchers call it before any process starts."""
    family = getattr(config, "model_type", type(config).__name__)
    stage_recipe(family)
    if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        raise ValueError(f"{family} with sliding-window layers: not confirmed for pipelines; use full attention")
    if getattr(config, "add_cross_attention", False):
        raise ValueError(f"{family} with cross-attention: not confirmed for the pipeline")
    if getattr(config, "tie_word_embeddings", False):
        raise ValueError(
            f"{family} ties its input embeddings to lm_head, which sit on the first and the last stage: a pipeline "
            "needs a model with tie_word_embeddings false (untie them in its config and weights)"
        )
    n_layers = config.num_hidden_layers
    if n_stages > n_layers:
        raise ValueError(
            f"{n_stages} pipeline stages for {n_layers} decoder layers: choose at most {n_layers} stages (pipe x "
            "--pipe-virtual)"
        )
    bounds = [0, *splits, n_layers]
    if splits and (len(splits) != n_stages - 1 or any(a >= b for a, b in zip(bounds, bounds[1:]))):
        raise ValueError(
            f"--pipe-split {','.join(map(str, splits))}: give {n_stages - 1} increasing decoder-layer indices in "
            f"1..{n_layers - 1}"
        )


def check_model(model: nn.Module) -> int:
    """The number of decoder layers of a causal LM whose pipeline set-up is confirmed; ValueError otherwise."""
    found = find_planned(model)
    if len(found) != 1:
        raise ValueError(f"{type(model).__name__}: the pipeline needs one base model with known decoder layers")
    _, base, plan = found[0]
    check_pipeline_config(base.config, 1)
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear):
        raise ValueError(f"{type(model).__name__}: the pipeline needs an lm_head Linear behind the base model")
    if head.weight is getattr(base, stage_recipe(plan.family).embed).weight:
        raise ValueError("input embeddings tied to lm_head sit on different stages; untie them (tie_word_embeddings)")
    return len(getattr(base, plan.layers))
