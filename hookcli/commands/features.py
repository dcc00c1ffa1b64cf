"""``hookcli features MODEL --layer PATTERN``: save the outputs of matching modules."""

from pathlib import Path
from typing import Annotated

import typer

from hookcli import cliopts as opts

NAME = "features"

LayerOpt = Annotated[
    list[str],
    typer.Option(
        "--layer",
        "-l",
        metavar="PATTERN",
        help="A qualified module name (layer4) or a glob (layer3.*.conv2); only matching "
        "modules get a hook. Repeatable.",
        show_default=False,
    ),
]
OutOpt = Annotated[
    Path | None,
    typer.Option(
        "--out",
        metavar="FILE",
        help="Save the outputs: .pt (torch.save of a dict name -> tensor), .npz, or "
        ".safetensors (needs the safetensors package). Written atomically.",
        show_default=False,
    ),
]
PngOpt = Annotated[
    Path | None,
    typer.Option(
        "--png",
        metavar="FILE",
        help="A PNG grid of the feature maps (needs matplotlib: pip install 'hookcli[plot]').",
        show_default=False,
    ),
]
ChannelsOpt = Annotated[
    int,
    typer.Option(
        "--channels", min=1, metavar="N", help="Channels shown per 4-D feature map in --png."
    ),
]


@opts.forwards(
    "hookcli.features.runner:cli_command",
    (opts.MODEL, opts.Param("layer", LayerOpt, opts.REQUIRED), opts.Param("out", OutOpt)),
    (opts.Param("png", PngOpt), opts.Param("channels", ChannelsOpt, 16)),
    (*opts.FORWARD, *opts.REPORT),
)
def command() -> None:
    """Save the outputs of the modules --layer matches (.pt, .npz, .safetensors); optional
    PNG grid of their feature maps."""
