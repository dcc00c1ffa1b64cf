"""Models with something wrong in them, for the checks: unused params, NaN, Inf."""

import torch
from torch import nn


class UnusedBranch(nn.Module):
    """``spare`` is never called in forward: its parameters never get a gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(8, 8)
        self.spare = nn.Linear(8, 8)
        self.out = nn.Linear(8, 2)
        self.example_input_array = torch.randn(4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.used(x)))


class Log(nn.Module):
    """Elementwise natural log (NaN for negative inputs)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


class NaNModel(nn.Module):
    """``log`` of a Linear's (partly negative) output produces NaN in a middle layer."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 6)
        self.log = Log()
        self.fc2 = nn.Linear(6, 3)
        self.example_input_array = torch.randn(4, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.log(self.fc1(x)))


class Exp(nn.Module):
    """``exp(scale * x)``: overflows to Inf for large inputs."""

    def __init__(self, scale: float = 1000.0) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(self.scale * x)


class InfModel(nn.Module):
    """An Inf appears in the middle layer ``blowup`` while its inputs are finite."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 6)
        self.blowup = Exp()
        self.fc2 = nn.Linear(6, 3)
        self.example_input_array = torch.randn(4, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.blowup(self.fc1(x)))
