"""Layer rows shared by inspect, grads and stats: one per module call, CLI.md keys."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from hookcli.options import HookKind
from hookcli.render import Column, fmt_int, fmt_shapes
from hookcli.report import Row, shapes_list

if TYPE_CHECKING:
    from torch import nn

    from hookcli.session import CallRecord, Probe


def layer_rows(
    records: Sequence[CallRecord],
    model: nn.Module,
    *,
    depth: int | None = None,
    kinds: Iterable[HookKind] = (HookKind.PRE, HookKind.FORWARD),
    probes: Sequence[Probe] = (),
) -> tuple[tuple[Row, ...], int]:
    """Rows for the calls at depth <= ``depth``, and the params no shown row holds.

    The table-only ``shown_params`` column counts each parameter tensor once: a
    row's own tensors, or its whole subtree where ``depth`` hides the children,
    and a tied tensor at the first row that holds it; so the column sums to the
    total, less the tensors of modules that never ran (returned as the second value).
    """
    from hookcli.modelinfo import all_param_counts, totals

    kinds = frozenset(kinds)
    counts = all_param_counts(model)
    modules = {id(m): m for m in model.modules()}
    seen: set[int] = set()
    rows: list[Row] = []
    for rec in records:
        if depth is not None and rec.depth > depth:
            continue
        pc = counts.get(rec.module_id)
        data: dict[str, Any] = {
            "name": rec.name,
            "type": rec.type,
            "depth": rec.depth,
            "call": rec.call,
        }
        if HookKind.PRE in kinds:
            data["input_shapes"] = shapes_list(rec.input_shapes)
        if HookKind.FORWARD in kinds:
            data["output_shapes"] = shapes_list(rec.output_shapes)
        data["params"] = pc.params if pc else 0
        data["own_params"] = pc.own_params if pc else 0
        data["trainable_params"] = pc.trainable_params if pc else 0
        for probe in probes:
            data.update(probe.columns(rec))
        shown = trainable = 0
        module = modules.get(rec.module_id)
        if module is not None:
            cut = depth is not None and rec.depth == depth
            tensors = module.parameters(recurse=cut)
            for p in tensors:
                if id(p) not in seen:
                    seen.add(id(p))
                    shown += p.numel()
                    trainable += p.numel() if p.requires_grad else 0
        display: dict[str, Any] = {"shown_params": shown, "shown_trainable": trainable}
        if rec.failed:
            display["mark"] = "<- failed here"
        rows.append(Row.of(data, display))
    unshown = totals(model)["params"] - sum(r.display["shown_params"] for r in rows)
    return tuple(rows), unshown


def shape_columns(kinds: Iterable[HookKind]) -> list[Column]:
    """Name, Type, and the shape columns of the kinds attached."""
    kinds = frozenset(kinds)
    cols = [Column("name", "Layer"), Column("type", "Type")]
    if HookKind.PRE in kinds:
        cols.append(Column("input_shapes", "Input shape", fmt_shapes))
    if HookKind.FORWARD in kinds:
        cols.append(Column("output_shapes", "Output shape", fmt_shapes))
    return cols


PARAM_COLUMNS = [
    Column("shown_params", "Params", fmt_int, "right"),
    Column("shown_trainable", "Trainable", fmt_int, "right"),
]


def param_totals(t: dict[str, int], unshown: int) -> list[tuple[str, str]]:
    """The totals block of the table."""
    from hookcli.render import fmt_bytes

    out = [
        ("Total params", fmt_int(t["params"])),
        ("Trainable params", fmt_int(t["trainable_params"])),
        ("Non-trainable params", fmt_int(t["non_trainable_params"])),
        ("Param size", fmt_bytes(t["param_bytes"])),
        ("Buffers", f"{fmt_int(t['buffers'])} elements ({fmt_bytes(t['buffer_bytes'])})"),
    ]
    if unshown:
        out.append(("Params in modules that did not run", fmt_int(unshown)))
    return out
