"""A 5,000-layer Linear+ReLU MLP (10,001 module calls), for the per-call overhead benchmark."""

from torch import nn


def deep_mlp(layers: int = 5000, width: int = 64) -> nn.Sequential:
    """``layers`` x (Linear(width, width), ReLU)."""
    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*blocks)
