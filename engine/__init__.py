"""4D hybrid-parallel engine (data x X x Y x Z tensor parallelism) on torch.distributed.

    grid = engine.init(data=D, x=X, y=Y, z=Z)      # starts torch.distributed if needed
    model = engine.auto_parallelize(grid, lambda: AutoModelForCausalLM.from_config(cfg))  # built on meta, sharded
    model = engine.parallelize(model, grid)         # or shard an already built model in place
    engine.shard_data_axis(model, grid, engine.ZeroConfig(stage=3))  # ZeRO over the data axis (optional)
    loss_sum.backward()                             # each rank on its own rows
    engine.sync_gradients(model, grid)              # gradients of the SUM of all ranks' losses
    engine.clip_grad_norm_(model, max_norm, grid)
    state = engine.full_state_dict(model, grid)     # serial keys, full tensors
    engine.load_full_state_dict(model, state, grid)

The names load on first use (PEP 562), so `import engine` costs nothing and the planner (engine.planner) and the
plain-Python run description (engine.spec) import without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> the module that defines it
_PUBLIC = {
    "AsyncSaver": "engine.training.checkpoint",
    "CheckpointError": "engine.training.checkpoint",
    "consolidate_checkpoint": "engine.training.checkpoint",
    "load_checkpoint": "engine.training.checkpoint",
    "save_checkpoint": "engine.training.checkpoint",
    "Grid": "engine.core.grid",
    "init": "engine.core.grid",
    "is_main_process": "engine.core.grid",
    "barrier": "engine.core.comm",
    "broadcast_object": "engine.core.comm",
    # the plain-Python run description (no torch): grid shapes, axes, precisions, schedules, quantization
    "AXES": "engine.spec",
    "GRID_AXES": "engine.spec",
    "GridError": "engine.spec",
    "GridShape": "engine.spec",
    "PipeConfig": "engine.spec",
    "ZeroConfig": "engine.spec",
    "ZeroError": "engine.spec",
    "DEFAULT_QUANT_BLOCK": "engine.spec",
    "PIPE_SCHEDULES": "engine.spec",
    "PLAN_PRECISION": "engine.spec",
    "PRECISIONS": "engine.spec",
    "QUANT_BITS": "engine.spec",
    "RowsLayout": "engine.spec",
    "STAGES": "engine.spec",
    "data_ranks_per_node": "engine.spec",
    "parse_grid_sizes": "engine.spec",
    "parse_quantize": "engine.spec",
    "is_vocab_parallel": "engine.core.vocab_parallel",
    "ShardedRunError": "engine.core.sharding",
    "ParallelLinear": "engine.core.linear",
    "ShardingError": "engine.core.linear",
    "local_shard": "engine.core.placement",
    "auto_parallelize": "engine.models.auto",
    "plan_of": "engine.models.layout",
    "ParallelPlan": "engine.models.layout",
    "FamilyAdapter": "engine.models.family",
    "known_families": "engine.models.families",
    "planner_shape": "engine.models.shape",
    "model_planner_shape": "engine.models.shape",
    "parallelize": "engine.training.verify",
    "verify_sharding": "engine.training.verify",
    "GridGradScaler": "engine.training.scaler",
    "clip_grad_norm_": "engine.training.state",
    "full_state_dict": "engine.training.state",
    "load_full_state_dict": "engine.training.state",
    "sync_gradients": "engine.training.state",
    "shard_data_axis": "engine.memory.zero",
    "check_model_folder": "engine.training.checkpoint",
    "can_load_sharded": "engine.training.loading",
    "load_sharded": "engine.training.loading",
    "check_pipeline_config": "engine.models.stages",
    # the training loop
    "TrainConfig": "engine.training.config",
    "OPTIMIZERS": "engine.training.config",
    "LR_SCHEDULES": "engine.training.config",
    "train": "engine.training.train",
    "LossFn": "engine.training.train",
    "TokenLossFn": "engine.training.train",
    "StepLoss": "engine.training.train",
    "TrainingStopped": "engine.training.train",
    "METRICS_FILE": "engine.training.train",
    "check_resume": "engine.training.train",
    "evaluate_loss": "engine.training.train",
    "epoch_order": "engine.training.train",
    "rows_consumed": "engine.training.train",
    "steps_per_epoch": "engine.training.train",
    "total_steps_of": "engine.training.train",
    # the planner (plain Python but measure_profile, which times this machine's collectives)
    "NAMED_SHAPES": "engine.planner.cost_model",
    "TransformerShape": "engine.planner.cost_model",
    "CHECKPOINTING": "engine.planner.plan",
    "DEFAULT_PIPE_SCHEDULES": "engine.planner.plan",
    "HIERARCHIES": "engine.planner.plan",
    "GridPlan": "engine.planner.plan",
    "PlanRequest": "engine.planner.plan",
    "format_table": "engine.planner.plan",
    "launch_nodes": "engine.planner.plan",
    "rank_grids": "engine.planner.plan",
    "train_command": "engine.planner.plan",
    "PROFILES": "engine.planner.profiles",
    "load_profile": "engine.planner.profiles",
    "measure_profile": "engine.planner.measure",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
