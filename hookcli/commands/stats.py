"""``hookcli stats MODEL``: activation statistics per module call, and the first NaN/Inf."""

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
    GlobalHooksOpt,
    HooksOpt,
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
from hookcli.distributed.options import (
    BackendOpt,
    BroadcastBuffersOpt,
    DdpOpt,
    DesyncTolOpt,
    DistTimeoutOpt,
    FsdpOpt,
    ShardOpt,
)
from hookcli.options import Format

NAME = "stats"

BackwardOpt = Annotated[
    bool,
    typer.Option(
        "--backward",
        help="Also run backward (loss from --loss) and add the statistics of grad_output.",
    ),
]
FailOnOpt = Annotated[
    str | None,
    typer.Option(
        "--fail-on",
        metavar="CHECKS",
        help="Comma-separated checks that fail the run (exit 1): nan, inf (in any module "
        "output, or gradient with backward kinds), dead (a module whose outputs are all zero); "
        "with --ddp also desync.",
        show_default=False,
    ),
]
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
    hooks: HooksOpt = None,
    global_hooks: GlobalHooksOpt = False,
    fail_on: FailOnOpt = None,
    dead_threshold: DeadThresholdOpt = None,
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
    ddp: DdpOpt = False,
    backend: BackendOpt = None,
    desync_tol: DesyncTolOpt = 0.0,
    dist_timeout: DistTimeoutOpt = 600.0,
    broadcast_buffers: BroadcastBuffersOpt = True,
    fsdp: FsdpOpt = False,
    shard: ShardOpt = None,
) -> int:
    """Per-layer activation statistics (mean, std, min, max, mean |x|, zeros, NaN, Inf);
    the first module producing NaN/Inf; checks nan, inf, dead."""
    from hookcli.stats.command import cli_command

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
        hooks=hooks,
        global_hooks=global_hooks,
        fail_on=fail_on,
        dead_threshold=dead_threshold,
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
        ddp=ddp,
        backend=backend,
        desync_tol=desync_tol,
        dist_timeout=dist_timeout,
        broadcast_buffers=broadcast_buffers,
        fsdp=fsdp,
        shard=shard,
    )
