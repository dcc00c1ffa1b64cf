"""``hookcli profile MODEL``: where the time goes, per module, forward and backward."""

from pathlib import Path
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
from hookcli.profile.plan import SortKey

NAME = "profile"

BackwardOpt = Annotated[
    bool,
    typer.Option(
        "--backward",
        help="Also time backward (loss from --loss) per module, from full "
        "backward-pre and backward hooks.",
    ),
]
WarmupOpt = Annotated[
    int, typer.Option("--warmup", min=0, metavar="N", help="Untimed passes first.")
]
RepeatOpt = Annotated[
    int,
    typer.Option(
        "--repeat", min=1, metavar="N", help="Timed passes: rows show the median and the IQR."
    ),
]
SortOpt = Annotated[
    SortKey,
    typer.Option(
        "--sort",
        help="Row order, most first: self time, inclusive time, calls, or FLOPs.",
    ),
]
TraceOutOpt = Annotated[
    Path | None,
    typer.Option(
        "--trace-out",
        metavar="FILE",
        help="Write the timed passes as Chrome trace-event JSON (Perfetto, chrome://tracing).",
        show_default=False,
    ),
]
PlotOpt = Annotated[
    Path | None,
    typer.Option(
        "--plot",
        metavar="FILE.png",
        help="A bar chart of the 20 modules with the most self time (needs matplotlib).",
        show_default=False,
    ),
]
MaxMsOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--max-ms",
        metavar="GLOB:MS",
        help="Fail (exit 1) when a matching module's median forward time (inclusive) is "
        "over MS milliseconds. GLOB: a name or class glob, or (root). Repeatable.",
        show_default=False,
    ),
]
SyncOpt = Annotated[
    bool,
    typer.Option(
        "--sync",
        help="On cuda: synchronize and read the wall clock in every hook instead of "
        "recording CUDA events (includes launch overhead; the pass runs slower).",
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
    backward: BackwardOpt = False,
    loss: LossOpt = None,
    warmup: WarmupOpt = 2,
    repeat: RepeatOpt = 10,
    sync: SyncOpt = False,
    sort: SortOpt = SortKey.SELF,
    depth: DepthOpt = None,
    trace_out: TraceOutOpt = None,
    plot: PlotOpt = None,
    max_ms: MaxMsOpt = None,
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
    """Time per module: forward (and backward) median and IQR over repeats, inclusive and
    self, % of the root, achieved FLOP/s; the overhead against a bare forward; a trace."""
    from hookcli.profile.runner import cli_command

    return cli_command(
        model=model,
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
        backward=backward,
        loss=loss,
        warmup=warmup,
        repeat=repeat,
        sync=sync,
        sort=sort,
        depth=depth,
        trace_out=trace_out,
        plot=plot,
        max_ms=max_ms,
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
