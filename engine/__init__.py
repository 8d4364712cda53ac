"""4D hybrid-parallel engine (data x X x Y x Z tensor parallelism) on torch.distributed.

    grid = engine.init(data=D, x=X, y=Y, z=Z)      # starts torch.distributed if needed
    with engine.auto_parallelize(grid):             # models built inside get parallel Linear layers
        model = AutoModelForCausalLM.from_config(cfg)
    model = engine.parallelize(model, grid)         # or shard an already built model in place
    engine.shard_data_axis(model, grid, engine.ZeroConfig(stage=3))  # ZeRO over the data axis (optional)
    loss_sum.backward()                             # each rank on its own rows
    engine.sync_gradients(model, grid)              # gradients of the SUM of all ranks' losses
    engine.clip_grad_norm_(model, max_norm, grid)
    state = engine.full_state_dict(model, grid)     # serial keys, full tensors
    engine.load_full_state_dict(model, state, grid)
"""

from engine.checkpoint import CheckpointError, consolidate_checkpoint, load_checkpoint, save_checkpoint
from engine.grid import Grid, GridError, GridShape, init, is_main_process
from engine.linear import ParallelLinear, ShardingError
from engine.parallelize import auto_parallelize, parallelize
from engine.state import clip_grad_norm_, full_state_dict, load_full_state_dict, sync_gradients
from engine.zero import ZeroConfig, ZeroError, shard_data_axis

__all__ = [
    "CheckpointError",
    "Grid",
    "GridError",
    "GridShape",
    "ParallelLinear",
    "ShardingError",
    "ZeroConfig",
    "ZeroError",
    "auto_parallelize",
    "clip_grad_norm_",
    "consolidate_checkpoint",
    "full_state_dict",
    "init",
    "is_main_process",
    "load_checkpoint",
    "load_full_state_dict",
    "parallelize",
    "save_checkpoint",
    "shard_data_axis",
    "sync_gradients",
]
