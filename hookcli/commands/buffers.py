"""``hookcli buffers MODEL``: every buffer, before and after N forward passes."""

from typing import Annotated

import typer

from hookcli import cliopts as opts

NAME = "buffers"

StepsOpt = Annotated[
    int,
    typer.Option(
        "--steps",
        min=1,
        metavar="N",
        help="Forward passes between the 'before' and 'after' summaries.",
    ),
]


@opts.forwards(
    "hookcli.probes.buffers:cli_command",
    (opts.MODEL, *opts.FORWARD, opts.Param("steps", StepsOpt, 1), opts.DEPTH, *opts.REPORT),
)
def command() -> None:
    """Every buffer: owner, shape, dtype, persistent, summary before/after N steps, changed."""
