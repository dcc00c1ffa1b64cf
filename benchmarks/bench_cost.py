"""cost overhead and accuracy, as ratios against bare PyTorch in the same process.

1. The Llama-2-7B-shaped decoder (``sample_models.decoder.llama_7b``, seq 2048,
   built under ``torch.device("meta")``: ``llama_7b_meta`` here) on meta:
   ``hookcli.cost(model, ids)`` against ``hookcli.inspect(model, ids)``, in process
   (the build, shared by both, excluded), and the two commands as whole processes
   (both with ``HOOKCLI_FULL_EXIT=1``). Target <= 2.
2. resnet50 on the CPU, batch 1 and 8: ``cost``'s counting pass (its one measured
   forward, with grad enabled, the rows, the totals, the Report; the default ``cost``
   adds the tracked step, timed in 3) against torch's own FLOP counter,
   ``torch.utils.flop_counter.FlopCounterMode`` around a plain ``model(x)`` (autograd
   on, as in cost's pass) with its per-module counts read, and against a bare
   ``torch.inference_mode()`` forward and a plain forward with autograd on (shown beside
   it); interleaved rounds, medians of the per-round ratios, one thread. Target: the
   counting pass / FlopCounterMode <= 1.00 at both batches.
3. The default ``cost`` (its two memory figures, the tracked training step's peak and
   the inference peak, included) on resnet18 b2 at 64x64, resnet50 b8 and a small
   GPT-2-style transformers model, on the CPU: the public call ``hookcli.cost(model, x)``
   against what ``cost`` ran by default before the figures were the tracked peaks (the
   counting pass: one forward, the rows, the report), against ``FlopCounterMode`` around
   a plain forward, and against one plain Adam training step (what the training figure
   runs, untracked); interleaved rounds, one thread, the CPU named. No target: the
   figures say what the two memory figures cost.
4. Where CUDA exists: the training-step estimate against
   ``torch.cuda.max_memory_allocated`` of real Adam steps, for resnet50 and a
   GPT-2-small-shaped decoder; torchinfo's "Estimated Total Size" beside it when
   torchinfo is importable. Target: within 10%.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:
    from torch import nn

from benchmarks.common import (  # noqa: E402
    benchmark,
    cpu_model,
    interleave,
    record,
    rounds,
    smoke,
    target_line,
)


def llama_7b_meta(seq: int = 2048) -> nn.Module:
    """The 7B decoder built on meta, whatever the loader does: never on the CPU (tiny
    under ``--smoke``)."""
    import torch

    from sample_models.decoder import Decoder, llama_7b

    with torch.device("meta"):
        if smoke():
            return Decoder(vocab=128, dim=64, layers=2, heads=4, kv_heads=4, hidden=128, seq=32)
        return llama_7b(seq=seq)


def decoder_on_meta(repeats: int = 3) -> dict[str, dict[str, Any]]:
    """``hookcli.cost`` against ``hookcli.inspect`` of the decoder on meta (public calls)."""
    import torch

    import hookcli

    model = llama_7b_meta()
    seq = 32 if smoke() else 2048
    ids = torch.empty((1, seq), dtype=torch.long, device="meta")

    def inspect() -> None:
        hookcli.inspect(model, ids)

    def cost() -> None:
        hookcli.cost(model, ids)

    # "bare" here is inspect: the ratio is cost / inspect
    return interleave({"bare": inspect, "cost": cost}, rounds(repeats))


def whole_process(repeats: int = 3) -> dict[str, dict[str, Any]]:
    spec = "benchmarks/bench_cost.py:llama_7b_meta"
    cmds = {
        "bare": [
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
    env = dict(os.environ, HOOKCLI_FULL_EXIT="1")  # both leave the same way

    def run(cmd: list[str]) -> Callable[[], None]:
        return lambda: subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=ROOT, env=env)

    return interleave({k: run(c) for k, c in cmds.items()}, rounds(repeats))


def resnet50_cpu(batch: int, repeats: int = 9) -> dict[str, dict[str, Any]]:
    import torch

    from hookcli.cost.runner import build_report, measure, plan_cost
    from hookcli.options import Mode, ModelOptions, RunOptions
    from hookcli.pipeline import prepare

    name, size = ("resnet18", 64) if smoke() else ("resnet50", 224)
    prepared = prepare(ModelOptions(name), RunOptions(inputs=(f"{batch}x3x{size}x{size}",)))
    model, x = prepared.model, prepared.inputs.args[0]
    model.eval()

    def bare() -> None:
        with torch.inference_mode():
            model(x)

    def bare_grad() -> None:
        model(x)  # a plain call: autograd records the graph, as cost's pass must

    plan = plan_cost()

    def cost() -> None:  # the counting pass and its report (no tracked step)
        probe, records, error = measure(prepared, mode=Mode.EVAL)
        build_report(prepared, probe, records, error, plan)

    def flopcounter() -> None:  # torch's own counter: FLOPs per module, no memory figures
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as counter:
            model(x)
        counter.get_flop_counts()

    runs = {"bare": bare, "bare_grad": bare_grad, "cost": cost, "flopcounter": flopcounter}
    return interleave(runs, rounds(repeats))


DEFAULT_CASES = {
    "resnet18 b2 3x64x64": ("resnet18", "2x3x64x64"),
    "resnet50 b8 3x224x224": ("resnet50", "8x3x224x224"),
    "GPT-2-style (transformers, 4 x 256) b2 128 tokens": ("gpt", "int64:2x128:0..8192"),
}


def _small_gpt() -> Any:
    """transformers' GPT2LMHeadModel, random weights, 4 layers of width 256 (no download)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=8192, n_positions=256, n_embd=256, n_layer=4, n_head=4)
    return GPT2LMHeadModel(config)


