"""``inspect``: shapes and parameters per module call; the module tree (``--no-forward``).

``plan_inspect`` checks the options, ``run_inspect`` runs a prepared model and builds the
report (``hookcli inspect`` and ``hookcli.inspect`` both go through them). The rows are
``hookcli.layers``' (shared with grads and stats); here are ``--columns`` and the tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard, overload

from hookcli.layers import (
    PARAM_COLUMNS,
    inspect_totals,
    layer_rows,
    param_totals,
    params_not_run,
    shape_columns,
)
from hookcli.modelinfo import TensorIndex, depth_of
from hookcli.options import (
    DEFAULT_LOSS,
    HookKind,
    Mode,
    depth_arg,
    hook_kinds_arg,
    loss_arg,
    names_arg,
)
from hookcli.render import fmt_int
from hookcli.report import Column, Report, Row

if TYPE_CHECKING:
    import torch
    from torch import nn

    from hookcli.distributed.strategy import Launch
    from hookcli.options import Hooks, Loss, Names
    from hookcli.pipeline import Outcome, Prepared
    from hookcli.session import CallRecord


@dataclass(frozen=True)
class InspectPlan:
    """The options of ``inspect``, checked."""

    kinds: tuple[HookKind, ...]
    depth: int | None = None
    global_hooks: bool = False
    columns: tuple[str, ...] = ()  # --columns: kernel_size, groups, mult_adds, ...
    loss: Loss = DEFAULT_LOSS  # --loss, with backward kinds in --hooks


INSPECT_KINDS = (HookKind.PRE, HookKind.FORWARD)


def plan_inspect(
    hooks: Hooks = None,
    depth: int | None = None,
    global_hooks: bool = False,
    columns: Names = None,
    loss: str | Loss | None = None,
) -> InspectPlan:
    """Check the options of ``inspect`` (UsageError)."""
    cols = parse_columns(names_arg(columns, "columns"))
    kinds = hook_kinds_arg(hooks) or INSPECT_KINDS
    return InspectPlan(kinds, depth_arg(depth), global_hooks, cols, loss_arg(loss))


@overload
def run_inspect(prepared: Prepared, plan: InspectPlan, launch: None = None) -> Outcome: ...
@overload
def run_inspect(prepared: Prepared, plan: InspectPlan, launch: Launch) -> Outcome | None: ...
def run_inspect(
    prepared: Prepared, plan: InspectPlan, launch: Launch | None = None
) -> Outcome | None:
    """Shapes and parameters per module call.

    ``launch``: one process (``Local``, the default) or every rank of ``--ddp``/``--fsdp``:
    rank 0 merges the ranks' rows (the others get None).
    """
    from hookcli.distributed.strategy import Local
    from hookcli.grads.probe import backward_probes

    launch = launch or Local(plan.global_hooks)
    kinds = plan.kinds
    probes = backward_probes(kinds)
    mode = Mode(prepared.settings["mode"])
    loss: Loss | str = "sum" if launch.distributed else plan.loss  # as --ddp always summed
    loss_fn = launch.loss_fn(loss, prepared.inputs)
    run = launch.session(
        prepared, probes, mode=mode, backward=False, loss_fn=loss_fn, compare=False
    )
    if launch.distributed:
        return _merged_inspect(prepared, plan, launch, run, probes)
    settings = dict(prepared.settings)
    if any(k.is_backward for k in kinds):
        settings["loss"] = plan.loss.value
    index = TensorIndex(prepared.model)  # the model's tensors, read once for all three
    rows, unshown = layer_rows(
        run.records, prepared.model, depth=plan.depth, kinds=kinds, probes=probes, index=index
    )
    model_totals, extra_cols = inspect_totals(prepared.model, probes, index)
    model_totals["params_not_run"] = params_not_run(run.records, prepared.model, index)
    rows, chosen = with_columns(
        prepared,
        rows,
        plan.columns,
        model_totals["params"],
        ran=run.error is None,
        global_hooks=plan.global_hooks,
    )
    report = prepared.report(
        "inspect",
        settings,
        layers=rows,
        totals=model_totals,
        error=run.error.message if run.error else None,
        columns=(*shape_columns(kinds), *extra_cols, *PARAM_COLUMNS, *chosen),
        table_totals=tuple(param_totals(model_totals, unshown)),
    )
    return report, run.error


def _merged_inspect(
    prepared: Prepared, plan: InspectPlan, launch: Any, run: Any, probes: Sequence[Any]
) -> Outcome | None:
    """Every rank's calls on rank 0: rows say on which ranks each call ran."""
    from hookcli.distributed.ranks import RankRows
    from hookcli.distributed.strategy import RankFindings

    kinds = plan.kinds
    rows, _ = layer_rows(run.records, prepared.model, depth=plan.depth, kinds=kinds, probes=probes)
    rank_rows: RankRows = launch.rank_rows(rows, run)
    gathered = launch.gather(
        RankFindings(launch.rank, run.loss, rank_rows, shards=launch.shards(run))
    )
    if gathered is None:
        return None
    keys = ["output_shapes"] if HookKind.FORWARD in kinds else []
    merged = launch.merge_rows(gathered, prepared.model, per_rank_keys=keys)
    model_totals, extra_cols = inspect_totals(prepared.model, probes)
    model_totals.update(launch.shard_totals(gathered))
    shown = sum(int(r.display.get("shown_params", 0)) for r in merged)
    unshown = max(int(model_totals["params"]) - shown, 0)  # ran on no rank
    table_totals = param_totals(model_totals, unshown)
    if "shard_params_per_rank" in model_totals:
        per_rank = " | ".join(fmt_int(n) for n in model_totals["shard_params_per_rank"])
        table_totals.append(("Shard params per rank", per_rank))
    report = Report(
        command="inspect",
        model=launch.model_info(prepared, run),
        settings=launch.settings(prepared, run),
        inputs=prepared.input_dicts(),
        layers=merged,
        totals=model_totals,
        notes=launch.notes(run, model_totals),
        columns=(*shape_columns(kinds), *launch.columns(), *extra_cols, *PARAM_COLUMNS),
        table_totals=tuple(table_totals),
    )
    return report, None


