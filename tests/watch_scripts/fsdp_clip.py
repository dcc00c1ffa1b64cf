"""Gradient clipping under FSDP on 2 CPU ranks (gloo), launched by torchrun (a watch
test script).

``--fsdp 1``: ``FullyShardedDataParallel`` (FSDP1), clipped with its own method
``model.clip_grad_norm_(max_norm)`` (which all-reduces the shards' norms itself);
``--fsdp 2``: ``fully_shard`` (FSDP2, DTensor parameters), clipped with
``torch.nn.utils.clip_grad_norm_``. Each rank writes ``OUT.rank{R}.json``: per step the
loss it computed and the norm the clipping call returned (the pre-clip norm of the
whole model).

Usage: ``torchrun --nproc_per_node 2 fsdp_clip.py OUT [--fsdp 1|2] [--steps N]``.
"""

import argparse
import json

import torch
import torch.distributed as dist
from torch import nn


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--fsdp", default="1")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--max-norm", type=float, default=0.1)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1)
    )
    if args.fsdp == "1":
        from torch.distributed.fsdp import FullyShardedDataParallel

        model = FullyShardedDataParallel(model, device_id=torch.device("cpu"))
    else:
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)
    seen = []
    for _ in range(args.steps):
        x = torch.randn(16, 8, generator=g)
        y = x[:, :1] * 2
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        if args.fsdp == "1":
            norm = model.clip_grad_norm_(args.max_norm)
        else:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_norm)
            if hasattr(norm, "full_tensor"):
                norm = norm.full_tensor()
        seen.append({"loss": loss.item(), "clip": float(norm)})
        optimizer.step()
        optimizer.zero_grad()
    with open(f"{args.out}.rank{rank}.json", "w") as f:
        json.dump(seen, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
