"""``hookcli params MODEL``: every parameter, its tied names, trainable and frozen totals."""

from typing import Annotated

import typer

from hookcli import cliopts as opts

NAME = "params"

FrozenOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--frozen",
        metavar="PATTERN",
        help="Set requires_grad=False first on parameters whose qualified name matches a glob "
        "(backbone.*, *.bias) or lies under a module name (layer1). Repeatable.",
        show_default=False,
    ),
]


@opts.forwards(
    "hookcli.parameters:cli_command",
    (opts.MODEL, *opts.BUILD, opts.DEVICE, opts.DTYPE, opts.Param("frozen", FrozenOpt), opts.DEPTH),
    opts.REPORT,
)
def command() -> None:
    """Every parameter: shape, dtype, device, requires_grad, numel, tied/shared names; no hooks."""