# -- --columns: extra per-row columns (torchinfo's col_names) ---------------------------

COLUMN_NAMES = ("kernel_size", "groups", "param_percent", "mult_adds", "trainable")


def parse_columns(text: str | None) -> tuple[str, ...]:
    """``kernel_size,mult_adds`` -> ('kernel_size', 'mult_adds'); an unknown name is exit 2."""
    from hookcli.errors import UsageError
    from hookcli.validate import comma_names

    if text is None:
        return ()
    names = comma_names(text, COLUMN_NAMES, "column", "--columns")
    if not names:  # --columns '' or ',': given, yet naming nothing
        raise UsageError(f"--columns names no column; choose from {','.join(COLUMN_NAMES)}")
    return names


def _kernel_size(module: nn.Module | None) -> list[int] | None:
    """A module's ``kernel_size``: an int, a tuple or list of ints, or a 0-d or 1-d integer
    tensor (transformers' EncodecConv1d and MimiConv1d keep ``torch.tensor(k)``)."""
    k = getattr(module, "kernel_size", None)
    if _int_tensor(k):
        if k.dim() > 1:
            return None
        k = k.tolist()
    values = k if isinstance(k, (tuple, list)) else [k]
    out = [_as_int(v) for v in values]
    return None if None in out else [v for v in out if v is not None]


def _int_tensor(v: Any) -> TypeGuard[torch.Tensor]:
    """A dense integer tensor whose values can be read (not on meta)."""
    import torch

    return (
        isinstance(v, torch.Tensor)
        and v.layout == torch.strided
        and not v.is_meta
        and not v.is_quantized
        and not (v.is_floating_point() or v.is_complex() or v.dtype == torch.bool)
    )


def _as_int(v: Any) -> int | None:
    """An int (not a bool; numpy integers and 0-d integer tensors too), else None."""
    import numbers

    if _int_tensor(v) and v.dim() == 0:
        v = v.item()
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):
        return int(v)
    return None


def _groups(module: nn.Module | None) -> int | None:
    g = getattr(module, "groups", None)
    return g if isinstance(g, int) and not isinstance(g, bool) else None


def _trainable(params: int, trainable_params: int) -> bool | str | None:
    """True (all trainable), False (none), "partial", or None (no parameters)."""
    if not params:
        return None
    if trainable_params == params:
        return True
    return "partial" if trainable_params else False


def _fmt_kernel(value: Any) -> str:
    return "-" if not value else "x".join(str(v) for v in value)


def _fmt_percent(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}%"


def _fmt_trainable(value: Any) -> str:
    if value is None:
        return "-"
    if value == "partial":
        return "partial"
    return "yes" if value else "no"


