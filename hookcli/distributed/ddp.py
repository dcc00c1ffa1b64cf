"""``--ddp``: grads, inspect and stats on every rank, through DistributedDataParallel.

Each rank builds the model with ``--seed`` (the same weights everywhere), draws its
inputs from a Generator seeded with ``seed + rank``, wraps the model in
``DistributedDataParallel`` and runs one forward (and backward) with the
command's hooks on the wrapped module. The ranks agree after every stage
(``DistContext.sync``), compare their reduced gradients and buffers with rank
0's, and send their rows to rank 0, which merges them (``hookcli.distributed.ranks``) and
alone writes the report.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hookcli.errors import HookcliError, RunError, UsageError, first_line
from hookcli.options import HookKind, Loss

if TYPE_CHECKING:
    import torch
    from torch import nn

    from hookcli.distributed.launch import DistContext
    from hookcli.distributed.ranks import Divergence, RankRows
    from hookcli.grads.checks import GradGates
    from hookcli.options import Mode, ModelOptions, OutputOptions, RunOptions
    from hookcli.pipeline import Prepared
    from hookcli.report import CheckResult, Column, Row
    from hookcli.session import CallRecord, Probe

DESYNC = "desync"


def launch_command(
    body: Callable[[DistContext], int],
    *,
    ddp: bool,
    device: str,
    backend: str | None,
    timeout_s: float,
    kinds: Sequence[HookKind],
    global_hooks: bool,
    need_tensor: bool = True,
) -> int:
    """Check the --ddp options, then run ``body`` on this rank (``distributed.launch``)."""
    from hookcli.distributed.launch import launch

    if not ddp:
        raise UsageError("--backend needs --ddp (under torchrun or srun)")
    check_ddp_options(kinds, global_hooks, need_tensor=need_tensor)
    return launch(body, device=device, backend=backend, timeout_s=timeout_s)


def check_ddp_options(
    kinds: Sequence[HookKind],
    global_hooks: bool,
    *,
    per_param: bool = False,
    plot: object = None,
    need_tensor: bool = True,
) -> None:
    """Options that do not combine with --ddp: exit 2 before any rank starts its group."""
    if global_hooks:
        raise UsageError("--global-hooks does not combine with --ddp (it would hook DDP itself)")
    if per_param or plot is not None:
        raise UsageError(f"{'--per-param' if per_param else '--plot'} does not combine with --ddp")
    if need_tensor and HookKind.TENSOR not in kinds:
        raise UsageError(
            "--ddp reads each rank's gradients with tensor hooks: add tensor to --hooks"
        )


def prepare_rank(
    ctx: DistContext, mopts: ModelOptions, ropts: RunOptions, allow_meta: bool = False
) -> Prepared:
    """The model built with ``--seed`` (as on every rank); inputs drawn with seed + rank."""
    from hookcli.distributed.launch import redraw_inputs
    from hookcli.pipeline import Prepared, build_model, prepare

    if ctx.device == "meta" and not allow_meta:
        raise UsageError(
            "--ddp/--fsdp need real tensors: --device meta only gives shapes (cost takes meta)"
        )
    if ctx.device == "meta":  # cost --fsdp: built on meta, never on the CPU (a 7B model)
        import torch

        loaded = build_model(mopts, torch.device("meta"))
    else:
        loaded = build_model(mopts)
    input_seed = mopts.seed + ctx.rank
    rank_mopts = dataclasses.replace(mopts, seed=input_seed)
    prepared = prepare(rank_mopts, dataclasses.replace(ropts, device=ctx.device), loaded=loaded)
    inputs = prepared.inputs
    assert inputs is not None
    if inputs.source == "example_input_array" and ctx.device != "meta":  # redraw per rank
        args, kwargs = redraw_inputs(inputs.args, inputs.kwargs, input_seed)
        inputs = dataclasses.replace(inputs, args=args, kwargs=kwargs)
    settings = {
        **prepared.settings,
        "seed": mopts.seed,
        "input_seed": "seed + rank",
        "ddp": True,
        "world_size": ctx.world_size,
        "backend": ctx.backend,
        "launcher": ctx.env.source,
    }
    return Prepared(loaded=prepared.loaded, inputs=inputs, settings=settings)


@dataclass(frozen=True)
class DdpRun:
    """What one rank's session saw, on the host."""

    records: tuple[CallRecord, ...]
    loss: float | None
    reduced: Mapping[str, float | None]  # parameter -> norm of .grad after DDP's all-reduce
    divergences: tuple[Divergence, ...]  # this rank's tensors that differ from rank 0's
    buffers_resynced: bool = True  # DDP(broadcast_buffers=True): rank 0's at every forward


