"""What every benchmark shares: the smoke switch, interleaved rounds, the machine, the figures.

- ``smoke()``: True under ``python benchmarks/run.py --smoke`` (``HOOKCLI_BENCH_SMOKE=1``):
  each benchmark runs once in a tiny configuration (a small model, one round), so the
  test suite can prove that it still runs to the end; its figures mean nothing.
- ``@benchmark`` on every benchmark's ``main``: at its start it prints (and keeps, for
  ``benchmarks/last-run.json``) the machine it runs on: the CPU model (``/proc/cpuinfo``'s
  "model name", else ``platform``), the cores, torch's version and thread count, and the
  load average, since a ratio measured on one CPU kind need not hold on another. It also
  byte-compiles this checkout's Python first (``compile_sources``).
- ``interleave(runs, rounds)``: after one warm-up of each, ``rounds`` rounds that each
  time every run once, rotating which goes first, so a neighbour's load on a shared
  machine hits all alike. Medians of wall and process CPU time per run, the median of
  the per-round ratios against the run named ``bare`` (``ratio``), and against every
  other run (``vs[name]``: against a floor, a reference implementation).
- ``record(key, value, ...)``: a figure for ``benchmarks/last-run.json``, with the
  torch thread count it was taken at and its target from ``TARGETS``;
  ``benchmarks/publish.py`` writes the tables of README.md and docs/performance.md.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

RESULTS: list[dict[str, Any]] = []
# One entry per benchmark run: its name and the machine at its start (``machine()``).
CONTEXTS: list[dict[str, Any]] = []
_CURRENT: dict[str, str] = {"bench": ""}

# The targets, in one place: ``record`` takes a figure's target from here and
# ``publish.py`` judges every figure, this run's or an older one's, by today's target.
# The speed targets are relative to the floors measured in the same run (plain hooks
# that only read what each command must read: no exact per-layer figure costs less),
# and cost's to torch's own FLOP counter; the figures against a bare forward are shown
# beside them without a target.
TARGETS: dict[str, str] = {
    "inspect_vs_floor": "<= 1.02",
    "grads_vs_floor": "<= 1.03",
    "stats_vs_floor_1t": "<= 1.25",
    "stats_vs_floor_2t": "<= 1.25",
    "cost_vs_flopcounter_b1": "<= 1.00",
    "cost_vs_flopcounter_b8": "<= 1.00",
    "cost_meta": "<= 2",
    "stats_rss": "<= 1.10",
    "help_s": "< 0.2 s",
    "inspect_process_full": "<= 1.05",
    "inspect_process": "<= 1.05",
    "profile_overhead": "<= 1.10",
    "profile_cpu": "<= 1.10",
    "ablate_one": "<= 1.10",
    "ablate_all": "about 1.10",
    "ddp": "<= 1.25",
    "fsdp": "<= 1.25",
    "features_failure": "about 1",
    "usage_error": "about 1",
    "llama_7b_time_full": "<= 1.0",
    "llama_7b_rss_full": "<= 1.0",
    "llama_7b_time": "<= 1.0",
    "llama_7b_rss": "<= 1.0",
    "llama_70b_time_full": "<= 1.0",
    "llama_70b_rss_full": "<= 1.0",
    "llama_70b_time": "<= 1.0",
    "llama_70b_rss": "<= 1.0",
    "mlp_time_full": "<= 1.15",
    "mlp_time": "<= 1.15",
    "watch_gpt": "<= 1.05",
    "watch_gpt_every50": "<= 1.02",
    "watch_resnet18": "<= 1.05",
    "watch_resnet18_every50": "<= 1.02",
    "watch_inproc_resnet18": "<= 1.05",
    "watch_inproc_resnet18_every50": "<= 1.02",
    "watch_inproc_cpu_resnet18": "<= 1.05",
    "watch_inproc_cpu_resnet18_every50": "<= 1.02",
}


def smoke() -> bool:
    return os.environ.get("HOOKCLI_BENCH_SMOKE") == "1"


def rounds(default: int) -> int:
    return 1 if smoke() else default


def cpu_model() -> str:
    """``/proc/cpuinfo``'s first "model name" (Linux), else what ``platform`` says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def machine() -> dict[str, Any]:
    """What the figures are taken on, and how busy it is now."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "load_1min": round(load[0], 2),
        "load_5min": round(load[1], 2),
        "load_15min": round(load[2], 2),
    }
    import torch

    info["torch"] = torch.__version__
    info["threads"] = torch.get_num_threads()
    info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
    return info


def machine_line(info: dict[str, Any]) -> str:
    gpu = f", {info['gpu']}" if info.get("gpu") else ""
    return (
        f"machine: {info['cpu']} ({info['cores']} cores{gpu}), torch {info['torch']}, "
        f"{info['threads']} torch threads, load average {info['load_1min']} / "
        f"{info['load_5min']} / {info['load_15min']} (1 / 5 / 15 min)"
    )


F = TypeVar("F", bound=Callable[..., Any])


_COMPILED: list[bool] = []


def compile_sources() -> None:
    """Byte-compile this checkout's Python (hookcli, the sample models, the tests'
    scripts), once per process, before anything is timed.

    ``pip install`` compiles a package's modules, and an editable checkout writes its
    ``__pycache__`` on first import, so a user's hookcli starts from bytecode. Where
    ``PYTHONDONTWRITEBYTECODE=1`` is set (these machines set it), nothing is written at
    import, and every process a whole-process benchmark starts would compile hookcli's
    modules from source again (tens of milliseconds a process), which no user pays, while
    torch, torchvision and torchinfo, installed by pip, start from bytecode. Compiling
    here makes both sides start as they would on a user's machine.
    """
    if _COMPILED:
        return
    _COMPILED.append(True)
    import compileall

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for folder in ("hookcli", "sample_models", "tests", "benchmarks"):
        path = os.path.join(root, folder)
        if os.path.isdir(path):
            compileall.compile_dir(path, quiet=2)


def benchmark(main: F) -> F:
    """Decorates a benchmark's ``main``: prints and keeps the machine at its start."""
    name = os.path.splitext(os.path.basename(main.__code__.co_filename))[0]

    @functools.wraps(main)
    def run(*args: Any, **kwargs: Any) -> Any:
        compile_sources()
        info = {"bench": name, **machine()}
        CONTEXTS.append(info)
        _CURRENT["bench"] = name
        print(machine_line(info), flush=True)
        return main(*args, **kwargs)

    run.benchmark = True  # type: ignore[attr-defined]
    return run  # type: ignore[return-value]


