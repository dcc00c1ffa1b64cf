"""profile overhead: the hooked forward against a bare forward.

1. ``hookcli.profile`` on resnet50, batch 8, cpu: its own ``totals.overhead_ratio``
   (medians of wall times around the model call, bare and hooked interleaved).
   Target <= 1.10.
2. The same comparison in thread CPU time (``time.thread_time_ns``) with one intra-op
   thread: on a machine shared with other work, wall times move with the load, CPU
   time of the one thread doing the work much less.
3. The hooks' cost per module call: a model of 2,000 ``nn.Identity`` calls, hooked
   against bare, in microseconds per call (pre and forward hook together).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

REPEATS = 7


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


def main() -> None:
    import torch
    import torchvision

    import hookcli
    from benchmarks.common import record, rounds, smoke

    torch.manual_seed(0)
    name, batch, size = ("resnet18", 1, 64) if smoke() else ("resnet50", 8, 224)
    model = getattr(torchvision.models, name)(weights=None).eval()
    x = torch.randn(batch, 3, size, size)
    report = hookcli.profile(model, x, warmup=1, repeat=rounds(REPEATS))
    t = report.totals
    print(
        f"profile {name} b{batch} cpu: bare {t['bare_forward_ms']:.1f} ms, hooked "
        f"{t['profiled_forward_ms']:.1f} ms, overhead_ratio {t['overhead_ratio']:.3f} "
        f"(wall; target <= 1.10); root forward_ms {t['forward_ms']:.1f}",
        flush=True,
    )
    record(
        "profile",
        t["overhead_ratio"],
        what=f"hookcli.profile({name}, x) b{batch}: its overhead_ratio (profiled / bare forward)",
        target="<= 1.10",
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
            what=f"the same in thread CPU time, 1 thread ({name} b{batch})",
            target="<= 1.10",
        )
        record("profile_call_us", us, what="profile's hooks per module call (us)", unit="us")
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    main()
