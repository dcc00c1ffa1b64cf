"""``hookcli grads MODEL``: per-layer gradient flow from backward and tensor hooks; CI gates."""

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

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
    InputOpt,
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
from hookcli.ddpopts import BackendOpt, DdpOpt, DesyncTolOpt, DistTimeoutOpt
from hookcli.options import Format, LossKind, Mode

if TYPE_CHECKING:
    from hookcli.options import OutputOptions
    from hookcli.report import Report, Row

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
        ddp=ddp,
    )
    plan = dataclasses.replace(plan, wide=format in (Format.CSV, Format.MARKDOWN))
    ci = ci_options(baseline, update_baseline, annotate, junit, rtol, atol)
    mopts = model_options(model, kwargs, weights, trust_pickle, seed)
    ropts = run_options(input, batch_size, device, dtype, mode, Mode.TRAIN, global_hooks)
    out = output_options(format, output, depth, debug, ci)
    if backend is not None and not ddp:
        raise UsageError("--backend needs --ddp (under torchrun or srun)")
    if ddp:
        from hookcli.ddp import check_ddp_options
        from hookcli.ddp import run_grads as run_grads_ddp
        from hookcli.distributed import launch

        check_ddp_options(plan.kinds, global_hooks, per_param=per_param, plot=plot)
        return launch(
            lambda ctx: run_grads_ddp(
                ctx, mopts, ropts, out, plan.kinds, plan.explicit, plan.loss, plan.gates, desync_tol
            ),
            device=device,
            backend=backend,
            timeout_s=dist_timeout,
        )

    report, error = run_grads(prepare(mopts, ropts), plan)
    code = _emit(report, out)
    if error is not None:
        raise error
    return code


def _emit(report: "Report", out: "OutputOptions") -> int:
    """Like pipeline.emit, with the per-parameter table between the layers and the totals."""
    from hookcli.pipeline import conclude, emit, write_text

    if out.format is not Format.TABLE or "params" not in report.lists:
        return emit(report, out)
    import dataclasses

    from hookcli.render import render_table

    columns, totals = report.columns, report.table_totals
    head = render_table(dataclasses.replace(report, checks=(), error=None), columns, ())
    tail = render_table(dataclasses.replace(report, layers=(), notes=()), [], totals)
    tail = tail.split("\n", 3)[-1]  # drop the header line, blank line and "(no layers)"
    text = head + "\nParameters:\n" + _param_table(report.lists["params"]) + "\n" + tail
    write_text(text, out)
    return conclude(report, out)


def _param_table(rows: "tuple[Row, ...]") -> str:
    import tabulate

    from hookcli.errors import printable
    from hookcli.render import fmt_float, fmt_int, fmt_shape

    body = [
        [
            printable(r.data["name"]),  # a module name may hold a newline
            fmt_shape(r.data["shape"]),
            fmt_float(r.data["grad_norm"]),
            fmt_float(r.data["weight_norm"]),
            fmt_float(r.data["grad_weight_ratio"]),
            fmt_int(r.data["nan_count"]),
            fmt_int(r.data["inf_count"]),
        ]
        for r in rows
    ]
    headers = ["Parameter", "Shape", "Grad norm", "Weight norm", "Grad/weight", "NaN", "Inf"]
    align = ["left", "left", "right", "right", "right", "right", "right"]
    return tabulate.tabulate(
        body, headers=headers, colalign=align, tablefmt="simple", disable_numparse=True
    )