def column_specs(names: Sequence[str]) -> list[Column]:
    """The table columns of ``--columns``, in the order given."""
    from hookcli.render import fmt_count

    specs = {
        "kernel_size": Column("kernel_size", "Kernel", _fmt_kernel, "right"),
        "groups": Column("groups", "Groups", fmt_int, "right"),
        "param_percent": Column("param_percent", "Param %", _fmt_percent, "right"),
        "mult_adds": Column("mult_adds", "Mult-adds", fmt_count, "right"),
        "trainable": Column("trainable", "All trainable", _fmt_trainable),
    }
    return [specs[n] for n in names]


def mult_adds_by_call(
    records: Sequence[CallRecord], probe: Any, model: nn.Module
) -> dict[tuple[str, int, bool], int | None]:
    """``(name, call, called) -> macs`` of a measured ``cost`` pass, as ``cost``'s rows
    have them (its ``macs`` column, from the same counter)."""
    from hookcli.cost.runner import _CostColumns

    source = _CostColumns(probe, model)
    rows, _ = layer_rows(records, model, probes=[source])  # type: ignore[list-item]
    return {(r["name"], r["call"], r["called"]): r["macs"] for r in rows}


def add_columns(
    rows: Sequence[Row],
    model: nn.Module,
    names: Sequence[str],
    total_params: int,
    macs: dict[tuple[str, int, bool], int | None] | None = None,
) -> tuple[Row, ...]:
    """Rows with the ``--columns`` keys added (in JSON, CSV and Markdown too)."""
    by_name = dict(model.named_modules())
    out = []
    for row in rows:
        data = dict(row.data)
        module = by_name.get(data["name"])
        for name in names:
            if name == "kernel_size":
                data[name] = _kernel_size(module)
            elif name == "groups":
                data[name] = _groups(module)
            elif name == "param_percent":
                data[name] = 100 * data["params"] / total_params if total_params else None
            elif name == "trainable":
                data[name] = _trainable(data["params"], data["trainable_params"])
            elif name == "mult_adds":
                key = (data["name"], data["call"], data["called"])
                data[name] = None if macs is None else macs.get(key)
        out.append(Row.of(data, row.display))
    return tuple(out)


# -- inspect --no-forward: the module tree, nothing run -------------------------------


def _display_type(module: nn.Module) -> str:
    """The class name; a TorchScript module's original class (not RecursiveScriptModule)."""
    from hookcli.scripted import is_scripted

    if is_scripted(module):
        return str(getattr(module, "original_name", type(module).__name__))
    return type(module).__name__


def tree_rows(model: nn.Module, depth: int | None = None) -> tuple[tuple[Row, ...], bool]:
    """One row per module of ``named_modules()`` (no forward): params and buffers.

    The table's Params and Buffers columns count each tensor once, as ``inspect``'s do
    (own tensors, or the subtree where ``depth`` hides the children). Returns the rows
    and whether any parameter or buffer is lazy (uninitialized).
    """
    from hookcli.modelinfo import TensorIndex, all_param_counts, is_lazy, numel

    index = TensorIndex(model)
    counts = all_param_counts(model, index)
    buffer_memo: dict[int, dict[int, int]] = {}

    def buffers_of(m: nn.Module) -> dict[int, int]:
        if id(m) not in buffer_memo:
            own = {id(b): numel(b) for b in m._buffers.values() if b is not None}
            for child in m._modules.values():
                if child is not None:
                    own.update(buffers_of(child))
            buffer_memo[id(m)] = own
        return buffer_memo[id(m)]

    lazy = any(is_lazy(t) for t in (*model.parameters(), *model.buffers()))
    seen: set[int | tuple[int, str]] = set()
    seen_buffers: set[int] = set()
    rows: list[Row] = []
    for name, module in model.named_modules():
        d = depth_of(name)
        if depth is not None and d > depth:
            continue
        pc = counts[id(module)]
        own_buffers = {id(b): numel(b) for b in module._buffers.values() if b is not None}
        subtree_buffers = buffers_of(module)
        data: dict[str, Any] = {
            "name": name,
            "type": _display_type(module),
            "depth": d,
            "call": 0,
            "called": False,
            "params": pc.params,
            "own_params": pc.own_params,
            "trainable_params": pc.trainable_params,
            "buffers": sum(subtree_buffers.values()),
            "own_buffers": sum(own_buffers.values()),
        }
        cut = depth is not None and d == depth
        shown = trainable = 0
        for h in index.held(module, recurse=cut):
            if h.key not in seen:
                seen.add(h.key)
                shown += h.numel
                trainable += h.numel if h.trainable else 0
        shown_buffers = 0
        for key, n in (subtree_buffers if cut else own_buffers).items():
            if key not in seen_buffers:
                seen_buffers.add(key)
                shown_buffers += n
        display = {
            "shown_params": shown,
            "shown_trainable": trainable,
            "shown_buffers": shown_buffers,
        }
        rows.append(Row.of(data, display))
    return tuple(rows), lazy


