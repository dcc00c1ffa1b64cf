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
    loss: LossOpt = None,
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
    from hookcli.grads.command import cli_command

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
        loss=loss,
        depth=depth,
        hooks=hooks,
        global_hooks=global_hooks,
        per_param=per_param,
        fail_on=fail_on,
        max_grad_norm=max_grad_norm,
        min_grad_norm=min_grad_norm,
        plot=plot,
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
