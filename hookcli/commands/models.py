"""``hookcli models``: the model names hookcli can build."""

from typing import Annotated

import typer

from hookcli import cliopts as opts

NAME = "models"

FilterOpt = opts.patterns(
    "--filter",
    "Keep names matching a glob, matched whole: resnet*, *llama*, 'timm:vit_*'.",
    str | None,
)


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


@opts.forwards(
    "hookcli.sources.listing:cli_command",
    (opts.Param("filter", FilterOpt), opts.Param("source", SourceOpt)),
    (opts.FORMAT, opts.OUTPUT, opts.DEBUG),
)
def command() -> None:
    """The model names it can build: torchvision, hf: and timm: (where installed), samples."""
