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

Usage: ``python benchmarks/bench_stats.py [--rounds 7] [--threads 1,2] [--time-only]``
(``python benchmarks/run.py stats`` runs the defaults).
"""

from __future__ import annotations

import argparse
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
    import statistics, sys, time, torch
    threads, rounds = int(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(threads)
    from hookcli.options import Mode, ModelOptions, RunOptions
    from hookcli.pipeline import prepare, run_session
    from hookcli.probes.stats import StatsProbe

    prepared = prepare(ModelOptions({MODEL!r}), RunOptions(batch_size={BATCH}))
    model, args = prepared.model, prepared.inputs.args

    def bare():
        with torch.inference_mode():
            model(*args)

    def stats():
        run_session(prepared, [StatsProbe()], mode=Mode.EVAL)

    def timed(fn, wall, cpu):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)

    bare()  # warm-up
    stats()
    b, s, bc, sc = [], [], [], []
    for r in range(rounds):
        if r % 2:
            timed(stats, s, sc)
            timed(bare, b, bc)
        else:
            timed(bare, b, bc)
            timed(stats, s, sc)
    med = statistics.median
    ratio = med(y / x for x, y in zip(b, s))
    print(med(b), med(s), ratio, med(bc), med(sc))
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


def _time(threads: int, rounds: int) -> float:
    out = _run(TIMING, str(threads), str(rounds)).split()
    t_bare, t_stats, ratio, c_bare, c_stats = (float(v) for v in out)
    verdict = "ok" if ratio <= 2.0 else "OVER TARGET"
    print(
        f"  {threads} thread(s), medians of {rounds} rounds: bare {t_bare:.3f} s, "
        f"stats {t_stats:.3f} s; stats/bare {ratio:.2f} (target <= 2.0: {verdict})"
    )
    print(
        f"    CPU time of the process (what a busy neighbour does not inflate at 1 thread): "
        f"bare {c_bare:.3f} s, stats {c_stats:.3f} s, ratio {c_stats / c_bare:.2f}"
    )
    return ratio


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--time-only", action="store_true", help="skip the memory figures")
    args = parser.parse_args([] if argv is None else argv)
    if not args.time_only:
        _memory()
    print(f"{MODEL} batch {BATCH}, time (interleaved rounds, medians):")
    for threads in (int(t) for t in args.threads.split(",")):
        _time(threads, args.rounds)


if __name__ == "__main__":
    main(sys.argv[1:])
