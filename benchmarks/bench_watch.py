"""``hookcli watch``'s cost on whole training runs: watched / unwatched wall time.

Two real training scripts of the tests (``tests/watch_scripts/``), 200 optimizer steps
each, run unchanged as whole processes, timed from start to exit (what a user waits for):

- ``gpt_char.py``: the 2-block GPT-style character model (AdamW, warm-up + cosine
  ``LambdaLR``, gradient clipping), batch 16 of 32 characters;
- ``cnn_bn.py --model resnet18``: torchvision's resnet18 (no weights) on random
  3x32x32 images, batch 8, SGD with momentum, a ``torch.no_grad()`` evaluation every
  5 steps.

Three ways to run each: ``bare`` (``python SCRIPT ARGS``), ``watch`` (``python -m hookcli
watch --out DIR -- python SCRIPT ARGS``, the defaults) and ``every50`` (the same with
``--every 50``), in interleaved rounds (``interleave``: one warm-up of each, the order
rotating); the figure is the median of the per-round wall-time ratios against ``bare``
(the processes' CPU seconds are printed beside, from ``RUSAGE_CHILDREN``). A fourth way,
``again``, runs the bare command once more in each round: its ratio against ``bare``
(two identical unwatched runs) is the benchmark's own noise on this machine, printed
and published beside the figures, since whole processes of a few seconds vary by a few
per cent from one start to the next on a shared machine. Targets:
<= 1.05 at the defaults, <= 1.02 with ``--every 50``. Every process runs with
``PYTHONPATH`` set to this checkout, so this checkout's hookcli is the one measured, and
with torch's default thread count. The watched runs must train exactly as the bare ones:
the scripts print every loss as ``float.hex`` and a digest of the final weights, and a
watched run whose lines differ fails the benchmark.

``--device cuda`` trains both on CUDA (the scripts' own ``--device``; the figures' keys
then end in ``_cuda``, and the targets are the same).

In one process (``inproc``, the target the monitor itself is held to): torchvision's
resnet18 (no weights, 10 classes) at batch 8 of 3x32x32, SGD with momentum, the same
fixed batches every way; ``bare`` is that loop plus one read of every gradient per step
(a ``sum`` of each, the least a per-step NaN check reads), ``watch`` the plain loop
inside ``hookcli.watch(model)`` (the defaults, ``every=10``), ``every50`` the same with
``every=50``, and ``again`` the reference loop once more (its ratio is this
measurement's own noise). Interleaved rounds of ``--inproc-steps`` steps each (100: a
round enters ``hookcli.watch`` once, so its first step logs as a run's first step does,
and ``every=10`` logs 11 of 100 steps as a long run logs one in ten; ``every=50`` logs
steps 1, 50 and 100 of a round, 3 in 100 where a long run logs 2, and step 1 is the
one that allocates the parameters' copy), the median of the per-round ratios; the
per-step times are printed and recorded. Targets: <= 1.05 at the defaults, <= 1.02 at
``every=50``. Two figures of the same rounds side by side: the wall-clock ratio
(``watch_inproc_resnet18*``, the target's figure: the time a user waits) and the ratio
of this process's CPU time (``time.process_time()``: ``watch_inproc_cpu_resnet18*``),
each with its own noise row (the reference's second run, ``..._again``). The CPU time
leaves out the time the process waits while other processes hold the cores, so on a
shared machine it moves less from one round to the next than the wall clock; it counts
every thread of the process, the time torch's idle OpenMP workers spin waiting for
work included.

Usage: ``python benchmarks/bench_watch.py [--rounds 5] [--steps 200] [--only gpt]
[--device cuda] [--inproc-steps 100] [--inproc-rounds 5] [--threads N]``; ``--only inproc`` runs the
in-process measurement alone; ``--only breakdown``: where a watched step's time goes
(the monitor's hooks in one thread's CPU time, unlogged and logged steps, beside the
reference's read); ``--smoke`` (``benchmarks/run.py --smoke watch``): 3 steps,
one round.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import (  # noqa: E402
    TARGETS,
    benchmark,
    interleave,
    record,
    rounds,
    smoke,
    target_line,
)

SCRIPTS = ROOT / "tests" / "watch_scripts"
# (key, script, its arguments, what)
RUNS: tuple[tuple[str, str, list[str], str], ...] = (
    ("gpt", "gpt_char.py", [], "the GPT-style char model"),
    (
        "resnet18",
        "cnn_bn.py",
        ["--model", "resnet18", "--batch", "8", "--size", "32"],
        "resnet18 on random 3x32x32",
    ),
)


def _training(stdout: str) -> list[str]:
    """The lines that say how the run trained: every loss and the final weights."""
    return [
        line
        for line in stdout.splitlines()
        if line.startswith("step ") or line.startswith("weights sha256 ")
    ]


class Runner:
    """One script run three ways; remembers what the bare run printed."""

    def __init__(self, script: str, args: list[str], tmp: Path):
        self.command = [sys.executable, str(SCRIPTS / script), *args]
        self.tmp = tmp
        self.count = itertools.count()
        self.bare_lines: list[str] | None = None
        # this checkout first, then what the caller's PYTHONPATH held (packages there)
        path = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
        # CPU seconds (user + system) of each run's processes, by way of running
        self.cpu: dict[str, list[float]] = {}

    def _run(self, cmd: list[str], way: str) -> str:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(
            cmd, env=self.env, capture_output=True, text=True, timeout=1800, check=False
        )
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        self.cpu.setdefault(way, []).append(cpu)
        if done.returncode != 0:
            raise SystemExit(f"run failed ({done.returncode}): {cmd}\n{done.stderr[-2000:]}")
        # both streams: the script's lines may come on either under watch
        return done.stdout + "\n" + done.stderr

    def bare(self, way: str = "bare") -> None:
        lines = _training(self._run(self.command, way))
        if not lines:
            raise SystemExit(f"no training lines from {self.command}")
        if self.bare_lines is not None and lines != self.bare_lines:
            raise SystemExit(f"two unwatched runs trained differently: {self.command}")
        self.bare_lines = lines

    def watched(self, *options: str) -> None:
        out = self.tmp / f"run{next(self.count)}"
        cmd = [sys.executable, "-m", "hookcli", "watch", *options, "--out", str(out), "--"]
        lines = _training(self._run([*cmd, *self.command], "every50" if options else "watch"))
        if self.bare_lines is not None and lines != self.bare_lines:
            raise SystemExit(
                f"the watched run trained differently from the bare one: {cmd + self.command}"
            )


class InProcess:
    """resnet18's training loop in this process, three ways (see the docstring)."""

    def __init__(self, steps: int, device: str) -> None:
        import torch
        import torchvision

        torch.manual_seed(0)
        self.torch = torch
        self.device = torch.device(device)
        self.model = torchvision.models.resnet18(weights=None, num_classes=10).to(self.device)
        self.model.train()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        gen = torch.Generator().manual_seed(0)
        self.batches = [
            (
                torch.randn(8, 3, 32, 32, generator=gen).to(self.device),
                torch.randint(10, (8,), generator=gen).to(self.device),
            )
            for _ in range(steps)
        ]
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.sink = 0.0

    def _step(self, x: Any, y: Any, read: bool) -> None:
        torch = self.torch
        self.opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        if read:  # one read of every gradient, as a per-step NaN check needs at least
            sums = [p.grad.sum() for p in self.params if p.grad is not None]
            self.sink += float(torch.stack(sums).sum())
        self.opt.step()
        self.sink += float(loss.detach())

    def reference(self) -> None:
        for x, y in self.batches:
            self._step(x, y, True)
        self._sync()

    def watched(self, every: int) -> None:
        import hookcli

        with hookcli.watch(self.model, self.opt, every=every):
            for x, y in self.batches:
                self._step(x, y, False)
            self._sync()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()


