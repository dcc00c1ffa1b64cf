"""A small classifier trained as people write it, for the ``hookcli watch`` examples.

Features are standardized by a hand-written ``Standardize`` module (no epsilon), an
MLP classifies them, AdamW with a cosine schedule trains it. ``--bad-batch K`` makes
the K-th batch hold one constant row, as a corrupt record would: its standard
deviation is 0 and ``Standardize`` divides 0 by 0.

    python docs/examples/watch_train.py --steps 30 [--bad-batch 12]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn


class Standardize(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - x.mean(-1, keepdim=True)) / x.std(-1, keepdim=True)  # no eps: a bug


class Classifier(nn.Module):
    def __init__(self, features: int = 16, hidden: int = 32, classes: int = 4) -> None:
        super().__init__()
        self.norm = Standardize()
        self.body = nn.Sequential(
            nn.Linear(features, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, hidden)
        )
        self.act = nn.ReLU()
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.act(self.body(self.norm(x))))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--bad-batch", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = Classifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, args.steps)
    data = torch.Generator().manual_seed(0)
    for step in range(1, args.steps + 1):
        x = torch.randn(64, 16, generator=data)
        y = x[:, :4].argmax(-1)
        if step == args.bad_batch:
            x[3] = 1.0  # a corrupt record: a constant row
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % 10 == 0:
            print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
