"""``hookcli registrations MODEL``: every module/parameter/buffer registration while building."""

from typing import Any

from hookcli.cliopts import (
    AnnotateOpt,
    AtolOpt,
    BaselineOpt,
    DebugOpt,
    DepthOpt,
    FormatOpt,
    JunitOpt,
    KwargsOpt,
    ModelArg,
    OutputOpt,
    RtolOpt,
    SeedOpt,
    TrustPickleOpt,
    UpdateBaselineOpt,
    WeightsOpt,
    ci_options,
    model_options,
    output_options,
)
from hookcli.options import Format

NAME = "registrations"
TOP_PARENTS = 3


def _fmt_module(value: Any) -> str:
    if value is None:
        return "(not in model)"
    return value or "(root)"


def _what(r: Any) -> str:
    from hookcli.render import fmt_shape

    if r.kind == "module":
        return str(r.type)
    if r.dtype is None:
        return "None"
    shape = "(lazy)" if r.shape is None else fmt_shape(r.shape)
    return f"{shape} {r.dtype}"


def command(
    model: ModelArg,
    kwargs: KwargsOpt = None,
    weights: WeightsOpt = None,
    trust_pickle: TrustPickleOpt = False,
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
    """Every registration while the model is built, in order: parent, kind, name, shape."""
    from collections import Counter

    from hookcli.loading import is_torchvision_name
    from hookcli.modelinfo import depth_of
    from hookcli.pipeline import build_model, emit
    from hookcli.registrations import KINDS, RegistrationRecorder
    from hookcli.render import Column, fmt_bool
    from hookcli.report import Report, Row

    mopts = model_options(model, kwargs, weights, trust_pickle, seed)
    out = output_options(
        format,
        output,
        depth,
        debug,
        ci_options(baseline, update_baseline, annotate, junit, rtol, atol),
    )
    if is_torchvision_name(mopts.spec.strip()):
        # Import torchvision before the hooks go in: only the model's own build is recorded.
        import torchvision.models  # noqa: F401

    recorder = RegistrationRecorder()
    with recorder:
        loaded = build_model(mopts)
    regs = recorder.resolve(loaded.module)
    recorder.release()

    rows = []
    for r in regs:
        if out.depth is not None and (r.module is None or depth_of(r.module) > out.depth):
            continue
        data: dict[str, Any] = {
            "seq": r.seq,
            "parent": r.parent,
            "module": r.module,
            "kind": r.kind,
            "name": r.name,
            "type": r.type,
            "shape": None if r.shape is None else list(r.shape),
            "dtype": r.dtype,
            "persistent": r.persistent,
            "overwrites": r.overwrites,
        }
        display: dict[str, Any] = {"what": _what(r)}
        if r.overwrites:
            display["mark"] = "(again)"
        rows.append(Row.of(data, display))

    per_kind = Counter(r.kind for r in regs)
    per_parent = Counter(r.parent_id for r in regs)
    first: dict[int, Any] = {}
    for r in regs:
        first.setdefault(r.parent_id, r)
    top = [
        {"module": first[pid].module, "parent": first[pid].parent, "count": n}
        for pid, n in per_parent.most_common(TOP_PARENTS)
    ]
    overwrites = sum(1 for r in regs if r.overwrites)
    outside = sum(1 for r in regs if r.module is None)
    totals = {
        "registrations": len(regs),
        **{kind: per_kind.get(kind, 0) for kind in KINDS},
        "overwrites": overwrites,
        "outside_model": outside,
        "top_parents": top,
    }
    notes = []
    if not regs:
        notes.append(
            "no registration was seen: the model registers nothing, or it was built before "
            "hookcli could watch (an nn.Module instance in a module imported earlier)"
        )
    report = Report(
        command=NAME,
        model={"spec": loaded.spec, "class": type(loaded.module).__name__},
        settings={"seed": mopts.seed},
        totals=totals,
        lists={"registrations": tuple(rows)},
        primary="registrations",
        notes=tuple(notes),
    )
    columns = [
        Column("seq", "Seq", str, "right"),
        Column("module", "Module", _fmt_module),
        Column("parent", "Parent"),
        Column("kind", "Kind"),
        Column("name", "Name"),
        Column("what", "Type / shape"),
        Column("persistent", "Persistent", fmt_bool),
    ]
    summary = ", ".join(f"{per_kind.get(k, 0)} {k}s" for k in KINDS)
    busiest = ", ".join(f"{_fmt_module(t['module'])} ({t['parent']}) {t['count']}" for t in top)
    table_totals = [("Registrations", f"{len(regs)}: {summary}, {overwrites} overwrites")]
    if busiest:
        table_totals.append(("Busiest parents", busiest))
    if outside:
        table_totals.append(("Not in the built model", f"{outside} registrations"))
    return emit(report, out, columns, table_totals)
