"""ablate overhead, as ratios against bare PyTorch forwards in the same process.

There is no Python API for ablate: the command itself is timed, called in process as
the CLI calls it (``hookcli.commands.ablate.command``: build the model, draw the input,
the clean pass, the ablated passes, rank, the report written as JSON to /dev/null),
against the same work without hooks (build, draw, as many bare
``torch.inference_mode()`` forwards as the command runs passes).

1. One ablation: ``ablate resnet18 -l fc`` (2 passes) against build + 2 forwards.
   Target <= 1.10.
2. Every leaf module of resnet18 one at a time (``-l '*' --leaves``) against build +
   leaves + 1 forwards. Target: about 1.10.

Interleaved rounds, median of the per-round ratios. resnet18, eval, 1x3x224x224
unless ``--batch``/``--size``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import interleave, record, rounds, smoke


def measure(batch: int = 1, repeats: int = 3, size: int = 224) -> dict[str, Any]:
    import torch
    import torchvision

    from hookcli.commands.ablate import command
    from hookcli.options import Format, ModelOptions, RunOptions
    from hookcli.pipeline import prepare

    name = "resnet18"
    shape = f"{batch}x3x{size}x{size}"
    prepared = prepare(ModelOptions(name), RunOptions(inputs=(shape,)))
    model, x = prepared.model.eval(), prepared.inputs.args[0]
    n_leaves = sum(1 for m in model.modules() if not list(m.children()))

    def bare(passes: int) -> Any:
        def run() -> None:
            # what the command does without hooks: build the model, draw the input, forward
            torch.manual_seed(0)
            m = torchvision.models.get_model(name, weights=None).eval()
            inp = torch.randn(x.shape, generator=torch.Generator().manual_seed(0))
            with torch.inference_mode():
                for _ in range(passes):
                    m(inp)

        return run

    def ablate(*layers: str, leaves: bool = False) -> Any:
        def run() -> None:  # the command, as the CLI calls it: build, run, rank, render
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
        f"hookcli ablate resnet18 -l fc -i {shape} (build, clean pass, one ablated pass, report) "
        f"vs build + 2 bare forwards: {one['bare']['wall']:.3f} s vs "
        f"{one['ablate']['wall']:.3f} s, "
        f"ratio {one['ablate']['ratio']:.3f} (target <= 1.10)",
        flush=True,
    )
    print(
        f"hookcli ablate resnet18 -l '*' --leaves ({r['leaves']} modules, {r['leaves'] + 1} "
        f"passes) vs build + {r['leaves'] + 1} bare forwards: ratio {every['ablate']['ratio']:.3f} "
        f"(target about 1.10)",
        flush=True,
    )
    record(
        "ablate_one",
        one["ablate"]["ratio"],
        what="`ablate resnet18 -l fc` vs build + 2 bare forwards",
        target="<= 1.10",
    )
    record(
        "ablate_all",
        every["ablate"]["ratio"],
        what="`ablate resnet18 --leaves` vs build + as many bare forwards",
        target="about 1.10",
    )


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
