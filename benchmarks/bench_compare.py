"""compare's cost, per mode, against its floor: two bare forwards plus one read of every
module output.

``hookcli.compare(a, b, x)`` (the Python twin: the same runner as the command) on a model
and its copy (``b`` = ``copy.deepcopy(a)``: every error is 0, the work is the same),

1. propagated mode alone (A's pass, B's pass, the per-call figures);
2. both modes (the report compare prints: propagated and the local passes, one per
   module depth);

each against the floor: A's and B's bare ``inference_mode`` forwards, with a forward hook
on every module of B that reads each output tensor once (``t.sum()``). Target <= 1.15
per mode. Also the process's peak RSS (``ru_maxrss``) after the runs, against the peak
after the bare forwards alone, and the CPU, threads and torch that the figures were taken
on. Interleaved rounds, median of the per-round ratios. resnet18, eval, 1x3x224x224
unless ``--model``/``--batch``/``--size``; ``--model gpt`` is a 4-layer GPT-2-shaped
decoder (tests/test_compare_models.py's ``Decoder``, d=768, 12 heads, 128 tokens).
"""

from __future__ import annotations

import argparse
import copy
import functools
import resource
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import benchmark, interleave, record, rounds, smoke


def _model(name: str, batch: int, size: int) -> tuple[Any, Any]:
    import torch

    torch.manual_seed(0)
    if name == "gpt":
        from tests.test_compare_models import Decoder

        seq = 16 if smoke() else 128
        d = 64 if smoke() else 768
        model = Decoder(vocab=1000, d=d, heads=12 if d % 12 == 0 else 4, n_layer=4, seq=seq)
        return model.eval(), torch.randint(0, 1000, (batch, seq))
    import torchvision

    model = torchvision.models.get_model(name, weights=None).eval()
    return model, torch.randn(batch, 3, size, size)


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def measure(name: str, batch: int, size: int, repeats: int) -> dict[str, Any]:
    import torch

    import hookcli
    from hookcli.compare import runner

    a, x = _model(name, batch, size)
    b = copy.deepcopy(a)

    def floor() -> None:
        def read(mod: Any, args: Any, out: Any) -> None:
            if isinstance(out, torch.Tensor):
                out.sum()
            elif isinstance(out, (tuple, list)):
                for t in out:
                    if isinstance(t, torch.Tensor):
                        t.sum()

        handles = [m.register_forward_hook(read) for m in b.modules()]
        try:
            with torch.inference_mode():
                a(x)
                b(x)
        finally:
            for h in handles:
                h.remove()

    def propagated() -> None:
        real = runner.Plan
        runner.Plan = functools.partial(real, local=False)  # type: ignore[misc]
        try:
            hookcli.compare(a, b, (x,))
        finally:
            runner.Plan = real  # type: ignore[misc]

    def both() -> None:
        hookcli.compare(a, b, (x,))

    floor()
    base = _peak_mib()
    res = interleave({"bare": floor, "propagated": propagated, "both": both}, rounds(repeats))
    return {
        "name": name,
        "batch": batch,
        "size": size,
        "res": res,
        "base": base,
        "peak": _peak_mib(),
    }


def report(r: dict[str, Any]) -> None:
    import torch

    res = r["res"]
    what = f"{r['name']} b{r['batch']}" + (f" {r['size']}px" if r["name"] != "gpt" else "")
    print(
        f"compare {what}, torch {torch.__version__}, {torch.get_num_threads()} threads: floor "
        f"(2 bare forwards + one read of every output) {res['bare']['wall']:.3f} s; "
        f"propagated {res['propagated']['wall']:.3f} s (ratio {res['propagated']['ratio']:.3f}); "
        f"both modes {res['both']['wall']:.3f} s (ratio {res['both']['ratio']:.3f}); "
        f"target <= 1.15 per mode",
        flush=True,
    )
    print(
        f"peak RSS: {r['peak']:.0f} MiB after compare vs {r['base']:.0f} MiB after the bare "
        "forwards",
        flush=True,
    )
    for mode in ("propagated", "both"):
        record(
            f"compare_{r['name']}_{mode}",
            res[mode]["ratio"],
            what=f"`compare` {mode}, {what}, vs 2 bare forwards + a read",
            target="<= 1.15",
        )


@benchmark
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18", help="a torchvision name, or gpt")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = parser.parse_args(argv if argv is not None else [])
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if smoke():
        args.size = 32
    report(measure(args.model, args.batch, args.size, args.repeats))


if __name__ == "__main__":
    main(sys.argv[1:])
