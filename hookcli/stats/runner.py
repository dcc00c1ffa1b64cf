"""``stats``: activation statistics per module call, the NaN/Inf origin and the checks.

``plan_stats`` checks the options before any model is built, ``run_stats`` runs a
prepared model and builds the report (``hookcli stats`` and ``hookcli.stats`` both go
through them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

from hookcli.errors import UsageError
from hookcli.options import HookKind, Mode, depth_arg, hook_kinds_arg, loss_arg, names_arg
from hookcli.report import Report

if TYPE_CHECKING:
    from hookcli.distributed.strategy import Launch
    from hookcli.options import Hooks, Loss, Names
    from hookcli.pipeline import Outcome, Prepared
    from hookcli.report import CheckResult, Row


# -- stats ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StatsPlan:
    """The options of ``stats``, checked."""

    kinds: tuple[HookKind, ...]
    checks: tuple[str, ...]
    backward: bool
    loss: Loss
    dead_threshold: float | None = None
    depth: int | None = None
    global_hooks: bool = False


def plan_stats(
    hooks: Hooks = None,
    backward: bool = False,
    loss: str | Loss | None = None,
    fail_on: Names = None,
    dead_threshold: float | None = None,
    depth: int | None = None,
    global_hooks: bool = False,
    ddp: bool = False,
) -> StatsPlan:
    """Check the options of ``stats`` (UsageError), before any model is built.

    ``desync`` is a check across ranks: it needs ``ddp`` (the CLI's --ddp).
    """
    from hookcli.cliopts import parse_fail_on
    from hookcli.stats.checks import STATS_CHECKS

    given = hook_kinds_arg(hooks)
    if given is not None:
        kinds = given
    else:
        kinds = (HookKind.FORWARD, HookKind.BACKWARD_PRE) if backward else (HookKind.FORWARD,)
    checks = parse_fail_on(names_arg(fail_on), (*STATS_CHECKS, "desync") if ddp else STATS_CHECKS)
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
    return StatsPlan(
        kinds=kinds,
        checks=checks,
        backward=backward,
        loss=loss_arg(loss),
        dead_threshold=dead_threshold,
        depth=depth_arg(depth),
        global_hooks=global_hooks,
    )


@overload
def run_stats(prepared: Prepared, plan: StatsPlan, launch: None = None) -> Outcome: ...
@overload
def run_stats(prepared: Prepared, plan: StatsPlan, launch: Launch) -> Outcome | None: ...
def run_stats(prepared: Prepared, plan: StatsPlan, launch: Launch | None = None) -> Outcome | None:
    """Activation statistics per module call, the NaN/Inf origin and the checks.

    ``launch``: one process (``Local``, the default) or every rank of ``--ddp``/``--fsdp``,
    whose findings rank 0 merges (None on the other ranks).
    """
    from hookcli.checks import layer_label
    from hookcli.distributed.strategy import DESYNC, Local
    from hookcli.layers import layer_rows, shape_columns
    from hookcli.losses import loss_notes
    from hookcli.pipeline import with_train_mode_hint
    from hookcli.stats.checks import CallStats, stats_checks
    from hookcli.stats.probe import StatsProbe

    launch = launch or Local(plan.global_hooks)
    if prepared.settings["device"] == "meta":
        raise UsageError("stats needs values: --device meta holds shapes only")
    kinds = plan.kinds
    probe = StatsProbe(kinds)
    run_backward = plan.backward or any(k.is_backward for k in kinds)
    mode = Mode(prepared.settings["mode"])
    loss_fn = launch.loss_fn(plan.loss, prepared.inputs)
    run = launch.session(
        prepared, [probe], mode=mode, backward=run_backward, loss_fn=loss_fn, compare=True
    )
    error = with_train_mode_hint(run.error, mode)
    rows, _ = layer_rows(run.records, prepared.model, depth=plan.depth, kinds=kinds, probes=[probe])
    calls = [
        CallStats(
            label=layer_label(r.name, r.call),
            output=probe.forward_stats(r.index),
            grads=probe.grad_stats(r),
        )
        for r in run.records
    ]
    origin = probe.origin.label if probe.origin else None
    results = stats_checks(
        calls,
        [c for c in plan.checks if c != DESYNC],
        origin=origin,
        dead_threshold=plan.dead_threshold,
        with_grads=run_backward and run.skipped is None,
    )
    if launch.distributed:
        return _merged_stats(prepared, plan, launch, run, rows, results, probe, run_backward)
    totals = dict(probe.totals())
    settings = dict(prepared.settings)
    if run.loss is not None:
        totals["loss"] = run.loss
    if run_backward:
        settings["loss"] = plan.loss.value
    natural = loss_notes(loss_fn, run.loss, totals)
    report = prepared.report(
        "stats",
        settings,
        layers=rows,
        totals=totals,
        checks=results,
        notes=_stats_notes(probe, run.loss, plan.loss) + natural,
        error=error.message if error else None,
        columns=(*shape_columns(kinds), *probe.table_columns),
    )
    return report, error


STATS_PER_RANK = ("mean", "std", "min", "max", "nan", "inf")


def _merged_stats(
    prepared: Prepared,
    plan: StatsPlan,
    launch: Any,
    run: Any,
    rows: tuple[Row, ...],
    checks: tuple[CheckResult, ...],
    probe: Any,
    run_backward: bool,
) -> Outcome | None:
    """Every rank's statistics on rank 0: per-rank columns, checks over all ranks."""
    from hookcli.distributed.ranks import fmt_per_rank, merge_checks
    from hookcli.distributed.strategy import DESYNC, RankFindings
    from hookcli.layers import shape_columns
    from hookcli.render import fmt_float, fmt_int
    from hookcli.report import Column

    mine = RankFindings(
        launch.rank,
        run.loss,
        launch.rank_rows(rows, run),
        checks,
        dict(probe.totals()),
        run.divergences,
        launch.shards(run),
    )
    gathered = launch.gather(mine)
    if gathered is None:
        return None
    kinds = plan.kinds
    keys = [k for k in STATS_PER_RANK if HookKind.FORWARD in kinds]
    merged = launch.merge_rows(gathered, prepared.model, per_rank_keys=keys)
    by_name = {c.name: c for c in merge_checks([g.checks for g in gathered])}
    divergences = [d for g in gathered for d in g.divergences]
    ordered = []
    for name in plan.checks:
        if name == DESYNC:
            ordered.append(launch.desync_check(divergences, run, run_backward))
        elif name in by_name:
            ordered.append(by_name[name])
    totals: dict[str, Any] = dict(gathered[0].totals)
    for key in ("nonfinite_origin", "nonfinite_calls"):
        if key in totals:
            totals[f"{key}_per_rank"] = [g.totals.get(key) for g in gathered]
    if run.loss is not None:
        totals["loss"] = gathered[0].loss
        totals["loss_per_rank"] = [g.loss for g in gathered]
    totals.update(launch.shard_totals(gathered))
    totals.update(launch.desync_totals(divergences, run))
    columns = [*shape_columns(kinds), *launch.columns(), *probe.table_columns]
    if HookKind.FORWARD in kinds:
        columns += [
            Column("mean_per_rank", "Mean per rank", fmt_per_rank(fmt_float), "right"),
            Column("nan_per_rank", "NaN per rank", fmt_per_rank(fmt_int), "right"),
        ]
    report = Report(
        command="stats",
        model=launch.model_info(prepared, run),
        settings=launch.settings(prepared, run, desync=True),
        inputs=prepared.input_dicts(),
        layers=merged,
        totals=totals,
        checks=tuple(ordered),
        notes=launch.notes(run, totals),
        columns=tuple(columns),
    )
    return report, None


def _stats_notes(probe: Any, loss: float | None, loss_kind: Loss) -> tuple[str, ...]:
    """Header lines of the table: the NaN/Inf origin and the loss."""
    from hookcli.losses import loss_words
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
        notes.append(f"loss ({loss_words(loss_kind)}): {fmt_float(loss)}")
    return tuple(notes)
