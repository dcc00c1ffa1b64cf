"""``grads`` overhead: resnet50, batch 8, against a bare forward + ``loss.backward()``.

In one process, on one model, interleaved rounds (bare, grads, floor; then grads,
floor, bare; ...) so that drift in machine load hits all alike; the figures are the
medians of the per-round ratios. Target: grads / floor <= 1.03 (grads / bare is shown
beside it).

- bare: ``loss = model(x).sum(); loss.backward()`` with grads reset to None;
- grads: the public call ``hookcli.grads(model, x, fail_on="nan,inf,dead")``: every
  hook, the forward watch those gates turn on, state saved and restored, the rows,
  the checks and the Report;
- floor: the bare step with plain PyTorch hooks that read, once each (one ``sum``),
  every tensor grads reports a figure of: each module output (the NaN/Inf/dead flags),
  each output gradient (``grad_output_norm``), each input gradient (``grad_input_norm``:
  torch's full backward hooks, the only way to see a module's grad_input, with the
  same aliasing of outputs that lets in-place ops run), and after backward each
  parameter gradient and each weight (``grad_norm``, ``weight_norm``): the least that
  exact per-layer figures cost, before any of hookcli's own work.
- outputs-only floor (shown, no target): the floor before 2026-11-26, which read only the
  outputs and output gradients, not the input gradients, parameter gradients and
  weights that grads also reports.

Every run starts from the model as a factory gives it, with no parameter gradients (as
``hookcli grads`` sees a model it built): the gradients a run leaves are dropped after it,
untimed. ``hookcli.grads`` leaves a model as it found it, so where gradients are already
there it keeps them and backward allocates new ones beside them: a run that followed a
bare step would pay for a second set of gradients (100 MB on resnet50, and their page
faults), which the bare step, which throws the old ones away, does not.

One CPU thread by default (``--threads 0``: torch's default). On a shared machine
torch's threads wait for each other whenever another process holds a core, which
stretches each run at random (2 threads measured 2 s to 12 s for the same bare run
here); one thread measures this process's own work, and the ratio is what counts.

Usage: ``python benchmarks/bench_grads.py [--model resnet50] [--batch 8] [--size 224]
[--repeats 9] [--device cpu] [--threads 1]`` (``python benchmarks/run.py grads`` runs
the defaults: resnet50, batch 8, 224px, 9 runs each; about a minute and a half).
"""

from __future__ import annotations

import argparse
import sys
import warnings
import weakref
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import benchmark, interleave, ratio_line, record, rounds, smoke, target_line


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


@benchmark
def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch.set_num_threads; 0 keeps torch's default"
    )
    args = parser.parse_args([] if argv is None else argv)

    import torch

    threads_before = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        return _measure(args, torch)
    finally:
        torch.set_num_threads(threads_before)  # run.py's next benchmarks get torch's default


