"""``hookcli grads MODEL``: per-layer gradient flow from backward and tensor hooks; CI gates."""

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

NAME = "grads"

PerParamOpt = Annotated[
    bool,
    typer.Option(
        "--per-param",
        help="Add a row per parameter: shape, grad_norm, weight_norm, grad/weight, NaN and Inf "
        "counts (CSV/Markdown then carry these rows).",
    ),
]
MaxGradNormOpt = Annotated[
    float | None,
    typer.Option(
        "--max-grad-norm",
        metavar="X",
        min=0.0,
        help="Fail (exit 1) when a layer's grad_norm is above X.",
        show_default=False,
    ),
]
MinGradNormOpt = Annotated[
    float | None,
    typer.Option(
        "--min-grad-norm",
        metavar="X",
        min=0.0,
        help="Fail (exit 1) when a layer's grad_norm is below X.",
        show_default=False,
    ),
]
PlotOpt = Annotated[
    Path | None,
    typer.Option(
        "--plot",
        metavar="FILE.png",
        help="Save a gradient-flow chart (needs matplotlib: pip install 'hookcli[plot]').",
        show_default=False,
    ),
]
GradsFailOnOpt = Annotated[
    str | None,
    typer.Option(
        "--fail-on",
        metavar="CHECKS",
        help="Comma-separated checks that fail the run (exit 1): nan, inf, unused, zero-grad, "
        "dead; with --ddp also desync.",
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
    loss: LossOpt = LossKind.SUM,
    depth: DepthOpt = None,
    hooks: HooksOpt = None,
    global_hooks: GlobalHooksOpt = False,
    per_param: PerParamOpt = False,
    fail_on: GradsFailOnOpt = None,
    max_grad_norm: MaxGradNormOpt = None,
    min_grad_norm: MinGradNormOpt = None,
    plot: PlotOpt = None,
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
    """Per-layer gradient flow: grad norms of parameters, grad_output, grad_input; checks."""
    import dataclasses

    from hookcli.api import plan_grads, run_grads
    from hookcli.errors import UsageError
    from hookcli.pipeline import prepare

    plan = plan_grads(
        hooks,
        loss,
        per_param,
        fail_on,
        max_grad_norm,
        min_grad_norm,
        plot,
        depth,
        global_hooks,
        device=device,
        ddp=ddp or fsdp,
    )
    plan = dataclasses.replace(plan, wide=format in (Format.CSV, Format.MARKDOWN))
    ci = ci_options(baseline, update_baseline, annotate, junit, rtol, atol)
    mopts = model_options(model, kwargs, weights, trust_pickle, seed)
    ropts = run_options(
        input,
        batch_size,
        device,
        dtype,
        mode,
        Mode.TRAIN,
        global_hooks,
        input_file=input_file,
        inputs_from=inputs_from,
    )
    out = output_options(format, output, depth, debug, ci)
    if fsdp:
        from hookcli.distributed import launch
        from hookcli.fsdp import check_fsdp_options, check_fsdp_torch
        from hookcli.fsdp import run_grads as run_grads_fsdp

        check_fsdp_options(
            plan.kinds,
            global_hooks,
            ddp=ddp,
            per_param=per_param,
            plot=plot,
            fail_on=plan.gates.fail_on,
            bounds=max_grad_norm is not None or min_grad_norm is not None,
        )
        check_fsdp_torch(device)
        return launch(
            lambda ctx: run_grads_fsdp(
                ctx,
                mopts,
                ropts,
                out,
                plan.kinds,
                plan.loss,
                plan.gates,
                desync_tol,
                tuple(shard or ()),
            ),
            device=device,
            backend=backend,
            timeout_s=dist_timeout,
            flag="--fsdp",
        )
    if shard:
        raise UsageError("--shard needs --fsdp (under torchrun or srun)")
    if backend is not None and not ddp:
        raise UsageError("--backend needs --ddp (under torchrun or srun)")
    if not broadcast_buffers and not ddp:
        raise UsageError("--no-broadcast-buffers needs --ddp (under torchrun or srun)")
    if ddp:
        from hookcli.ddp import check_ddp_options
        from hookcli.ddp import run_grads as run_grads_ddp
        from hookcli.distributed import launch

        check_ddp_options(plan.kinds, global_hooks, per_param=per_param, plot=plot)
        return launch(
            lambda ctx: run_grads_ddp(
                ctx,
                mopts,
                ropts,
                out,
                plan.kinds,
                plan.explicit,
                plan.loss,
                plan.gates,
                desync_tol,
                broadcast_buffers,
            ),
            device=device,
            backend=backend,
            timeout_s=dist_timeout,
        )

    from hookcli.warnsummary import summarised_warnings

    with summarised_warnings(debug) as warned:
        report, error = run_grads(prepare(mopts, ropts), plan)
        warned.keep = error is None  # on failure the error is the one line to read
    if out.format is Format.TABLE and "params" in report.lists:
        from hookcli.pipeline import conclude, write_text
        from hookcli.probes.grads import render_table_with_params

        write_text(render_table_with_params(report), out)
        code = conclude(report, out)
    else:
        from hookcli.pipeline import emit

        code = emit(report, out)
    if error is not None:
        raise error
    return code