def default_cost(case: str, repeats: int = 5) -> dict[str, dict[str, Any]]:
    """The default ``cost`` of ``case`` (``DEFAULT_CASES``) against what ``cost`` ran by
    default before its figures were the tracked peaks (the counting pass, the rows and
    the report: ``bare``), FlopCounterMode around a plain forward, and one plain training
    step (forward, the sum of the output as the loss, backward, Adam with its state made)."""
    import torch

    import hookcli
    from hookcli.cost.runner import build_report, measure, plan_cost
    from hookcli.options import Mode, ModelOptions, RunOptions
    from hookcli.pipeline import prepare
    from hookcli.sources import LoadedModel

    name, spec = DEFAULT_CASES[case]
    if smoke():
        name, spec = ("resnet18", "2x3x32x32") if name != "gpt" else (name, "int64:1x16:0..8192")
    loaded = LoadedModel(_small_gpt(), "gpt") if name == "gpt" else None
    prepared = prepare(ModelOptions(name), RunOptions(inputs=(spec,)), loaded=loaded)
    model, x = prepared.model, prepared.inputs.args[0]
    model.eval()
    plan = plan_cost()

    def counting() -> None:  # the default before: the forward that counts, the report
        probe, records, error = measure(prepared, mode=Mode.EVAL)
        build_report(prepared, probe, records, error, plan)

    def cost() -> None:  # the public call: the counting pass and the two tracked peaks
        hookcli.cost(model, x)

    def flopcounter() -> None:
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as counter:
            model(x)
        counter.get_flop_counts()

    opt = torch.optim.Adam(model.parameters(), lr=0.0)

    def train_step() -> None:  # what the training figure measures, with nothing around it
        model.train()
        out = model(x)
        out = out.logits if hasattr(out, "logits") else out
        out.float().sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        model.eval()

    runs = {"bare": counting, "cost": cost, "flopcounter": flopcounter, "train_step": train_step}
    return interleave(runs, rounds(repeats))


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
    from hookcli.cost.runner import Optimizer, measure, memory_totals
    from hookcli.options import Mode, ModelOptions, RunOptions
    from hookcli.pipeline import prepare
    from hookcli.sources import LoadedModel

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

    from hookcli.inputs.grammar import parse_spec

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


@benchmark
def main() -> None:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _main(torch)
    finally:
        torch.set_num_threads(before)


