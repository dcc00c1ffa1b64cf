"""Run every ``benchmarks/bench_*.py`` (each has ``main()``) to the end and print their figures.

Usage: ``python benchmarks/run.py [--smoke] [--json FILE] [NAME ...]``; NAME picks
bench_NAME.py. ``make bench`` runs them all and writes ``benchmarks/last-run.json``
(the figures, the date, torch's version and the machine), which
``python benchmarks/publish.py`` turns into the tables of README.md and
docs/performance.md (``make bench-docs`` does both). ``--smoke``: each benchmark once,
in a tiny configuration, to prove it runs (``tests/test_benchmarks.py``); its figures
mean nothing and no file is written.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def machine() -> dict[str, object]:
    """What the figures were taken on, and how busy it was."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "load_1min": round(load[0], 2)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--json", default="", help="write the figures there")
    parser.add_argument("names", nargs="*")
    args = parser.parse_args(argv)
    if args.smoke:
        os.environ["HOOKCLI_BENCH_SMOKE"] = "1"
    from benchmarks import common

    files = sorted(HERE.glob("bench_*.py"))
    if args.names:
        files = [f for f in files if f.stem.removeprefix("bench_") in args.names]
    start = datetime.datetime.now(datetime.timezone.utc)
    loads = [machine()["load_1min"]]
    failed = []
    for path in files:
        print(f"== {path.stem}", flush=True)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        try:  # one broken benchmark does not stop the others
            spec.loader.exec_module(module)
            module.main()
        except Exception:
            traceback.print_exc()
            failed.append(path.stem)
        loads.append(machine()["load_1min"])
    if args.json and not args.smoke:
        import torch

        info = machine()
        info["load_1min"] = max(loads)  # type: ignore[type-var]
        data = {
            "date": start.strftime("%Y-%m-%d %H:%M UTC"),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "machine": info,
            "failed": failed,
            "results": common.RESULTS,
        }
        Path(args.json).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        print(f"figures written to {args.json}")
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
