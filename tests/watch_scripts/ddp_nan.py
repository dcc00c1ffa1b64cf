"""DistributedDataParallel on 2 CPU ranks (gloo) where rank 1 alone goes NaN at a known
step (a watch test script, launched by torchrun).

Model: ``encoder`` = ``proj`` (Linear, no bias) -> ``norm`` (each row divided by its L2
norm, no eps) -> ``act`` (Tanh), then ``head`` (Linear), wrapped in DDP; SGD. Each
rank draws its own data shard (seed + rank). At step ``--nan-step`` rank 1's shard holds
an all-zero row: ``proj`` maps it to zeros and ``norm`` divides 0 by 0, so on rank 1
``module.encoder.norm``'s output turns NaN from finite inputs and its loss is NaN.
Rank 0's loss at that step is finite: its gradients turn NaN only through DDP's
all-reduce of rank 1's (no module of rank 0 makes a non-finite value); from the next
step on, both ranks train NaN weights.

With ``--ref PATH`` each rank writes its own reference to PATH with ``.rank{R}`` before
the suffix (``ref.json`` -> ``ref.rank0.json``, ``ref.rank1.json``); module names are
under the DDP wrapper (``module.encoder.proj``), the root that forward is called on.
``nan``: rank 1 ``{"step": K, "phase": "forward", "module": "module.encoder.norm"}``;
rank 0 ``{"step": K, "phase": "backward", "module": null}`` (the all-reduce).

Usage: ``torchrun --nproc_per_node 2 ddp_nan.py --steps 6 --seed 0 --nan-step 4 [--ref F]``.
"""

from __future__ import annotations

import math
import sys
from collections import OrderedDict

import torch
import torch.distributed as dist
from reference_figures import RefFile, base_parser, rank_path, weights_digest
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel


class RowNorm(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / (x * x).sum(-1, keepdim=True).sqrt()


def build(features: int = 8, hidden: int = 16) -> nn.Module:
    encoder = nn.Sequential(
        OrderedDict(proj=nn.Linear(features, hidden, bias=False), norm=RowNorm(), act=nn.Tanh())
    )
    return nn.Sequential(OrderedDict(encoder=encoder, head=nn.Linear(hidden, 1)))


def main(argv: list[str] | None = None) -> int:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--nan-step", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args(argv)

    dist.init_process_group("gloo")
    try:
        rank = dist.get_rank()
        torch.manual_seed(args.seed)  # the same initial weights on every rank
        model = DistributedDataParallel(build())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        ref = RefFile(rank_path(args.ref, rank) if args.ref else None)
        track = ref.track("", model, optimizer)
        gen = torch.Generator().manual_seed(args.seed + rank)
        for step in range(1, args.steps + 1):
            x = torch.randn(args.batch, 8, generator=gen)
            y = x[:, :2].sum(1)
            if rank == 1 and step == args.nan_step:
                x[2] = 0.0
            loss = F.mse_loss(model(x).squeeze(1), y)
            optimizer.zero_grad()
            loss.backward()
            value = loss.item()
            if ref.enabled:
                if not math.isfinite(value):
                    track.non_finite(step, "forward", "module.encoder.norm")
                elif not all(bool(p.grad.isfinite().all()) for p in model.parameters()):
                    track.non_finite(step, "backward", None)
            track.before_step(value)
            optimizer.step()
            track.after_step()
            print(f"rank {rank} step {step} loss {value:.6f} ({value.hex()})", flush=True)
        print(f"rank {rank} weights sha256 {weights_digest(model)}")
        ref.write()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