def breakdown(steps: int, n: int, device: str) -> None:
    """Where a watched step's time goes (``--only breakdown``): the monitor's hooks
    (``optimizer.step()``'s pre- and post-hook, the backward wrapper, the forward hook)
    timed in the CPU time of the thread that runs them, split by whether the step logs,
    beside the reference's read of every gradient timed the same way, and what a logged
    step's figures take inside those hooks (the gradient norms; the parameters' copy
    with their weight norms; the update's difference and norms; the activation
    statistics), the first logged step of a round (which allocates the copy) apart from
    the others. Torch runs on that one thread here (``set_num_threads(1)``, restored
    after): the CPU time of one thread stays close to the work done on a shared machine,
    where the wall clock does not (and a process's CPU time counts its OpenMP threads'
    spinning)."""
    import time

    import torch

    from hookcli.watch import monitor as mon

    clock = time.thread_time
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    spent: dict[tuple[str, bool], float] = {}

    def timed(name: str, real: Any) -> Any:
        @functools.wraps(real)
        def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
            track = self._all_tracks[0] if self._all_tracks else None
            logs = track is None or (  # before its track exists: step 1, which logs
                track.pending.logged if track.pending is not None else track.next_logged
            )
            start = clock()
            try:
                return real(self, *args, **kwargs)
            finally:
                spent[(name, logs)] = spent.get((name, logs), 0.0) + clock() - start

        return hook

    loop = InProcess(steps, device)
    read = [0.0]

    def step(x: Any, y: Any, reads: bool) -> None:
        loop.opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(loop.model(x), y)
        loss.backward()
        if reads:
            start = clock()
            sums = [p.grad.sum() for p in loop.params if p.grad is not None]
            loop.sink += float(torch.stack(sums).sum())
            read[0] += clock() - start
        loop.opt.step()
        loop.sink += float(loss.detach())

    loop._step = step  # type: ignore[method-assign]
    names = ("_pre", "_post", "_before_backward", "_forward_hook")
    saved = {name: getattr(mon.Monitor, name) for name in names}
    for name in names:
        setattr(mon.Monitor, name, timed(name, saved[name]))
    # the figures inside the hooks, on logged steps: (name, first logged step of a round)
    inner: dict[tuple[str, bool], float] = {}
    figures = {
        "_norm_vector": "gradient norms",
        "_copies_normed": "copy + weight norms",
        "_updates_normed": "update norms",
        "_stats": "activation statistics",
    }
    saved_figures = {name: getattr(mon, name) for name in figures}

    def inside(name: str, real: Any) -> Any:
        @functools.wraps(real)
        def figure(*args: Any, **kwargs: Any) -> Any:
            track = loop_monitor[0]._all_tracks[0] if loop_monitor[0]._all_tracks else None
            if track is not None and not (
                track.pending.logged if track.pending is not None else track.next_logged
            ):
                return real(*args, **kwargs)
            first = track is None or track.steps <= 1
            start = clock()
            try:
                return real(*args, **kwargs)
            finally:
                inner[(name, first)] = inner.get((name, first), 0.0) + clock() - start

        return figure

    loop_monitor: list[Any] = [None]
    real_install = mon.Monitor.install

    def install(self: Any, *args: Any, **kwargs: Any) -> Any:
        loop_monitor[0] = self
        return real_install(self, *args, **kwargs)

    mon.Monitor.install = install  # type: ignore[method-assign]
    for name in figures:
        setattr(mon, name, inside(name, saved_figures[name]))
    try:
        for every in (10, 50):
            loop.reference()
            loop.watched(every)  # warm-up
            read[0] = 0.0
            spent.clear()
            inner.clear()
            for _ in range(n):
                loop.reference()
                loop.watched(every)
            logged = sum(1 for k in range(1, steps + 1) if k == 1 or k % every == 0)
            counts = {True: logged * n, False: (steps - logged) * n}
            per = {
                logs: 1e3 * sum(v for (_, lg), v in spent.items() if lg == logs) / counts[logs]
                for logs in (False, True)
            }
            parts = ", ".join(
                f"{name.strip('_')} {1e3 * v / counts[logs]:.3f}"
                for (name, logs), v in sorted(spent.items())
                if logs
            )
            ref = 1e3 * read[0] / (steps * n)
            # what the monitor adds over the reference's read, averaged over every step
            extra = sum((per[logs] - ref) * counts[logs] for logs in (False, True)) / (steps * n)
            print(
                f"every={every}, {n} rounds of {steps} steps ({torch.get_num_threads()} "
                f"threads), CPU ms a step: the reference's read {ref:.3f}; the monitor on "
                f"an unlogged step {per[False]:.3f}, on a logged step {per[True]:.3f} "
                f"({parts}); {logged} logged steps a round; over the reference's read, "
                f"averaged over every step: {extra:.3f}"
            )
            later = max(1, (logged - 1) * n)
            split = ", ".join(
                f"{label} {1e3 * inner.get((name, False), 0.0) / later:.3f}"
                for name, label in figures.items()
            )
            first = ", ".join(
                f"{label} {1e3 * inner.get((name, True), 0.0) / n:.3f}"
                for name, label in figures.items()
            )
            print(
                f"  of which, on a logged step after the first: {split}; "
                f"on a round's first step: {first}"
            )
    finally:
        torch.set_num_threads(threads)
        for name in names:
            setattr(mon.Monitor, name, saved[name])
        for name in figures:
            setattr(mon, name, saved_figures[name])
        mon.Monitor.install = real_install  # type: ignore[method-assign]


