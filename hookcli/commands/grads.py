"""``hookcli grads MODEL``: per-layer gradient flow from backward and tensor hooks; CI gates."""

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hookcli.cliopts import (
    BatchOpt,
    DebugOpt,
    DepthOpt,
    DeviceOpt,
    DtypeOpt,
    FormatOpt,
    GlobalHooksOpt,
    HooksOpt,
    InputOpt,
    KwargsOpt,
    LossOpt,
    ModelArg,
    ModeOpt,
    OutputOpt,
    SeedOpt,
    TrustPickleOpt,
    WeightsOpt,
    model_options,
    output_options,
    parse_fail_on,
    run_options,
)
from hookcli.ddpopts import BackendOpt, DdpOpt, DesyncTolOpt, DistTimeoutOpt
from hookcli.options import Format, HookKind, LossKind, Mode, parse_hook_kinds

if TYPE_CHECKING:
    from hookcli.checks.grads import GradGates
    from hookcli.errors import RunError
    from hookcli.options import ModelOptions, OutputOptions, RunOptions
    from hookcli.pipeline import Prepared
    from hookcli.probes.grads import GradFindings
    from hookcli.render import Column
    from hookcli.report import CheckResult, Report, Row
    from hookcli.session import CallRecord

NAME = "grads"
DEFAULT_KINDS = (HookKind.FORWARD, HookKind.BACKWARD_PRE, HookKind.BACKWARD, HookKind.TENSOR)

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

_BATCHNORM_MARKERS = (
    "Expected more than 1 value per channel when training",
    "Expected more than 1 spatial element when training",
)


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
    seed: SeedOpt = 0,
    debug: DebugOpt = False,
    ddp: DdpOpt = False,
    backend: BackendOpt = None,
    desync_tol: DesyncTolOpt = 0.0,
    dist_timeout: DistTimeoutOpt = 600.0,
) -> int:
    """Per-layer gradient flow: grad norms of parameters, grad_output, grad_input; checks."""
    from hookcli.checks.grads import FAIL_ON, NEED_PARAM_GRADS, GradGates
    from hookcli.errors import UsageError

    explicit_kinds = parse_hook_kinds(hooks)
    kinds = explicit_kinds or DEFAULT_KINDS
    gates = GradGates(parse_fail_on(fail_on, (*FAIL_ON, "desync")), max_grad_norm, min_grad_norm)
    if not ddp and (backend is not None or "desync" in gates.fail_on):
        what = "--backend" if backend is not None else "--fail-on desync"
        raise UsageError(f"{what} needs --ddp (under torchrun or srun)")
    if HookKind.TENSOR not in kinds:
        needs = [f"--fail-on {n}" for n in gates.fail_on if n in NEED_PARAM_GRADS]
        needs += ["--max-grad-norm"] if max_grad_norm is not None else []
        needs += ["--min-grad-norm"] if min_grad_norm is not None else []
        needs += ["--plot"] if plot is not None else []
        needs += ["--per-param"] if per_param else []
        if needs:
            raise UsageError(
                f"{', '.join(needs)} needs parameter grads: add the tensor kind to --hooks"
            )
    if device.strip().lower() == "meta":
        raise UsageError("grads needs real gradient values; --device meta only gives shapes")
    if plot is not None:
        from hookcli.plot import require_matplotlib
        from hookcli.plot.gradflow import check_plot_path

        require_matplotlib()  # exit 2 before any work when matplotlib is missing
        check_plot_path(plot)

    mopts = model_options(model, kwargs, weights, trust_pickle, seed)
    ropts = run_options(input, batch_size, device, dtype, mode, Mode.TRAIN, global_hooks)
    out = output_options(format, output, depth, debug)
    if ddp:
        from hookcli.ddp import check_ddp_options, run_grads
        from hookcli.distributed import launch

        check_ddp_options(kinds, global_hooks, per_param=per_param, plot=plot)
        return launch(
            lambda ctx: run_grads(
                ctx, mopts, ropts, out, kinds, explicit_kinds is not None, loss, gates, desync_tol
            ),
            device=device,
            backend=backend,
            timeout_s=dist_timeout,
        )
    return _run(mopts, ropts, out, kinds, explicit_kinds is not None, loss, per_param, gates, plot)


