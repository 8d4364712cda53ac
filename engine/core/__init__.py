"""The parallel core: the process grid, collectives, autograd pairs, the parallel Linear and vocabulary-parallel
layers, data-axis work splitting. Knows torch, nothing of transformers."""
