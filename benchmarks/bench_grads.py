"""``grads`` overhead: resnet50, batch 8, against a bare forward + ``loss.backward()``.

In one process, on one model, runs alternate (bare, hooked, report, bare, ...) so
that drift in machine load hits all three alike; the figure is the ratio of
medians. Target: hooked / bare <= 1.15.

- bare: ``loss = model(x).sum(); loss.backward()`` with grads reset to None;
- hooked: the grads session (forward, backward-pre, backward and tensor hooks on
  every module and parameter, state saved and restored, figures fetched once);
- report: hooked plus building the rows, running every check and rendering the table.

One CPU thread by default (``--threads 0``: torch's default). On a shared machine
torch's threads wait for each other whenever another process holds a core, which
stretches each run at random (2 threads measured 2 s to 12 s for the same bare run
here); one thread measures this process's own work, and the ratio is what counts.

Usage: ``python benchmarks/bench_grads.py [--model resnet50] [--batch 8] [--size 224]
[--repeats 5] [--device cpu] [--threads 1]`` (``python benchmarks/run.py grads`` runs
the defaults: resnet50, batch 8, 224px, 5 runs each; about a minute on one core).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch.set_num_threads; 0 keeps torch's default"
    )
    args = parser.parse_args([] if argv is None else argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    from hookcli.api import GRADS_KINDS as DEFAULT_KINDS
    from hookcli.checks.grads import FAIL_ON, GradGates, run_checks
    from hookcli.layers import layer_rows, shape_columns
    from hookcli.losses import reduce_output
    from hookcli.options import Mode, ModelOptions, RunOptions
    from hookcli.pipeline import prepare, run_session
    from hookcli.probes.grads import GradProbe
    from hookcli.render import render_table
    from hookcli.report import Report

    spec = f"{args.batch}x3x{args.size}x{args.size}"
    prepared = prepare(
        ModelOptions(spec=args.model),
        RunOptions(inputs=(spec,), device=args.device, mode=Mode.TRAIN),
    )
    assert prepared.inputs is not None
    model = prepared.model
    x = prepared.inputs.args

    def bare() -> None:
        model.train()
        for p in model.parameters():
            p.grad = None
        loss = reduce_output(model(*x), "sum")
        loss.backward()
        float(loss.detach())  # the session reads the loss too
        _sync(args.device)

    def hooked() -> object:
        probe = GradProbe(frozenset(DEFAULT_KINDS), output_hooks=False)
        outcome = run_session(prepared, [probe], mode=Mode.TRAIN, backward=True)
        _sync(args.device)
        return probe, outcome

    def report() -> None:
        probe, outcome = hooked()  # type: ignore[misc]
        assert probe.findings is not None and outcome.error is None
        gates = GradGates(FAIL_ON, 1e9, 0.0)
        checks = run_checks(gates, probe.findings, outcome.records, outcome.loss)
        rows, _ = layer_rows(outcome.records, model, kinds=DEFAULT_KINDS, probes=[probe])
        rep = Report(command="grads", model={}, settings={}, layers=rows, checks=checks)
        render_table(rep, [*shape_columns(DEFAULT_KINDS), *probe.table_columns])

    runs: dict[str, Callable[[], object]] = {"bare": bare, "hooked": hooked, "report": report}
    times: dict[str, list[float]] = {k: [] for k in runs}
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    print(
        f"{args.model} batch {args.batch} at {args.size}px on {args.device}, "
        f"{torch.get_num_threads()} threads, {args.repeats} runs each (after one warm-up)",
        flush=True,
    )
    for fn in runs.values():
        fn()  # warm-up: allocator, kernels, lazy imports
    for _ in range(args.repeats):
        for name, fn in runs.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    med = {k: statistics.median(v) for k, v in times.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    for name in runs:
        spread = f"min {min(times[name]):.3f}, max {max(times[name]):.3f}"
        print(
            f"  {name:7s} wall median {med[name]:.3f} s ({spread}); "
            f"process CPU median {med_cpu[name]:.3f} s"
        )
    # Wall time is the figure that matters; on a shared machine other processes stretch
    # it at random, so the process CPU time (this process's work alone) is shown too.
    ratio = med["hooked"] / med["bare"]
    ratio_cpu = med_cpu["hooked"] / med_cpu["bare"]
    verdict = "ok" if ratio <= 1.15 else "OVER TARGET"
    print(f"  ratio hooked/bare: wall {ratio:.3f} (target <= 1.15: {verdict}), CPU {ratio_cpu:.3f}")
    print(
        f"  ratio report/bare: wall {med['report'] / med['bare']:.3f}, "
        f"CPU {med_cpu['report'] / med_cpu['bare']:.3f}"
    )
    return {"bare": med["bare"], "hooked": med["hooked"], "ratio": ratio, "ratio_cpu": ratio_cpu}


if __name__ == "__main__":
    main(sys.argv[1:])
