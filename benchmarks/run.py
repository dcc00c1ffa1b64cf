"""Run every ``benchmarks/bench_*.py`` (each has ``main()``) to the end and print their figures.

Usage: ``python benchmarks/run.py [--smoke] [--json FILE] [NAME ...]``; NAME picks
bench_NAME.py. ``make bench`` runs them all and writes ``benchmarks/last-run.json``
(the figures, the date, torch's version, the machine, and each benchmark's CPU model,
torch thread count and load average at its start), which
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
    first = common.machine()  # torch's default thread count, before any benchmark sets one
    print(common.machine_line(first), flush=True)
    loads = [first["load_1min"]]
    failed = []
    for path in files:
        print(f"== {path.stem}", flush=True)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        # One broken benchmark does not stop the others: bench_ddp and bench_fsdp end a
        # failed launch with SystemExit, which is no Exception.
        try:
            spec.loader.exec_module(module)
            module.main()
        except SystemExit as err:
            if err.code not in (None, 0):
                print(f"{path.stem} ended with SystemExit: {err.code}", file=sys.stderr)
                failed.append(path.stem)
        except Exception:
            traceback.print_exc()
            failed.append(path.stem)
        loads.append(common.machine()["load_1min"])
    if args.json and not args.smoke:
        info = dict(first)
        info["load_1min"] = max(loads)
        info["load_1min_start"], info["load_1min_end"] = loads[0], loads[-1]
        data = {
            "date": start.strftime("%Y-%m-%d %H:%M UTC"),
            "torch": info.pop("torch"),
            "python": platform.python_version(),
            "machine": info,
            "benchmarks": common.CONTEXTS,
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
