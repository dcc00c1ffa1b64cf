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
    ci_options,
    model_options,
    output_options,
    run_options,
)
from hookcli.options import Format, Mode

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
    from hookcli.parameters import freeze, params_report
    from hookcli.pipeline import emit, prepare

    mopts = model_options(model, kwargs, weights, trust_pickle, seed)
    ropts = run_options(None, None, device, dtype, None, Mode.EVAL)
    ci = ci_options(baseline, update_baseline, annotate, junit, rtol, atol)
    out = output_options(format, output, depth, debug, ci)
    prepared = prepare(mopts, ropts, need_inputs=False)
    frozen_names = freeze(prepared.model, list(frozen or ()))
    return emit(params_report(prepared, out.depth, list(frozen or ()), frozen_names), out)
