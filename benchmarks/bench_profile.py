"""profile's cost: the whole public call, and its hooked forward, against bare forwards.

1. The public call ``hookcli.profile(model, x, warmup=1, repeat=7)`` on resnet50,
   batch 8, cpu, whole: the counting pass, the warm-up (a bare and a hooked forward),
   the 7 timed repeats (each a bare and a hooked forward), the rows and the Report;
   against a plain timing loop of the same model (1 warm-up and 7 timed bare
   forwards: what timing the model alone takes); interleaved rounds, median of the
   per-round ratios. Since every repeat also runs a bare forward to compare with, the
   same ratio scaled to as many bare forwards as the call runs (1 + 2 x 8 = 17, the
   counting pass counted as one) is given too: what the hooks, the counting and the
   report add to those forwards.
2. The report's own ``totals.overhead_ratio``: the hooked forward alone against the
   bare forward, medians of wall times around the model call (the median over the
   calls of 1). Target <= 1.10.
3. The same comparison in thread CPU time (``time.thread_time_ns``) with one intra-op
   thread: on a machine shared with other work, wall times move with the load, CPU
   time of the one thread doing the work much less.
4. The hooks' cost per module call: a model of 2,000 ``nn.Identity`` calls, hooked
   against bare, in microseconds per call (pre and forward hook together).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import benchmark, interleave, record, rounds, smoke

REPEATS = 7
WARMUP = 1


def _tree_and_modules(model: Any, x: Any) -> tuple[Any, list[Any]]:
    from hookcli.cost.runner import measure
    from hookcli.options import Mode
    from hookcli.profile.runner import call_tree

    prepared = _prepared(model, x)
    probe, records, error = measure(prepared, mode=Mode.EVAL)
    assert error is None
    tree = call_tree(probe, records)
    by_id = {id(m): m for m in model.modules()}
    return tree, [by_id[tree.module_ids[c[0]]] for c in tree.slot_calls]


def _prepared(model: Any, x: Any) -> Any:
    from hookcli.api import live
    from hookcli.options import Mode

    return live(model, (x,), None, Mode.EVAL, None)


def cpu_time_ratio(model: Any, x: Any, repeats: int = REPEATS) -> tuple[float, float]:
    """Median thread CPU seconds of a bare and a hooked forward, interleaved."""
    import torch

    from hookcli.profile.hooks import TimingHooks

    tree, modules = _tree_and_modules(model, x)
    hooks = TimingHooks(modules, tree, repeats + 1, now=time.perf_counter_ns)
    clock = time.thread_time_ns
    bare, hooked = [], []

    def run(p: int, with_hooks: bool) -> int:
        if with_hooks:
            hooks.begin_pass(p)
            hooks.attach()
        try:
            t0 = clock()
            with torch.inference_mode():
                model(x)
            return clock() - t0
        finally:
            if with_hooks:
                hooks.detach()

    run(0, False)
    run(0, True)
    for r in range(repeats):
        for with_hooks in (False, True) if r % 2 == 0 else (True, False):
            (hooked if with_hooks else bare).append(run(r + 1, with_hooks))
    return statistics.median(bare) / 1e9, statistics.median(hooked) / 1e9


def per_call_us(calls: int = 2000, repeats: int = 15) -> float:
    """Microseconds the hooks add per module call (both hooks), thread CPU time."""
    import torch
    from torch import nn

    model = nn.Sequential(*[nn.Identity() for _ in range(calls - 1)]).eval()
    x = torch.zeros(1)
    bare, hooked = cpu_time_ratio(model, x, repeats)
    return (hooked - bare) / calls * 1e6


def whole_call(model: Any, x: Any, repeat: int, n: int = 3) -> dict[str, Any]:
    """The public call against a plain timing loop of as many warm-ups and repeats."""
    import torch

    import hookcli

    ratios: list[float] = []

    def bare() -> None:  # timing the model alone: warm-up, then the timed forwards
        with torch.inference_mode():
            for _ in range(WARMUP + repeat):
                model(x)

    def profile() -> None:  # the public call, whole: counting pass, passes, report
        report = hookcli.profile(model, x, warmup=WARMUP, repeat=repeat)
        ratios.append(report.totals["overhead_ratio"])

    res = interleave({"bare": bare, "profile": profile}, rounds(n))
    forwards = 1 + 2 * (WARMUP + repeat)  # the counting pass, and bare + hooked per pass
    return {
        "loop": res["profile"]["ratio"],
        "same": res["profile"]["ratio"] * (WARMUP + repeat) / forwards,
        "forwards": forwards,
        "bare_s": res["bare"]["wall"],
        "call_s": res["profile"]["wall"],
        "overhead_ratio": statistics.median(ratios),
    }


@benchmark
def main() -> None:
    import torch
    import torchvision

    torch.manual_seed(0)
    name, batch, size = ("resnet18", 1, 64) if smoke() else ("resnet50", 8, 224)
    model = getattr(torchvision.models, name)(weights=None).eval()
    x = torch.randn(batch, 3, size, size)
    repeat = rounds(REPEATS)
    w = whole_call(model, x, repeat)
    what = f"hookcli.profile({name}, x, warmup={WARMUP}, repeat={repeat}) b{batch}, whole call"
    print(
        f"{what}: {w['call_s']:.2f} s; a plain timing loop ({WARMUP + repeat} bare "
        f"forwards) {w['bare_s']:.2f} s, ratio {w['loop']:.3f}; against as many bare "
        f"forwards as the call runs ({w['forwards']}): {w['same']:.3f}",
        flush=True,
    )
    record(
        "profile_whole",
        w["loop"],
        what=what + f" vs a plain timing loop of the same {WARMUP} + {repeat} forwards",
    )
    record(
        "profile_whole_same",
        w["same"],
        what=what + f" vs as many bare forwards as it runs ({w['forwards']})",
    )
    print(
        f"profile {name} b{batch} cpu: the report's overhead_ratio (hooked forward / bare "
        f"forward), median over the calls: {w['overhead_ratio']:.3f} (target <= 1.10)",
        flush=True,
    )
    record(
        "profile_overhead",
        w["overhead_ratio"],
        what=f"hookcli.profile({name}, x) b{batch}: its report's overhead_ratio "
        "(the hooked forward alone / the bare forward)",
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        bare, hooked = cpu_time_ratio(model, x, rounds(REPEATS))
        print(
            f"profile {name} b{batch} cpu, 1 thread, thread CPU time: bare {bare:.3f} s, "
            f"hooked {hooked:.3f} s, ratio {hooked / bare:.4f}",
            flush=True,
        )
        us = per_call_us(repeats=rounds(15))
        print(f"hook cost per module call: {us:.2f} us (thread CPU time)", flush=True)
        record(
            "profile_cpu",
            hooked / bare,
            what=f"the hooked forward / the bare forward in thread CPU time ({name} b{batch})",
        )
        record("profile_call_us", us, what="profile's hooks per module call (us)", unit="us")
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    main()
