"""Run every ``benchmarks/bench_*.py`` (each has ``main()``) and print their figures.

Usage: ``python benchmarks/run.py [NAME ...]`` (``make bench``); NAME picks bench_NAME.py.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    files = sorted(HERE.glob("bench_*.py"))
    if argv:
        files = [f for f in files if f.stem.removeprefix("bench_") in argv]
    for path in files:
        print(f"== {path.stem}", flush=True)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
