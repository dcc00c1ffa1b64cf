"""ablate overhead, as ratios against bare PyTorch forwards in the same process.

1. One ablation: one ablated pass inside ``run_ablations`` (restore buffers, reseed,
   attach the replacing hook, forward, compare with the clean output, remove the
   hook: from one pass's start to the next's) against one bare
   ``torch.inference_mode()`` forward. Target <= 1.10.
2. Every leaf module of resnet18 one at a time: the whole ``run_ablations`` (the
   clean pass, one pass per leaf, figures copied to the host at the end) against as
   many bare forwards as there are leaves. Target: about 1.10.

The bare forwards run interleaved with the passes (one before each pass, from the
``on_pass`` callback, and subtracted from the run's time), so both sides see the same
machine load; each ratio is the median over the passes / repeats. resnet18, eval,
1x3x224x224 unless ``--batch``/``--size``; ``--device cuda`` to run on a GPU
(synchronized around every timed region).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any


def _timer(device: Any) -> Callable[[], float]:
    import torch

    if device.type == "cuda":

        def now() -> float:
            torch.cuda.synchronize(device)
            return time.perf_counter()

        return now
    return time.perf_counter


def measure(
    batch: int = 1, repeats: int = 3, device_name: str = "cpu", size: int = 224
) -> dict[str, Any]:
    import torch

    from hookcli.ablation import leaves, parse_op, run_ablations, single_targets
    from hookcli.options import Mode, ModelOptions, RunOptions
    from hookcli.pipeline import prepare

    prepared = prepare(
        ModelOptions("resnet18"),
        RunOptions(inputs=(f"{batch}x3x{size}x{size}",), device=device_name),
    )
    model, x = prepared.model, prepared.inputs.args[0]
    device = x.device
    now = _timer(device)
    model.eval()
    op = parse_op("zero")
    every_leaf = single_targets(leaves(list(model.named_modules())))

    def one_run(targets: list[Any]) -> tuple[float, float, list[float]]:
        """(ablate time without the bare forwards, bare time, per-pass ablated/bare ratios)."""
        bare: list[float] = []
        starts: list[float] = []

        def on_pass(i: int, n: int, name: str) -> None:
            t0 = now()
            with torch.inference_mode():
                model(x)
            t1 = now()
            bare.append(t1 - t0)
            starts.append(t1)

        start = now()
        run_ablations(
            model, (x,), {}, targets, op=op, mode=Mode.EVAL, device=device, on_pass=on_pass
        )
        total = now() - start
        # pass i runs from starts[i] to the next bare forward's start (starts[i+1] - bare[i+1])
        passes = [(starts[i + 1] - bare[i + 1]) - starts[i] for i in range(len(starts) - 1)]
        ratios = [p / b for p, b in zip(passes, bare[:-1], strict=True)]
        return total - sum(bare), sum(bare), ratios

    one_run(every_leaf[:3])  # warm-up
    whole, per_pass = [], []
    for _ in range(repeats):
        ablate_time, bare_time, ratios = one_run(every_leaf)
        whole.append(ablate_time / bare_time)
        per_pass.append(statistics.median(ratios))
        last = (ablate_time, bare_time)
    return {
        "device": str(device),
        "threads": torch.get_num_threads(),
        "batch": batch,
        "size": size,
        "leaves": len(every_leaf),
        "one": statistics.median(per_pass),
        "all": statistics.median(whole),
        "ablate_time": last[0],
        "bare_time": last[1],
    }


def report(r: dict[str, Any]) -> None:
    shape = f"{r['batch']}x3x{r['size']}x{r['size']}"
    print(
        f"ablate resnet18 {shape} on {r['device']} ({r['threads']} threads): one ablation / "
        f"bare forward {r['one']:.3f} (target <= 1.10)",
        flush=True,
    )
    print(
        f"ablate resnet18 every leaf ({r['leaves']} modules, {r['leaves'] + 1} passes) / "
        f"{r['leaves']} bare forwards {r['all']:.3f} (target about 1.10); last run "
        f"{r['ablate_time']:.2f} s vs {r['bare_time']:.2f} s",
        flush=True,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size", type=int, default=224, help="image height and width")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv if argv is not None else [])
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    report(measure(args.batch, args.repeats, args.device, args.size))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
