"""``grads --ddp`` under torchrun against a plain DDP step script: 2 ranks, cpu, gloo.

Both sides are whole torchrun launches, timed from start to exit, so the figure
is what a user waits for:

- plain: this file with ``--worker`` under ``torchrun --nproc_per_node=2``: every rank
  builds ``torchvision.models.get_model(MODEL, weights=None)`` after
  ``torch.manual_seed(0)``, draws its batch with seed + rank, wraps the model in
  ``DistributedDataParallel`` (default options), runs one forward, ``loss = out.sum()``
  and ``loss.backward()``, then leaves the process group;
- hookcli: ``torchrun --nproc_per_node=2 -m hookcli grads MODEL --ddp -b BATCH
  --fail-on unused,nan,inf -o FILE`` (the report goes to a file; the same
  model, inputs and step, plus every hook, the checks, the cross-rank comparison
  of reduced gradients and buffers, and the report).

Like for like, both sides end with the interpreter's ordinary shutdown: the plain
script always does, and hookcli, which would otherwise leave each rank with
``os._exit`` once the process group is gone, runs with ``HOOKCLI_FULL_EXIT=1``.
Launches alternate (plain, hookcli, plain, ...) so that drift in the machine's load
hits both alike; the figure is the ratio of the medians. Target: <= 1.25.
One OpenMP thread per rank (2 ranks on a small machine).

Usage: ``python benchmarks/bench_ddp.py [--model resnet18] [--batch 8] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import benchmark, record, smoke, target_line  # noqa: E402


def worker(model_name: str, batch: int) -> None:
    """The plain DDP step (run by torchrun on every rank)."""
    import torch
    import torch.distributed as dist
    import torchvision
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torchvision.models.get_model(model_name, weights=None).train()
    x = torch.randn(
        batch,
        3,
        64 if smoke() else 224,
        64 if smoke() else 224,
        generator=torch.Generator().manual_seed(0 + rank),
    )
    ddp = DistributedDataParallel(model)
    loss = ddp(x).sum()
    loss.backward()
    dist.destroy_process_group()


def _launch(args: list[str]) -> float:
    torchrun = Path(sys.executable).with_name("torchrun")
    # HOOKCLI_FULL_EXIT=1: hookcli's ranks pay the interpreter's teardown, as the plain
    # script's do (the plain script does not read it)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HOOKCLI_FULL_EXIT": "1"}
    start = time.perf_counter()
    proc = subprocess.run(
        [str(torchrun), "--nproc_per_node=2", "--standalone", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"launch failed ({proc.returncode}): {args}\n{proc.stderr[-2000:]}")
    return took


@benchmark
def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args([] if argv is None else argv)
    if args.worker:
        worker(args.model, args.batch)
        return {}
    if smoke():
        args.batch, args.repeats = 1, 1
    plain_cmd = [str(Path(__file__).resolve()), "--worker", "--model", args.model]
    plain_cmd += ["--batch", str(args.batch)]
    plain: list[float] = []
    hooked: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        report = str(Path(tmp, "report.json"))
        hook_cmd = ["-m", "hookcli", "grads", args.model, "--ddp", "-b", str(args.batch)]
        hook_cmd += ["--fail-on", "unused,nan,inf", "-f", "json", "-o", report]
        if smoke():
            hook_cmd += ["-i", f"{args.batch}x3x64x64"]
        _launch(plain_cmd)  # warm the file cache before timing
        for _ in range(args.repeats):
            plain.append(_launch(plain_cmd))
            hooked.append(_launch(hook_cmd))
    result = {
        "plain_s": statistics.median(plain),
        "hookcli_s": statistics.median(hooked),
    }
    result["ratio"] = result["hookcli_s"] / result["plain_s"]
    print(
        f"model {args.model}, batch {args.batch} per rank, 2 ranks (gloo, cpu), "
        f"{args.repeats} launches each"
    )
    print(f"plain DDP step:  median {result['plain_s']:.2f} s  {[round(t, 2) for t in plain]}")
    print(f"hookcli --ddp:   median {result['hookcli_s']:.2f} s  {[round(t, 2) for t in hooked]}")
    print(target_line("ratio, both with the interpreter's teardown", result["ratio"], "ddp"))
    record(
        "ddp",
        result["ratio"],
        what="`torchrun ... grads --ddp` vs a plain DDP step, 2 ranks, both with the "
        "interpreter's teardown",
        threads="1 per rank",
    )
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