def in_process(steps: int, n: int, device: str) -> dict[str, float]:
    """The in-process figures: watched / reference at the defaults and every=50."""
    import torch

    loop = InProcess(steps, device)
    res = interleave(
        {
            "bare": loop.reference,
            "watch": functools.partial(loop.watched, 10),
            "every50": functools.partial(loop.watched, 50),
            "again": loop.reference,
        },
        n,
    )
    on = "" if device == "cpu" else f"_{device.split(':')[0]}"
    what = f"resnet18 at batch 8 of 3x32x32, in one process, {steps} steps a round, {n} rounds"
    if on:
        what += f", on {device}"
    print(f"{what} (torch {torch.__version__}, {torch.get_num_threads()} threads):")
    for way, label in (
        ("bare", "the loop + one read of every gradient"),
        ("watch", "inside hookcli.watch(model), every=10"),
        ("every50", "inside hookcli.watch(model, every=50)"),
        ("again", "the loop + one read again"),
    ):
        print(f"  {label}: {1e3 * res[way]['wall'] / steps:.2f} ms a step (median round)")
    key = "watch_inproc_resnet18"
    noise = res["again"]["ratio"]
    print(target_line("  watched / reference, defaults", res["watch"]["ratio"], key, noise))
    print(
        target_line(
            "  watched / reference, every=50", res["every50"]["ratio"], f"{key}_every50", noise
        )
    )
    print(f"  reference again / reference (this measurement's noise): {noise:.3f}")
    # the same rounds in this process's CPU time (the docstring): its own noise row
    cpu_noise = res["again"]["cpu_ratio"]
    for way, label in (
        ("bare", "the loop + one read of every gradient"),
        ("watch", "inside hookcli.watch(model), every=10"),
        ("every50", "inside hookcli.watch(model, every=50)"),
    ):
        print(f"  {label}: {1e3 * res[way]['cpu'] / steps:.2f} CPU ms a step (median round)")
    cpu_key = "watch_inproc_cpu_resnet18"
    print(
        target_line(
            "  in CPU time, watched / reference, defaults",
            res["watch"]["cpu_ratio"],
            cpu_key,
            cpu_noise,
        )
    )
    print(
        target_line(
            "  in CPU time, watched / reference, every=50",
            res["every50"]["cpu_ratio"],
            f"{cpu_key}_every50",
            cpu_noise,
        )
    )
    print(f"  in CPU time, reference again / reference (its noise): {cpu_noise:.3f}")
    for k, field, noise, clock in (
        (key, "ratio", res["again"]["ratio"], ""),
        (cpu_key, "cpu_ratio", cpu_noise, " in process CPU time"),
    ):
        label = f"`hookcli.watch` / the same loop plus one read of every gradient{clock}, {what}"
        record(
            f"{k}{on}", res["watch"][field], what=f"{label}, defaults", target=TARGETS.get(k, "-")
        )
        record(
            f"{k}_every50{on}",
            res["every50"][field],
            what=f"{label}, `every=50`",
            target=TARGETS.get(f"{k}_every50", "-"),
        )
        record(
            f"{k}_again{on}",
            noise,
            what=f"the same reference loop twice{clock}, {what} (this measurement's own noise: "
            "1 where the machine is steady)",
        )
    for way, label in (
        ("bare", "reference"),
        ("watch", "watched, defaults"),
        ("every50", "watched, every=50"),
    ):
        record(
            f"{key}_{way}_step_ms{on}",
            1e3 * res[way]["wall"] / steps,
            what=f"one step, {label}, {what}",
            unit="ms",
        )
        record(
            f"{key}_{way}_step_cpu_ms{on}",
            1e3 * res[way]["cpu"] / steps,
            what=f"one step's process CPU time, {label}, {what}",
            unit="ms",
        )
    return {f"{key}{on}": res["watch"]["ratio"], f"{key}_every50{on}": res["every50"]["ratio"]}


