"""``hookcli watch [OPTIONS] -- COMMAND [ARGS...]``: watch a real training run, unchanged."""

from typing import Annotated, Any

import typer

from hookcli import cliopts as opts
from hookcli.watch.config import DEFAULT_EVERY

NAME = "watch"

CommandArg = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="-- COMMAND [ARGS]...",
        help="The command that trains (python train.py, python -m pkg.train, torchrun ..., "
        "accelerate launch ...), after --.",
        show_default=False,
    ),
]
EveryOpt = Annotated[
    int,
    typer.Option(
        "--every",
        metavar="N",
        min=1,
        help="Per-module figures (grad norm, weight norm, update/weight ratio, activation "
        "statistics) on the first step and every N-th; loss, total grad norm, learning "
        "rates and step time on every step.",
        rich_help_panel="Run",
    ),
]
NanOriginOpt = Annotated[
    bool,
    typer.Option(
        "--nan-origin",
        help="Check every module's output and input gradient on every step, so the first "
        "NaN/Inf is traced to the module that produced it (slower: see docs/watch.md).",
        rich_help_panel="Run",
    ),
]
WatchFailOnOpt = Annotated[
    str | None,
    typer.Option(
        "--fail-on",
        metavar="CHECKS",
        help="Comma-separated checks that fail the run (exit 1): nan, inf, dead, vanishing, "
        "exploding, unused.",
        show_default=False,
        rich_help_panel="Checks",
    ),
]
StopOnOpt = Annotated[
    str | None,
    typer.Option(
        "--stop-on",
        metavar="nan[,inf]",
        help="End the run at the first NaN (or Inf) in a loss or gradient, before the "
        "optimizer applies it (exit 1).",
        show_default=False,
        rich_help_panel="Checks",
    ),
]
MinGradNormOpt = opts.threshold(
    "--min-grad-norm",
    "vanishing: a module's grad norm below X on a logged step (default 1e-8).",
    rich_help_panel="Checks",
)
MaxGradNormOpt = opts.threshold(
    "--max-grad-norm",
    "exploding: a module's (or the total) grad norm above X (default 1e3).",
    rich_help_panel="Checks",
)
MaxUpdateRatioOpt = opts.threshold(
    "--max-update-ratio",
    "exploding: a module's ||w_after - w_before|| / ||w_before|| above X (default 1).",
    rich_help_panel="Checks",
)


def _output(flag: str, metavar: str, help: str) -> Any:
    """A path in the Output panel, kept as typed: an empty path is refused by name, not
    taken for '.'."""
    return opts.option(str | None, flag, metavar=metavar, help=help, rich_help_panel="Output")


OutDirOpt = _output(
    "--out",
    "DIR",
    "Where steps.jsonl (one per rank) and report.json go (default: a new hookcli-runs/<time>/).",
)
PlotOpt = _output(
    "--plot",
    "FILE.png",
    "Save a heatmap of log grad norm (modules x steps) with the loss and total grad norm "
    "(needs matplotlib: pip install 'hookcli[plot]').",
)
TensorboardOpt = _output(
    "--tensorboard",
    "DIR",
    "Write the per-step scalars as TensorBoard event files while the run goes "
    "(needs tensorboard: pip install 'hookcli[tensorboard]').",
)
# -o as typed, as the others: '' is refused by name (a Path would make it '.')
OutputOpt = opts.option(
    str | None, "--output", "-o", metavar="FILE", help="Write the report to FILE instead of stdout."
)


@opts.forwards(
    "hookcli.watch.command:cli_command",
    (opts.Param("cmd", CommandArg), opts.Param("every", EveryOpt, DEFAULT_EVERY)),
    (opts.Param("nan_origin", NanOriginOpt, False), opts.Param("fail_on", WatchFailOnOpt)),
    (opts.Param("stop_on", StopOnOpt), opts.Param("min_grad_norm", MinGradNormOpt)),
    opts.Param("max_grad_norm", MaxGradNormOpt),
    opts.Param("max_update_ratio", MaxUpdateRatioOpt),
    (opts.Param("out", OutDirOpt), opts.Param("plot", PlotOpt)),
    (opts.Param("tensorboard", TensorboardOpt), opts.FORMAT, opts.Param("output", OutputOpt)),
    opts.DEBUG,
)
def command() -> None:
    """Watch a real training run, unchanged: per-step loss, grad norms, update ratios and
    activations of every model it trains, the first NaN/Inf and where it came from; checks
    that fail CI. Runs COMMAND with hookcli's monitor in each of its Python processes."""


# Everything after COMMAND's first word is COMMAND's own (its --flags too).
command.context_settings = {"allow_interspersed_args": False}  # type: ignore[attr-defined]
