"""A tiny training script for the watch tests of hookcli's own code (not helper B's
scripts): an MLP with an in-place ReLU, SGD or Adam, a few steps, and options that
make it misbehave on purpose.

``python tiny.py --steps N [--seed S] [--opt sgd|adam|none] [--nan-at K] [--exit C]
[--accumulate A] [--eval] [--sleep S] [--unused] [--dead]``; prints one line per step:
``step K loss L (HEX)`` and, at the end, ``sha256 DIGEST`` of the weights.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time

import torch
from torch import nn


class Poison(nn.Module):
    """On the forward call given: multiplies by NaN (``forward``), or adds a term that
    is 0 forward and NaN backward (``backward``: sqrt's gradient at 0 times 0); else
    passes its input through."""

    def __init__(self) -> None:
        super().__init__()
        self.at = -1
        self.phase = "forward"
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls != self.at:
            return x
        if self.phase == "forward":
            return x * float("nan")
        return x + torch.sqrt(x * 0.0) * 0.0


class Net(nn.Module):
    def __init__(self, dead: bool = False, unused: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.ReLU(inplace=True)
        self.poison = Poison()
        self.fc2 = nn.Linear(16, 4)
        self.spare = nn.Linear(4, 4) if unused else None
        if dead:
            with torch.no_grad():
                self.fc1.bias.fill_(-100.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.fc1(x))
        h = self.poison(h)
        return self.fc2(h.view(h.shape))  # a view of an output


def digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--opt", default="sgd", choices=["sgd", "adam", "none"])
    p.add_argument("--nan-at", type=int, default=-1, help="the forward call that goes NaN")
    p.add_argument("--nan-phase", default="forward", choices=["forward", "backward"])
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--eval", action="store_true", help="a no_grad eval forward per step")
    p.add_argument("--exit", type=int, default=0, help="exit status at the end")
    p.add_argument("--sleep", type=float, default=0.0, help="seconds to sleep per step")
    p.add_argument("--unused", action="store_true")
    p.add_argument("--dead", action="store_true")
    p.add_argument("--compile", default=None, help="torch.compile backend for fc2")
    args = p.parse_args()

    torch.manual_seed(args.seed)
    model = Net(dead=args.dead, unused=args.unused)
    model.poison.at = args.nan_at
    model.poison.phase = args.nan_phase
    if args.compile:
        model.fc2 = torch.compile(model.fc2, backend=args.compile)
    opt: torch.optim.Optimizer | None = None
    if args.opt == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    elif args.opt == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(args.seed)
    for step in range(1, args.steps + 1):
        total = 0.0
        for _ in range(args.accumulate):
            x = torch.randn(32, 8, generator=gen)
            y = torch.randn(32, 4, generator=gen)
            loss = nn.functional.mse_loss(model(x), y) / args.accumulate
            loss.backward()
            total += loss.item()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                for q in model.parameters():
                    if q.grad is not None:
                        q -= 0.1 * q.grad
                        q.grad = None
        if args.eval:
            with torch.no_grad():
                model.eval()
                model(torch.randn(4, 8, generator=gen))
                model.train()
        print(f"step {step} loss {total:.6f} ({total.hex()})", flush=True)
        if args.sleep:
            time.sleep(args.sleep)
    print(f"sha256 {digest(model)}", flush=True)
    return args.exit


if __name__ == "__main__":
    sys.exit(main())
