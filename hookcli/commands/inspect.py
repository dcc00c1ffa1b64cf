"""``hookcli inspect MODEL``: the per-layer table of shapes and parameters."""

from hookcli.cliopts import (
    AnnotateOpt,
    AtolOpt,
    BaselineOpt,
    BatchOpt,
    ColumnsOpt,
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
    ModelArg,
    ModeOpt,
    NoForwardOpt,
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
from hookcli.ddpopts import BackendOpt, DdpOpt, DistTimeoutOpt, FsdpOpt, ShardOpt
from hookcli.options import Format, Mode

NAME = "inspect"


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
    hooks: HooksOpt = None,
    global_hooks: GlobalHooksOpt = False,
    no_forward: NoForwardOpt = False,
    columns: ColumnsOpt = None,
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
    dist_timeout: DistTimeoutOpt = 600.0,
    fsdp: FsdpOpt = False,
    shard: ShardOpt = None,
) -> int:
    """Per-layer table: name, type, input and output shapes, params, trainable; totals."""
    from hookcli.api import plan_inspect, run_inspect
    from hookcli.pipeline import emit, prepare

    plan = plan_inspect(hooks, depth, global_hooks, columns)
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
    if no_forward:
        from hookcli.layers import check_no_forward, tree_report

        distributed = ddp or fsdp or bool(shard) or backend is not None
        check_no_forward(hooks, global_hooks, distributed, ropts)
        return emit(tree_report(prepare(mopts, ropts, need_inputs=False), depth, plan.columns), out)
    if plan.columns and (ddp or fsdp or shard or backend is not None):
        from hookcli.errors import UsageError

        raise UsageError("--columns is not available with --ddp or --fsdp")
    if fsdp or shard:
        from hookcli.fsdp import launch_fsdp
        from hookcli.fsdp import run_inspect as run_inspect_fsdp

        return launch_fsdp(
            lambda ctx: run_inspect_fsdp(ctx, mopts, ropts, out, plan.kinds, tuple(shard or ())),
            fsdp=fsdp,
            ddp=ddp,
            device=device,
            backend=backend,
            timeout_s=dist_timeout,
            kinds=plan.kinds,
            global_hooks=global_hooks,
        )
    if ddp or backend is not None:
        from hookcli.ddp import launch_command
        from hookcli.ddp import run_inspect as run_inspect_ddp

        return launch_command(
            lambda ctx: run_inspect_ddp(ctx, mopts, ropts, out, plan.kinds),
            ddp=ddp,
            device=device,
            backend=backend,
            timeout_s=dist_timeout,
            kinds=plan.kinds,
            global_hooks=global_hooks,
            need_tensor=False,
        )

    report, error = run_inspect(prepare(mopts, ropts), plan)
    code = emit(report, out)
    if error is not None:
        raise error
    return code
