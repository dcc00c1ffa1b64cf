"""inspect overhead, as ratios against bare PyTorch.

1. In one process: the public call ``hookcli.inspect(model, x)`` (session, forward,
   rows, the Report) on resnet50, batch 8, against a bare ``torch.inference_mode()``
   forward and against a floor: the bare forward with plain forward-pre and forward
   hooks on every module that read what inspect reports of each call, once (the shape
   of each tensor input and output), and after it each module's own parameter count:
   the least that inspect's rows cost before any of hookcli's own work. Interleaved
   rounds, medians of the per-round ratios. Target: inspect / floor <= 1.02 (the ratios
   to the bare forward and to the no-op-hook floor, the floor before 2026-11-26, are
   shown beside it).
2. Whole process: ``hookcli inspect resnet50 --format json`` against a plain
   script that imports torch+torchvision, builds resnet50 and runs one forward.
   Both end with the interpreter's ordinary shutdown (``HOOKCLI_FULL_EXIT=1``):
   that ratio leads; the shipped ``os._exit`` figure follows. Target <= 1.05.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    TARGETS,
    benchmark,
    interleave,
    ratio_line,
    record,
    rounds,
    smoke,
    target_line,
)

REPEATS = 15  # rounds of a 0.2 s forward: a median of 5 moved by 3% from run to run


def MODEL() -> str:
    return "resnet18" if smoke() else "resnet50"


def SIZE() -> int:
    return 64 if smoke() else 224


def plain_script() -> str:
    """Build, one forward, and the ordinary interpreter shutdown."""
    return f"""
import torch, torchvision
torch.manual_seed(0)
model = torchvision.models.get_model({MODEL()!r}, weights=None).eval()
x = torch.randn((1, 3, {SIZE()}, {SIZE()}), generator=torch.Generator().manual_seed(0))
with torch.inference_mode():
    model(x)
