"""Training: the loop, gradient sync and clipping, full state dicts, checkpoints and sharded loading."""
