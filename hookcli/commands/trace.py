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
    InputOpt,
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
        "name (layer1.*, *conv*, BatchNorm2d), or a module name with its submodules (layer1).",
        show_default=False,
    ),
]


def matches(module: str, type_name: str, pattern: str) -> bool:
    """Does an event's module match ``--filter``? (glob on name or class; else subtree)."""
    import fnmatch

    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(module, pattern) or fnmatch.fnmatchcase(type_name, pattern)
    return module == pattern or module.startswith(pattern + ".") or type_name == pattern


def _ms(ns: int | None) -> float | None:
    return None if ns is None else round(ns / 1e6, 4)


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
    from collections import Counter

    from hookcli.pipeline import emit, prepare, run_session
    from hookcli.probes.trace import EVENTS, TraceProbe
    from hookcli.render import Column, fmt_float, fmt_shapes
    from hookcli.report import Report, Row, shapes_list

    mopts = model_options(model, kwargs, weights, trust_pickle, seed)
    ropts = run_options(input, batch_size, device, dtype, mode, Mode.EVAL, True)
    out = output_options(
        format,
        output,
        depth,
        debug,
        ci_options(baseline, update_baseline, annotate, junit, rtol, atol),
    )

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
    events = probe.events
    kept = [
        e
        for e in events
        if (out.depth is None or e.depth <= out.depth)
        and (filter is None or matches(e.module, e.type, filter))
    ]
    if limit is not None:
        kept = kept[:limit]

    rows = []
    for e in kept:
        data = {
            "seq": e.seq,
            "event": e.event,
            "module": e.module,
            "type": e.type,
            "depth": e.depth,
            "call": e.call,
            "shapes": shapes_list(e.shapes),
            "elapsed_ms": _ms(e.elapsed_ns),
            "at_ms": _ms(e.at_ns),
            "duration_ms": _ms(e.duration_ns),
            "failed": e.failed,
        }
        display = {"name": e.module}
        if e.origin:
            display["mark"] = "<- raised here"
        elif e.failed:
            display["mark"] = "<- raised (propagating)"
        rows.append(Row.of(data, display))

    counts = Counter(e.event for e in events)
    outside = sorted({e.module for e in events if e.module.startswith("[")})
    total_ms = _ms(events[-1].at_ns) if events else 0.0
    totals = {
        "events": len(events),
        "shown": len(rows),
        **{name: counts.get(name, 0) for name in EVENTS},
        "outside_tree": outside,
        "elapsed_ms": total_ms,
    }
    if outcome.loss is not None:
        totals["loss"] = outcome.loss
    notes = []
    if filter is not None or limit is not None or out.depth is not None:
        picked = [
            f"--filter {filter}" if filter is not None else "",
            f"--depth {out.depth}" if out.depth is not None else "",
            f"--limit {limit}" if limit is not None else "",
        ]
        notes.append(
            f"showing {len(rows)} of {len(events)} events ({' '.join(p for p in picked if p)})"
        )
    report = Report(
        command=NAME,
        model=prepared.model_info(),
        settings={**prepared.settings, "backward": backward},
        inputs=prepared.input_dicts(),
        totals=totals,
        lists={"events": tuple(rows)},
        primary="events",
        notes=tuple(notes),
        error=outcome.error.message if outcome.error else None,
    )
    columns = [
        Column("seq", "Seq", str, "right"),
        Column("event", "Event"),
        Column("name", "Module"),
        Column("type", "Type"),
        Column("shapes", "Shapes", fmt_shapes),
        Column("elapsed_ms", "dt (ms)", fmt_float, "right"),
        Column("at_ms", "at (ms)", fmt_float, "right"),
        Column("duration_ms", "took (ms)", fmt_float, "right"),
    ]
    per_kind = ", ".join(f"{name} {counts.get(name, 0)}" for name in EVENTS if counts.get(name))
    table_totals = [
        ("Events", f"{len(events)} ({per_kind or 'none'})"),
        ("Time", f"{fmt_float(total_ms)} ms from hooks attached to the last event"),
    ]
    if outside:
        table_totals.append(("Outside the model's tree", ", ".join(outside)))
    if outcome.loss is not None:
        table_totals.append(("Loss (sum of outputs)", fmt_float(outcome.loss)))
    code = emit(report, out, columns, table_totals)
    if outcome.error is not None:
        raise outcome.error
    return code
