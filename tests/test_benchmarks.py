"""Every benchmark runs to the end: ``benchmarks/run.py --smoke NAME``, a tiny configuration.

Its figures mean nothing (a small model, one round); the test proves that no benchmark
is broken, so ``make bench`` completes. Each launches processes of its own: slow.
The harness itself (run.py going on past a broken benchmark, the machine each one
records, interleave's ratios, publish.py's tables and statuses) is tested in process.
"""

from __future__ import annotations

import json
import os
import platform
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
    assert done.stdout.count("machine: ") >= 2, done.stdout[-3000:]  # the run's, the benchmark's
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


# --- the harness itself (fast, in process) ---------------------------------------------

sys.path.insert(0, str(ROOT))


def _cpu_model() -> str:
    """Read independently of benchmarks.common: /proc/cpuinfo's "model name", else platform."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


BROKEN = """
from benchmarks.common import benchmark

@benchmark
def main():
    raise SystemExit("launch failed (1): torchrun ...")
"""
FINE = """
from benchmarks.common import benchmark, record

@benchmark
def main():
    record("inspect_vs_floor", 1.01, what="a figure")
"""
CLEAN_EXIT = """
def main():
    raise SystemExit(0)
"""


def test_run_goes_on_after_a_benchmark_raises_system_exit_and_fails_at_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from benchmarks import common, run

    (tmp_path / "bench_a_broken.py").write_text(BROKEN)
    (tmp_path / "bench_b_fine.py").write_text(FINE)
    (tmp_path / "bench_c_clean_exit.py").write_text(CLEAN_EXIT)
    monkeypatch.setattr(run, "HERE", tmp_path)
    monkeypatch.setattr(common, "RESULTS", [])
    monkeypatch.setattr(common, "CONTEXTS", [])
    out = tmp_path / "last-run.json"
    assert run.main(["--json", str(out)]) == 1  # a benchmark broke: the run fails at its end
    data = json.loads(out.read_text())
    assert data["failed"] == ["bench_a_broken"]  # SystemExit(0) is no failure
    assert [r["key"] for r in data["results"]] == ["inspect_vs_floor"]  # b ran after a
    assert data["results"][0]["bench"] == "bench_b_fine"
    assert data["results"][0]["threads"] == torch.get_num_threads()
    assert data["results"][0]["target"] == "<= 1.02"
    # every benchmark's machine at its start: CPU model, torch and its threads, load
    assert [c["bench"] for c in data["benchmarks"]] == ["bench_a_broken", "bench_b_fine"]
    for c in data["benchmarks"]:
        assert c["cpu"] == _cpu_model()
        assert c["torch"] == torch.__version__
        assert c["threads"] == torch.get_num_threads()
        assert c["cores"] == os.cpu_count()
        assert all(c[k] >= 0 for k in ("load_1min", "load_5min", "load_15min"))
    assert data["torch"] == torch.__version__
    assert data["machine"]["cpu"] == _cpu_model()


def test_every_benchmark_prints_and_keeps_its_machine() -> None:
    import importlib.util

    for name in NAMES:
        path = ROOT / "benchmarks" / f"bench_{name}.py"
        spec = importlib.util.spec_from_file_location(f"_bench_{name}", path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert getattr(module.main, "benchmark", False), f"bench_{name}.main lacks @benchmark"


def test_interleave_gives_the_ratio_against_every_other_run(monkeypatch: pytest.MonkeyPatch):
    from benchmarks import common

    now = [0.0]

    class Clock:
        @staticmethod
        def perf_counter() -> float:
            return now[0]

        @staticmethod
        def process_time() -> float:
            return now[0]

    monkeypatch.setattr(common, "time", Clock)
    costs = {"bare": 2.0, "floor": 2.5, "cmd": 3.0}

    def run(name: str):
        def go() -> None:
            now[0] += costs[name]

        return go

    res = common.interleave({k: run(k) for k in costs}, 3)
    assert res["cmd"]["ratio"] == pytest.approx(3.0 / 2.0)
    assert res["cmd"]["vs"]["floor"] == pytest.approx(3.0 / 2.5)
    assert res["floor"]["vs"]["cmd"] == pytest.approx(2.5 / 3.0)
    assert res["bare"]["wall"] == pytest.approx(2.0)


def _run(cpu: str, results: list[dict], **extra: object) -> dict:
    return {
        "date": "2030-01-02 03:04 UTC",
        "torch": "9.9.0",
        "python": "3.99.0",
        "machine": {"cpu": cpu, "cores": 3, "threads": 3, "load_1min": 0.5},
        "failed": [],
        "results": results,
        **extra,
    }


def test_publish_names_the_machine_judges_each_target_and_sets_other_cpus_beside(
    tmp_path: Path,
) -> None:
    from benchmarks import publish

    figures = [
        {"key": "inspect_vs_floor", "value": 1.01, "what": "inspect / floor", "threads": 3},
        {"key": "grads_vs_floor", "value": 1.2, "what": "grads / floor", "threads": 1},
        {"key": "inspect", "value": 1.5, "what": "inspect / bare", "threads": 3},
    ]
    data = _run("CPU-A", figures)
    other = tmp_path / "other-runs"
    other.mkdir()
    beside = [
        {"key": "inspect_vs_floor", "value": 1.04, "what": "inspect / floor"},
        # the same key, another measurement (a floor that read less): not set beside
        {"key": "grads_vs_floor", "value": 1.11, "what": "grads / old floor"},
    ]
    (other / "b.json").write_text(json.dumps(_run("CPU-B", beside)))
    (other / "a.json").write_text(  # the same CPU model as this run: left out
        json.dumps(_run("CPU-A", [{"key": "inspect_vs_floor", "value": 7.0, "what": "x"}]))
    )
    others = publish.other_runs(data, other)
    assert [o["machine"]["cpu"] for o in others] == ["CPU-B"]
    text = publish.table(data, None, others)
    head = text.splitlines()[0]
    for part in ("CPU-A", "3 cores", "torch 9.9.0", "3 threads", "2030-01-02 03:04 UTC"):
        assert part in head
    rows = {
        ln.split(" | ")[0].lstrip("| "): ln.strip("| ").split(" | ")
        for ln in text.splitlines()
        if ln.startswith("| ") and not ln.startswith("| what")
    }
    # what | threads | figure | target | status | CPU-B
    assert rows["inspect / floor"] == ["inspect / floor", "3", "1.010", "<= 1.02", "met", "1.040"]
    assert rows["grads / floor"] == ["grads / floor", "1", "1.200", "<= 1.03", "NOT MET", "-"]
    assert rows["inspect / bare"][3:] == ["-", "-", "-"]  # no target against a bare forward
    assert "Also measured on [1] CPU-B: grads / old floor: 1.110." in text
    assert "| CPU-B [1] |" in text
    lines = publish.statuses(data)
    assert len(lines) == 2
    assert lines[0].startswith("met") and "inspect_vs_floor" in lines[0]
    assert lines[1].startswith("NOT MET") and "grads_vs_floor" in lines[1]


def test_the_header_says_how_the_run_was_made(tmp_path: Path) -> None:
    from benchmarks import publish

    for name in ("bench_a.py", "bench_b.py", "bench_memory.py"):
        (tmp_path / name).write_text("")
    every = {"benchmarks": [{"bench": n} for n in ("bench_a", "bench_b", "bench_memory")]}
    assert publish.ran_by(every, tmp_path) == "`make bench`"
    some = {"benchmarks": [{"bench": "bench_b"}, {"bench": "bench_a"}]}
    assert publish.ran_by(some, tmp_path) == (
        "`python benchmarks/run.py a b` (every benchmark but bench_memory)"
    )
    # one that failed before it printed its machine still ran
    assert publish.ran_by({**some, "failed": ["bench_memory"]}, tmp_path) == "`make bench`"
    # the real run the tables were made from names what it ran
    data = json.loads((publish.ROOT / "benchmarks" / "last-run.json").read_text())
    assert publish.header(data).startswith("Measured by " + publish.ran_by(data))
