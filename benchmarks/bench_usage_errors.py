"""How fast a usage error comes back: options are checked before torch is imported.

Each case runs ``python -m hookcli inspect sample_models:LeNet BAD-OPTION`` in a fresh
process (exit 2 expected) and is timed from start to exit; the median of ``--repeat``
runs is printed next to two references measured the same way, interleaved with the
cases so that all see the same machine load:

- ``hookcli --help``: the floor (Python, Typer and hookcli's own modules, no torch);
- ``python -c "import torch"``: what a check made after importing torch costs at least.

The ratio column is each case's median over the ``--help`` median (target: about 1.0).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import benchmark, record, rounds

ROOT = Path(__file__).resolve().parent.parent
CASES = {
    "--seed 2**64": ["--seed", str(2**64)],
    "-i bad dims": ["-i", "1x3xq"],
    "-i LOW..HIGH > int64": ["-i", f"int64:1x2:0..{2**63}"],
    "-i overflowing dims": ["-i", "99999999999x99999999999x9999"],
    "--device CPU": ["--device", "CPU"],
    "--device cpu:5": ["--device", "cpu:5"],
    "-o a folder": ["-o", str(ROOT)],
}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["HOOKCLI_NO_CONFIG"] = "1"
    return env


def _time(argv: list[str], codes: list[int]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, env=_env(), capture_output=True, cwd=ROOT, check=False)
    elapsed = time.perf_counter() - start
    codes.append(proc.returncode)
    return elapsed


@benchmark
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv or [])
    hookcli = [sys.executable, "-m", "hookcli"]
    help_times: list[float] = []
    torch_times: list[float] = []
    case_times: dict[str, list[float]] = {name: [] for name in CASES}
    codes: dict[str, list[int]] = {name: [] for name in ("help", "torch", *CASES)}
    model = "sample_models:LeNet"
    for _ in range(rounds(args.repeat)):
        help_times.append(_time([*hookcli, "--help"], codes["help"]))
        torch_times.append(_time([sys.executable, "-c", "import torch"], codes["torch"]))
        for name, extra in CASES.items():
            case_times[name].append(_time([*hookcli, "inspect", model, *extra], codes[name]))
    floor = statistics.median(help_times)
    print(f"{'case':<24} {'exit':>4} {'median s':>9} {'/ --help':>9}")
    print(f"{'hookcli --help':<24} {codes['help'][0]:>4} {floor:>9.3f} {1.0:>9.2f}")
    torch_s = statistics.median(torch_times)
    name = "python -c import torch"
    print(f"{name:<24} {codes['torch'][0]:>4} {torch_s:>9.3f} {torch_s / floor:>9.2f}")
    worst = 0.0
    for name, times in case_times.items():
        median = statistics.median(times)
        worst = max(worst, median / floor)
        print(f"{name:<24} {codes[name][0]:>4} {median:>9.3f} {median / floor:>9.2f}")
    record("usage_error", worst, what="slowest usage error vs `hookcli --help`", threads="-")


if __name__ == "__main__":
    main(sys.argv[1:])
