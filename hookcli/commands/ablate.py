"""``hookcli ablate MODEL --layer GLOB``: replace module outputs (or gradients) with hooks and
rank the modules by how much the model's output moves."""

from typing import Annotated

import typer

from hookcli import cliopts as opts

NAME = "ablate"

LayerOpt = Annotated[
    list[str],
    typer.Option(
        "--layer",
        "-l",
        metavar="GLOB",
        help="A qualified module name (layer4) or a glob (layer3.*.conv2; '' or (root) for the "
        "root); each matching module is ablated on its own. Repeatable.",
        show_default=False,
    ),
]
LeavesOpt = Annotated[
    bool,
    typer.Option("--leaves", help="Keep only the matched modules that have no child modules."),
]
OpOpt = Annotated[
    str | None,
    typer.Option(
        "--op",
        metavar="OP",
        help="What replaces each output tensor: zero, mean (over the batch, dim 0), scale:K, "
        "noise:SIGMA (Gaussian, SIGMA times the tensor's std, seeded by --seed), clamp:LO..HI. "
        "Default: zero (none when only --grad-op is given).",
        show_default=False,
    ),
]
GradOpOpt = Annotated[
    str | None,
    typer.Option(
        "--grad-op",
        metavar="OP",
        help="Replace the gradient flowing back into each module's output with a tensor hook: "
        "zero or scale:K. Runs backward (loss from --loss) and reports every parameter group's "
        "grad norm.",
        show_default=False,
    ),
]
TogetherOpt = Annotated[
    bool,
    typer.Option("--together", help="Ablate every matched module in one pass (one row)."),
]
MetricOpt = Annotated[
    str | None,
    typer.Option(
        "--metric",
        metavar="METRIC",
        help="Rank by rel_l2 (default), cosine, max_abs, top1_agreement, kl, or grad_rel_l2 "
        "(the default with --grad-op alone); largest effect first.",
        show_default=False,
    ),
]
AblateFailOnOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--fail-on",
        metavar="GATE",
        help="[GLOB:]METRIC<X (or <=, >, >=): fail (exit 1) when an ablation meets it, e.g. "
        "fc:top1_agreement>0.99 (ablating fc changes almost no prediction). Repeatable.",
        show_default=False,
    ),
]


@opts.forwards(
    "hookcli.ablate.runner:cli_command",
    (opts.MODEL, opts.Param("layer", LayerOpt, opts.REQUIRED), opts.Param("op", OpOpt)),
    (opts.Param("grad_op", GradOpOpt), opts.Param("together", TogetherOpt, False)),
    (opts.Param("leaves", LeavesOpt, False), opts.Param("metric", MetricOpt)),
    (opts.Param("fail_on", AblateFailOnOpt), opts.LOSS, *opts.FORWARD, *opts.REPORT),
)
def command() -> None:
    """Ablate each module --layer matches (zero, mean, scale, noise, clamp its output; or its
    gradient with --grad-op) and rank them by the change of the model's output."""
