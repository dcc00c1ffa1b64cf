"""What every benchmark shares: the smoke switch, interleaved rounds, and the figures it records.

- ``smoke()``: True under ``python benchmarks/run.py --smoke`` (``HOOKCLI_BENCH_SMOKE=1``):
  each benchmark runs once in a tiny configuration (a small model, one round), so the
  test suite can prove that it still runs to the end; its figures mean nothing.
- ``interleave(runs, rounds)``: after one warm-up of each, ``rounds`` rounds that each
  time every run once, rotating which goes first, so a neighbour's load on a shared
  machine hits all alike. Medians of wall and process CPU time per run, and the median
  of the per-round ratios against the run named ``bare``.
- ``record(key, value, ...)``: a figure for ``benchmarks/last-run.json``, from which
  ``benchmarks/publish.py`` writes the tables of README.md and docs/performance.md.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

RESULTS: list[dict[str, Any]] = []


def smoke() -> bool:
    return os.environ.get("HOOKCLI_BENCH_SMOKE") == "1"


def rounds(default: int) -> int:
    return 1 if smoke() else default


def interleave(runs: dict[str, Callable[[], object]], n: int) -> dict[str, dict[str, float]]:
    """Medians over ``n`` interleaved rounds (after a warm-up of each run)."""
    for fn in runs.values():
        fn()
    names = list(runs)
    wall: dict[str, list[float]] = {k: [] for k in names}
    cpu: dict[str, list[float]] = {k: [] for k in names}
    for r in range(n):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            c0, t0 = time.process_time(), time.perf_counter()
            runs[k]()
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
    med = statistics.median
    out: dict[str, dict[str, float]] = {}
    for k in names:
        out[k] = {"wall": med(wall[k]), "cpu": med(cpu[k])}
        if "bare" in wall:
            out[k]["ratio"] = med(y / x for x, y in zip(wall["bare"], wall[k], strict=True))
            out[k]["cpu_ratio"] = med(y / x for x, y in zip(cpu["bare"], cpu[k], strict=True))
    return out


def record(key: str, value: float, *, what: str = "", target: str = "", unit: str = "x") -> None:
    """One figure of this run (printed by the benchmark itself; published by publish.py)."""
    RESULTS.append({"key": key, "value": value, "what": what, "target": target, "unit": unit})


def ratio_line(label: str, res: dict[str, dict[str, float]], name: str, target: float) -> str:
    """``label: bare 0.412 s, NAME 0.455 s; ratio 1.10 (target <= 1.10: ok)``."""
    b, r = res["bare"], res[name]
    verdict = "ok" if r["ratio"] <= target else "OVER TARGET"
    return (
        f"{label}: bare {b['wall']:.3f} s, {name} {r['wall']:.3f} s; ratio {r['ratio']:.3f} "
        f"(target <= {target}: {verdict}); CPU-time ratio {r['cpu_ratio']:.3f}"
    )
