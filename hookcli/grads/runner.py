"""``grads``: gradient flow per module call, the totals and the checks.

``plan_grads`` checks the options before any model is built, ``run_grads`` runs a
prepared model forward and backward and builds the report (``hookcli grads`` and
``hookcli.grads`` both go through them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

from hookcli.errors import UsageError
from hookcli.options import HookKind, Mode, depth_arg, hook_kinds_arg, loss_arg, names_arg

if TYPE_CHECKING:
    from hookcli.distributed.strategy import Launch
    from hookcli.grads.checks import GradGates
    from hookcli.grads.probe import GradFindings
    from hookcli.options import Hooks, Loss, Names
    from hookcli.pipeline import Outcome, Prepared
    from hookcli.report import CheckResult, Row
    from hookcli.session import CallRecord


# -- grads ----------------------------------------------------------------------------------

GRADS_KINDS = (HookKind.FORWARD, HookKind.BACKWARD_PRE, HookKind.BACKWARD, HookKind.TENSOR)


@dataclass(frozen=True)
class GradsPlan:
    """The options of ``grads``, checked."""

    kinds: tuple[HookKind, ...]
    explicit: bool
    loss: Loss
    per_param: bool
    gates: GradGates
    plot: Path | None = None
    depth: int | None = None
    global_hooks: bool = False
    wide: bool = False  # per-parameter rows are the primary list (CSV/Markdown)


def plan_grads(
    hooks: Hooks = None,
    loss: str | Loss | None = None,
    per_param: bool = False,
    fail_on: Names = None,
    max_grad_norm: float | None = None,
    min_grad_norm: float | None = None,
    plot: str | Path | None = None,
    depth: int | None = None,
    global_hooks: bool = False,
    device: str | None = None,
    ddp: bool = False,
) -> GradsPlan:
    """Check the options of ``grads`` (UsageError), before any model is built.

    ``desync`` is a check across ranks: it needs ``ddp`` (the CLI's --ddp).
    """
    from hookcli.cliopts import parse_fail_on
    from hookcli.grads.checks import FAIL_ON, NEED_PARAM_GRADS, GradGates

    explicit_kinds = hook_kinds_arg(hooks)
    kinds = explicit_kinds or GRADS_KINDS
    # The CLI reaches this check (hookcli.grads checks its own max_grad_norm= first): the
    # message names the option as typed.
    for name, bound in (("--max-grad-norm", max_grad_norm), ("--min-grad-norm", min_grad_norm)):
        if bound is not None and not bound >= 0:
            raise UsageError(f"{name} must be a number >= 0, got {bound}")
    gates = GradGates(
        parse_fail_on(names_arg(fail_on), (*FAIL_ON, "desync")), max_grad_norm, min_grad_norm
    )
    if "desync" in gates.fail_on and not ddp:
        raise UsageError("--fail-on desync needs --ddp (under torchrun or srun)")
    plot_path = None if plot is None else Path(plot)
    if HookKind.TENSOR not in kinds:
        needs = [f"--fail-on {n}" for n in gates.fail_on if n in NEED_PARAM_GRADS]
        needs += ["--max-grad-norm"] if max_grad_norm is not None else []
        needs += ["--min-grad-norm"] if min_grad_norm is not None else []
        needs += ["--plot"] if plot_path is not None else []
        needs += ["--per-param"] if per_param else []
        if needs:
            raise UsageError(
                f"{', '.join(needs)} needs parameter grads: add the tensor kind to --hooks"
            )
    if device is not None and device.strip().lower() == "meta":
        raise UsageError("grads needs real gradient values; --device meta only gives shapes")
    if plot_path is not None:
        from hookcli.grads.plot import check_plot_path
        from hookcli.plot import require_matplotlib

        require_matplotlib()  # exit 2 before any work when matplotlib is missing
        check_plot_path(plot_path)
    return GradsPlan(
        kinds=kinds,
        explicit=explicit_kinds is not None,
        loss=loss_arg(loss),
        per_param=per_param,
        gates=gates,
        plot=plot_path,
        depth=depth_arg(depth),
        global_hooks=global_hooks,
    )


@overload
def run_grads(prepared: Prepared, plan: GradsPlan, launch: None = None) -> Outcome: ...
@overload
def run_grads(prepared: Prepared, plan: GradsPlan, launch: Launch) -> Outcome | None: ...
def run_grads(prepared: Prepared, plan: GradsPlan, launch: Launch | None = None) -> Outcome | None:
    """Gradient flow per module call, the totals and the checks.

    ``launch``: one process (the default) or every rank of ``--ddp``/``--fsdp``, whose
    gradients rank 0 merges (``grads.ranks``; None on the other ranks).
    """
    from hookcli.failure import grad_off_forwards
    from hookcli.grads.checks import run_checks
    from hookcli.grads.probe import GradProbe
    from hookcli.layers import (
        PARAM_COLUMNS,
        layer_rows,
        param_totals,
        params_not_run,
        shape_columns,
    )
    from hookcli.losses import loss_notes, make_loss
    from hookcli.modelinfo import TensorIndex, totals
    from hookcli.pipeline import progress, run_session, with_train_mode_hint

    if prepared.settings["device"] == "meta":
        raise UsageError("grads needs real gradient values; the meta device only gives shapes")
    if launch is not None and launch.distributed:
        from hookcli.grads.ranks import merged_grads

        return merged_grads(prepared, plan, launch)
    kinds, gates, loss_kind = plan.kinds, plan.gates, plan.loss
    mode = Mode(prepared.settings["mode"])
    probe = GradProbe(
        frozenset(kinds),
        per_param=plan.per_param,
        output_hooks=plan.explicit and HookKind.TENSOR in kinds,
        watch_forward=bool({"nan", "inf", "dead"} & set(gates.fail_on)),
        flag_inf="inf" in gates.fail_on,
        depth=plan.depth,
    )
    outcome = run_session(
        prepared,
        [probe],
        mode=mode,
        global_hooks=plan.global_hooks,
        backward=True,
        loss_fn=(loss_fn := make_loss(loss_kind, prepared.inputs)),
    )
    error = with_train_mode_hint(outcome.error, mode)
    findings = probe.findings
    assert findings is not None
    checks = () if error is not None else run_checks(gates, findings, outcome.records, outcome.loss)
    index = TensorIndex(prepared.model)  # the model's tensors, read once for all three
    rows, unshown = layer_rows(
        outcome.records, prepared.model, depth=plan.depth, kinds=kinds, probes=[probe], index=index
    )
    rows = _mark(rows, checks, findings, outcome.records)
    model_totals: dict[str, Any] = dict(totals(prepared.model, index))
    model_totals["params_not_run"] = params_not_run(outcome.records, prepared.model, index)
    model_totals["loss"] = outcome.loss
    model_totals.update(probe.totals())
    notes = loss_notes(loss_fn, outcome.loss, model_totals)
    notes += grad_off_notes(grad_off_forwards(prepared.model), model_totals)
    settings = {**prepared.settings, "loss": loss_kind.value}
    lists: dict[str, tuple[Row, ...]] = {}
    if plan.per_param:
        lists["params"] = _param_rows(findings)
    report = prepared.report(
        "grads",
        settings,
        layers=rows,
        totals=model_totals,
        checks=checks,
        lists=lists,
        primary="params" if plan.per_param and plan.wide else "layers",
        notes=notes,
        error=error.message if error else None,
        columns=(*shape_columns(kinds), *probe.table_columns, PARAM_COLUMNS[0]),
        table_totals=(*param_totals(model_totals, unshown), *_grad_totals(model_totals)),
    )
    if plan.plot is not None and error is None:
        from hookcli.grads.plot import plot_gradflow

        spec = prepared.loaded.spec or type(prepared.model).__name__
        title = f"gradient flow: {spec} ({loss_kind.value} loss)"
        plot_gradflow(_flow_points(findings, outcome.records, prepared), plan.plot, title)
        progress(f"gradient-flow plot written to {plan.plot}")
    return report, error


def grad_off_notes(off: Any, totals: dict[str, Any]) -> tuple[str, ...]:
    """Submodules whose forward runs without autograd: their parameters get no grad."""
    from hookcli.pipeline import progress

    notes = []
    for o in off:
        if o.name:  # the root's is refused before the run
            note = (
                f"note: {o.name} ({o.label()}): nothing computed inside it gets a gradient, "
                "so its parameters stay unused (--enable-grad runs it with gradients)"
            )
            progress(f"hookcli: {note}")
            notes.append(note)
    return tuple(notes)


def _mark(
    rows: tuple[Row, ...],
    checks: tuple[CheckResult, ...],
    findings: GradFindings,
    records: tuple[CallRecord, ...],
) -> tuple[Row, ...]:
    """Rows that failed a check get '<- FAIL name, ...' after their name in the table."""
    from hookcli.checks import layer_label
    from hookcli.report import Row

    failed = [c for c in checks if not c.passed]
    if not failed:
        return rows
    module_ids = {r.name: r.module_id for r in records}
    marked: list[Row] = []
    for row in rows:
        name, call = row.data["name"], row.data["call"]
        labels = {layer_label(name, call), layer_label(name)}
        module_id = module_ids.get(name)
        own = set(findings.module_params.get(module_id, ())) if module_id is not None else set()
        hits = []
        for c in failed:
            layers = set(c.layers)
            per_call = c.name in ("nan", "inf", "dead")
            if (layer_label(name, call) in layers if per_call else labels & layers) or own & layers:
                hits.append(c.name)
        if hits:
            mark = f"<- FAIL {', '.join(hits)}"
            if row.display.get("mark"):
                mark = f"{row.display['mark']} {mark}"
            marked.append(Row.of(row.data, {**row.display, "mark": mark}))
        else:
            marked.append(row)
    return tuple(marked)


def _param_rows(findings: GradFindings) -> tuple[Row, ...]:
    from hookcli.report import Row

    return tuple(
        Row.of(
            {
                "name": p.name,
                "shape": list(p.shape),
                "dtype": p.dtype,
                "requires_grad": p.requires_grad,
                "grad_norm": p.grad_norm,
                "weight_norm": p.weight_norm,
                "grad_weight_ratio": p.ratio,
                "nan_count": p.nan_count,
                "inf_count": p.inf_count,
            }
        )
        for p in findings.params
    )


def _grad_totals(t: dict[str, Any]) -> list[tuple[str, str]]:
    from hookcli.render import fmt_float

    out = [("Loss", fmt_float(t.get("loss")))]
    if "grad_norm" in t:
        out.append(("Total grad norm", fmt_float(t["grad_norm"])))
    if t.get("unused_params"):
        out.append(("Unused params", ", ".join(t["unused_params"])))
    return out


def _flow_points(
    findings: GradFindings, records: tuple[CallRecord, ...], prepared: Prepared
) -> list[Any]:
    """One point per module owning trainable params: forward order, then modules never run."""
    from hookcli.grads.plot import FlowPoint

    points = []
    seen: set[int] = set()
    for r in records:
        if r.module_id in seen or not findings.module_params.get(r.module_id):
            continue
        seen.add(r.module_id)
        points.append(FlowPoint(r.name or "(root)", findings.modules[r.module_id].grad_norm))
    for name, m in prepared.model.named_modules():
        if id(m) not in seen and findings.module_params.get(id(m)):
            seen.add(id(m))
            points.append(FlowPoint(name or "(root)", findings.modules[id(m)].grad_norm))
    return points