def _main(torch: Any) -> None:
    t = decoder_on_meta()
    print(
        "hookcli.cost vs hookcli.inspect, 7B decoder (seq 2048) on meta, in process: "
        f"inspect {t['bare']['wall']:.3f} s, cost {t['cost']['wall']:.3f} s, "
        f"ratio {t['cost']['ratio']:.2f} (target <= 2)",
        flush=True,
    )
    record(
        "cost_meta", t["cost"]["ratio"], what="`cost` vs `inspect`, 7B decoder on meta, in process"
    )
    t = whole_process()
    print(
        "cost vs inspect, 7B decoder on meta, whole process (both HOOKCLI_FULL_EXIT=1): "
        f"inspect {t['bare']['wall']:.2f} s, cost {t['cost']['wall']:.2f} s, "
        f"ratio {t['cost']['ratio']:.2f} (target <= 2)",
        flush=True,
    )
    for batch in (1, 8):
        t = resnet50_cpu(batch)
        b, c, g, f = t["bare"], t["cost"], t["bare_grad"], t["flopcounter"]
        print(
            f"cost's counting pass, resnet50 b{batch} cpu (1 thread), in process: FlopCounterMode "
            f"{f['wall']:.3f} s, cost {c['wall']:.3f} s; bare inference forward "
            f"{b['wall']:.3f} s, cost/bare {c['ratio']:.3f}; a plain forward with autograd "
            f"on {g['wall']:.3f} s ({g['ratio']:.2f}x), cost against it {c['vs']['bare_grad']:.2f}",
            flush=True,
        )
        label = f"cost's counting pass, resnet50 b{batch}, vs FlopCounterMode (a plain forward)"
        print(target_line(label, c["vs"]["flopcounter"], f"cost_vs_flopcounter_b{batch}"))
        record(f"cost_vs_flopcounter_b{batch}", c["vs"]["flopcounter"], what=label)
        record(
            f"cost_b{batch}",
            c["ratio"],
            what=f"cost's counting pass, resnet50 b{batch}, vs a bare inference forward",
        )
    for case in DEFAULT_CASES:
        t = default_cost(case, 3 if "resnet50" in case else 5)
        c, k, f, s = t["cost"], t["bare"], t["flopcounter"], t["train_step"]
        print(
            f"default cost, {case}, cpu ({cpu_model()}, 1 thread, torch {torch.__version__}), in "
            f"process: cost {c['wall']:.3f} s; the default before (counting pass and "
            f"report) {k['wall']:.3f} s, cost/it {c['ratio']:.2f}; FlopCounterMode "
            f"{f['wall']:.3f} s, cost/it {c['vs']['flopcounter']:.2f}; a plain Adam "
            f"training step {s['wall']:.3f} s, cost/it {c['vs']['train_step']:.2f}",
            flush=True,
        )
        key = case.split()[0].lower().replace("-", "").replace("(", "")
        record(
            f"cost_default_vs_before_{key}",
            c["ratio"],
            what=f"default cost (both tracked peaks), {case}, vs the default before",
        )
        record(
            f"cost_default_vs_flopcounter_{key}",
            c["vs"]["flopcounter"],
            what=f"default cost (both tracked peaks), {case}, vs FlopCounterMode",
        )
    if not torch.cuda.is_available():
        print("CUDA training-step comparison: skipped (no CUDA device)")
        return
    gib = 2**30
    for label, t, peak, ti in cuda_training_peaks():
        est, live = t["memory_parts"]["train_step_bytes"], t["memory_parts"]["train_peak_bytes"]
        extra = "" if ti is None else f", torchinfo estimate {ti / gib:.2f} GiB"
        print(
            f"{label}: measured Adam-step peak {peak / gib:.2f} GiB; hookcli train step "
            f"{est / gib:.2f} GiB ({(est - peak) / peak:+.1%}), training peak "
            f"{live / gib:.2f} GiB ({(live - peak) / peak:+.1%}){extra}",
            flush=True,
        )


if __name__ == "__main__":
    main()