@benchmark
def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated keys of what to time (inproc, gpt, resnet18; breakdown: "
        "the monitor's CPU time per step, by hook)",
    )
    parser.add_argument(
        "--device", default="cpu", help="the scripts' --device (cuda: the figures' keys end _cuda)"
    )
    parser.add_argument("--inproc-steps", type=int, default=100, help="steps a round, in process")
    parser.add_argument("--inproc-rounds", type=int, default=5, help="rounds, in process")
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads in process (0: torch's default)"
    )
    args = parser.parse_args([] if argv is None else argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    on = "" if args.device == "cpu" else f"_{args.device.split(':')[0]}"
    only = {k for k in args.only.split(",") if k}
    steps = 3 if smoke() else args.steps
    n = rounds(args.rounds)
    result: dict[str, float] = {}
    if "breakdown" in only:
        breakdown(3 if smoke() else args.inproc_steps, rounds(args.inproc_rounds), args.device)
    if not only or "inproc" in only:
        result.update(
            in_process(3 if smoke() else args.inproc_steps, rounds(args.inproc_rounds), args.device)
        )
    with tempfile.TemporaryDirectory() as tmp:
        for key, script, extra, what in RUNS:
            if only and key not in only:
                continue
            folder = Path(tmp, key)
            folder.mkdir()
            device = [] if args.device == "cpu" else ["--device", args.device]
            runner = Runner(script, [*extra, *device, "--steps", str(steps), "--seed", "0"], folder)
            if on:
                what = f"{what} on {args.device}"
            res = interleave(
                {
                    "bare": runner.bare,
                    "watch": runner.watched,
                    "every50": functools.partial(runner.watched, "--every", "50"),
                    "again": functools.partial(runner.bare, "again"),
                },
                n,
            )
            print(f"{what}, {steps} steps, {n} rounds:")
            # the timed runs' (interleave's warm-up of each way is the first)
            cpu = {way: statistics.median(t[1:] or t) for way, t in runner.cpu.items()}
            for way, label in (
                ("bare", "unwatched"),
                ("watch", "watched"),
                ("every50", "--every 50"),
                ("again", "unwatched again"),
            ):
                print(
                    f"  {label}: median wall {res[way]['wall']:.2f} s, "
                    f"median CPU {cpu[way]:.2f} s (the run's processes)"
                )
            print(
                target_line(
                    "  watched / unwatched, defaults", res["watch"]["ratio"], f"watch_{key}"
                )
            )
            print(
                target_line(
                    "  watched / unwatched, --every 50",
                    res["every50"]["ratio"],
                    f"watch_{key}_every50",
                )
            )
            print(
                f"  unwatched again / unwatched (this machine's noise): {res['again']['ratio']:.3f}"
            )
            label = f"`hookcli watch` / unwatched wall time, {what}, {steps} steps"
            record(
                f"watch_{key}{on}",
                res["watch"]["ratio"],
                what=f"{label}, defaults",
                target=TARGETS.get(f"watch_{key}", "-"),  # the same target on any device
            )
            record(
                f"watch_{key}_every50{on}",
                res["every50"]["ratio"],
                what=f"{label}, `--every 50`",
                target=TARGETS.get(f"watch_{key}_every50", "-"),
            )
            record(
                f"watch_{key}_again{on}",
                res["again"]["ratio"],
                what=f"the same unwatched run twice, {what}, {steps} steps (the benchmark's "
                "own noise: 1 where the machine is steady)",
            )
            record(
                f"watch_{key}_bare{on}",
                res["bare"]["wall"],
                what=f"unwatched wall time, {what}, {steps} steps",
                unit="s",
            )
            result[f"watch_{key}{on}"] = res["watch"]["ratio"]
            result[f"watch_{key}_every50{on}"] = res["every50"]["ratio"]
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
