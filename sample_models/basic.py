"""Small classic models from the hook literature, each with ``example_input_array``."""

import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    """A conv + max-pool net on a 1x1x4x4 image (the classic hooks tutorial shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, kernel_size=2)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(kernel_size=2, stride=1)
        self.fc = nn.Linear(2 * 2 * 2, 3)
        self.example_input_array = torch.randn(1, 1, 4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.relu(self.conv(x)))
        return self.fc(torch.flatten(x, 1))


class CustomLinearLayer(nn.Module):
    """Holds its own weight and bias, plus a nested Linear and a Sequential (3x10 input)."""

    def __init__(self, in_features: int = 10, hidden: int = 8, out_features: int = 4) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(hidden, in_features) * 0.1)
        self.bias = nn.Parameter(torch.zeros(hidden))
        self.inner = nn.Linear(hidden, hidden)
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(hidden, out_features), nn.Tanh())
        self.example_input_array = torch.randn(3, in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.linear(x, self.weight, self.bias)
        return self.head(self.inner(x))


class LeNet(nn.Module):
    """LeNet-5 on a 1x1x32x32 image."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.pool2 = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)
        self.example_input_array = torch.randn(1, 1, 32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool1(F.relu(self.conv1(x)))
        x = self.pool2(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class BNMLP(nn.Module):
    """An MLP with BatchNorm1d and Dropout (batch of 4, so train mode works)."""

    def __init__(self, in_features: int = 16, hidden: int = 32, out_features: int = 5) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_features, hidden),
            nn.BatchNorm1d(hidden),
            nn.ReLU(),
            nn.Dropout(0.2),
            nn.Linear(hidden, hidden),
            nn.BatchNorm1d(hidden),
            nn.ReLU(),
            nn.Dropout(0.2),
            nn.Linear(hidden, out_features),
        )
        self.register_buffer("step_scale", torch.ones(1), persistent=False)
        self.example_input_array = torch.randn(4, in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) * self.step_scale
