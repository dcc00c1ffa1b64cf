"""cost overhead and accuracy, as ratios against bare PyTorch in the same process.

1. The Llama-2-7B-shaped decoder (``sample_models.decoder.llama_7b``, seq 2048,
   built under ``torch.device("meta")``: ``llama_7b_meta`` here) on meta:
   ``cost``'s run against ``inspect``'s run of it, in process (the build, shared
   by both, excluded) and as whole processes. Target <= 2.
2. resnet50 on the CPU, batch 1 and 8: ``cost``'s run (its one measured forward,
   with grad enabled, and the rows) against a bare ``torch.inference_mode()``
   forward; medians of interleaved runs, one thread. Target <= 1.3.
3. Where CUDA exists: the training-step estimate against
   ``torch.cuda.max_memory_allocated`` of real Adam steps, for resnet50 and a
   GPT-2-small-shaped decoder; torchinfo's "Estimated Total Size" beside it when
   torchinfo is importable. Target: within 10%.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _median_times(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    for fn in fns.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}


def _cost_rows(prepared: Any) -> Any:
    from hookcli.costing import _CostColumns, measure
    from hookcli.layers import layer_rows

    probe, records, _ = measure(prepared, mode=prepared_mode())
    return layer_rows(records, prepared.model, probes=[_CostColumns(probe, prepared.model)])  # type: ignore[list-item]


def prepared_mode() -> Any:
    from hookcli.options import Mode

    return Mode.EVAL


def llama_7b_meta(seq: int = 2048) -> Any:
    """The 7B decoder built on meta, whatever the loader does: never on the CPU."""
    import torch

    from sample_models.decoder import llama_7b

    with torch.device("meta"):
        return llama_7b(seq=seq)


def decoder_on_meta(repeats: int = 3) -> dict[str, float]:
    from hookcli.layers import layer_rows
    from hookcli.loading import LoadedModel
    from hookcli.options import Mode, ModelOptions, RunOptions
    from hookcli.pipeline import prepare, run_session

    model = llama_7b_meta()
    prepared = prepare(
        ModelOptions("llama_7b"),
        RunOptions(device="meta"),
        loaded=LoadedModel(model, "llama_7b"),
    )

    def inspect() -> None:
        outcome = run_session(prepared, [], mode=Mode.EVAL)
        layer_rows(outcome.records, model)

    return _median_times({"inspect": inspect, "cost": lambda: _cost_rows(prepared)}, repeats)


def whole_process(repeats: int = 3) -> dict[str, float]:
    spec = "benchmarks/bench_cost.py:llama_7b_meta"
    cmds = {
        "inspect": [
            sys.executable,
            "-m",
            "hookcli",
            "inspect",
            spec,
            "--device",
            "meta",
            "-f",
            "json",
        ],
        "cost": [sys.executable, "-m", "hookcli", "cost", spec, "--device", "meta", "-f", "json"],
    }

    def run(cmd: list[str]) -> Callable[[], None]:
        return lambda: subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)

    return _median_times({k: run(c) for k, c in cmds.items()}, repeats)


def resnet50_cpu(batch: int, repeats: int = 9) -> dict[str, float]:
    import torch

    from hookcli.options import ModelOptions, RunOptions
    from hookcli.pipeline import prepare

    prepared = prepare(ModelOptions("resnet50"), RunOptions(inputs=(f"{batch}x3x224x224",)))
    model, x = prepared.model, prepared.inputs.args[0]
    model.eval()

    def bare() -> None:
        with torch.inference_mode():
            model(x)

    def bare_grad() -> None:
        model(x)  # a plain call: autograd records the graph, as cost's pass must

    fns = {"bare": bare, "bare_grad": bare_grad, "cost": lambda: _cost_rows(prepared)}
    return _median_times(fns, repeats)


def cuda_training_peaks() -> list[tuple[str, dict[str, int], int, int | None]]:
    """(model, hookcli totals, measured peak, torchinfo estimate) on CUDA."""
    import torch
    import torchvision

    from sample_models.decoder import Decoder

    cases: list[tuple[str, Callable[[], torch.nn.Module], str]] = [
        ("resnet50 b32", lambda: torchvision.models.resnet50(weights=None), "float32:32x3x224x224"),
        (
            "gpt2-small-shaped b8 s1024",
            lambda: Decoder(
                vocab=50257, dim=768, layers=12, heads=12, kv_heads=12, hidden=3072, seq=1024
            ),
            "int64:8x1024:0..50257",
        ),
    ]
    out = []
    for label, build, spec in cases:
        est = cost_estimate(build, spec)
        peak = measured_peak(build, spec)
        out.append((label, est, peak, torchinfo_estimate(build, spec)))
    return out


def cost_estimate(build: Callable[[], Any], spec: str) -> dict[str, int]:
    from hookcli.costing import Optimizer, measure, memory_totals
    from hookcli.loading import LoadedModel
    from hookcli.options import Mode, ModelOptions, RunOptions
    from hookcli.pipeline import prepare

    prepared = prepare(
        ModelOptions("m"),
        RunOptions(inputs=(spec,), device="cuda"),
        loaded=LoadedModel(build(), "m"),
    )
    probe, _, error = measure(prepared, mode=Mode.TRAIN, backward=True)
    assert error is None
    return memory_totals(prepared.model, probe, Optimizer.ADAM)


def _input(spec: str) -> Any:
    import torch

    from hookcli.inputs import parse_spec

    s = parse_spec(spec)
    if s.dtype == "int64":
        return torch.randint(s.low, s.high, s.dims, device="cuda")
    return torch.randn(s.dims, device="cuda")


def measured_peak(build: Callable[[], Any], spec: str) -> int:
    """torch.cuda.max_memory_allocated over a second Adam step (the first creates state)."""
    import torch

    torch.cuda.empty_cache()
    model = build().cuda().train()
    x = _input(spec)
    opt = torch.optim.Adam(model.parameters())
    for step in range(2):
        if step == 1:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        opt.zero_grad(set_to_none=True)
        model(x).float().sum().backward()
        opt.step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del model, opt, x
    torch.cuda.empty_cache()
    return peak


def torchinfo_estimate(build: Callable[[], Any], spec: str) -> int | None:
    try:
        import torchinfo
    except ImportError:
        return None
    x = _input(spec)
    stats = torchinfo.summary(build().cuda(), input_data=[x], verbose=0, device="cuda")
    return int(
        stats.total_input + stats.total_output_bytes + stats.total_param_bytes
    )  # torchinfo's "Estimated Total Size"


def main() -> None:
    import torch

    torch.set_num_threads(1)
    t = decoder_on_meta()
    print(
        "cost vs inspect, 7B decoder (seq 2048) on meta, in process: "
        f"inspect {t['inspect']:.3f} s, cost {t['cost']:.3f} s, "
        f"ratio {t['cost'] / t['inspect']:.2f} (target <= 2)",
        flush=True,
    )
    t = whole_process()
    print(
        f"cost vs inspect, 7B decoder on meta, whole process: inspect {t['inspect']:.2f} s, "
        f"cost {t['cost']:.2f} s, ratio {t['cost'] / t['inspect']:.2f} (target <= 2)",
        flush=True,
    )
    for batch in (1, 8):
        t = resnet50_cpu(batch)
        print(
            f"cost resnet50 b{batch} cpu (1 thread), in process: bare inference forward "
            f"{t['bare']:.3f} s, cost {t['cost']:.3f} s, ratio {t['cost'] / t['bare']:.2f} "
            f"(target <= 1.3); a plain forward with autograd on {t['bare_grad']:.3f} s "
            f"({t['bare_grad'] / t['bare']:.2f}x), "
            f"cost against it {t['cost'] / t['bare_grad']:.2f}",
            flush=True,
        )
    if not torch.cuda.is_available():
        print("CUDA training-step comparison: skipped (no CUDA device)")
        return
    gib = 2**30
    for label, t, peak, ti in cuda_training_peaks():
        est, live = t["train_step_bytes"], t["train_peak_bytes"]
        extra = "" if ti is None else f", torchinfo estimate {ti / gib:.2f} GiB"
        print(
            f"{label}: measured Adam-step peak {peak / gib:.2f} GiB; hookcli train step "
            f"{est / gib:.2f} GiB ({(est - peak) / peak:+.1%}), training peak "
            f"{live / gib:.2f} GiB ({(live - peak) / peak:+.1%}){extra}",
            flush=True,
        )


if __name__ == "__main__":
    main()
