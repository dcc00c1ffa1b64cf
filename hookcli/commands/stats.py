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
    ci_options,
    model_options,
    output_options,
    run_options,
)
from hookcli.ddpopts import (
    BackendOpt,
    BroadcastBuffersOpt,
    DdpOpt,
    DesyncTolOpt,
    DistTimeoutOpt,
    FsdpOpt,
    ShardOpt,
)
from hookcli.options import Format, LossKind, Mode

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
    loss: LossOpt = LossKind.SUM,
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
    from hookcli.api import plan_stats, run_stats
    from hookcli.pipeline import emit, prepare

    plan = plan_stats(
        hooks, backward, loss, fail_on, dead_threshold, depth, global_hooks, ddp=ddp or fsdp
    )
    ci = ci_options(baseline, update_baseline, annotate, junit, rtol, atol)
    mopts = model_options(model, kwargs, weights, trust_pickle, seed)
    ropts = run_options(
        input,
        batch_size,
        device,
        dtype,
        mode,
        Mode.EVAL,
        global_hooks,
        input_file=input_file,
        inputs_from=inputs_from,
    )
    out = output_options(format, output, depth, debug, ci)
    if fsdp or shard:
        from hookcli.fsdp import launch_fsdp
        from hookcli.fsdp import run_stats as run_stats_fsdp

        with_grads = plan.backward or any(k.is_backward for k in plan.kinds)
        return launch_fsdp(
            lambda ctx: run_stats_fsdp(
                ctx,
                mopts,
                ropts,
                out,
                plan.kinds,
                plan.loss,
                plan.checks,
                plan.dead_threshold,
                with_grads,
                desync_tol,
                tuple(shard or ()),
            ),
            fsdp=fsdp,
            ddp=ddp,
            device=device,
            backend=backend,
            timeout_s=dist_timeout,
            kinds=plan.kinds,
            global_hooks=global_hooks,
        )
    if not broadcast_buffers and not ddp:
        from hookcli.errors import UsageError

        raise UsageError("--no-broadcast-buffers needs --ddp (under torchrun or srun)")
    if ddp or backend is not None:
        from hookcli.ddp import launch_command
        from hookcli.ddp import run_stats as run_stats_ddp

        with_grads = plan.backward or any(k.is_backward for k in plan.kinds)
        return launch_command(
            lambda ctx: run_stats_ddp(
                ctx,
                mopts,
                ropts,
                out,
                plan.kinds,
                plan.loss,
                plan.checks,
                plan.dead_threshold,
                with_grads,
                desync_tol,
                broadcast_buffers,
            ),
            ddp=ddp,
            device=device,
            backend=backend,
            timeout_s=dist_timeout,
            kinds=plan.kinds,
            global_hooks=global_hooks,
            need_tensor=False,
        )

    from hookcli.warnsummary import summarised_warnings

    with summarised_warnings(debug) as warned:
        report, error = run_stats(prepare(mopts, ropts), plan)
        warned.keep = error is None  # on failure the error is the one line to read
    code = emit(report, out)
    if error is not None:
        raise error
    return code
