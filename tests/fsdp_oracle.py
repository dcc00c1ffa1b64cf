"""The reference for tests/test_fsdp.py: one FSDP2 step in plain torch.distributed.

Run under torchrun: ``torchrun --nproc_per_node=2 tests/fsdp_oracle.py MODULE:CLASS OUT_DIR
[--seed N] [--blocks ATTR]``. No hookcli code: the model is sharded with
``fully_shard`` on each child of the ModuleList ``ATTR`` (with ``--blocks``), else on
each top-level child that has parameters, then on the root. Each rank writes
OUT_DIR/rank{r}.json:

- ``units``: the modules sharded, in order (the root as "");
- ``params``: per parameter, the unsharded ``shape``, this rank's ``shard_numel`` and
  ``shard_bytes`` (``to_local()``), ``shard_grad_norm`` (``p.grad.to_local()``) and
  ``reduced_grad_norm`` (``p.grad.full_tensor()``);
- ``local``: per parameter, the grad norm of a plain backward of an unsharded copy
  on this rank's batch (no reduction);
- ``total_norm``: ``clip_grad_norm_`` on the sharded parameters (DTensor grads), in full;
- ``loss``, ``output_mean``: the sum and mean of this rank's output.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from tests.ddp_oracle import finish  # run with the repository on PYTHONPATH, as the tests do


def build(spec: str, seed: int) -> nn.Module:
    module, _, attr = spec.partition(":")
    torch.manual_seed(seed)
    return getattr(importlib.import_module(module), attr)()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("spec")
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--blocks", default=None)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build(args.spec, args.seed)
    example = model.example_input_array
    g = torch.Generator().manual_seed(args.seed + rank)
    if example.is_floating_point():
        x = torch.randn(example.shape, generator=g, dtype=example.dtype)
    else:
        low, high = int(example.min()), int(example.max()) + 1
        x = torch.randint(low, high, example.shape, generator=g).to(example.dtype)

    plain = copy.deepcopy(model).train()
    plain(x).sum().backward()
    local = {
        n: None if p.grad is None else float(p.grad.double().norm())
        for n, p in plain.named_parameters()
    }

    mesh = init_device_mesh("cpu", (world,))
    if args.blocks:
        units = [f"{args.blocks}.{n}" for n, _ in getattr(model, args.blocks).named_children()]
    else:
        units = [n for n, m in model.named_children() if any(True for _ in m.parameters())]
    for name in units:
        fully_shard(model.get_submodule(name), mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.train()
    out = model(x)
    loss = out.sum()
    loss.backward()
    params = {}
    for n, p in model.named_parameters():
        s = p.to_local()
        params[n] = {
            "shape": list(p.shape),
            "shard_numel": s.numel(),
            "shard_bytes": s.numel() * s.element_size(),
            "shard_grad_norm": None if p.grad is None else float(p.grad.to_local().double().norm()),
            "reduced_grad_norm": None
            if p.grad is None
            else float(p.grad.full_tensor().double().norm()),
        }
    total = torch.nn.utils.clip_grad_norm_(list(model.parameters()), float("inf"))
    total = total.full_tensor() if hasattr(total, "full_tensor") else total
    result = {
        "rank": rank,
        "units": [*units, ""],
        "params": params,
        "local": local,
        "total_norm": float(total),
        "loss": float(loss),
        "output_mean": float(out.detach().mean()),
    }
    Path(args.out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finish()


if __name__ == "__main__":
    main()
