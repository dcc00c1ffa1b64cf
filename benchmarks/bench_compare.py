"""compare's cost, per mode, against its floor: two bare forwards plus one read of every
module output; and its peak memory against the larger model's forward.

``hookcli.compare(a, b, x)`` (the Python twin: the same runner as the command) on a model
and a copy of it with its first weight scaled by 1 + 1e-3 (so every output from there on
differs and each figure takes its full path, as in a real comparison):

1. propagated mode alone (A's pass, B's pass, the per-call figures);
2. local mode alone: the time of both modes minus propagated's, against the same floor
   (one more forward of each model in step, B's modules fed A's values, and the
   figures);
3. both modes (the report compare prints).

The floor: A's and B's bare ``inference_mode`` forwards, with a forward hook on every
module of both that reads each output tensor once (one ``torch.sum``). Target <= 1.15
per mode. Interleaved rounds (the order rotates each round); the median of the per-round
ratios, and their spread (min..max). The floor is timed twice per round: the ratio of
the two (``noise``, 1 on a quiet machine) is each mode's noise row.

Memory: each case in a fresh subprocess (``--peak CASE``), which builds both models and
runs the case once; its peak RSS (``VmHWM``) against the case ``forward`` (both
models built, the larger model's bare forward). The target: an excess no larger than one
copy of the largest module output (measured by hooks, printed beside it).

Models: ``resnet50`` (torchvision, eval, b8 3x224x224 unless ``--batch``/``--size``)
and ``gpt2`` (transformers' GPT2LMHeadModel at GPT-2 small's shape: 12 layers, 768 wide,
12 heads, random weights; b1, ``--seq`` 64 tokens). ``--model`` picks one (default both).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import benchmark, cpu_model, record, rounds, smoke

ROOT = Path(__file__).resolve().parent.parent


def _models(name: str, batch: int, size: int, seq: int) -> tuple[Any, Any, Any]:
    """A, B (A's copy, first weight scaled by 1 + 1e-3) and the input."""
    import copy

    import torch

    torch.manual_seed(0)
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        small = smoke()
        config = GPT2Config(
            n_layer=2 if small else 12,
            n_embd=64 if small else 768,
            n_head=4 if small else 12,
            n_positions=max(seq, 64),
            vocab_size=1000 if small else 50257,
        )
        model = GPT2LMHeadModel(config).eval()
        x: Any = torch.randint(0, config.vocab_size, (batch, seq))
    else:
        import torchvision

        model = torchvision.models.get_model(name, weights=None).eval()
        x = torch.randn(batch, 3, size, size)
    other = copy.deepcopy(model)
    with torch.no_grad():
        next(other.parameters()).mul_(1 + 1e-3)
    return model, other, x


def _read_hooks(models: tuple[Any, ...]) -> list[Any]:
    from hookcli.structures import iter_tensors

    def read(mod: Any, args: Any, out: Any) -> None:
        for t in iter_tensors(out):
            t.sum()

    return [m.register_forward_hook(read) for model in models for m in model.modules()]


def _cases(a: Any, b: Any, x: Any) -> dict[str, Any]:
    import torch

    import hookcli

    def floor() -> None:
        handles = _read_hooks((a, b))
        try:
            with torch.inference_mode():
                a(x)
                b(x)
        finally:
            for h in handles:
                h.remove()

    def forward() -> None:
        with torch.inference_mode():
            a(x)

    def propagated() -> None:
        from hookcli.compare import runner

        real = runner.Plan
        runner.Plan = functools.partial(real, local=False)  # type: ignore[misc]
        try:
            hookcli.compare(a, b, (x,))
        finally:
            runner.Plan = real  # type: ignore[misc]

    def both() -> None:
        hookcli.compare(a, b, (x,))

    return {
        "bare": floor,
        "bare2": floor,  # the noise row: the floor timed twice
        "forward": forward,
        "propagated": propagated,
        "both": both,
    }


def _largest_output(a: Any, x: Any) -> int:
    import torch

    from hookcli.structures import iter_tensors

    sizes = [0]

    def hook(mod: Any, args: Any, out: Any) -> None:
        sizes.extend(t.numel() * t.element_size() for t in iter_tensors(out))

    handles = [m.register_forward_hook(hook) for m in a.modules()]
    try:
        with torch.inference_mode():
            a(x)
    finally:
        for h in handles:
            h.remove()
    return max(sizes)


def _hwm_mib() -> float:
    """This process's peak RSS (VmHWM: unlike ``ru_maxrss``, not inherited from the
    parent across fork and exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def peak_child(args: argparse.Namespace) -> None:
    """(In a fresh process) build, run one case once, print the peak RSS in MiB."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    a, b, x = _models(args.model, args.batch, args.size, args.seq)
    case = _cases(a, b, x)[args.peak]
    built = _hwm_mib()
    case()
    peak = _hwm_mib()
    out = {"built": built, "peak": peak}
    if args.peak == "forward":
        out["largest"] = _largest_output(a, x) / 2**20
    print(json.dumps(out))


def _peak(args: argparse.Namespace, case: str) -> dict[str, float]:
    cmd = [
        sys.executable, str(Path(__file__).resolve()), "--peak", case, "--model", args.model,
        "--batch", str(args.batch), "--size", str(args.size), "--seq", str(args.seq),
    ]  # fmt: skip
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True, cwd=ROOT)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def measure(args: argparse.Namespace) -> None:
    import torch

    a, b, x = _models(args.model, args.batch, args.size, args.seq)
    cases = _cases(a, b, x)
    names = ["bare", "bare2", "propagated", "both"]
    for name in names:  # warm-up
        cases[name]()
    wall: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds(args.repeats)):
        for k in names[r % 4 :] + names[: r % 4]:
            t0 = time.perf_counter()
            cases[k]()
            wall[k].append(time.perf_counter() - t0)
    ratios = {
        "noise": [g / f for g, f in zip(wall["bare2"], wall["bare"], strict=True)],
        "propagated": [p / f for p, f in zip(wall["propagated"], wall["bare"], strict=True)],
        "local": [
            (t - p) / f
            for t, p, f in zip(wall["both"], wall["propagated"], wall["bare"], strict=True)
        ],
        "both": [t / f for t, f in zip(wall["both"], wall["bare"], strict=True)],
    }
    what = (
        f"gpt2-small shape b{args.batch} {args.seq} tokens"
        if args.model == "gpt2"
        else f"{args.model} b{args.batch} 3x{args.size}x{args.size}"
    )
    load = os.getloadavg()[0]
    print(
        f"compare {what}; CPU {cpu_model()}, {os.cpu_count()} cores, torch "
        f"{torch.__version__}, {torch.get_num_threads()} threads, load {load:.1f}; "
        f"{len(wall['bare'])} interleaved rounds",
        flush=True,
    )
    print(
        f"  floor (2 bare forwards + one sum of every module output): median "
        f"{statistics.median(wall['bare']):.2f} s",
        flush=True,
    )
    for mode, rs in ratios.items():
        med = statistics.median(rs)
        print(
            f"  {mode:<10} ratio to the floor: median {med:.2f} (rounds {min(rs):.2f}..."
            f"{max(rs):.2f}); "
            + (
                "the floor against itself: 1 on a quiet machine"
                if mode == "noise"
                else "target <= 1.15 per mode"
            ),
            flush=True,
        )
        if mode == "noise":  # publish.py's noise row of each mode's figure
            for of in ("propagated", "local"):
                record(
                    f"compare_{args.model}_{of}_again",
                    med,
                    what=f"the floor against itself, {what} (noise row)",
                    target="-",
                )
            continue
        record(
            f"compare_{args.model}_{mode}",
            med,
            what=f"`compare` {mode}, {what}, vs 2 bare forwards + one read of every output",
            target="<= 1.15" if mode != "both" else "-",
        )
    fwd = _peak(args, "forward")
    for case in ("propagated", "both"):
        p = _peak(args, case)
        excess = p["peak"] - fwd["peak"]
        print(
            f"  peak RSS {case}: {p['peak']:.0f} MiB against {fwd['peak']:.0f} MiB for the "
            f"forward ({fwd['built']:.0f} MiB once both are built): +{excess:.0f} MiB, "
            f"{excess / max(fwd['largest'], 1e-9):.1f} x the largest output "
            f"({fwd['largest']:.1f} MiB); target <= 1 x",
            flush=True,
        )


@benchmark
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="resnet50 (or a torchvision name), gpt2")
    parser.add_argument("--batch", type=int, default=None, help="8 for resnet50, 1 for gpt2")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--peak", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv if argv is not None else [])
    if smoke():
        args.size, args.seq = 32, 8
    models = [args.model] if args.model else ["resnet50", "gpt2"]
    for model in models:
        run = argparse.Namespace(**vars(args))
        run.model = model
        if run.batch is None:
            run.batch = 1 if model == "gpt2" or smoke() else 8
        if args.peak:
            peak_child(run)
            return
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        measure(run)


if __name__ == "__main__":
    main(sys.argv[1:])
