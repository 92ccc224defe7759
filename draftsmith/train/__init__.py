"""Training: the one loop, parallelism, checkpoints and experiment tracking."""
