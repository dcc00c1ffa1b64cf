"""``hookcli buffers MODEL``: every buffer, before and after N forward passes."""

from typing import Annotated

import typer

from hookcli.cliopts import (
    AnnotateOpt,
    AtolOpt,
    BaselineOpt,
    BatchOpt,
    DebugOpt,
    DepthOpt,
    DeviceOpt,
    DtypeOpt,
    FormatOpt,
    InputFileOpt,
    InputOpt,
    InputsFromOpt,
    JunitOpt,
    KwargsOpt,
    ModelArg,
    ModeOpt,
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


def command(
    model: ModelArg,
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
    steps: StepsOpt = 1,
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
    """Every buffer: owner, shape, dtype, persistent, summary before/after N steps, changed."""
    from hookcli.pipeline import emit, prepare, run_session
    from hookcli.probes.buffers import BufferProbe, buffers_report

    mopts = model_options(model, kwargs, weights, trust_pickle, seed)
    ropts = run_options(
        input,
        batch_size,
        device,
        dtype,
        mode,
        Mode.TRAIN,
        input_file=input_file,
        inputs_from=inputs_from,
    )
    ci = ci_options(baseline, update_baseline, annotate, junit, rtol, atol)
    out = output_options(format, output, depth, debug, ci)

    prepared = prepare(mopts, ropts)
    probe = BufferProbe()
    outcome = run_session(prepared, [probe], mode=ropts.mode, steps=steps)
    code = emit(buffers_report(prepared, probe, outcome, steps=steps, depth=out.depth), out)
    if outcome.error is not None:
        raise outcome.error
    return code
