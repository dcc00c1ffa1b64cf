"""Every benchmark runs to the end: ``benchmarks/run.py --smoke NAME``, a tiny configuration.

Its figures mean nothing (a small model, one round); the test proves that no benchmark
is broken, so ``make bench`` completes. Each launches processes of its own: slow.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NAMES = sorted(p.stem.removeprefix("bench_") for p in (ROOT / "benchmarks").glob("bench_*.py"))


def test_every_benchmark_is_listed():
    assert {"stats", "grads", "inspect", "cost", "ablate", "features_failure"} <= set(NAMES)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_benchmark_runs_to_the_end(name: str) -> None:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HOOKCLI_NO_CONFIG="1")
    done = subprocess.run(
        [sys.executable, "benchmarks/run.py", "--smoke", name],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert f"== bench_{name}" in done.stdout
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
