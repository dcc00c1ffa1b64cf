"""A regression net that goes non-finite at a known step through a known module
(a watch test script).

Model: ``proj`` (Linear, no bias) -> ``temper`` (divides by its ``temperature`` buffer)
-> ``length`` (each row's Euclidean length, ``sqrt(sum(x * x))``, appended to the row)
-> ``head`` (MLP). SGD.

- ``--phase forward``: the temperature is annealed linearly from 1 so that it is
  exactly 0 at step ``--nan-step``: ``temper`` then divides finite values by 0 (its
  input finite, its output Inf/NaN), so the loss of that step is non-finite.
- ``--phase backward``: the temperature stays 1, and the batch of step ``--nan-step``
  holds an all-zero row. ``proj`` (no bias) maps it to zeros, ``temper`` keeps them,
  and ``length``'s forward is sqrt(0) = 0, finite; its backward, through sqrt at 0, is
  0 * Inf = NaN: ``length``'s grad_input is non-finite from a finite grad_output, the
  loss is finite, and ``proj``'s weight gradient turns NaN.

The run goes on to ``--steps`` (training on NaN weights after the event) and exits 0.
With ``--ref PATH`` the reference holds the per-step figures and ``"nan": {"step":
K, "phase": "forward"|"backward", "module": "temper"|"length"}``: the step is the first
whose loss (forward) or, the loss being finite, grad norm (backward) is non-finite, and
the module the one this script makes non-finite by construction (the tests check it
with hooks).

Usage: ``python goes_nan.py --steps 8 --seed 0 --nan-step 5 --phase forward [--ref F]``.
"""

from __future__ import annotations

import math
import sys

import torch
from reference_figures import RefFile, base_parser, on_device, weights_digest
from torch import nn
from torch.nn import functional as F

ORIGIN = {"forward": "temper", "backward": "length"}


class Temper(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("temperature", torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / self.temperature


class Length(nn.Module):
    """Appends each row's length (a naive sqrt(sum(x * x)), no eps) to the row."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, (x * x).sum(-1, keepdim=True).sqrt()], -1)


class Net(nn.Module):
    def __init__(self, features: int = 8, hidden: int = 16):
        super().__init__()
        self.proj = nn.Linear(features, hidden, bias=False)
        self.temper = Temper()
        self.length = Length()
        self.head = nn.Sequential(nn.Linear(hidden + 1, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.length(self.temper(self.proj(x)))).squeeze(-1)


def main(argv: list[str] | None = None) -> int:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--nan-step", type=int, default=5)
    parser.add_argument("--phase", choices=("forward", "backward"), default="forward")
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args(argv)

    device = on_device(args.device)
    torch.manual_seed(args.seed)
    model = Net().train().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    ref = RefFile(args.ref)
    track = ref.track("", model, optimizer)
    gen = torch.Generator().manual_seed(args.seed)
    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch, 8, generator=gen)
        y = x[:, 0] - 0.5 * x[:, 1]
        if args.phase == "forward":
            left = max(args.nan_step - step, 0)
            model.temper.temperature.fill_(left / max(args.nan_step - 1, 1))
        elif step == args.nan_step:
            x[3] = 0.0
        x, y = x.to(device), y.to(device)
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        value = loss.item()
        if ref.enabled:
            if not math.isfinite(value):
                track.non_finite(step, "forward", ORIGIN[args.phase])
            elif not all(bool(p.grad.isfinite().all()) for p in model.parameters()):
                track.non_finite(step, "backward", ORIGIN[args.phase])
        track.before_step(value)
        optimizer.step()
        track.after_step()
        print(f"step {step} loss {value:.6f} ({value.hex()})", flush=True)
    print(f"weights sha256 {weights_digest(model)}")
    ref.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