def _run(
    mopts: "ModelOptions",
    ropts: "RunOptions",
    out: "OutputOptions",
    kinds: tuple[HookKind, ...],
    explicit: bool,
    loss_kind: LossKind,
    per_param: bool,
    gates: "GradGates",
    plot: Path | None,
) -> int:
    from hookcli.checks.grads import run_checks
    from hookcli.layers import PARAM_COLUMNS, layer_rows, param_totals, shape_columns
    from hookcli.losses import reduce_output
    from hookcli.modelinfo import totals
    from hookcli.pipeline import prepare, progress, run_session
    from hookcli.probes.grads import GradProbe
    from hookcli.report import Report

    prepared = prepare(mopts, ropts)
    probe = GradProbe(
        frozenset(kinds),
        per_param=per_param,
        output_hooks=explicit and HookKind.TENSOR in kinds,
        watch_forward=bool({"nan", "inf", "dead"} & set(gates.fail_on)),
        flag_inf="inf" in gates.fail_on,
    )
    outcome = run_session(
        prepared,
        [probe],
        mode=ropts.mode,
        global_hooks=ropts.global_hooks,
        backward=True,
        loss_fn=lambda output: reduce_output(output, loss_kind.value),
    )
    error = _with_hint(outcome.error, ropts.mode)
    findings = probe.findings
    assert findings is not None
    checks = () if error is not None else run_checks(gates, findings, outcome.records, outcome.loss)
    rows, unshown = layer_rows(
        outcome.records, prepared.model, depth=out.depth, kinds=kinds, probes=[probe]
    )
    rows = _mark(rows, checks, findings, outcome.records)
    model_totals: dict[str, Any] = dict(totals(prepared.model))
    model_totals["loss"] = outcome.loss
    model_totals.update(probe.totals())
    settings = {**prepared.settings, "loss": loss_kind.value}
    lists: dict[str, tuple[Row, ...]] = {}
    if per_param:
        lists["params"] = _param_rows(findings)
    primary = "params" if per_param and out.format in (Format.CSV, Format.MARKDOWN) else "layers"
    report = Report(
        command=NAME,
        model=prepared.model_info(),
        settings=settings,
        inputs=prepared.input_dicts(),
        layers=rows,
        totals=model_totals,
        checks=checks,
        lists=lists,
        primary=primary,
        error=error.message if error else None,
    )
    columns = [*shape_columns(kinds), *probe.table_columns, PARAM_COLUMNS[0]]
    table_totals = [*param_totals(model_totals, unshown), *_grad_totals(model_totals)]
    code = _emit(report, out, columns, table_totals)
    if plot is not None and error is None:
        from hookcli.plot.gradflow import plot_gradflow

        title = f"gradient flow: {prepared.loaded.spec} ({loss_kind.value} loss)"
        plot_gradflow(_flow_points(findings, outcome.records, prepared), plot, title)
        progress(f"gradient-flow plot written to {plot}")
    if error is not None:
        raise error
    return code


def _with_hint(error: "RunError | None", mode: Mode) -> "RunError | None":
    """Batch-norm on a batch of one in train mode: say how to get past it."""
    if error is None or mode is not Mode.TRAIN:
        return error
    if not any(m in error.message for m in _BATCHNORM_MARKERS):
        return error
    from hookcli.errors import RunError

    hint = (
        "; hint: grads runs in train mode, where batch norm needs more than one value per "
        "channel: pass a larger batch (-b 2) or --mode eval"
    )
    hinted = RunError(error.message + hint, module=error.module)
    hinted.__cause__ = error.__cause__
    return hinted


