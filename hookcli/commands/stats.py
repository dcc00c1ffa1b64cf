"""``hookcli stats MODEL``: activation statistics per module call, and the first NaN/Inf."""

from typing import TYPE_CHECKING, Annotated

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
    run_options,
)
from hookcli.ddpopts import BackendOpt, DdpOpt, DesyncTolOpt, DistTimeoutOpt
from hookcli.options import Format, HookKind, LossKind, Mode, parse_hook_kinds

if TYPE_CHECKING:
    from hookcli.probes.stats import StatsProbe

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


def _kinds(hooks: str | None, backward: bool) -> tuple[HookKind, ...]:
    given = parse_hook_kinds(hooks)
    if given is not None:
        return given
    return (HookKind.FORWARD, HookKind.BACKWARD_PRE) if backward else (HookKind.FORWARD,)


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
    backward: BackwardOpt = False,
    loss: LossOpt = LossKind.SUM,
    hooks: HooksOpt = None,
    global_hooks: GlobalHooksOpt = False,
    fail_on: FailOnOpt = None,
    dead_threshold: DeadThresholdOpt = None,
    depth: DepthOpt = None,
    format: FormatOpt = Format.TABLE,
    output: OutputOpt = None,
    seed: SeedOpt = 0,
    debug: DebugOpt = False,
    ddp: DdpOpt = False,
    backend: BackendOpt = None,
    desync_tol: DesyncTolOpt = 0.0,
    dist_timeout: DistTimeoutOpt = 600.0,
) -> int:
    """Per-layer activation statistics (mean, std, min, max, mean |x|, zeros, NaN, Inf);
    the first module producing NaN/Inf; checks nan, inf, dead."""
    from functools import partial

    from hookcli.checks import layer_label
    from hookcli.checks.stats import STATS_CHECKS, CallStats, stats_checks
    from hookcli.cliopts import parse_fail_on
    from hookcli.errors import UsageError
    from hookcli.layers import layer_rows, shape_columns
    from hookcli.pipeline import emit, prepare, run_session
    from hookcli.report import Report

    kinds = _kinds(hooks, backward)
    checks = parse_fail_on(fail_on, (*STATS_CHECKS, "desync") if ddp else STATS_CHECKS)
    if dead_threshold is not None:
        if not 0 < dead_threshold <= 1:
            raise UsageError(f"--dead-threshold must be in (0, 1], got {dead_threshold:g}")
        if "dead" not in checks:
            checks = (*checks, "dead")
    if "dead" in checks and HookKind.FORWARD not in kinds:
        raise UsageError("--fail-on dead needs the forward statistics: add forward to --hooks")
    stat_kinds = [k for k in kinds if k is not HookKind.PRE]
    if checks and not stat_kinds:
        raise UsageError(
            f"--fail-on {','.join(checks)} needs statistics: add forward (or a backward kind) "
            "to --hooks"
        )
    mopts = model_options(model, kwargs, weights, trust_pickle, seed)
    ropts = run_options(input, batch_size, device, dtype, mode, Mode.EVAL, global_hooks)
    out = output_options(format, output, depth, debug)
    if ddp or backend is not None:
        from hookcli.ddp import launch_command, run_stats

        with_grads = backward or any(k.is_backward for k in kinds)
        return launch_command(
            lambda ctx: run_stats(
                ctx, mopts, ropts, out, kinds, loss, checks, dead_threshold, with_grads, desync_tol
            ),
            ddp=ddp,
            device=device,
            backend=backend,
            timeout_s=dist_timeout,
            kinds=kinds,
            global_hooks=global_hooks,
            need_tensor=False,
        )

    prepared = prepare(mopts, ropts)
    if prepared.settings["device"] == "meta":
        raise UsageError("stats needs values: --device meta holds shapes only")

    from hookcli.losses import reduce_output
    from hookcli.probes.stats import StatsProbe

    probe = StatsProbe(kinds)
    run_backward = backward or any(k.is_backward for k in kinds)
    outcome = run_session(
        prepared,
        [probe],
        mode=ropts.mode,
        global_hooks=ropts.global_hooks,
        backward=run_backward,
        loss_fn=partial(reduce_output, kind=loss.value),
    )
    rows, _ = layer_rows(
        outcome.records, prepared.model, depth=out.depth, kinds=kinds, probes=[probe]
    )
    calls = [
        CallStats(
            label=layer_label(r.name, r.call),
            output=probe.forward_stats(r.index),
            grads=probe.grad_stats(r),
        )
        for r in outcome.records
    ]
    origin = probe.origin.label if probe.origin else None
    results = stats_checks(
        calls,
        checks,
        origin=origin,
        dead_threshold=dead_threshold,
        with_grads=run_backward,
    )
    totals = dict(probe.totals())
    if outcome.loss is not None:
        totals["loss"] = outcome.loss
    report = Report(
        command=NAME,
        model=prepared.model_info(),
        settings=prepared.settings,
        inputs=prepared.input_dicts(),
        layers=rows,
        totals=totals,
        checks=results,
        notes=_notes(probe, outcome.loss, loss.value),
        error=outcome.error.message if outcome.error else None,
    )
    code = emit(report, out, [*shape_columns(kinds), *probe.table_columns])
    if outcome.error is not None:
        raise outcome.error
    return code


def _notes(probe: "StatsProbe", loss: float | None, loss_kind: str) -> tuple[str, ...]:
    """Header lines of the table: the NaN/Inf origin and the loss."""
    from hookcli.render import fmt_float

    notes: list[str] = []
    if HookKind.FORWARD in probe.kinds:
        if probe.origin is not None:
            notes.append(
                f"NaN/Inf origin: {probe.origin.label} ({probe.origin.type}), the first module "
                f"to output NaN/Inf from finite inputs; {probe.nonfinite_calls} call(s) "
                "output NaN/Inf"
            )
        elif probe.nonfinite_calls:
            notes.append(
                f"NaN/Inf in {probe.nonfinite_calls} call(s), but no module turned finite "
                "inputs into them (do the model's inputs hold NaN/Inf?)"
            )
        else:
            notes.append("NaN/Inf origin: none (no module output holds NaN or Inf)")
    if loss is not None:
        notes.append(f"loss ({loss_kind} of the outputs): {fmt_float(loss)}")
    return tuple(notes)
