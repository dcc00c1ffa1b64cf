"""The reference for tests/test_distributed.py: one DDP step in plain torch.distributed.

Run under torchrun: ``torchrun --nproc_per_node=2 tests/ddp_oracle.py MODULE:CLASS OUT_DIR
[--seed N] [--plain-ddp-error]``. Each rank writes OUT_DIR/rank{r}.json with what
hookcli should report, computed without hookcli:

- ``local``: per module, the L2 norm of its own parameters' grads from a plain
  backward of a copy of the model on this rank's batch (no DDP, so no reduction);
- ``local_unused``: parameters whose grad stays None in that backward;
- ``reduced``: the same norms after a DDP backward (grads all-reduced, averaged);
- ``loss``, ``output_mean``: the sum and mean of this rank's output;
- ``grads_differ`` / ``params_differ`` / ``buffers_differ`` (rank 0): names whose tensors
  differ across ranks after the DDP step (all_gather_object, compared with torch.equal);
- with ``--plain-ddp-error``: DDP's own ``Parameters which did not receive grad for rank
  R: ...`` names, from two steps with find_unused_parameters=False under
  TORCH_DISTRIBUTED_DEBUG=INFO.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import math
import os
import re
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def build(spec: str, seed: int) -> nn.Module:
    module, _, attr = spec.partition(":")
    torch.manual_seed(seed)
    return getattr(importlib.import_module(module), attr)()


def own_norms(model: nn.Module) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name, m in model.named_modules():
        grads = [p.grad for p in m.parameters(recurse=False) if p.grad is not None]
        has = [p for p in m.parameters(recurse=False) if p.requires_grad]
        if not has:
            continue
        out[name] = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads)) if grads else None
    return out


def differing(named: dict[str, torch.Tensor | None]) -> list[str]:
    """Names whose tensor differs from rank 0's (gathered to every rank)."""
    mine = {k: None if v is None else v.detach().clone() for k, v in named.items()}
    everyone: list[dict[str, torch.Tensor | None]] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(everyone, mine)
    out = []
    for name, base in everyone[0].items():
        for other in everyone[1:]:
            t = other[name]
            if (t is None) != (base is None) or (t is not None and not torch.equal(t, base)):
                out.append(name)
                break
    return out


def plain_ddp_error(spec: str, seed: int, x: torch.Tensor) -> list[str]:
    """The parameter names in DDP's own error for this rank (find_unused_parameters=False)."""
    model = build(spec, seed)
    ddp = DistributedDataParallel(model)
    message = ""
    for _ in range(2):
        try:
            ddp(x).sum().backward()
        except RuntimeError as err:
            message = str(err)
            break
    found = re.search(r"Parameters which did not receive grad for rank \d+: (.*)", message)
    return [n.strip() for n in found.group(1).split(",")] if found else []


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("spec")
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plain-ddp-error", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = build(args.spec, args.seed)
    example = model.example_input_array
    g = torch.Generator().manual_seed(args.seed + rank)
    x = torch.randn(example.shape, generator=g, dtype=example.dtype)

    local = copy.deepcopy(model).train()
    out = local(x)
    out.sum().backward()
    result: dict[str, object] = {
        "rank": rank,
        "loss": float(out.sum()),
        "output_mean": float(out.mean()),
        "local": own_norms(local),
        "local_unused": [n for n, p in local.named_parameters() if p.grad is None],
    }

    model.train()
    ddp = DistributedDataParallel(model, find_unused_parameters=True)
    ddp(x).sum().backward()
    result["reduced"] = own_norms(model)
    result["reduced_params"] = {
        n: None if p.grad is None else float(p.grad.double().norm())
        for n, p in model.named_parameters()
    }
    result["grads_differ"] = differing({n: p.grad for n, p in model.named_parameters()})
    result["buffers_differ"] = differing(dict(model.named_buffers()))
    result["params_differ"] = differing(dict(model.named_parameters()))
    if args.plain_ddp_error:
        result["ddp_error_unused"] = plain_ddp_error(args.spec, args.seed, x)
    Path(args.out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finish()


def finish() -> None:
    """Both ranks meet, the group goes, and the process leaves without interpreter teardown.

    Teardown frees DDP's reducer and gloo's threads in no set order, and gloo can then
    abort with ``terminate called without an active exception`` (seen once in CI, after
    the results were written). hookcli's own ranks leave the same way (``os._exit``).
    """
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
