"""The CI layer's costs, as ratios against bare PyTorch in the same process.

1. ``hookcli.inspect(model, x)`` (the Python API, the same path the CLI takes:
   RNG and path guards, session, rows, totals) on resnet18, batch 8, against a bare
   ``torch.inference_mode()`` forward; and ``hookcli.grads`` against a bare
   forward + ``loss.backward()``. Medians of interleaved runs.
2. ``diff`` of two resnet50 ``grads`` reports (every value perturbed, so every
   number is compared and flagged), and the whole ``--baseline`` step (read
   the file, diff, render the differences), against the model's own forward +
   backward time: what a baseline adds to a CI run.
"""

from __future__ import annotations

import copy
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import benchmark, record, rounds, smoke

REPEATS = 5


def _size() -> int:
    return 32 if smoke() else 224


def _median(fn: Callable[[], object], repeats: int = REPEATS) -> float:
    times = []
    for _ in range(rounds(repeats)):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def api_overhead(batch: int = 8) -> dict[str, float]:
    import torch
    import torchvision

    import hookcli

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(batch, 3, _size(), _size())

    def bare_fwd() -> None:
        with torch.inference_mode():
            model(x)

    def bare_bwd() -> None:
        model.train()
        model(x).sum().backward()
        model.zero_grad(set_to_none=True)
        model.eval()

    def api_inspect() -> None:
        hookcli.inspect(model, x)

    def api_grads() -> None:
        hookcli.grads(model, x)

    for fn in (bare_fwd, api_inspect, bare_bwd, api_grads):
        fn()  # warm-up
    out: dict[str, list[float]] = {"bare_fwd": [], "inspect": [], "bare_bwd": [], "grads": []}
    for _ in range(rounds(REPEATS)):
        for key, fn in (
            ("bare_fwd", bare_fwd),
            ("inspect", api_inspect),
            ("bare_bwd", bare_bwd),
            ("grads", api_grads),
        ):
            out[key].append(_median(fn, 1))
    return {k: statistics.median(v) for k, v in out.items()}


def diff_cost() -> dict[str, float]:
    import torch
    import torchvision

    import hookcli
    from hookcli.ci import compare_baseline
    from hookcli.diff import diff_reports
    from hookcli.options import CIOptions

    torch.manual_seed(0)
    model = torchvision.models.get_model("resnet18" if smoke() else "resnet50", weights=None)
    x = torch.randn(2, 3, _size(), _size())
    report = hookcli.grads(model, x)
    old = report.to_dict()
    new = copy.deepcopy(old)
    for row in new["layers"]:
        for k, v in row.items():
            if isinstance(v, float):
                row[k] = v * 1.01

    def bare_bwd() -> None:
        model(x).sum().backward()
        model.zero_grad(set_to_none=True)

    model.train()
    t_model = _median(bare_bwd, 3)
    t_diff = _median(lambda: diff_reports(old, new))
    result = diff_reports(old, new)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "baseline.json"
        path.write_text(json.dumps(new))
        import contextlib
        import io

        with contextlib.redirect_stderr(io.StringIO()):  # the diff table goes to stderr
            t_baseline = _median(lambda: compare_baseline(report, CIOptions(baseline=path)))
    return {
        "rows": len(old["layers"]),
        "values": sum(s.compared for s in result.key_stats.values()),
        "differences": len(result.differences),
        "model": t_model,
        "diff": t_diff,
        "baseline": t_baseline,
    }


@benchmark
def main() -> None:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # steady figures on a shared machine
    try:
        _main()
    finally:
        torch.set_num_threads(before)


def _main() -> None:
    a = api_overhead()
    print(
        f"API on resnet18, batch 8, 1 thread: inspect {a['inspect'] * 1e3:.0f} ms vs bare forward "
        f"{a['bare_fwd'] * 1e3:.0f} ms (x{a['inspect'] / a['bare_fwd']:.3f}); grads "
        f"{a['grads'] * 1e3:.0f} ms vs bare forward+backward {a['bare_bwd'] * 1e3:.0f} ms "
        f"(x{a['grads'] / a['bare_bwd']:.3f})"
    )

    d = diff_cost()
    print(
        f"diff of two resnet50 grads reports ({d['rows']:.0f} rows, {d['values']:.0f} values, "
        f"{d['differences']:.0f} differences): {d['diff'] * 1e3:.1f} ms; whole --baseline step "
        f"(read, diff, render to stderr): {d['baseline'] * 1e3:.1f} ms = "
        f"{100 * d['baseline'] / d['model']:.1f}% of the model's forward+backward "
        f"({d['model'] * 1e3:.0f} ms, batch 2)"
    )
    record(
        "baseline_step",
        100 * d["baseline"] / d["model"],
        what="the whole `--baseline` step, in % of a resnet50 forward + backward (batch 2)",
        unit="%",
    )


if __name__ == "__main__":
    main()