def _mark(
    rows: "tuple[Row, ...]",
    checks: "tuple[CheckResult, ...]",
    findings: "GradFindings",
    records: "tuple[CallRecord, ...]",
) -> "tuple[Row, ...]":
    """Rows that failed a check get '<- FAIL name, ...' after their name in the table."""
    from hookcli.checks import layer_label
    from hookcli.report import Row

    failed = [c for c in checks if not c.passed]
    if not failed:
        return rows
    module_ids = {r.name: r.module_id for r in records}
    marked: list[Row] = []
    for row in rows:
        name, call = row.data["name"], row.data["call"]
        labels = {layer_label(name, call), layer_label(name)}
        module_id = module_ids.get(name)
        own = set(findings.module_params.get(module_id, ())) if module_id is not None else set()
        hits = []
        for c in failed:
            layers = set(c.layers)
            per_call = c.name in ("nan", "inf", "dead")
            if (layer_label(name, call) in layers if per_call else labels & layers) or own & layers:
                hits.append(c.name)
        if hits:
            mark = f"<- FAIL {', '.join(hits)}"
            if row.display.get("mark"):
                mark = f"{row.display['mark']} {mark}"
            marked.append(Row.of(row.data, {**row.display, "mark": mark}))
        else:
            marked.append(row)
    return tuple(marked)


def _param_rows(findings: "GradFindings") -> "tuple[Row, ...]":
    from hookcli.report import Row

    return tuple(
        Row.of(
            {
                "name": p.name,
                "shape": list(p.shape),
                "dtype": p.dtype,
                "requires_grad": p.requires_grad,
                "grad_norm": p.grad_norm,
                "weight_norm": p.weight_norm,
                "grad_weight_ratio": p.ratio,
                "nan_count": p.nan_count,
                "inf_count": p.inf_count,
            }
        )
        for p in findings.params
    )


def _grad_totals(t: dict[str, Any]) -> list[tuple[str, str]]:
    from hookcli.render import fmt_float

    out = [("Loss", fmt_float(t.get("loss")))]
    if "grad_norm" in t:
        out.append(("Total grad norm", fmt_float(t["grad_norm"])))
    if t.get("unused_params"):
        out.append(("Unused params", ", ".join(t["unused_params"])))
    return out


def _flow_points(
    findings: "GradFindings", records: "tuple[CallRecord, ...]", prepared: "Prepared"
) -> list[Any]:
    """One point per module owning trainable params: forward order, then modules never run."""
    from hookcli.plot.gradflow import FlowPoint

    points = []
    seen: set[int] = set()
    for r in records:
        if r.module_id in seen or not findings.module_params.get(r.module_id):
            continue
        seen.add(r.module_id)
        points.append(FlowPoint(r.name or "(root)", findings.modules[r.module_id].grad_norm))
    for name, m in prepared.model.named_modules():
        if id(m) not in seen and findings.module_params.get(id(m)):
            seen.add(id(m))
            points.append(FlowPoint(name or "(root)", findings.modules[id(m)].grad_norm))
    return points


def _emit(
    report: "Report",
    out: "OutputOptions",
    columns: "list[Column]",
    totals: list[tuple[str, str]],
) -> int:
    """Like pipeline.emit, with the per-parameter table between the layers and the totals."""
    from hookcli.pipeline import emit, write_text

    if out.format is not Format.TABLE or "params" not in report.lists:
        return emit(report, out, columns, totals)
    import dataclasses

    from hookcli.errors import EXIT_CHECK_FAILED, EXIT_OK
    from hookcli.render import render_table

    head = render_table(dataclasses.replace(report, checks=(), error=None), columns, ())
    tail = render_table(dataclasses.replace(report, layers=(), notes=()), [], totals)
    tail = tail.split("\n", 3)[-1]  # drop the header line, blank line and "(no layers)"
    text = head + "\nParameters:\n" + _param_table(report.lists["params"]) + "\n" + tail
    write_text(text, out)
    return EXIT_CHECK_FAILED if report.failed_checks else EXIT_OK


def _param_table(rows: "tuple[Row, ...]") -> str:
    import tabulate

    from hookcli.render import fmt_float, fmt_int, fmt_shape

    body = [
        [
            r.data["name"],
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
