"""Gradient accumulation, views of module outputs and in-place ops on module outputs,
and optionally a ``torch.compile``d submodule (a watch test script).

Model: ``stem`` (Linear) -> ``out.relu_()`` in place on its output -> 2 residual
``blocks`` (``h = block(x); h += x`` in place on the block's output) -> ``head``
(Linear to 2 x 3), whose output is viewed (``out.view(b, 2, 3)``) and sliced
(``out[:, 0]``) before the loss. Each optimizer step accumulates ``--accum``
micro-batches, each ``loss = cross_entropy(...) / accum`` with its own ``backward()``;
the step's loss in the reference is the sum of those ``accum`` values (each
``loss.item()``, added in order as Python floats from 0.0). SGD with momentum.

``--compile``: ``blocks.1`` is replaced by ``torch.compile(blocks.1)`` (module names
under it gain ``_orig_mod``). The backend is chosen at run time: inductor if it
compiles and runs a probe function on this machine, else ``aot_eager``; the script
prints ``compile backend: NAME``.

Usage: ``python accumulate.py --steps 6 --seed 0 [--accum 3] [--compile] [--ref F]``.
"""

from __future__ import annotations

import sys

import torch
from reference_figures import RefFile, base_parser, weights_digest
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(x))


class Net(nn.Module):
    def __init__(self, features: int = 12, width: int = 24):
        super().__init__()
        self.stem = nn.Linear(features, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(2))
        self.head = nn.Linear(width, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x.relu_()  # in place, on a module's output
        for block in self.blocks:
            h = block(x)
            h += x  # in place, on a module's output
            x = h
        out = self.head(x)
        return out.view(out.size(0), 2, 3)  # a view of a module's output


def pick_backend() -> str:
    """inductor when it compiles and runs here, else aot_eager."""
    try:
        probe = torch.compile(lambda t: torch.sin(t) * 2 + 1, backend="inductor")
        probe(torch.ones(4))
        return "inductor"
    except Exception as err:  # no C++ compiler, no Triton, an unsupported platform
        print(f"inductor cannot compile here ({type(err).__name__}); using aot_eager")
        return "aot_eager"


def main(argv: list[str] | None = None) -> int:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--accum", type=int, default=3, help="micro-batches per step")
    parser.add_argument("--batch", type=int, default=8, help="micro-batch size")
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args(argv)

    backend = pick_backend() if args.compile else ""
    if backend:
        print(f"compile backend: {backend}")
    torch.manual_seed(args.seed)
    model = Net().train()
    if backend:
        model.blocks[1] = torch.compile(model.blocks[1], backend=backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ref = RefFile(args.ref)
    track = ref.track("", model, optimizer)
    gen = torch.Generator().manual_seed(args.seed)
    for step in range(1, args.steps + 1):
        optimizer.zero_grad()
        total = 0.0
        for _ in range(args.accum):
            x = torch.randn(args.batch, 12, generator=gen)
            y = torch.randint(3, (args.batch, 2), generator=gen)
            out = model(x)
            first, second = out[:, 0], out[:, 1]  # views of the output
            loss = (F.cross_entropy(first, y[:, 0]) + F.cross_entropy(second, y[:, 1])) / args.accum
            loss.backward()
            total += loss.item()
        track.before_step(total)
        optimizer.step()
        track.after_step()
        print(f"step {step} loss {total:.6f} ({total.hex()})", flush=True)
    print(f"weights sha256 {weights_digest(model)}")
    ref.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
