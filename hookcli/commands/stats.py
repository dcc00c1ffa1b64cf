"""``hookcli stats MODEL``: activation statistics per module call, and the first NaN/Inf."""

from typing import Annotated

import typer

from hookcli import cliopts as opts
from hookcli.distributed import options as dist

NAME = "stats"

BackwardOpt = opts.backward(
    "Also run backward (loss from --loss) and add the statistics of grad_output."
)
FailOnOpt = opts.checks(
    "Comma-separated checks that fail the run (exit 1): nan, inf (in any module "
    "output, or gradient with backward kinds), dead (a module whose outputs are all zero); "
    "with --ddp also desync."
)
DeadThresholdOpt = Annotated[
    float | None,
    typer.Option(
        "--dead-threshold",
        metavar="F",
        help="The 'dead' check fails a module when at least F (0 < F <= 1) of its outputs "
        "are zero (default: all of them). Implies --fail-on dead.",
        show_default=False,
    ),
]


@opts.forwards(
    "hookcli.stats.command:cli_command",
    (opts.MODEL, *opts.FORWARD, opts.Param("backward", BackwardOpt, False), opts.LOSS),
    (opts.HOOKS, opts.GLOBAL_HOOKS, opts.Param("fail_on", FailOnOpt)),
    (opts.Param("dead_threshold", DeadThresholdOpt), opts.DEPTH),
    (*opts.REPORT, *dist.DISTRIBUTED),
)
def command() -> None:
    """Per-layer activation statistics (mean, std, min, max, mean |x|, zeros, NaN, Inf);
    the first module producing NaN/Inf; checks nan, inf, dead."""
