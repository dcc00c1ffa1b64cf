"""``hookcli trace MODEL``: the hook events of one run, in the order they fire."""

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

NAME = "trace"

BackwardOpt = Annotated[
    bool,
    typer.Option(
        "--backward",
        help="Also run backward (loss: the sum of the outputs) and trace the global "
        "full backward-pre and backward hooks.",
    ),
]
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
FilterOpt = Annotated[
    str | None,
    typer.Option(
        "--filter",
        metavar="PATTERN",
        help="Keep events of matching modules: a glob on the qualified name or the class "
        "name (layer1.*, *conv*, BatchNorm2d), a module name with its submodules (layer1), "
        "or (root).",
        show_default=False,
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
    depth: DepthOpt = None,
    backward: BackwardOpt = False,
    limit: LimitOpt = None,
    filter: FilterOpt = None,
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
    """The event timeline: every global forward-pre/forward (and backward) hook firing."""
    import warnings

    from hookcli.pipeline import emit, prepare, run_session
    from hookcli.probes.trace import TraceProbe, trace_report
    from hookcli.warnsummary import summarised_warnings

    mopts = model_options(model, kwargs, weights, trust_pickle, seed)
    ropts = run_options(
        input,
        batch_size,
        device,
        dtype,
        mode,
        Mode.EVAL,
        True,
        input_file=input_file,
        inputs_from=inputs_from,
    )
    ci = ci_options(baseline, update_baseline, annotate, junit, rtol, atol)
    out = output_options(format, output, depth, debug, ci)

    with summarised_warnings(debug) as warned:
        prepared = prepare(mopts, ropts)
        probe = TraceProbe()
        with warnings.catch_warnings():
            # The first module's inputs never require grad: torch warns that its full
            # backward hook sees no grad_input. The trace shows that as empty shapes.
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            outcome = run_session(
                prepared,
                [probe],
                mode=ropts.mode,
                global_hooks=True,
                always_call=True,
                backward=backward,
            )
        warned.keep = outcome.error is None  # on failure the error is the one line to read
    report = trace_report(
        prepared, probe, outcome, depth=out.depth, filter=filter, limit=limit, backward=backward
    )
    code = emit(report, out)
    if outcome.error is not None:
        raise outcome.error
    return code