def interleave(
    runs: Mapping[str, Callable[[], object]],
    n: int,
    reset: Callable[[], object] | None = None,
) -> dict[str, dict[str, Any]]:
    """Medians over ``n`` interleaved rounds (after a warm-up of each run). ``reset``,
    untimed, after every run: each run starts from the same state, not from what the
    run before it left."""
    for fn in runs.values():
        fn()
        if reset is not None:
            reset()
    names = list(runs)
    wall: dict[str, list[float]] = {k: [] for k in names}
    cpu: dict[str, list[float]] = {k: [] for k in names}
    for r in range(n):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            c0, t0 = time.process_time(), time.perf_counter()
            runs[k]()
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
            if reset is not None:
                reset()
    med = statistics.median
    out: dict[str, dict[str, Any]] = {}
    for k in names:
        out[k] = {"wall": med(wall[k]), "cpu": med(cpu[k])}
        out[k]["vs"] = {
            ref: med(y / x for x, y in zip(wall[ref], wall[k], strict=True))
            for ref in names
            if ref != k
        }
        if "bare" in wall:
            out[k]["ratio"] = med(y / x for x, y in zip(wall["bare"], wall[k], strict=True))
            out[k]["cpu_ratio"] = med(y / x for x, y in zip(cpu["bare"], cpu[k], strict=True))
    return out


def target_bound(target: str) -> tuple[str, float] | None:
    """``<= 1.10`` -> ``("<=", 1.1)``; None for a target without a bound (``-``)."""
    m = re.fullmatch(r"\s*(<=|<|>=|>)\s*([0-9.]+)\s*\S*\s*", target or "")
    return (m.group(1), float(m.group(2))) if m else None


def verdict(value: float, target: str) -> str:
    """``met`` or ``NOT MET`` for a target such as ``<= 1.10`` or ``< 0.2 s``; ``""``
    for none (``-``, ``about 1``)."""
    found = target_bound(target)
    if found is None:
        return ""
    op, bound = found
    ok = {
        "<=": value <= bound,
        "<": value < bound,
        ">=": value >= bound,
        ">": value > bound,
    }[op]
    return "met" if ok else "NOT MET"


def record(
    key: str,
    value: float,
    *,
    what: str = "",
    target: str | None = None,
    unit: str = "x",
    threads: int | str | None = None,
) -> None:
    """One figure of this run (printed by the benchmark itself; published by publish.py).

    ``threads``: the torch thread count it was taken at; by default this process's now
    (a figure from other processes says theirs)."""
    if threads is None and "torch" in sys.modules:
        threads = sys.modules["torch"].get_num_threads()
    RESULTS.append(
        {
            "key": key,
            "value": value,
            "what": what,
            "target": TARGETS.get(key, "-") if target is None else target,
            "unit": unit,
            "threads": threads,
            "bench": _CURRENT["bench"],
        }
    )


def target_line(label: str, value: float, key: str, noise: float | None = None) -> str:
    """``label: 1.013 (target <= 1.02: met)``, the target from ``TARGETS``; with
    ``noise`` (the run's noise row, 1 on a steady machine) "within noise" where the
    margin to the bound is smaller than that row's distance from 1, as publish.py says."""
    target = TARGETS.get(key, "-")
    status = verdict(value, target)
    bound = target_bound(target)
    if (
        status
        and bound is not None
        and noise is not None
        and abs(value - bound[1]) < abs(noise - 1.0)
    ):
        status = "within noise"
    return f"{label}: {value:.3f}" + (f" (target {target}: {status})" if status else "")


def ratio_line(label: str, res: dict[str, dict[str, Any]], name: str) -> str:
    """``label: bare 0.412 s, NAME 0.455 s; ratio 1.104; CPU-time ratio 1.09``."""
    b, r = res["bare"], res[name]
    return (
        f"{label}: bare {b['wall']:.3f} s, {name} {r['wall']:.3f} s; ratio {r['ratio']:.3f}; "
        f"CPU-time ratio {r['cpu_ratio']:.3f}"
    )
