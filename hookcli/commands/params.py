"""``hookcli params MODEL``: every parameter, its tied names, trainable and frozen totals."""

from typing import TYPE_CHECKING, Annotated, Any

import typer

from hookcli.cliopts import (
    AnnotateOpt,
    AtolOpt,
    BaselineOpt,
    DebugOpt,
    DepthOpt,
    DeviceOpt,
    DtypeOpt,
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
    run_options,
)
from hookcli.options import Format, Mode

if TYPE_CHECKING:
    from torch import nn

NAME = "params"

FrozenOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--frozen",
        metavar="PATTERN",
        help="Set requires_grad=False first on parameters whose qualified name matches a glob "
        "(backbone.*, *.bias) or lies under a module name (layer1). Repeatable.",
        show_default=False,
    ),
]


def matches(name: str, pattern: str) -> bool:
    """A glob on the qualified name, or a module prefix (``layer1`` -> ``layer1.*``)."""
    import fnmatch

    return (
        fnmatch.fnmatchcase(name, pattern)
        or name == pattern
        or name.startswith(pattern.rstrip(".") + ".")
    )


def freeze(model: "nn.Module", patterns: list[str]) -> list[str]:
    """requires_grad=False on every matching parameter; the names matched (exit 2 if a
    pattern matches nothing: it is almost always a typo)."""
    from hookcli.errors import UsageError

    named = list(model.named_parameters(remove_duplicate=False))
    hit: list[str] = []
    for pattern in patterns:
        found = [n for n, _ in named if matches(n, pattern)]
        if not found:
            if not named:
                raise UsageError(f"--frozen {pattern!r}: the model has no parameters")
            sample = ", ".join(n for n, _ in named[:5])
            more = ", ..." if len(named) > 5 else ""
            raise UsageError(
                f"--frozen {pattern!r} matches no parameter (names look like: {sample}{more})"
            )
        hit.extend(n for n in found if n not in hit)
    for n, p in named:
        if n in hit:
            p.requires_grad_(False)
    return hit


def command(
    model: ModelArg,
    kwargs: KwargsOpt = None,
    weights: WeightsOpt = None,
    trust_pickle: TrustPickleOpt = False,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = None,
    frozen: FrozenOpt = None,
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
    """Every parameter: shape, dtype, device, requires_grad, numel, tied/shared names; no hooks."""
    from hookcli.modelinfo import depth_of
    from hookcli.pipeline import emit, prepare
    from hookcli.render import Column, fmt_bool, fmt_int, fmt_shape
    from hookcli.report import Report, Row

    mopts = model_options(model, kwargs, weights, trust_pickle, seed)
    ropts = run_options(None, None, device, dtype, None, Mode.EVAL)
    out = output_options(
        format,
        output,
        depth,
        debug,
        ci_options(baseline, update_baseline, annotate, junit, rtol, atol),
    )

    prepared = prepare(mopts, ropts, need_inputs=False)
    module = prepared.model
    frozen_names = freeze(module, list(frozen or ()))

    named = list(module.named_parameters(remove_duplicate=False))
    names_of: dict[int, list[str]] = {}
    for n, p in named:
        names_of.setdefault(id(p), []).append(n)

    rows = []
    first_seen: set[int] = set()
    hidden = hidden_numel = 0
    for n, p in named:
        counted = id(p) not in first_seen
        first_seen.add(id(p))
        owner = n.rpartition(".")[0]
        if out.depth is not None and depth_of(owner) > out.depth:
            hidden += 1
            hidden_numel += p.numel() if counted else 0
            continue
        data = {
            "name": n,
            "shape": list(p.shape),
            "dtype": str(p.dtype).removeprefix("torch."),
            "device": str(p.device),
            "requires_grad": p.requires_grad,
            "numel": p.numel(),
            "shared_with": [o for o in names_of[id(p)] if o != n],
        }
        # The table's Numel column counts a shared tensor at its first name only,
        # so the column sums to the total.
        display: dict[str, Any] = {"counted": p.numel() if counted else None}
        if not counted:
            display["mark"] = "(tied)"
        rows.append(Row.of(data, display))

    unique = {id(p): p for _, p in named}.values()
    total = sum(p.numel() for p in unique)
    trainable = sum(p.numel() for p in unique if p.requires_grad)
    groups = [ns for ns in names_of.values() if len(ns) > 1]
    totals = {
        "params": total,
        "trainable_params": trainable,
        "frozen_params": total - trainable,
        "tensors": len(unique),
        "names": len(named),
        "trainable_tensors": sum(1 for p in unique if p.requires_grad),
        "param_bytes": sum(p.numel() * p.element_size() for p in unique),
        "shared_groups": [list(g) for g in groups],
        "frozen_by_option": frozen_names,
    }
    settings = {k: v for k, v in prepared.settings.items() if k != "mode"}
    if frozen:
        settings["frozen"] = list(frozen)
    notes = []
    if frozen:
        notes.append(
            f"--frozen {' '.join(frozen)}: requires_grad=False set on "
            f"{len(frozen_names)} parameter name(s)"
        )
    report = Report(
        command=NAME,
        model=prepared.model_info(),
        settings=settings,
        totals=totals,
        lists={"params": tuple(rows)},
        primary="params",
        notes=tuple(notes),
    )
    columns = [
        Column("name", "Parameter"),
        Column("shape", "Shape", fmt_shape),
        Column("dtype", "Dtype"),
        Column("device", "Device"),
        Column("requires_grad", "Grad", fmt_bool),
        Column("counted", "Numel", fmt_int, "right"),
        Column("shared_with", "Shared with"),
    ]

    def pct(n: int) -> str:
        return f" ({100 * n / total:.1f}%)" if total else ""

    table_totals = [
        ("Total params", f"{fmt_int(total)} in {len(unique)} tensors"),
        ("Trainable", fmt_int(trainable) + pct(trainable)),
        ("Frozen", fmt_int(total - trainable) + pct(total - trainable)),
    ]
    if groups:
        table_totals.append(
            ("Shared", "; ".join(" = ".join(g) for g in groups) + " (each counted once)")
        )
    if hidden:
        table_totals.append(
            (f"Not shown (--depth {out.depth})", f"{fmt_int(hidden_numel)} in {hidden} names")
        )
    return emit(report, out, columns, table_totals)