def _measure(args: argparse.Namespace, torch: Any) -> dict[str, float]:

    import hookcli
    from hookcli.losses import reduce_output
    from hookcli.options import Mode, ModelOptions, RunOptions
    from hookcli.pipeline import prepare

    if smoke():
        args.model, args.batch, args.size = "resnet18", 1, 64
    spec = f"{args.batch}x3x{args.size}x{args.size}"
    prepared = prepare(
        ModelOptions(spec=args.model),
        RunOptions(inputs=(spec,), device=args.device, mode=Mode.TRAIN),
    )
    assert prepared.inputs is not None
    model = prepared.model
    x = prepared.inputs.args

    def bare() -> None:
        model.train()
        for p in model.parameters():
            p.grad = None
        loss = reduce_output(model(*x), "sum")
        loss.backward()
        float(loss.detach())  # hookcli reads the loss too
        _sync(args.device)

    def grads() -> None:  # the public call, report included; the gates turn on watch_forward
        report = hookcli.grads(model, *x, fail_on="nan,inf,dead")
        assert report.checks
        _sync(args.device)

    seen: dict[tuple[int, int], Any] = {}  # weak references: no tensor is kept alive

    def read(t: Any) -> None:  # each tensor object (and version) read once: one sum
        key = (id(t), t._version)
        ref = seen.get(key)
        if ref is None or ref() is not t:
            seen[key] = weakref.ref(t)
            t.detach().sum()

    def read_output(module: Any, inputs: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor) and output.is_floating_point():
            read(output)
            if output.requires_grad:
                output.register_hook(read)

    def read_grad_input(module: Any, grad_input: Any, grad_output: Any) -> None:
        for g in grad_input:
            if isinstance(g, torch.Tensor) and g.is_floating_point():
                read(g)

    def outputs_floor() -> None:  # plain hooks: every output and output gradient read once
        seen.clear()
        handles = [m.register_forward_hook(read_output) for m in model.modules()]
        try:
            bare()
        finally:
            for h in handles:
                h.remove()
            seen.clear()

    def floor() -> None:  # plain hooks: every tensor grads reports on, read once
        from torch.nn.modules import _functions

        from hookcli.session import _aliasing_hook_forward

        seen.clear()
        handles = [m.register_forward_hook(read_output) for m in model.modules()]
        handles += [m.register_full_backward_hook(read_grad_input) for m in model.modules()]
        fn_cls = _functions.BackwardHookFunction
        original = fn_cls.__dict__["forward"]
        fn_cls.forward = staticmethod(_aliasing_hook_forward)  # in-place ops on outputs
        try:
            with warnings.catch_warnings():  # the stem's input needs no grad: torch says so
                warnings.simplefilter("ignore", UserWarning)
                bare()
            for p in model.parameters():
                p.detach().sum()
                if p.grad is not None:
                    p.grad.sum()
        finally:
            fn_cls.forward = original
            for h in handles:
                h.remove()
            seen.clear()

    print(
        f"{args.model} batch {args.batch} at {args.size}px on {args.device}, "
        f"{torch.get_num_threads()} threads, {rounds(args.repeats)} interleaved rounds",
        flush=True,
    )
    runs = {"bare": bare, "grads": grads, "floor": floor, "outputs_floor": outputs_floor}

    def no_grads() -> None:  # untimed, after every run: the next one starts from none
        for p in model.parameters():
            p.grad = None

    res = interleave(runs, rounds(args.repeats), reset=no_grads)
    vs_floor = res["grads"]["vs"]["floor"]
    label = (
        f"hookcli.grads({args.model}, x, fail_on='nan,inf,dead') b{args.batch} vs its floor "
        "(hooks reading once each output, output gradient, input gradient, parameter "
        "gradient and weight)"
    )
    print(target_line(label, vs_floor, "grads_vs_floor"), flush=True)
    record("grads_vs_floor", vs_floor, what=label)
    label = (
        f"hookcli.grads({args.model}, x, fail_on='nan,inf,dead') b{args.batch} "
        "vs bare forward + backward"
    )
    print(ratio_line(label, res, "grads"), flush=True)
    record("grads", res["grads"]["ratio"], what=label)
    floor_label = (
        "floor: plain hooks that read once each output, output gradient, input gradient, "
        "parameter gradient and weight, vs bare forward + backward"
    )
    print(f"{floor_label}: ratio {res['floor']['ratio']:.3f}", flush=True)
    record("grads_floor", res["floor"]["ratio"], what=floor_label)
    label = (
        f"hookcli.grads({args.model}, x, fail_on='nan,inf,dead') b{args.batch} vs the "
        "outputs-only floor (each output and output gradient read once; no target)"
    )
    vs_outputs = res["grads"]["vs"]["outputs_floor"]
    print(f"{label}: ratio {vs_outputs:.3f}", flush=True)
    record("grads_vs_outputs_floor", vs_outputs, what=label)
    return {k: v["wall"] for k, v in res.items()} | {"ratio": res["grads"]["ratio"]}


if __name__ == "__main__":
    main(sys.argv[1:])
