"""``hookcli trace MODEL``: the hook events of one run, in the order they fire."""

from typing import Annotated

import typer

from hookcli import cliopts as opts

NAME = "trace"

BackwardOpt = opts.backward(
    "Also run backward (loss from --loss) and trace the global "
    "full backward-pre and backward hooks."
)
LimitOpt = Annotated[
    int | None,
    typer.Option(
        "--limit",
        "-n",
        min=1,
        metavar="N",
        help="Keep the first N events (after --filter).",
        show_default=False,
    ),
]
FilterOpt = opts.patterns(
    "--filter",
    "Keep events of matching modules: a glob on the qualified name or the class "
    "name (layer1.*, *conv*, BatchNorm2d), a module name with its submodules (layer1), "
    "or (root).",
    str | None,
)


@opts.forwards(
    "hookcli.probes.trace:cli_command",
    (opts.MODEL, *opts.FORWARD, opts.DEPTH, opts.Param("backward", BackwardOpt, False), opts.LOSS),
    (opts.Param("limit", LimitOpt), opts.Param("filter", FilterOpt), *opts.REPORT),
)
def command() -> None:
    """The event timeline: every global forward-pre/forward (and backward) hook firing."""
