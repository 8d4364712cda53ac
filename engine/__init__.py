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
    "GridError": "engine.spec",
    "GridShape": "engine.spec",
    "ZeroConfig": "engine.spec",
    "ZeroError": "engine.spec",
    "ParallelLinear": "engine.core.linear",
    "ShardingError": "engine.core.linear",
    "local_shard": "engine.core.placement",
    "PlacedAdamW": "engine.core.placement",
    "PlacedSGD": "engine.core.placement",
    "single_tensor_steps": "engine.core.placement",
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
