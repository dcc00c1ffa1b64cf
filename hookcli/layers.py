"""Layer rows shared by inspect, grads and stats: one per module call (docs/reference.md)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from hookcli.modelinfo import depth_of
from hookcli.options import HookKind
from hookcli.render import fmt_int, fmt_shapes
from hookcli.report import Column, Row, shapes_list

if TYPE_CHECKING:
    from torch import nn

    from hookcli.modelinfo import TensorIndex
    from hookcli.session import CallRecord, Probe


def layer_rows(
    records: Sequence[CallRecord],
    model: nn.Module,
    *,
    depth: int | None = None,
    kinds: Iterable[HookKind] = (HookKind.PRE, HookKind.FORWARD),
    probes: Sequence[Probe] = (),
    containers: bool = True,
    index: TensorIndex | None = None,
) -> tuple[tuple[Row, ...], int]:
    """Rows for the calls at depth <= ``depth``, and the params no shown row holds.

    A module that was never called but whose descendants ran (``ModuleList``,
    ``ModuleDict``, a plain holder) gets a row of its own, ``called: false``,
    just before its first descendant's call, with its subtree's figures.

    The table-only ``shown_params`` column counts each parameter tensor once: a
    row's own tensors, or its whole subtree where ``depth`` hides the children,
    and a tied tensor at the first row that holds it; so the column sums to the
    total, less the tensors of modules none of whose forward ran (returned as
    the second value). ``containers=False`` where only some modules were hooked.
    ``index``: the model's tensors, when the caller has read them already.
    """
    from hookcli.modelinfo import TensorIndex, all_param_counts, tied_parameters

    kinds = frozenset(kinds)
    index = index or TensorIndex(model)  # parameters and quantized modules' packed weights
    counts = all_param_counts(model, index)
    tied = tied_parameters(model, index)
    by_name = index.modules_by_name(model)
    modules = {id(m): m for m in by_name.values()}
    called = {rec.name for rec in records} if containers else set(by_name)
    opened: set[str] = set()
    seen: set[int | tuple[int, str]] = set()
    rows: list[Row] = []

    def add(data: dict[str, Any], module: nn.Module | None, row_depth: int, mark: str) -> None:
        shown = trainable = 0
        if module is not None:
            cut = depth is not None and row_depth == depth
            for h in index.held(module, recurse=cut):
                if h.key not in seen:
                    seen.add(h.key)
                    shown += h.numel
                    trainable += h.numel if h.trainable else 0
        display: dict[str, Any] = {"shown_params": shown, "shown_trainable": trainable}
        if mark:
            display["mark"] = mark
        rows.append(Row.owning(data, display))

    def counts_of(module_id: int) -> dict[str, Any]:
        pc = counts.get(module_id)
        out: dict[str, Any] = {
            "params": pc.params if pc else 0,
            "own_params": pc.own_params if pc else 0,
            "trainable_params": pc.trainable_params if pc else 0,
        }
        if module_id in tied:  # only on a tied module's rows: other reports keep their keys
            out["shared_with"] = tied[module_id]
        return out

    for rec in records:
        for name in _uncalled_ancestors(rec.name, called, opened, by_name):
            opened.add(name)
            container = by_name[name]
            cdepth = depth_of(name)
            if depth is not None and cdepth > depth:
                continue
            data: dict[str, Any] = {
                "name": name,
                "type": type(container).__name__,
                "depth": cdepth,
                "call": 0,
                "called": False,
            }
            if HookKind.PRE in kinds:
                data["input_shapes"] = None
            if HookKind.FORWARD in kinds:
                data["output_shapes"] = None
            data.update(counts_of(id(container)))
            for probe in probes:
                data.update(probe.container_columns(container))
            add(data, container, cdepth, "(not called)")
        if depth is not None and rec.depth > depth:
            continue
        data = {
            "name": rec.name,
            "type": rec.type,
            "depth": rec.depth,
            "call": rec.call,
            "called": True,
        }
        if HookKind.PRE in kinds:
            data["input_shapes"] = shapes_list(rec.input_shapes)
        if HookKind.FORWARD in kinds:
            data["output_shapes"] = shapes_list(rec.output_shapes)
        data.update(counts_of(rec.module_id))
        for probe in probes:
            data.update(probe.columns(rec))
        add(data, modules.get(rec.module_id), rec.depth, "<- failed here" if rec.failed else "")
    # the root's count is every tensor once: totals()'s "params", without its buffer walk
    unshown = counts[id(model)].params - sum(r.display["shown_params"] for r in rows)
    return tuple(rows), unshown


def _uncalled_ancestors(
    name: str, called: set[str], opened: set[str], by_name: dict[str, nn.Module]
) -> list[str]:
    """Ancestors of ``name`` that never ran and have no row yet, outermost first."""
    if name not in by_name or not name:
        return []  # the root, or a module outside the model's tree ("[Type]")
    out = []
    parent = name
    while parent:
        parent = parent.rpartition(".")[0]
        if parent in opened or parent in called:
            break  # its ancestors were handled when it was
        out.append(parent)
    out.reverse()
    return out


def inspect_totals(
    model: nn.Module, probes: Sequence[Probe], index: TensorIndex | None = None
) -> tuple[dict[str, Any], list[Column]]:
    """``inspect``'s totals (with the probes' own) and the table columns the probes add."""
    from hookcli.modelinfo import totals
    from hookcli.parameters import pruned_counts

    model_totals: dict[str, Any] = dict(totals(model, index))
    pruned = pruned_counts(model)
    if pruned is not None:
        model_totals.update(pruned)
    extra_cols: list[Column] = []
    for p in probes:
        model_totals.update(p.totals())
        extra_cols.extend(getattr(p, "table_columns", ()))
    return model_totals, extra_cols


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
        ("Param size", fmt_bytes(t["param_bytes"], binary=False)),
        (
            "Buffers",
            f"{fmt_int(t['buffers'])} elements ({fmt_bytes(t['buffer_bytes'], binary=False)})",
        ),
    ]
    if t.get("packed_params"):
        out.append(("Packed (quantized) params", fmt_int(t["packed_params"])))
    if "pruned_params" in t:
        from hookcli.parameters import pruned_line

        out.append(("Params after pruning", pruned_line(t)))
    if unshown:
        out.append(("Params in modules that did not run", fmt_int(unshown)))
    return out


def params_not_run(
    records: Sequence[CallRecord], model: nn.Module, index: TensorIndex | None = None
) -> int:
    """Elements of the parameters no module that ran holds (each tensor once).

    A module "ran" when its forward was called, or when it is a container whose
    descendants ran (its row is ``called: false``); so this is an unused branch's
    parameters, whatever ``--depth`` shows.
    """
    from hookcli.modelinfo import TensorIndex

    index = index or TensorIndex(model)
    by_name = index.modules_by_name(model)
    ran: set[int] = {rec.module_id for rec in records}
    for rec in records:
        name = rec.name
        while name and name in by_name:
            name = name.rpartition(".")[0]
            ran.add(id(by_name[name]))
    used: set[int | tuple[int, str]] = set()
    for module_id, held in index.own.items():
        if module_id in ran:
            used.update(h.key for h in held)
    return sum(h.numel for h in index.held(model) if h.key not in used)
