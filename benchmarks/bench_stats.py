"""Peak memory and time of ``hookcli stats`` against a bare forward: resnet50, batch 8.

Memory: each figure comes from its own fresh subprocess reading
its peak resident set at its end: ``VmHWM`` from ``/proc/self/status`` on Linux
(``ru_maxrss`` would do elsewhere, but on Linux it carries over the high-water mark of
the process that forked the child, so after an in-process benchmark every child would
report the parent's peak):

- ``idle``: torch + torchvision imported, resnet50 built, input drawn, no forward;
- ``bare``: the same plus one plain ``model(x)`` under ``torch.inference_mode()``;
- ``stats``: the full CLI, ``hookcli stats resnet50 -b 8 -f json -o /dev/null``.

Printed: ``stats/bare`` (target <= 1.10) and, stricter, the memory the forward
adds above ``idle`` in each case.

Time (target: stats/bare <= 2.0): a plain ``model(x)`` under ``torch.inference_mode()``
against the same forward inside a HookSession with the StatsProbe (every hook, the
figures fetched and pooled, the origin found), in one process per thread count
(1 and 2 threads by default). After one warm-up of each, ``--rounds`` rounds each time
both, alternating which goes first, so that a neighbour's load on a shared machine hits
both alike; printed are the medians of each and the median of the per-round ratios
(the target's figure), then the medians of the process's CPU time, which a neighbour
holding the core does not stretch (with one thread; with more, torch's threads also
spend CPU time waiting for each other).

``--baseline FILE`` times another version of ``hookcli/probes/stats.py`` in the same
rounds (``git show REV:hookcli/probes/stats.py > FILE``), for a before/after under the
same load.

Usage: ``python benchmarks/bench_stats.py [--rounds 7] [--threads 1,2] [--time-only]
[--baseline FILE]`` (``python benchmarks/run.py stats`` runs the defaults).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = "resnet50"
BATCH = 8
REPEAT = 2

_PEAK = """
def peak_kib():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
"""
_SETUP = (
    _PEAK
    + f"""
import torch, torchvision
torch.manual_seed(0)
model = torchvision.models.get_model({MODEL!r}, weights=None).eval()
x = torch.randn(({BATCH}, 3, 224, 224), generator=torch.Generator().manual_seed(0))
"""
)

SCRIPTS = {
    "idle": _SETUP + "print(peak_kib())\n",
    "bare": _SETUP
    + textwrap.dedent(
        """
        with torch.inference_mode():
            model(x)
        print(peak_kib())
        """
    ),
    "stats": _PEAK
    + textwrap.dedent(
        f"""
        import os, sys
        from hookcli.cli import main
        sys.argv = ["hookcli", "stats", {MODEL!r}, "-b", "{BATCH}", "-f", "json",
                    "-o", os.devnull]
        try:
            main()
        except SystemExit as e:
            assert not e.code, e.code
        print(peak_kib())
        """
    ),
}

TIMING = textwrap.dedent(
    f"""
    import importlib.util, json, statistics, sys, time, torch
    threads, rounds, baseline = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(threads)
    from hookcli.options import Mode, ModelOptions, RunOptions
    from hookcli.pipeline import prepare, run_session
    from hookcli.probes.stats import StatsProbe

    prepared = prepare(ModelOptions({MODEL!r}), RunOptions(batch_size={BATCH}))
    model, args = prepared.model, prepared.inputs.args

    def bare():
        with torch.inference_mode():
            model(*args)

    def session(probe_class):
        return lambda: run_session(prepared, [probe_class()], mode=Mode.EVAL)

    runs = {{"bare": bare, "stats": session(StatsProbe)}}
    if baseline:  # another version of the probe module, timed alongside
        spec = importlib.util.spec_from_file_location("baseline_stats", baseline)
        module = importlib.util.module_from_spec(spec)
        sys.modules["baseline_stats"] = module
        spec.loader.exec_module(module)
        runs["baseline"] = session(module.StatsProbe)
    wall = {{k: [] for k in runs}}
    cpu = {{k: [] for k in runs}}
    for fn in runs.values():
        fn()  # warm-up
    names = list(runs)
    for r in range(rounds):
        for k in names[r % len(names):] + names[: r % len(names)]:  # rotate who goes first
            c0, t0 = time.process_time(), time.perf_counter()
            runs[k]()
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
    med = statistics.median
    out = {{}}
    for k in names:
        out[k] = {{"wall": med(wall[k]), "cpu": med(cpu[k]),
                  "ratio": med(y / x for x, y in zip(wall["bare"], wall[k]))}}
    print(json.dumps(out))
    """
)


def _run(code: str, *argv: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"benchmark subprocess failed:\n{done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


def _peak_mb(name: str) -> float:
    # ru_maxrss is in KiB on Linux (bytes on macOS).
    scale = 1024 * 1024 if sys.platform == "darwin" else 1024
    return min(int(_run(SCRIPTS[name])) * scale / 1e6 for _ in range(REPEAT))


def _memory() -> None:
    peaks = {name: _peak_mb(name) for name in SCRIPTS}
    idle, bare, stats = peaks["idle"], peaks["bare"], peaks["stats"]
    print(f"{MODEL} batch {BATCH}, peak RSS (MB, best of {REPEAT} fresh processes):")
    print(f"  idle (model built, no forward): {idle:8.1f}")
    print(f"  bare forward:                   {bare:8.1f}")
    print(f"  hookcli stats:                  {stats:8.1f}")
    ratio = stats / bare
    verdict = "ok" if ratio <= 1.10 else "OVER TARGET"
    print(f"  stats/bare peak RSS ratio: {ratio:.3f} (target <= 1.10: {verdict})")
    if bare > idle:
        print(f"  forward's own memory, stats vs bare: {(stats - idle) / (bare - idle):.3f}")


def _time(threads: int, rounds: int, baseline: str) -> float:
    res = json.loads(_run(TIMING, str(threads), str(rounds), baseline))
    b, st = res["bare"], res["stats"]
    verdict = "ok" if st["ratio"] <= 2.0 else "OVER TARGET"
    print(
        f"  {threads} thread(s), medians of {rounds} rounds: bare {b['wall']:.3f} s, "
        f"stats {st['wall']:.3f} s; stats/bare {st['ratio']:.2f} (target <= 2.0: {verdict})"
    )
    if "baseline" in res:
        bl = res["baseline"]
        print(f"    baseline probe: {bl['wall']:.3f} s; baseline/bare {bl['ratio']:.2f}")
    cpu = f"bare {b['cpu']:.3f} s, stats {st['cpu']:.3f} s, ratio {st['cpu'] / b['cpu']:.2f}"
    if "baseline" in res:
        cpu += f"; baseline {res['baseline']['cpu']:.3f} s"
    print(f"    CPU time of the process: {cpu}")
    return float(st["ratio"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--time-only", action="store_true", help="skip the memory figures")
    parser.add_argument(
        "--baseline",
        default="",
        help="another version of hookcli/probes/stats.py to time alongside "
        "(git show REV:hookcli/probes/stats.py > FILE)",
    )
    args = parser.parse_args([] if argv is None else argv)
    if not args.time_only:
        _memory()
    print(f"{MODEL} batch {BATCH}, time (interleaved rounds, medians):")
    for threads in (int(t) for t in args.threads.split(",")):
        _time(threads, args.rounds, str(Path(args.baseline).resolve()) if args.baseline else "")


if __name__ == "__main__":
    main(sys.argv[1:])
