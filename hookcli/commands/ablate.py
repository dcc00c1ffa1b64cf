"""``hookcli ablate MODEL --layer GLOB``: replace module outputs (or gradients) with hooks and
rank the modules by how much the model's output moves."""

from typing import Annotated

import typer

from hookcli.cliopts import (
    AnnotateOpt,
    AtolOpt,
    BaselineOpt,
    BatchOpt,
    DebugOpt,
    DeviceOpt,
    DtypeOpt,
    FormatOpt,
    InputFileOpt,
    InputOpt,
    InputsFromOpt,
    JunitOpt,
    KwargsOpt,
    LossOpt,
    ModelArg,
    ModeOpt,
    OutputOpt,
    RtolOpt,
    SeedOpt,
    TrustPickleOpt,
    UpdateBaselineOpt,
    WeightsOpt,
)
from hookcli.options import Format

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


def command(
    model: ModelArg,
    layer: LayerOpt,
    op: OpOpt = None,
    grad_op: GradOpOpt = None,
    together: TogetherOpt = False,
    leaves: LeavesOpt = False,
    metric: MetricOpt = None,
    fail_on: AblateFailOnOpt = None,
    loss: LossOpt = None,
    kwargs: KwargsOpt = None,
    weights: WeightsOpt = None,
    trust_pickle: TrustPickleOpt = False,
    input: InputOpt = None,
    input_file: InputFileOpt = None,
    inputs_from: InputsFromOpt = None,
    batch_size: BatchOpt = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = None,
    mode: ModeOpt = None,
    format: FormatOpt = Format.TABLE,
    output: OutputOpt = None,
    baseline: BaselineOpt = None,
    update_baseline: UpdateBaselineOpt = False,
    rtol: RtolOpt = None,
    atol: AtolOpt = None,
    annotate: AnnotateOpt = None,
    junit: JunitOpt = None,
    seed: SeedOpt = 0,
    debug: DebugOpt = False,
) -> int:
    """Ablate each module --layer matches (zero, mean, scale, noise, clamp its output; or its
    gradient with --grad-op) and rank them by the change of the model's output."""
    from hookcli.ablate.runner import cli_command

    return cli_command(
        model=model,
        layer=layer,
        op=op,
        grad_op=grad_op,
        together=together,
        leaves=leaves,
        metric=metric,
        fail_on=fail_on,
        loss=loss,
        kwargs=kwargs,
        weights=weights,
        trust_pickle=trust_pickle,
        input=input,
        input_file=input_file,
        inputs_from=inputs_from,
        batch_size=batch_size,
        device=device,
        dtype=dtype,
        mode=mode,
        format=format,
        output=output,
        baseline=baseline,
        update_baseline=update_baseline,
        rtol=rtol,
        atol=atol,
        annotate=annotate,
        junit=junit,
        seed=seed,
        debug=debug,
    )