"""


def in_process(batch: int = 8, repeats: int = REPEATS) -> dict[str, dict[str, Any]]:
    import torch

    import hookcli
    from hookcli.options import ModelOptions, RunOptions
    from hookcli.pipeline import prepare

    prepared = prepare(ModelOptions(MODEL()), RunOptions(inputs=(f"{batch}x3x{SIZE()}x{SIZE()}",)))
    model, x = prepared.model, prepared.inputs.args[0]
    model.eval()  # what inspect runs in by default (torchvision builds in train mode)

    def bare() -> None:
        with torch.inference_mode():
            model(x)

    def inspect() -> None:  # the public call, report included
        hookcli.inspect(model, x)

    def noop(*args: object) -> None:
        return None

    def noop_floor() -> None:  # torch's own cost of a forward-pre and forward hook per module
        handles = [
            h
            for m in model.modules()
            for h in (m.register_forward_pre_hook(noop), m.register_forward_hook(noop))
        ]
        try:
            bare()
        finally:
            for h in handles:
                h.remove()

    shapes: list[Any] = []

    def read_inputs(module: object, args: tuple[Any, ...]) -> None:
        shapes.append([tuple(a.shape) for a in args if isinstance(a, torch.Tensor)])

    def read_output(module: object, args: object, output: Any) -> None:
        shapes.append(tuple(output.shape) if isinstance(output, torch.Tensor) else None)

    def floor() -> None:  # hooks that read each call's shapes once; each module's params
        shapes.clear()
        handles = [
            h
            for m in model.modules()
            for h in (
                m.register_forward_pre_hook(read_inputs),
                m.register_forward_hook(read_output),
            )
        ]
        try:
            bare()
            for m in model.modules():
                shapes.append(sum(p.numel() for p in m.parameters(recurse=False)))
        finally:
            for h in handles:
                h.remove()
            shapes.clear()

    runs = {"bare": bare, "inspect": inspect, "floor": floor, "noop_floor": noop_floor}
    return interleave(runs, rounds(repeats))


def whole_process(repeats: int = 3) -> tuple[float, float, float]:
    """Medians: the plain script, hookcli, and hookcli with an ordinary interpreter
    shutdown (``HOOKCLI_FULL_EXIT=1``), interleaved."""
    size = f"1x3x{SIZE()}x{SIZE()}"
    hookcli = [sys.executable, "-m", "hookcli", "inspect", MODEL(), "-i", size, "--format", "json"]
    plain = [sys.executable, "-c", plain_script()]

    def wall(cmd: list[str], full_exit: str = "") -> float:
        env = {**os.environ, "HOOKCLI_FULL_EXIT": full_exit}
        start = time.perf_counter()
        subprocess.run(
            cmd, check=True, stdout=subprocess.DEVNULL, cwd=Path(__file__).parent.parent, env=env
        )
        return time.perf_counter() - start

    wall(plain)  # warm the file cache
    t_plain, t_cli, t_full = [], [], []
    for _ in range(rounds(repeats)):
        t_plain.append(wall(plain))
        t_cli.append(wall(hookcli))
        t_full.append(wall(hookcli, "1"))
    return statistics.median(t_plain), statistics.median(t_cli), statistics.median(t_full)


def help_time(repeats: int = 5) -> float:
    times = []
    for _ in range(rounds(repeats)):
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "hookcli", "--help"], check=True, stdout=subprocess.DEVNULL
        )
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@benchmark
def main() -> None:
    help_s = help_time()
    print(f"hookcli --help: {help_s:.3f} s (target < 0.2 s)", flush=True)
    record("help_s", help_s, what="`hookcli --help` (no torch)", unit="s", threads="-")
    res = in_process()
    vs_floor = res["inspect"]["vs"]["floor"]
    label = (
        f"hookcli.inspect({MODEL()}, x) b8 vs its floor (hooks reading each call's shapes "
        "and each module's parameter count once)"
    )
    print(target_line(label, vs_floor, "inspect_vs_floor"), flush=True)
    record("inspect_vs_floor", vs_floor, what=label)
    label = f"hookcli.inspect({MODEL()}, x) b8 vs a bare forward, in process"
    print(ratio_line(label, res, "inspect"), flush=True)
    record("inspect", res["inspect"]["ratio"], what=label)
    floor_label = (
        "floor: plain forward-pre and forward hooks that read each call's input and output "
        "shapes, then each module's own parameter count, vs a bare forward"
    )
    print(f"{floor_label}: ratio {res['floor']['ratio']:.3f}", flush=True)
    record("inspect_floor", res["floor"]["ratio"], what=floor_label)
    label = (
        f"hookcli.inspect({MODEL()}, x) b8 vs the no-op-hook floor (plain no-op forward-pre "
        "and forward hooks on every module; no target)"
    )
    vs_noop = res["inspect"]["vs"]["noop_floor"]
    print(f"{label}: ratio {vs_noop:.3f}", flush=True)
    record("inspect_vs_noop_floor", vs_noop, what=label)
    plain, cli, full = whole_process()
    # Like for like first: the plain script pays torch's teardown, so does hookcli with
    # HOOKCLI_FULL_EXIT=1; the shipped os._exit figure second.
    print(
        f"inspect {MODEL()} whole process: plain script {plain:.2f} s; hookcli with an "
        f"ordinary shutdown (HOOKCLI_FULL_EXIT=1) {full:.2f} s, ratio {full / plain:.3f} "
        f"(target {TARGETS['inspect_process_full']}); as shipped (os._exit) {cli:.2f} s, "
        f"ratio {cli / plain:.3f}",
        flush=True,
    )
    record(
        "inspect_process_full",
        full / plain,
        what="`hookcli inspect` whole process, full exit, vs a plain script",
    )
    record("inspect_process", cli / plain, what="the same, as shipped (os._exit)")


if __name__ == "__main__":
    main()
