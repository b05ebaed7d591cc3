"""Memory per rank: weights, gradients, optimizer state, activations per schedule and
recompute mode, workspace (``accounting``)."""