def _unique_params(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    seen: set[int] = set()
    out = []
    for name, p in model.named_parameters():
        if id(p) not in seen:
            seen.add(id(p))
            out.append((name, p))
    return out


def run_ddp_session(
    ctx: DistContext,
    prepared: Prepared,
    probes: Sequence[Probe],
    *,
    mode: Mode,
    backward: bool,
    loss_fn: Callable[[Any], torch.Tensor],
    compare: bool,
    broadcast_buffers: bool = True,
) -> DdpRun:
    """One forward (and backward) of DDP(model) with the probes' hooks on the model.

    The ranks agree after the forward and after the backward, so a rank that
    failed stops the others before they wait for it inside DDP's all-reduce.
    """
    import torch

    from hookcli.distributed.launch import wrap_ddp
    from hookcli.grads.probe import tensor_norm
    from hookcli.session import HookSession

    model = prepared.model
    assert prepared.inputs is not None
    args, kwargs = prepared.inputs.args, dict(prepared.inputs.kwargs)
    ddp = ctx.step(
        "wrapping the model in DistributedDataParallel",
        lambda: wrap_ddp(model, ctx, broadcast_buffers),
    )
    try:
        with HookSession(model, probes, mode=mode, backward=backward, call=ddp) as session:
            error: HookcliError | None = None
            loss: torch.Tensor | None = None
            try:
                output = session.forward(args, kwargs)
                if session.backward_needed:
                    loss = loss_fn(output)
            except HookcliError as err:
                error = err
            except Exception as err:  # the loss: tell the others rather than leave them waiting
                error = RunError(f"the loss could not be computed: {first_line(err)}")
            ctx.sync("forward", error)
            loss_value: float | None = None
            if loss is not None:
                loss_value = float(loss.detach())
                try:
                    session.backward(loss)
                except HookcliError as err:
                    error = err
                ctx.sync("backward", error)
            session.finish()
            params = _unique_params(model)
            reduced: dict[str, float | None] = {}
            if session.backward_needed:
                with torch.no_grad():
                    have = [(n, p.grad) for n, p in params if p.grad is not None]
                    norms = (
                        torch.stack([tensor_norm(g).double().cpu() for _, g in have]).tolist()
                        if have
                        else []
                    )
                reduced = {n: None for n, _ in params}
                reduced.update({n: v for (n, _), v in zip(have, norms, strict=True)})
            found: list[Divergence] = []
            if compare:
                if session.backward_needed:
                    grads = [(n, p.grad) for n, p in params if p.requires_grad]
                    found += ctx.compare(grads, "grad")
                # DDP syncs parameters only when it wraps the model: one that a forward
                # changed on some rank stays different (as after an optimizer step).
                found += ctx.compare([(n, p.detach()) for n, p in params], "param")
                found += ctx.compare(list(model.named_buffers()), "buffer")
            records = session.records
            resynced = bool(getattr(ddp, "broadcast_buffers", broadcast_buffers))
    finally:
        del ddp  # the reducer and its hooks on the gradient accumulators go with it
    return DdpRun(records, loss_value, reduced, tuple(found), resynced)


def _rank_rows(rank: int, rows: Sequence[Row], extra: Callable[[Row], dict[str, Any]]) -> RankRows:
    from hookcli.distributed.ranks import RankRows

    return RankRows(rank, tuple(({**dict(r.data), **extra(r)}, dict(r.display)) for r in rows))


def _l2(values: Sequence[float | None]) -> float | None:
    import math

    vals = [v for v in values if v is not None]
    return math.sqrt(math.fsum(v * v for v in vals)) if vals else None


def _fmt_per_rank(fmt: Callable[[Any], str]) -> Callable[[Any], str]:
    def cell(values: Any) -> str:
        if not values:
            return "-"
        return " | ".join(fmt(v) for v in values)

    return cell


def _fmt_pct(value: Any) -> str:
    import math

    if value is None:
        return "-"
    v = float(value)
    if math.isnan(v) or math.isinf(v):
        return str(v)
    return f"{100 * v:.1f}%"


def _fmt_ranks(value: Any) -> str:
    return ",".join(str(v) for v in value) if value else "-"


def _fmt_unused_per_rank(values: Any) -> str:
    if not values or not any(values):
        return ""
    return "; ".join(
        f"r{r}: {', '.join(str(n).rsplit('.', 1)[-1] for n in names)}"
        for r, names in enumerate(values)
        if names
    )


def _notes(
    ctx: DistContext, drift: Sequence[Mapping[str, Any]] = (), resynced: bool = True
) -> tuple[str, ...]:
    flags = "find_unused_parameters=True" + ("" if resynced else ", broadcast_buffers=False")
    notes = [
        f"distributed: {ctx.world_size} ranks ({ctx.backend}, {ctx.env.source}); "
        f"DistributedDataParallel({flags}); rank r draws its inputs with seed + r"
    ]
    names = list(dict.fromkeys(str(d["name"]) for d in drift))
    if names:
        notes.append(
            f"note: {len(names)} buffer(s) differ across ranks after the step (first: "
            f"{names[0]}); DDP overwrites them with rank 0's at the next forward "
            "(broadcast_buffers=True), so this is not a desync"
        )
    return tuple(notes)


def desync_totals(
    divergences: Sequence[Divergence], tol: float, resynced: bool
) -> dict[str, list[dict[str, Any]]]:
    """``desync``: what differs beyond ``tol`` and DDP leaves so; ``buffer_drift``: the rest."""
    over = [d for d in divergences if d.relative > tol or d.why != "values"]
    drift = [d for d in over if resynced and d.kind == "buffer"]
    return {
        "desync": [d.to_dict() for d in over if d not in drift],
        "buffer_drift": [d.to_dict() for d in drift],
    }


# -- grads --------------------------------------------------------------------------------


@dataclass(frozen=True)
class GradsRank:
    """What rank r sends to rank 0 in ``grads --ddp``."""

    rank: int
    loss: float | None
    rows: RankRows
    checks: tuple[CheckResult, ...]
    unused: tuple[str, ...]  # parameters whose tensor hook never fired on this rank
    unused_indices: tuple[int, ...]  # their DDP indices (among the trainable parameters)
    grad_norm: float | None  # total, before the all-reduce
    reduced_grad_norm: float | None  # total, after it
    divergences: tuple[Divergence, ...]
    module_grad_norm: Mapping[str, float | None]  # module -> own params' local grad norm
    module_unused: Mapping[str, tuple[str, ...]]  # module -> own params with no local grad


def run_grads(
    ctx: DistContext,
    mopts: ModelOptions,
    ropts: RunOptions,
    out: OutputOptions,
    kinds: tuple[HookKind, ...],
    explicit: bool,
    loss_kind: Loss,
    gates: GradGates,
    desync_tol: float,
    broadcast_buffers: bool = True,
) -> int:
    """``grads --ddp`` on this rank; rank 0 writes the merged report. The exit status."""
    from hookcli.grads.checks import GradGates, run_checks
    from hookcli.grads.probe import GradProbe
    from hookcli.layers import layer_rows
    from hookcli.losses import reduce_output

    prepared = ctx.step("building the model", lambda: prepare_rank(ctx, mopts, ropts))
    model = prepared.model
    probe = GradProbe(
        frozenset(kinds),
        output_hooks=explicit and HookKind.TENSOR in kinds,
        watch_forward=bool({"nan", "inf", "dead"} & set(gates.fail_on)),
        flag_inf="inf" in gates.fail_on,
    )
    run = run_ddp_session(
        ctx,
        prepared,
        [probe],
        mode=ropts.mode,
        backward=True,
        loss_fn=lambda output: reduce_output(output, loss_kind),
        compare=True,
        broadcast_buffers=broadcast_buffers,
    )
    findings = probe.findings
    assert findings is not None
    local_gates = GradGates(
        tuple(n for n in gates.fail_on if n not in ("unused", DESYNC)),
        gates.max_grad_norm,
        gates.min_grad_norm,
    )
    checks = run_checks(local_gates, findings, run.records, run.loss)
    # No grad on this rank: the tensor hook never fired (after the all-reduce, .grad is
    # set wherever any rank produced one, so .grad cannot tell).
    unused = [pg.name for pg in findings.params if pg.requires_grad and pg.grad_norm is None]
    trainable = [pg.name for pg in findings.params if pg.requires_grad]
    unused_set = set(unused)
    modules = dict(model.named_modules())
    own = {name: findings.module_params.get(id(m), ()) for name, m in modules.items()}

    def extra(row: Row) -> dict[str, Any]:
        names = own.get(str(row.data["name"]), ())
        return {
            "reduced_grad_norm": _l2([run.reduced.get(n) for n in names]) if names else None,
            "unused_params": [n for n in names if n in unused_set],
        }

    module_grad_norm = {
        name: findings.modules[id(m)].grad_norm
        for name, m in modules.items()
        if id(m) in findings.modules
    }
    module_unused = {
        name: tuple(n for n in names if n in unused_set) for name, names in own.items() if names
    }

    rows, _ = layer_rows(run.records, model, depth=out.depth, kinds=kinds, probes=[probe])
    mine = GradsRank(
        rank=ctx.rank,
        loss=run.loss,
        rows=_rank_rows(ctx.rank, rows, extra),
        checks=checks,
        unused=tuple(unused),
        unused_indices=tuple(trainable.index(n) for n in unused),
        grad_norm=findings.total_grad_norm,
        reduced_grad_norm=_l2(list(run.reduced.values())),
        divergences=run.divergences,
        module_grad_norm=module_grad_norm,
        module_unused=module_unused,
    )
    gathered = ctx.gather(mine)
    if gathered is None:
        return 0
    return _report_grads(
        ctx,
        prepared,
        probe,
        kinds,
        out,
        gates,
        desync_tol,
        loss_kind,
        gathered,
        run.buffers_resynced,
    )


def _report_grads(
    ctx: DistContext,
    prepared: Prepared,
    probe: Any,
    kinds: tuple[HookKind, ...],
    out: OutputOptions,
    gates: GradGates,
    desync_tol: float,
    loss_kind: Loss,
    ranks: Sequence[GradsRank],
    resynced: bool = True,
) -> int:
    from hookcli.distributed.ranks import desync_check, merge_checks, merge_rows, unused_check
    from hookcli.layers import PARAM_COLUMNS, param_totals, shape_columns
    from hookcli.modelinfo import totals
    from hookcli.pipeline import emit
    from hookcli.render import fmt_float
    from hookcli.report import Column, Report

    rows = tuple(_per_module(row, ranks) for row in merge_rows([r.rows for r in ranks]))
    checks = list(merge_checks([r.checks for r in ranks]))
    by_name = {c.name: c for c in checks}
    divergences = [d for r in ranks for d in r.divergences]
    ordered: list[CheckResult] = []
    for name in gates.fail_on:
        if name == "unused":
            ordered.append(
                unused_check([r.unused for r in ranks], [r.unused_indices for r in ranks])
            )
        elif name == DESYNC:
            ordered.append(desync_check(divergences, desync_tol, buffers_resynced=resynced))
        elif name in by_name:
            ordered.append(by_name.pop(name))
    ordered.extend(by_name.values())  # the norm bounds
    model_totals: dict[str, Any] = dict(totals(prepared.model))
    model_totals.update(probe.totals())
    unused_any: list[str] = []
    for r in ranks:
        unused_any.extend(n for n in r.unused if n not in unused_any)
    model_totals.update(
        {
            "loss": ranks[0].loss,
            "loss_per_rank": [r.loss for r in ranks],
            "grad_norm": ranks[0].grad_norm,
            "grad_norm_per_rank": [r.grad_norm for r in ranks],
            "grad_norm_spread": _spread([r.grad_norm for r in ranks]),
            "reduced_grad_norm": ranks[0].reduced_grad_norm,
            "unused_params": unused_any,
            "unused_params_per_rank": [list(r.unused) for r in ranks],
            **desync_totals(divergences, desync_tol, resynced),
        }
    )
    report = Report(
        command="grads",
        model=prepared.model_info(),
        settings={
            **prepared.settings,
            "loss": loss_kind.value,
            "desync_tolerance": desync_tol,
            "broadcast_buffers": resynced,
        },
        inputs=prepared.input_dicts(),
        layers=rows,
        totals=model_totals,
        checks=tuple(ordered),
        notes=_notes(ctx, model_totals["buffer_drift"], resynced),
    )
    skip = {"grad_norm", "weight_norm", "grad_weight_ratio", "unused_params"}
    columns: list[Column] = [
        *shape_columns(kinds),
        Column("ranks", "Ranks", _fmt_ranks),
        Column("grad_norm_per_rank", "Local grad norm per rank", _fmt_per_rank(fmt_float), "right"),
        Column("reduced_grad_norm", "Reduced grad norm", fmt_float, "right"),
        Column("grad_norm_spread", "Spread", _fmt_pct, "right"),
        *[c for c in probe.table_columns if c.key not in skip],
        Column("unused_params_per_rank", "Unused (per rank)", _fmt_unused_per_rank),
        PARAM_COLUMNS[0],
    ]
    per_rank = _fmt_per_rank(fmt_float)
    table_totals = [
        *param_totals(model_totals, 0)[:1],
        ("Loss per rank", per_rank(model_totals["loss_per_rank"])),
        ("Local grad norm per rank", per_rank(model_totals["grad_norm_per_rank"])),
        ("Reduced grad norm", fmt_float(model_totals["reduced_grad_norm"])),
    ]
    for rank, names in enumerate(model_totals["unused_params_per_rank"]):
        if names:
            table_totals.append((f"No grad on rank {rank}", ", ".join(names)))
    return emit(report, out, columns, table_totals)


def _per_module(row: Row, ranks: Sequence[GradsRank]) -> Row:
    """Each rank's figures for the row's module, also from ranks where it did not run."""
    from hookcli.report import Row

    name = str(row.data["name"])
    data = dict(row.data)
    per_rank = [r.module_grad_norm.get(name) for r in ranks]
    unused = [list(r.module_unused.get(name, ())) for r in ranks]
    data["grad_norm_per_rank"] = per_rank
    data["grad_norm_spread"] = _spread(per_rank)
    data["unused_params"] = list(dict.fromkeys(n for names in unused for n in names))
    data["unused_params_per_rank"] = unused
    return Row.of(data, row.display)


def _spread(values: Sequence[float | None]) -> float | None:
    from hookcli.distributed.ranks import spread

    return spread(values)


# -- inspect and stats ----------------------------------------------------------------------


@dataclass(frozen=True)
class RowsRank:
    """What rank r sends to rank 0 in ``inspect --ddp`` and ``stats --ddp``."""

    rank: int
    loss: float | None
    rows: RankRows
    checks: tuple[CheckResult, ...] = ()
    totals: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    divergences: tuple[Divergence, ...] = ()


def run_inspect(
    ctx: DistContext,
    mopts: ModelOptions,
    ropts: RunOptions,
    out: OutputOptions,
    kinds: tuple[HookKind, ...],
) -> int:
    """``inspect --ddp``: every rank's calls; rows say on which ranks each call ran."""
    from hookcli.distributed.ranks import merge_rows
    from hookcli.grads.probe import backward_probes
    from hookcli.layers import (
        PARAM_COLUMNS,
        inspect_totals,
        layer_rows,
        param_totals,
        shape_columns,
    )
    from hookcli.losses import reduce_output
    from hookcli.pipeline import emit
    from hookcli.report import Column, Report

    prepared = ctx.step("building the model", lambda: prepare_rank(ctx, mopts, ropts))
    probes = backward_probes(kinds)
    run = run_ddp_session(
        ctx,
        prepared,
        probes,
        mode=ropts.mode,
        backward=False,
        loss_fn=lambda o: reduce_output(o, "sum"),
        compare=False,
    )
    rows, _ = layer_rows(run.records, prepared.model, depth=out.depth, kinds=kinds, probes=probes)
    mine = RowsRank(ctx.rank, run.loss, _rank_rows(ctx.rank, rows, lambda r: {}))
    gathered = ctx.gather(mine)
    if gathered is None:
        return 0
    keys = ["output_shapes"] if HookKind.FORWARD in kinds else []
    merged = merge_rows([g.rows for g in gathered], per_rank_keys=keys)
    model_totals, extra_cols = inspect_totals(prepared.model, probes)
    report = Report(
        command="inspect",
        model=prepared.model_info(),
        settings=prepared.settings,
        inputs=prepared.input_dicts(),
        layers=merged,
        totals=model_totals,
        notes=_notes(ctx),
    )
    columns = [
        *shape_columns(kinds),
        Column("ranks", "Ranks", _fmt_ranks),
        *extra_cols,
        *PARAM_COLUMNS,
    ]
    shown = sum(int(r.display.get("shown_params", 0)) for r in merged)
    unshown = max(int(model_totals["params"]) - shown, 0)  # ran on no rank
    return emit(report, out, columns, param_totals(model_totals, unshown))


STATS_PER_RANK = ("mean", "std", "min", "max", "nan", "inf")


def run_stats(
    ctx: DistContext,
    mopts: ModelOptions,
    ropts: RunOptions,
    out: OutputOptions,
    kinds: tuple[HookKind, ...],
    loss_kind: Loss,
    checks_asked: tuple[str, ...],
    dead_threshold: float | None,
    run_backward: bool,
    desync_tol: float,
    broadcast_buffers: bool = True,
) -> int:
    """``stats --ddp``: per-rank statistics of every call; checks over all ranks."""
    from hookcli.checks import layer_label
    from hookcli.distributed.ranks import desync_check, merge_checks, merge_rows
    from hookcli.layers import layer_rows, shape_columns
    from hookcli.losses import reduce_output
    from hookcli.pipeline import emit
    from hookcli.report import Column, Report
    from hookcli.stats.checks import CallStats, stats_checks
    from hookcli.stats.probe import StatsProbe

    prepared = ctx.step("building the model", lambda: prepare_rank(ctx, mopts, ropts))
    probe = StatsProbe(kinds)
    run = run_ddp_session(
        ctx,
        prepared,
        [probe],
        mode=ropts.mode,
        backward=run_backward,
        loss_fn=lambda o: reduce_output(o, loss_kind),
        compare=True,
        broadcast_buffers=broadcast_buffers,
    )
    rows, _ = layer_rows(run.records, prepared.model, depth=out.depth, kinds=kinds, probes=[probe])
    calls = [
        CallStats(
            label=layer_label(r.name, r.call),
            output=probe.forward_stats(r.index),
            grads=probe.grad_stats(r),
        )
        for r in run.records
    ]
    origin = probe.origin.label if probe.origin else None
    local = stats_checks(
        calls,
        [c for c in checks_asked if c != DESYNC],
        origin=origin,
        dead_threshold=dead_threshold,
        with_grads=run_backward,
    )
    mine = RowsRank(
        ctx.rank,
        run.loss,
        _rank_rows(ctx.rank, rows, lambda r: {}),
        local,
        dict(probe.totals()),
        run.divergences,
    )
    gathered = ctx.gather(mine)
    if gathered is None:
        return 0
    keys = [k for k in STATS_PER_RANK if HookKind.FORWARD in kinds]
    merged = merge_rows([g.rows for g in gathered], per_rank_keys=keys)
    merged_checks = list(merge_checks([g.checks for g in gathered]))
    divergences = [d for g in gathered for d in g.divergences]
    by_name = {c.name: c for c in merged_checks}
    ordered = []
    for name in checks_asked:
        if name == DESYNC:
            compared = "parameters and buffers"
            if run_backward:
                compared = "reduced gradients, " + compared
            resynced = run.buffers_resynced
            ordered.append(desync_check(divergences, desync_tol, compared, resynced))
        elif name in by_name:
            ordered.append(by_name[name])
    stats_totals: dict[str, Any] = dict(gathered[0].totals)
    for key in ("nonfinite_origin", "nonfinite_calls"):
        if key in stats_totals:
            stats_totals[f"{key}_per_rank"] = [g.totals.get(key) for g in gathered]
    if run.loss is not None:
        stats_totals["loss"] = gathered[0].loss
        stats_totals["loss_per_rank"] = [g.loss for g in gathered]
    stats_totals.update(desync_totals(divergences, desync_tol, run.buffers_resynced))
    report = Report(
        command="stats",
        model=prepared.model_info(),
        settings={
            **prepared.settings,
            "desync_tolerance": desync_tol,
            "broadcast_buffers": run.buffers_resynced,
        },
        inputs=prepared.input_dicts(),
        layers=merged,
        totals=stats_totals,
        checks=tuple(ordered),
        notes=_notes(ctx, stats_totals["buffer_drift"], run.buffers_resynced),
    )
    columns = [*shape_columns(kinds), Column("ranks", "Ranks", _fmt_ranks), *probe.table_columns]
    if HookKind.FORWARD in kinds:
        from hookcli.render import fmt_float, fmt_int

        columns += [
            Column("mean_per_rank", "Mean per rank", _fmt_per_rank(fmt_float), "right"),
            Column("nan_per_rank", "NaN per rank", _fmt_per_rank(fmt_int), "right"),
        ]
    return emit(report, out, columns)
