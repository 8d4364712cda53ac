"""4D hybrid-parallel engine (data x X x Y x Z tensor parallelism) on torch.distributed.

    grid = engine.init(data=D, x=X, y=Y, z=Z)
"""

from engine.grid import Grid, GridError, GridShape, init
from engine.linear import ParallelLinear, ShardingError

__all__ = ["Grid", "GridError", "GridShape", "ParallelLinear", "ShardingError", "init"]