# --no-forward: the run's columns without shapes, and the buffers
TREE_COLUMNS = [
    *shape_columns(()),
    *PARAM_COLUMNS,
    Column("shown_buffers", "Buffers", fmt_int, "right"),
]


def with_columns(
    prepared: Prepared,
    rows: Sequence[Row],
    names: Sequence[str],
    total_params: int,
    *,
    ran: bool,
    global_hooks: bool = False,
) -> tuple[tuple[Row, ...], list[Column]]:
    """``--columns``: the rows with the chosen keys, and their table columns.

    ``mult_adds`` runs the model once more under ``cost``'s counter (the same
    ``CostProbe`` and ``measure`` pass as ``hookcli cost``), so each row's figure is
    ``cost``'s ``macs`` for that call; null when the model failed (``ran`` false).
    """
    if not names:
        return tuple(rows), []
    macs = None
    if "mult_adds" in names and ran:
        from hookcli.cost.runner import measure
        from hookcli.options import Mode

        probe, records, error = measure(
            prepared, mode=Mode(prepared.settings["mode"]), global_hooks=global_hooks
        )
        if error is None:
            macs = mult_adds_by_call(records, probe, prepared.model)
    return add_columns(rows, prepared.model, names, total_params, macs), column_specs(names)


MULT_ADDS_NEED_FORWARD = "--columns mult_adds counts the ops of a forward: drop --no-forward"


def tree_report(prepared: Prepared, depth: int | None, names: Sequence[str] = ()) -> Report:
    """``inspect --no-forward``: the module tree with parameters and buffers, nothing run."""
    from hookcli.errors import UsageError

    if "mult_adds" in names:
        raise UsageError(MULT_ADDS_NEED_FORWARD)
    model = prepared.model
    rows, lazy = tree_rows(model, depth)
    model_totals, _ = inspect_totals(model, ())
    rows, extra = with_columns(prepared, rows, names, model_totals["params"], ran=False)
    notes = ["no forward run (--no-forward): the module tree, its parameters and buffers"]
    if lazy:
        notes.append(
            "lazy modules (nn.LazyLinear, ...) hold uninitialized parameters: counted as 0 "
            "until a forward sets their shapes (run without --no-forward)"
        )
    settings = {k: v for k, v in prepared.settings.items() if k != "mode"}
    settings["forward"] = False
    table_totals = param_totals(model_totals, 0)
    if depth is not None:
        shown = sum(r.display["shown_params"] for r in rows)
        if shown != model_totals["params"]:  # cannot happen: the cut rows hold their subtrees
            table_totals.append(("Not shown", fmt_int(model_totals["params"] - shown)))
    return prepared.report(  # no inputs: no forward
        "inspect",
        settings,
        layers=rows,
        totals=model_totals,
        notes=tuple(notes),
        columns=(*TREE_COLUMNS, *extra),
        table_totals=tuple(table_totals),
    )


def check_no_forward(
    hooks: str | None, global_hooks: bool, ddp: bool, ropts: Any, columns: Sequence[str] = ()
) -> None:
    """Options that need a forward, given with ``--no-forward``: exit 2 naming them (before
    the model is built)."""
    from hookcli.errors import UsageError
    from hookcli.validate import given_flags

    if "mult_adds" in columns:
        raise UsageError(MULT_ADDS_NEED_FORWARD)
    given = given_flags(
        ("--hooks", hooks),
        ("--global-hooks", global_hooks),
        ("--ddp/--fsdp", ddp),
        ("--input", ropts.inputs),
        ("--input-file", ropts.input_file),
        ("--inputs-from", ropts.inputs_from),
        ("--batch-size", ropts.batch_size is not None),
    )
    if given:
        raise UsageError(f"--no-forward runs nothing: {', '.join(given)} would not apply")
