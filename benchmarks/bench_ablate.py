"""ablate overhead, as ratios against bare PyTorch forwards in the same process.

There is no Python API for ablate: the command itself is timed, called in process as
the CLI calls it (``hookcli.commands.ablate.command``: the options checked, the clean
pass, the ablated passes, rank, the report written as JSON to /dev/null), against as
many bare ``torch.inference_mode()`` forwards as the command runs passes. Neither side
builds the model or draws the input: both use one model and input made beforehand (the
command's ``prepare`` hands them over), so the build, which would be the same on both
sides, does not dilute the ratio.

1. One ablation: ``ablate resnet18 -l fc`` (2 passes) against 2 forwards.
   Target <= 1.10.
2. Every leaf module of resnet18 one at a time (``-l '*' --leaves``) against leaves + 1
   forwards. Target: about 1.10.

Interleaved rounds, median of the per-round ratios. resnet18, eval, 1x3x224x224
unless ``--batch``/``--size``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (
    TARGETS,
    benchmark,
    interleave,
    record,
    rounds,
    smoke,
    target_line,
)


@contextlib.contextmanager
def built(prepared: Any) -> Iterator[None]:
    """The command's ``prepare`` hands over the model and input made beforehand."""
    import hookcli.pipeline

    real = hookcli.pipeline.prepare
    hookcli.pipeline.prepare = lambda *args, **kwargs: prepared
    try:
        yield
    finally:
        hookcli.pipeline.prepare = real


def measure(batch: int = 1, repeats: int = 3, size: int = 224) -> dict[str, Any]:
    import torch

    from hookcli.commands.ablate import command
    from hookcli.options import Format, ModelOptions, RunOptions
    from hookcli.pipeline import prepare

    name = "resnet18"
    shape = f"{batch}x3x{size}x{size}"
    prepared = prepare(ModelOptions(name), RunOptions(inputs=(shape,)))
    model, x = prepared.model.eval(), prepared.inputs.args[0]
    n_leaves = sum(1 for m in model.modules() if not list(m.children()))

    def bare(passes: int) -> Any:
        def run() -> None:  # what the command's passes do without hooks
            with torch.inference_mode():
                for _ in range(passes):
                    model(x)

        return run

    def ablate(*layers: str, leaves: bool = False) -> Any:
        def run() -> None:  # the command as the CLI calls it, on the model built beforehand
            with built(prepared):
                code = command(
                    model=name,
                    layer=list(layers),
                    leaves=leaves,
                    input=[shape],
                    format=Format.JSON,
                    output=Path(os.devnull),
                )
            assert code in (0, None), code

        return run

    one = interleave({"bare": bare(2), "ablate": ablate("fc")}, rounds(repeats))
    every = interleave(
        {"bare": bare(n_leaves + 1), "ablate": ablate("*", leaves=True)}, rounds(repeats)
    )
    return {"batch": batch, "size": size, "leaves": n_leaves, "one": one, "all": every}


def report(r: dict[str, Any]) -> None:
    shape = f"{r['batch']}x3x{r['size']}x{r['size']}"
    one, every = r["one"], r["all"]
    print(
        f"hookcli ablate resnet18 -l fc -i {shape} (clean pass, one ablated pass, report; "
        f"no build) vs 2 bare forwards: {one['bare']['wall']:.3f} s vs "
        f"{one['ablate']['wall']:.3f} s; "
        + target_line("ratio", one["ablate"]["ratio"], "ablate_one"),
        flush=True,
    )
    print(
        f"hookcli ablate resnet18 -l '*' --leaves ({r['leaves']} modules, {r['leaves'] + 1} "
        f"passes; no build) vs {r['leaves'] + 1} bare forwards: ratio "
        f"{every['ablate']['ratio']:.3f} (target {TARGETS['ablate_all']})",
        flush=True,
    )
    record(
        "ablate_one",
        one["ablate"]["ratio"],
        what="`ablate resnet18 -l fc` vs 2 bare forwards (neither builds the model)",
    )
    record(
        "ablate_all",
        every["ablate"]["ratio"],
        what="`ablate resnet18 --leaves` vs as many bare forwards (neither builds the model)",
    )


@benchmark
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size", type=int, default=224, help="image height and width")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = parser.parse_args(argv if argv is not None else [])
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if smoke():
        args.size = 32
    report(measure(args.batch, args.repeats, args.size))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
