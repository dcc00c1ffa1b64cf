"""``hookcli grads MODEL``: per-layer gradient flow from backward and tensor hooks; CI gates."""

from typing import Annotated

import typer

from hookcli import cliopts as opts
from hookcli.distributed import options as dist

NAME = "grads"

PerParamOpt = Annotated[
    bool,
    typer.Option(
        "--per-param",
        help="Add a row per parameter: shape, grad_norm, weight_norm, grad/weight, NaN and Inf "
        "counts (CSV/Markdown then carry these rows).",
    ),
]
MaxGradNormOpt = opts.threshold(
    "--max-grad-norm", "Fail (exit 1) when a layer's grad_norm is above X."
)
MinGradNormOpt = opts.threshold(
    "--min-grad-norm", "Fail (exit 1) when a layer's grad_norm is below X."
)
PlotOpt = opts.plot("Save a gradient-flow chart (needs matplotlib: pip install 'hookcli[plot]').")
GradsFailOnOpt = opts.checks(
    "Comma-separated checks that fail the run (exit 1): nan, inf, unused, zero-grad, "
    "dead; with --ddp also desync."
)


@opts.forwards(
    "hookcli.grads.command:cli_command",
    (opts.MODEL, *opts.FORWARD, opts.LOSS, opts.DEPTH, opts.HOOKS, opts.GLOBAL_HOOKS),
    (opts.Param("per_param", PerParamOpt, False), opts.Param("fail_on", GradsFailOnOpt)),
    (opts.Param("max_grad_norm", MaxGradNormOpt), opts.Param("min_grad_norm", MinGradNormOpt)),
    (opts.Param("plot", PlotOpt), *opts.REPORT, *dist.DISTRIBUTED),
)
def command() -> None:
    """Per-layer gradient flow: grad norms of parameters, grad_output, grad_input; checks."""
