"""``stats``: activation statistics per module call, the NaN/Inf origin and the checks.

``plan_stats`` checks the options before any model is built, ``run_stats`` runs a
prepared model and builds the report (``hookcli stats`` and ``hookcli.stats`` both go
through them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hookcli.errors import UsageError
from hookcli.options import (
    HookKind,
    Loss,
    Mode,
    Names,
    depth_arg,
    hook_kinds_arg,
    loss_arg,
    names_arg,
)
from hookcli.report import Report

if TYPE_CHECKING:
    from hookcli.options import Hooks
    from hookcli.pipeline import Outcome, Prepared


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


def run_stats(prepared: Prepared, plan: StatsPlan) -> Outcome:
    """Activation statistics per module call, the NaN/Inf origin and the checks."""
    from hookcli.checks import layer_label
    from hookcli.layers import layer_rows, shape_columns
    from hookcli.losses import loss_notes, make_loss
    from hookcli.pipeline import run_session, with_train_mode_hint
    from hookcli.stats.checks import CallStats, stats_checks
    from hookcli.stats.probe import StatsProbe

    if prepared.settings["device"] == "meta":
        raise UsageError("stats needs values: --device meta holds shapes only")
    kinds = plan.kinds
    probe = StatsProbe(kinds)
    run_backward = plan.backward or any(k.is_backward for k in kinds)
    outcome = run_session(
        prepared,
        [probe],
        mode=Mode(prepared.settings["mode"]),
        global_hooks=plan.global_hooks,
        backward=run_backward,
        loss_fn=(loss_fn := make_loss(plan.loss, prepared.inputs)),
    )
    error = with_train_mode_hint(outcome.error, Mode(prepared.settings["mode"]))
    rows, _ = layer_rows(
        outcome.records, prepared.model, depth=plan.depth, kinds=kinds, probes=[probe]
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
        plan.checks,
        origin=origin,
        dead_threshold=plan.dead_threshold,
        with_grads=run_backward,
    )
    totals = dict(probe.totals())
    settings = dict(prepared.settings)
    if outcome.loss is not None:
        totals["loss"] = outcome.loss
    if run_backward:
        settings["loss"] = plan.loss.value
    natural = loss_notes(loss_fn, outcome.loss, totals)
    report = Report(
        command="stats",
        model=prepared.model_info(),
        settings=settings,
        inputs=prepared.input_dicts(),
        layers=rows,
        totals=totals,
        checks=results,
        notes=_stats_notes(probe, outcome.loss, plan.loss) + natural,
        error=error.message if error else None,
        columns=(*shape_columns(kinds), *probe.table_columns),
    )
    return report, error


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
