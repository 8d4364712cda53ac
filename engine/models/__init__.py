"""Models on the grid: which module of a model becomes which parallel layer (parallelize)."""
