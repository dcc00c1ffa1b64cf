"""The models of docs/hardening-models.md: TorchScript, torch.compile, dynamic quantization,
and a model whose output cannot be backpropagated. ``hookcli inspect
docs/examples/odd_models.py:scripted`` and so on, from the repository root."""

from __future__ import annotations

import torch
from torch import nn


class Net(nn.Module):
    """Linear-ReLU-Linear, 4 -> 8 -> 2."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(8, 2)
        self.example_input_array = torch.randn(3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def scripted() -> nn.Module:
    """The whole model through ``torch.jit.script``."""
    return torch.jit.script(Net())


def compiled() -> nn.Module:
    """``torch.compile(Net())``: an OptimizedModule around the eager Net."""
    return torch.compile(Net())


def quantized() -> nn.Module:
    """Dynamic int8 quantization of Net's Linear layers (weights packed)."""
    return torch.ao.quantization.quantize_dynamic(Net(), {nn.Linear}, dtype=torch.qint8)


class Argmax(nn.Module):
    """Returns a Python int: nothing to backpropagate."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.example_input_array = torch.randn(2, 4)

    def forward(self, x: torch.Tensor) -> int:
        return int(self.fc(x).argmax())
