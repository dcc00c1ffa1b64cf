"""``hookcli models``: the model names hookcli can build."""

from typing import Annotated

import typer

from hookcli.cliopts import DebugOpt, FormatOpt, OutputOpt
from hookcli.options import Format

NAME = "models"

FilterOpt = Annotated[
    str | None,
    typer.Option(
        "--filter",
        metavar="PATTERN",
        help="Keep names matching a glob, matched whole: resnet*, *llama*, 'timm:vit_*'.",
        show_default=False,
    ),
]


SourceOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--source",
        metavar="SOURCE",
        help="Only these sources: torchvision, hf, timm, samples. Repeatable. "
        "Default: every installed one.",
        show_default=False,
    ),
]


def command(
    filter: FilterOpt = None,
    source: SourceOpt = None,
    format: FormatOpt = Format.TABLE,
    output: OutputOpt = None,
    debug: DebugOpt = False,
) -> int:
    """The model names it can build: torchvision, hf: and timm: (where installed), samples."""
    from hookcli.sources.listing import cli_command

    return cli_command(
        filter=filter,
        source=source,
        format=format,
        output=output,
        debug=debug,
    )
