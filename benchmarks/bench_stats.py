"""Peak memory (and time) of ``hookcli stats`` against a bare forward: resnet50, batch 8.

Each figure comes from its own fresh subprocess reading
its peak resident set at its end: ``VmHWM`` from ``/proc/self/status`` on Linux
(``ru_maxrss`` would do elsewhere, but on Linux it carries over the high-water mark of
the process that forked the child, so after an in-process benchmark every child would
report the parent's peak):

- ``idle``: torch + torchvision imported, resnet50 built, input drawn, no forward;
- ``bare``: the same plus one plain ``model(x)`` under ``torch.inference_mode()``;
- ``stats``: the full CLI, ``hookcli stats resnet50 -b 8 -f json -o /dev/null``.

Printed: ``stats/bare`` (target <= 1.10) and, stricter, the memory the forward
adds above ``idle`` in each case. Timing is informational: a plain forward vs the
same forward inside a HookSession with the StatsProbe, best of 3, in one process
on one thread (with several threads on a shared machine the figures swing 10x).

Usage: ``python benchmarks/run.py stats`` (or ``python benchmarks/bench_stats.py``).
"""

from __future__ import annotations

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
    import time, torch
    torch.set_num_threads(1)  # one thread: stable figures on a shared machine
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

    best = {{}}
    for name, fn in (("bare", bare), ("stats", stats)):
        fn()  # warm-up
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        best[name] = min(times)
    print(best["bare"], best["stats"])
    """
)


def _run(code: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    if done.returncode:
        raise RuntimeError(f"benchmark subprocess failed:\n{done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


def _peak_mb(name: str) -> float:
    # ru_maxrss is in KiB on Linux (bytes on macOS).
    scale = 1024 * 1024 if sys.platform == "darwin" else 1024
    return min(int(_run(SCRIPTS[name])) * scale / 1e6 for _ in range(REPEAT))


def main() -> None:
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
    t_bare, t_stats = (float(v) for v in _run(TIMING).split())
    print(
        f"  time per forward, 1 thread: bare {t_bare:.2f} s, stats {t_stats:.2f} s "
        f"(ratio {t_stats / t_bare:.2f}, informational)"
    )


if __name__ == "__main__":
    main()
