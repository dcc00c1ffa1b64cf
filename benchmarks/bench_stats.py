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

Time (target: stats/floor <= 1.25): the public call ``hookcli.stats(model, x)`` (every
hook, the figures fetched and pooled, the origin found, the rows and the Report) against
a floor: plain ``register_forward_hook`` hooks that read each output tensor once (one
``sum``), the least that any exact per-layer statistic costs, and against a plain
``model(x)`` under ``torch.inference_mode()`` (shown beside it), in one process per
thread count (1 and 2 threads by default). After one warm-up of each, ``--rounds``
rounds each time every run, rotating which goes first, so that a neighbour's load on a
shared machine hits all alike; printed are the medians of each and the medians of the
per-round ratios (stats / floor is the target's figure), then the medians of the
process's CPU time, which a neighbour holding the core does not stretch (with one
thread; with more, torch's threads also spend CPU time waiting for each other).

``--baseline FILE`` times another version of ``hookcli/stats/probe.py`` in the same
rounds (``git show REV:hookcli/stats/probe.py > FILE``), for a before/after under the
same load: the session alone with that module's probe (``baseline``) and with this
one's (``session``), each against the floor of its round.

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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import benchmark, record, rounds, smoke, target_line

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


def _config() -> tuple[str, int, int]:
    """(model, batch, size): resnet50, 8, 224; tiny under ``--smoke``."""
    return ("resnet18", 1, 64) if smoke() else (MODEL, BATCH, 224)


def _scripts() -> dict[str, str]:
    model, batch, size = _config()
    setup = (
        _PEAK
        + f"""
import torch, torchvision
torch.manual_seed(0)
model = torchvision.models.get_model({model!r}, weights=None).eval()
x = torch.randn(({batch}, 3, {size}, {size}), generator=torch.Generator().manual_seed(0))
"""
    )
    return {
        "idle": setup + "print(peak_kib())\n",
        "bare": setup
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
            os.environ["HOOKCLI_FULL_EXIT"] = "1"  # else main() ends in os._exit, before the print
            # hookcli keeps fd 1 for its report alone (a model's late prints go elsewhere),
            # so the peak goes out through a copy of it taken first
            peak_out = os.fdopen(os.dup(1), "w")
            from hookcli.cli import main
            sys.argv = ["hookcli", "stats", {model!r}, "-i", "{batch}x3x{size}x{size}",
                        "-f", "json", "-o", os.devnull]
            try:
                main()
            except SystemExit as e:
                assert not e.code, e.code
            print(peak_kib(), file=peak_out, flush=True)
            """
        ),
    }


TIMING = textwrap.dedent(
    """
    import importlib.util, json, statistics, sys, time, torch, weakref
    threads, rounds, baseline = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    MODEL, INPUT = sys.argv[4], sys.argv[5]
    torch.set_num_threads(threads)
    import hookcli
    from hookcli.options import Mode, ModelOptions, RunOptions
    from hookcli.pipeline import prepare, run_session

    prepared = prepare(ModelOptions(MODEL), RunOptions(inputs=(INPUT,)))
    model, args = prepared.model, prepared.inputs.args
    model.eval()

    def bare():
        with torch.inference_mode():
            model(*args)

    def stats():  # the public call: session, rows, origin, notes, the Report
        hookcli.stats(model, *args)

    seen = {}  # (id, version) -> a weak reference: no output is kept alive

    def read_once(module, args, output):  # plain PyTorch: every output element read once
        if isinstance(output, torch.Tensor) and output.is_floating_point():
            key = (id(output), output._version)
            ref = seen.get(key)
            if ref is None or ref() is not output:
                seen[key] = weakref.ref(output)
                output.sum()

    def floor():  # the least any exact per-layer figure costs: one read of each output
        seen.clear()
        handles = [m.register_forward_hook(read_once) for m in model.modules()]
        try:
            with torch.no_grad():
                model(*args)
        finally:
            for h in handles:
                h.remove()
            seen.clear()

    runs = {"bare": bare, "stats": stats, "floor": floor}
    if baseline:  # another version of the probe module, timed alongside (session only)
        spec = importlib.util.spec_from_file_location("baseline_stats", baseline)
        module = importlib.util.module_from_spec(spec)
        sys.modules["baseline_stats"] = module
        spec.loader.exec_module(module)
        runs["baseline"] = lambda: run_session(prepared, [module.StatsProbe()], mode=Mode.EVAL)
        from hookcli.stats.probe import StatsProbe
        runs["session"] = lambda: run_session(prepared, [StatsProbe()], mode=Mode.EVAL)
    wall = {k: [] for k in runs}
    cpu = {k: [] for k in runs}
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
    out = {}
    for k in names:
        out[k] = {"wall": med(wall[k]), "cpu": med(cpu[k]),
                  "ratio": med(y / x for x, y in zip(wall["bare"], wall[k])),
                  "floor_ratio": med(y / x for x, y in zip(wall["floor"], wall[k]))}
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
    return min(int(_run(_scripts()[name])) * scale / 1e6 for _ in range(rounds(REPEAT)))


def _memory() -> None:
    peaks = {name: _peak_mb(name) for name in _scripts()}
    model, batch, _ = _config()
    idle, bare, stats = peaks["idle"], peaks["bare"], peaks["stats"]
    print(f"{model} batch {batch}, peak RSS (MB, best of {rounds(REPEAT)} fresh processes):")
    print(f"  idle (model built, no forward): {idle:8.1f}")
    print(f"  bare forward:                   {bare:8.1f}")
    print(f"  hookcli stats:                  {stats:8.1f}")
    ratio = stats / bare
    verdict = "ok" if ratio <= 1.10 else "OVER TARGET"
    print(f"  stats/bare peak RSS ratio: {ratio:.3f} (target <= 1.10: {verdict})")
    record("stats_rss", ratio, what="`hookcli stats` peak RSS vs a bare forward, fresh processes")
    if bare > idle:
        print(f"  forward's own memory, stats vs bare: {(stats - idle) / (bare - idle):.3f}")


def _time(threads: int, n: int, baseline: str) -> float:
    model, batch, size = _config()
    res = json.loads(
        _run(TIMING, str(threads), str(n), baseline, model, f"{batch}x3x{size}x{size}")
    )
    b, st = res["bare"], res["stats"]
    print(
        f"  {threads} thread(s), medians of {n} rounds: bare {b['wall']:.3f} s, "
        f"hookcli.stats {st['wall']:.3f} s; stats/bare {st['ratio']:.2f}"
    )
    label = f"hookcli.stats({model}, x) b{batch} vs its floor (hooks reading each output once)"
    print("    " + target_line(label, st["floor_ratio"], f"stats_vs_floor_{threads}t"))
    record(f"stats_vs_floor_{threads}t", float(st["floor_ratio"]), what=label, threads=threads)
    if "baseline" in res:
        bl, se = res["baseline"], res["session"]
        print(
            f"    session alone, this probe: {se['wall']:.3f} s, / floor {se['floor_ratio']:.3f}; "
            f"baseline probe: {bl['wall']:.3f} s, / floor {bl['floor_ratio']:.3f}"
        )
    fl = res["floor"]
    print(
        f"    floor (plain hooks reading each output once, one sum): {fl['wall']:.3f} s; "
        f"floor/bare {fl['ratio']:.2f}"
    )
    record(
        f"stats_floor_{threads}t",
        float(fl["ratio"]),
        what="floor: plain hooks that read each output once, vs a bare forward",
        threads=threads,
    )
    cpu = f"bare {b['cpu']:.3f} s, stats {st['cpu']:.3f} s, ratio {st['cpu'] / b['cpu']:.2f}"
    if "baseline" in res:
        cpu += f"; session {res['session']['cpu']:.3f} s, baseline {res['baseline']['cpu']:.3f} s"
    print(f"    CPU time of the process: {cpu}")
    return float(st["ratio"])


@benchmark
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--time-only", action="store_true", help="skip the memory figures")
    parser.add_argument(
        "--baseline",
        default="",
        help="another version of hookcli/stats/probe.py to time alongside "
        "(git show REV:hookcli/stats/probe.py > FILE)",
    )
    args = parser.parse_args([] if argv is None else argv)
    if smoke():
        args.threads = "1"
    if not args.time_only:
        _memory()
    model, batch, _ = _config()
    print(f"{model} batch {batch}, time (interleaved rounds, medians):")
    for threads in (int(t) for t in args.threads.split(",")):
        ratio = _time(
            threads,
            rounds(args.rounds),
            str(Path(args.baseline).resolve()) if args.baseline else "",
        )
        record(
            f"stats_{threads}t",
            ratio,
            what=f"hookcli.stats({model}, x) b{batch} vs a bare forward",
            threads=threads,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
