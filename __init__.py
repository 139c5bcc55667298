"""meshplan: an automatic parallelization planner for training large models."""
