"""``grads --fsdp`` under torchrun against a plain FSDP2 step script: 2 ranks, cpu, gloo.

Both sides are whole torchrun launches, timed from start to exit, so the figure
is what a user waits for:

- plain: this file with ``--worker`` under ``torchrun --nproc_per_node=2``: every rank
  builds ``sample_models.decoder.Decoder`` (a Llama-shaped decoder; blocks in a
  ModuleList) after ``torch.manual_seed(0)``, draws its token batch with seed + rank,
  applies ``fully_shard`` to each block and then to the root (FSDP2's defaults),
  runs one forward, ``loss = out.sum()`` and ``loss.backward()``, then leaves the
  process group;
- hookcli: ``torchrun --nproc_per_node=2 -m hookcli grads sample_models.decoder:Decoder
  --fsdp -k ... -b BATCH --fail-on unused,nan,inf,desync -o FILE`` (the same model,
  sharding, inputs and step, plus every hook, the per-rank figures, clip_grad_norm_'s
  total, the cross-rank agreement, the checks and the report).

Like for like, both sides end with the interpreter's ordinary shutdown: the plain
script always does, and hookcli, which would otherwise leave each rank with
``os._exit`` once the process group is gone, runs with ``HOOKCLI_FULL_EXIT=1``.
Launches alternate (plain, hookcli, plain, ...) so that drift in the machine's load
hits both alike; the figure is the ratio of the medians. Target: <= 1.25.
One OpenMP thread per rank (2 ranks on a small machine).

Usage: ``python benchmarks/bench_fsdp.py [--dim 256] [--layers 4] [--seq 128] [--batch 4]
[--repeats 3]``.
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


def _kwargs(args: argparse.Namespace) -> dict[str, int]:
    return {"dim": args.dim, "layers": args.layers, "hidden": 4 * args.dim, "seq": args.seq}


def worker(args: argparse.Namespace) -> None:
    """The plain FSDP2 step (run by torchrun on every rank)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from sample_models.decoder import Decoder

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Decoder(**_kwargs(args)).train()
    g = torch.Generator().manual_seed(0 + rank)
    x = torch.randint(0, 256, (args.batch, args.seq), generator=g)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    loss = model(x).sum()
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
        timeout=300,
    )
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"launch failed ({proc.returncode}): {args}\n{proc.stderr[-2000:]}")
    return took


@benchmark
def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args([] if argv is None else argv)
    if args.worker:
        worker(args)
        return {}
    if smoke():
        args.dim, args.layers, args.seq, args.batch, args.repeats = 32, 2, 16, 1, 1
    sizes = ["--dim", str(args.dim), "--layers", str(args.layers), "--seq", str(args.seq)]
    plain_cmd = [str(Path(__file__).resolve()), "--worker", *sizes, "--batch", str(args.batch)]
    plain: list[float] = []
    hooked: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        report = str(Path(tmp, "report.json"))
        hook_cmd = ["-m", "hookcli", "grads", "sample_models.decoder:Decoder", "--fsdp"]
        for key, value in _kwargs(args).items():
            hook_cmd += ["-k", f"{key}={value}"]
        hook_cmd += ["-b", str(args.batch), "--fail-on", "unused,nan,inf,desync"]
        hook_cmd += ["-f", "json", "-o", report]
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
        f"Decoder dim {args.dim}, {args.layers} layers, seq {args.seq}, batch {args.batch} "
        f"per rank, 2 ranks (gloo, cpu), {args.repeats} launches each"
    )
    print(f"plain FSDP2 step: median {result['plain_s']:.2f} s  {[round(t, 2) for t in plain]}")
    print(f"hookcli --fsdp:   median {result['hookcli_s']:.2f} s  {[round(t, 2) for t in hooked]}")
    print(target_line("ratio, both with the interpreter's teardown", result["ratio"], "fsdp"))
    record(
        "fsdp",
        result["ratio"],
        what="`torchrun ... grads --fsdp` vs a plain FSDP2 step, 2 ranks, both with the "
        "interpreter's teardown",
        threads="1 per rank",
    )
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
