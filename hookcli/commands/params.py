"""``hookcli params MODEL``: every parameter, its tied names, trainable and frozen totals."""

from typing import Annotated

import typer

from hookcli.cliopts import (
    AnnotateOpt,
    AtolOpt,
    BaselineOpt,
    DebugOpt,
    DepthOpt,
    DeviceOpt,
    DtypeOpt,
    FormatOpt,
    JunitOpt,
    KwargsOpt,
    ModelArg,
    OutputOpt,
    RtolOpt,
    SeedOpt,
    TrustPickleOpt,
    UpdateBaselineOpt,
    WeightsOpt,
)
from hookcli.options import Format

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


def command(
    model: ModelArg,
    kwargs: KwargsOpt = None,
    weights: WeightsOpt = None,
    trust_pickle: TrustPickleOpt = False,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = None,
    frozen: FrozenOpt = None,
    depth: DepthOpt = None,
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
    """Every parameter: shape, dtype, device, requires_grad, numel, tied/shared names; no hooks."""
    from hookcli.parameters import cli_command

    return cli_command(
        model=model,
        kwargs=kwargs,
        weights=weights,
        trust_pickle=trust_pickle,
        device=device,
        dtype=dtype,
        frozen=frozen,
        depth=depth,
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
