"""features on a model that raises: the cost of naming where it failed.

``hookcli features`` has no Python API: the command is timed, called in process as the
CLI calls it (``hookcli.commands.features.command``: build, draw the input, the hooked
forward that raises, the module located, the report of the layers that ran), on
resnet50 (batch 2) whose ``fc`` has the wrong width, so forward raises in ``fc``, a
module that is not hooked (``--layer layer1``). Against: the same build and a bare
forward that raises the same way. Interleaved rounds, median of the per-round ratios.
Before issue 10 item 20 features ran forward a second time with every module hooked to
find the module (about 2x).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

if TYPE_CHECKING:
    from torch import nn

from benchmarks.common import benchmark, interleave, record, rounds, smoke

SPEC = "benchmarks/bench_features_failure.py:broken"


def _name() -> str:
    return "resnet18" if smoke() else "resnet50"


def broken() -> nn.Module:
    """resnet50 (resnet18 under --smoke) whose fc expects 1000 features: forward raises."""
    import torch
    import torchvision
    from torch import nn

    torch.manual_seed(0)
    model = torchvision.models.get_model(_name(), weights=None)
    model.fc = nn.Linear(1000, 10)
    return model


@benchmark
def main(batch: int = 2, repeats: int = 5) -> None:
    import torch

    from hookcli.commands.features import command
    from hookcli.errors import RunError
    from hookcli.options import Format

    size = 64 if smoke() else 224
    shape = f"{batch}x3x{size}x{size}"

    def bare() -> None:
        model = broken().eval()
        x = torch.randn((batch, 3, size, size), generator=torch.Generator().manual_seed(0))
        try:
            with torch.inference_mode():
                model(x)
        except RuntimeError:
            return
        raise AssertionError("the broken model ran")

    message: list[str] = []

    def features() -> None:
        try:
            command(
                model=SPEC,
                layer=["layer1"],
                input=[shape],
                format=Format.JSON,
                output=Path(os.devnull),
            )
        except RunError as err:  # exit 4, as the CLI maps it
            message[:] = [str(err)]
            return
        raise AssertionError("features did not fail")

    cwd = os.getcwd()
    os.chdir(Path(__file__).resolve().parent.parent)
    try:
        res = interleave({"bare": bare, "features": features}, rounds(repeats))
    finally:
        os.chdir(cwd)
    print(f"failure named: {message[0][:80]}...")
    ratio = res["features"]["ratio"]
    print(
        f"hookcli features (failing run, {_name()}, batch {batch}) vs build + bare failing "
        f"forward: {res['bare']['wall']:.3f} s vs {res['features']['wall']:.3f} s, "
        f"ratio {ratio:.2f}x (median of {rounds(repeats)} rounds)"
    )
    record(
        "features_failure",
        ratio,
        what="`features` on a model that raises vs build + bare forward",
    )


if __name__ == "__main__":
    main()
