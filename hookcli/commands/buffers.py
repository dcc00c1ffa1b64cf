"""``hookcli buffers MODEL``: every buffer, before and after N forward passes."""

from typing import Annotated, Any

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

NAME = "buffers"

StepsOpt = Annotated[
    int,
    typer.Option(
        "--steps",
        min=1,
        metavar="N",
        help="Forward passes between the 'before' and 'after' summaries.",
    ),
]


def _fmt_change(before: Any, after: Any, key: str) -> str:
    from hookcli.render import fmt_float

    a = None if before is None else before[key]
    b = None if after is None else after[key]
    if a is None and b is None:
        return "-"
    if a == b:
        return fmt_float(a)
    return f"{fmt_float(a)} -> {fmt_float(b)}"


def _fmt_range(stats: Any) -> str:
    from hookcli.render import fmt_float

    if stats is None:
        return "-"
    return f"[{fmt_float(stats['min'])}, {fmt_float(stats['max'])}]"


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
    steps: StepsOpt = 1,
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
) -> int:
    """Every buffer: owner, shape, dtype, persistent, summary before/after N steps, changed."""
    from hookcli.modelinfo import depth_of
    from hookcli.pipeline import emit, prepare, run_session
    from hookcli.probes.buffers import BufferProbe
    from hookcli.render import Column, fmt_bool, fmt_int, fmt_shape
    from hookcli.report import Report, Row

    mopts = model_options(model, kwargs, weights, trust_pickle, seed)
    ropts = run_options(input, batch_size, device, dtype, mode, Mode.TRAIN)
    out = output_options(
        format,
        output,
        depth,
        debug,
        ci_options(baseline, update_baseline, annotate, junit, rtol, atol),
    )

    prepared = prepare(mopts, ropts)
    probe = BufferProbe()
    outcome = run_session(prepared, [probe], mode=ropts.mode, steps=steps)

    rows = []
    for b in probe.buffers:
        if out.depth is not None and depth_of(b.module) > out.depth:
            continue
        data = {
            "name": b.name,
            "module": b.module,
            "shape": list(b.shape),
            "dtype": b.dtype,
            "persistent": b.persistent,
            "before": None if b.before is None else dict(b.before),
            "after": None if b.after is None else dict(b.after),
            "changed": b.changed,
        }
        display = {
            "owner": b.module_type,
            "mean": _fmt_change(b.before, b.after, "mean"),
            "std": _fmt_change(b.before, b.after, "std"),
            "range": _fmt_range(b.after if b.after is not None else b.before),
        }
        rows.append(Row.of(data, display))

    model_obj = prepared.model
    seen: set[int] = set()
    elements = nbytes = 0
    for buf in model_obj.buffers():
        if id(buf) not in seen:
            seen.add(id(buf))
            elements += buf.numel()
            nbytes += buf.numel() * buf.element_size()
    infos = probe.buffers
    changed = [b.name for b in infos if b.changed]
    unknown = sum(1 for b in infos if b.changed is None)
    totals = {
        "buffers": len(infos),
        "persistent": sum(1 for b in infos if b.persistent),
        "non_persistent": sum(1 for b in infos if not b.persistent),
        "changed": len(changed),
        "elements": elements,
        "bytes": nbytes,
        "steps": steps,
    }
    report = Report(
        command=NAME,
        model=prepared.model_info(),
        settings={**prepared.settings, "steps": steps},
        inputs=prepared.input_dicts(),
        totals=totals,
        lists={"buffers": tuple(rows)},
        primary="buffers",
        error=outcome.error.message if outcome.error else None,
    )
    columns = [
        Column("name", "Buffer"),
        Column("owner", "Owner"),
        Column("shape", "Shape", fmt_shape),
        Column("dtype", "Dtype"),
        Column("persistent", "Persistent", fmt_bool),
        Column("mean", "Mean (before -> after)"),
        Column("std", "Std"),
        Column("range", "Range after"),
        Column("changed", "Changed", fmt_bool),
    ]
    runs = f"{steps} forward pass{'es' if steps != 1 else ''} in {ropts.mode.value} mode"
    kinds = (
        f"{totals['non_persistent']} non-persistent, not saved in state_dict"
        if totals["non_persistent"]
        else "all persistent"
    )
    count = f"{len(infos)} ({kinds})" if infos else "0"
    table_totals = [
        ("Buffers", count),
        (
            "Changed",
            f"{len(changed)} of {len(infos)} after {runs}"
            + (f" ({unknown} unknown: no values on the meta device)" if unknown else ""),
        ),
        ("Size", f"{fmt_int(elements)} elements, {fmt_int(nbytes)} bytes"),
    ]
    code = emit(report, out, columns, table_totals)
    if outcome.error is not None:
        raise outcome.error
    return code
