"""The memory oracle under FSDP2: one rank's real peak of a steady-state training step.

Run as ``python tests/fsdp_memory_oracle.py MODULE:CLASS --world N --rank R [--blocks
ATTR] [--ids B S V | --shape B,F] [--optimizer adam] [--zero-grad none] [--checkpoint
CLASS] [--eval] [--amp] [--kwargs JSON]``; prints one JSON object with ``peak_bytes``.

No hookcli code. One process plays rank R of N: the default process group is
torch's fake backend (``torch.testing._internal.distributed.fake_pg``), whose
collectives move no data and allocate nothing, so what is measured is what FSDP2
itself allocates on that rank (the sharded parameters, its all-gather outputs, the
unsharded parameters, its reduce-scatter buffers, the sharded gradients), which is
what it allocates over NCCL too. The model is sharded with ``fully_shard`` on each
child of the ModuleList ``ATTR`` (else each top-level child with parameters), then
on the root. The step is the one ``tests/memory_oracle.py`` measures (forward, the
sum of the output as the loss, backward, ``optimizer.step()`` with its state made by
one step before, ``zero_grad``; ``torch.utils.checkpoint`` around each module of the
class ``--checkpoint``; with ``--amp`` the forward under ``torch.autocast("cpu",
torch.bfloat16)``), its peak measured at the CPU allocator
(``memory_oracle.measure_peak``) above the storages alive before it: the local
shards, their gradients and optimizer state, buffers and the inputs.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.memory_oracle import checkpointed, make_optimizer, measure_peak


def _local(t: Any) -> Any:
    return t.to_local() if hasattr(t, "to_local") else t


def shard(model: nn.Module, world: int, blocks: str | None) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    if blocks:
        units = list(getattr(model, blocks))
    else:
        units = [c for c in model.children() if next(c.parameters(), None) is not None]
    for unit in units:
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser()
    ap.add_argument("spec")
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--blocks")
    ap.add_argument("--ids", nargs=3, type=int, metavar=("B", "S", "V"))
    ap.add_argument("--shape")
    ap.add_argument("--optimizer", default="adam")
    ap.add_argument("--zero-grad", default="none")
    ap.add_argument("--checkpoint")
    ap.add_argument("--eval", action="store_true")
    ap.add_argument("--amp", action="store_true")
    ap.add_argument("--kwargs", default="{}")
    a = ap.parse_args(argv)

    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=a.rank, world_size=a.world)
    try:
        module, _, attr = a.spec.partition(":")
        torch.manual_seed(0)
        model = getattr(importlib.import_module(module), attr)(**json.loads(a.kwargs))
        shard(model, a.world, a.blocks)
        if a.ids:
            b, s, v = a.ids
            x = torch.randint(0, v, (b, s))
        else:
            x = torch.randn(*(int(n) for n in a.shape.split(",")))
        params = list(model.parameters())
        held: list[Any] = [_local(t) for t in [*params, *model.buffers()]] + [x]
        if a.eval:
            model.eval()

            def infer() -> None:
                with torch.no_grad():
                    model(x)

            infer()
            # the root keeps its parameters unsharded after an eval forward (there is no
            # backward to reshard them): reshard, so the measured forward gathers them again
            model.reshard()
            m = measure_peak(infer, held)
            return {"peak_bytes": m.peak_bytes, "held_bytes": m.held_bytes}
        model.train()
        opt = make_optimizer(a.optimizer, params)
        set_to_none = a.zero_grad == "none"

        # fully_shard renames a unit's class (Block -> FSDPBlock)
        classes = {type(m).__name__ for m in model.modules()}
        wrapped = f"FSDP{a.checkpoint}" if f"FSDP{a.checkpoint}" in classes else a.checkpoint

        def step() -> None:
            with checkpointed(model, wrapped):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.amp):
                    loss = model(x).float().sum()  # the output not held through backward
                loss.backward()
                del loss
            if opt is not None:
                opt.step()
                opt.zero_grad(set_to_none=set_to_none)

        step()  # the optimizer's state, as after the first step
        held += [_local(p.grad) for p in params if p.grad is not None]
        if opt is not None:
            for state in opt.state.values():
                held += [_local(v) for v in state.values() if isinstance(v, torch.Tensor)]
        m = measure_peak(step, held)
        return {"peak_bytes": m.peak_bytes, "held_bytes": m.held_bytes}
    finally:
        dist.destroy_process_group()


def args_of(how: dict[str, Any]) -> list[str]:
    """The command line for one case: ``world``, ``rank``, ``ids`` (B, S, V) or
    ``shape``, and optionally ``blocks``, ``kwargs``, ``optimizer``, ``zero_grad``,
    ``checkpoint``, ``eval``, ``amp``."""
    args = ["--world", str(how["world"]), "--rank", str(how["rank"])]
    if "ids" in how:
        args += ["--ids", *(str(n) for n in how["ids"])]
    else:
        args += ["--shape", ",".join(str(n) for n in how["shape"])]
    for key in ("blocks", "kwargs", "optimizer", "zero_grad", "checkpoint"):
        if key in how:
            args += [f"--{key.replace('_', '-')}", str(how[key])]
    args += ["--amp"] if how.get("amp") else []
    return [*args, "--eval"] if how.get("eval") else args


def measured(spec: str, how: dict[str, Any]) -> int:
    """One case's peak, in a process of its own (one default process group each)."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    run = subprocess.run(
        [sys.executable, __file__, spec, *args_of(how)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
    )
    if run.returncode != 0:
        raise RuntimeError(run.stderr[-3000:])
    return int(json.loads(run.stdout.strip().splitlines()[-1])["peak_bytes"])


if __name__ == "__main__":
    print(json.dumps(main()))
