"""``ablate``: the command's run, from the parsed options to the exit status.

``cli_command`` checks the options (ops, metric, ``--fail-if`` gates), builds the model,
finds where a failing model raises, runs ``hookcli.ablate.passes.run_ablations`` on the
matched modules and builds the report: one row per target, ranked by the metric.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from hookcli.options import Loss, Mode

if TYPE_CHECKING:
    from typing import Unpack

    from hookcli.ablate.checks import Gate
    from hookcli.ablate.passes import AblationRun, Basis, Op, Outcome
    from hookcli.commandargs import RunArgs
    from hookcli.pipeline import Prepared
    from hookcli.report import Column, Row


def cli_command(
    *,
    layer: list[str],
    op: str | None,
    grad_op: str | None,
    together: bool,
    leaves: bool,
    metric: str | None,
    fail_on: list[str] | None,
    loss: str | Loss | None,
    **common: Unpack[RunArgs],
) -> int:
    """The ablate command's run (``hookcli ablate``): plan, build, locate, ablate, emit."""
    from hookcli.ablate.checks import metric_key, parse_gates
    from hookcli.ablate.passes import EFFECT_KEYS, METRICS, parse_grad_op, parse_op
    from hookcli.commandargs import command_options
    from hookcli.errors import UsageError
    from hookcli.options import loss_arg

    the_loss = loss_arg(loss)
    the_op = parse_op(op) if op is not None else None
    the_grad_op = parse_grad_op(grad_op) if grad_op is not None else None
    if the_op is None and the_grad_op is None:
        the_op = parse_op("zero")
    default_metric = "rel_l2" if the_op is not None else "grad_rel_l2"
    key = metric_key(metric, METRICS, "--metric") if metric is not None else default_metric
    gates = parse_gates(fail_on or (), METRICS)
    for what, k in [("--metric", key), *(("--fail-on", g.key) for g in gates)]:
        if k == "grad_rel_l2" and the_grad_op is None:
            raise UsageError(f"{what} grad_rel_l2 needs --grad-op")
        if k in EFFECT_KEYS and the_op is None:
            raise UsageError(f"{what} {k} measures the output: add --op (only --grad-op is given)")
    if common["device"].strip().lower() == "meta":
        raise UsageError("ablate needs values: --device meta holds shapes only")

    mopts, ropts, out = command_options(common, Mode.EVAL, None)

    from hookcli.pipeline import prepare

    prepared = prepare(mopts, ropts)
    return _run(prepared, layer, the_op, the_grad_op, together, leaves, key, gates, the_loss, out)


def _stderr_is_tty() -> bool:
    """Progress lines go to stderr only when a person watches it."""
    return sys.stderr.isatty()


def _check_mean_batch(prepared: Prepared) -> None:
    """``--op mean`` averages over dim 0: a batch of one would change nothing."""
    from hookcli.errors import UsageError
    from hookcli.structures import iter_tensors

    assert prepared.inputs is not None
    tensors = list(iter_tensors((prepared.inputs.args, dict(prepared.inputs.kwargs))))
    if tensors and all(t.dim() == 0 or t.shape[0] <= 1 for t in tensors):
        raise UsageError(
            "--op mean replaces each output by its mean over the batch (dim 0), which a batch "
            "of one leaves unchanged: pass --batch-size N (N >= 2)"
        )


def _locate(prepared: Prepared, mode: Mode) -> str | None:
    """Re-run with a hook on every module to name where the model raised."""
    from hookcli.pipeline import run_session

    outcome = run_session(prepared, [], mode=mode)
    return outcome.error.message if outcome.error else None


def _run(
    prepared: Prepared,
    patterns: list[str],
    op: Op | None,
    grad_op: Op | None,
    together: bool,
    only_leaves: bool,
    key: str,
    gates: tuple[Gate, ...],
    loss: Loss,
    out: Any,
) -> int:
    from hookcli.ablate.checks import GateRow, run_gates
    from hookcli.ablate.passes import (
        CLASSIFIER,
        LANGUAGE_MODEL,
        TENSOR,
        leaves,
        rank,
        run_ablations,
        single_targets,
        together_target,
    )
    from hookcli.errors import RunError, UsageError
    from hookcli.globs import select_modules
    from hookcli.losses import loss_notes, make_loss
    from hookcli.pipeline import emit
    from hookcli.scripted import refuse_scripted

    model = prepared.model
    mode = Mode(prepared.settings["mode"])
    selected = select_modules(model, patterns)
    refuse_scripted(selected)  # ablation hooks go on the selected modules themselves
    if only_leaves:
        selected = leaves(selected)
        if not selected:
            raise UsageError(f"--layer {' '.join(patterns)} --leaves: no matched module is a leaf")
    if op is not None and op.kind == "mean":
        _check_mean_batch(prepared)
    scopes = {
        g.glob: frozenset(
            n for n, _ in select_modules(model, [g.glob], option=f"--fail-on {g.text!r}: glob")
        )
        for g in gates
        if g.glob is not None
    }
    names = {n for n, _ in selected}
    for g in gates:
        if g.glob is not None and not scopes[g.glob] & names:
            raise UsageError(
                f"--fail-on {g.text!r}: {g.glob!r} matches no module that --layer selects"
            )
    label = ",".join(p if p not in ("",) else "(root)" for p in patterns)
    targets = [together_target(label, selected)] if together else single_targets(selected)

    needs_logits = {"top1_agreement", "kl"} & {key, *(g.key for g in gates)}

    def check(basis: Basis) -> None:
        if needs_logits and basis.kind == TENSOR:
            raise UsageError(
                f"{', '.join(sorted(needs_logits))} need(s) logits: a 2-D [batch, classes] or "
                f"3-D [batch, seq, vocab] output; this model's output is "
                f"{_shapes_text(basis.shapes)}"
            )

    show = _stderr_is_tty()

    def on_pass(i: int, n: int, name: str) -> None:
        if show:
            print(f"ablate [{i + 1}/{n}] {name or '(root)'}", file=sys.stderr, flush=True)

    assert prepared.inputs is not None
    try:
        run = run_ablations(
            model,
            prepared.inputs.args,
            prepared.inputs.kwargs,
            targets,
            op=op,
            grad_op=grad_op,
            mode=mode,
            seed=int(prepared.settings["seed"]),
            loss=(loss_fn := make_loss(loss, prepared.inputs)),
            on_pass=on_pass,
            check=check,
        )
    except RunError as err:
        where = _locate(prepared, mode)
        if where is not None:
            raise RunError(f"the clean pass failed: {where}", module=err.module) from err
        raise
    ranked = rank(run.outcomes, key)
    rows = tuple(_row(i + 1, o, grad_op is not None) for i, o in enumerate(ranked))
    gate_rows = [
        GateRow(
            o.target.name,
            tuple(n for n, _ in o.target.modules),
            {k: o.metric(k) for k in (*_EFFECT, "grad_rel_l2")},
            o.error,
        )
        for o in ranked
    ]
    checks = run_gates(gates, gate_rows, scopes)
    settings = {
        **prepared.settings,
        "op": op.text if op else None,
        "grad_op": grad_op.text if grad_op else None,
        "together": together,
        "metric": key,
    }
    if grad_op is not None:
        settings["loss"] = loss.value
    passes = 1 + sum(1 for o in run.outcomes if o.calls or o.error)
    totals: dict[str, Any] = {
        "ablations": len(run.outcomes),
        "forward_passes": passes,
        "clean_output": run.clean.to_dict(),
        "not_called": list(run.not_called),
    }
    failed = [o for o in ranked if o.error is not None]
    notes = [_op_line(op, grad_op, together, len(selected))]
    if grad_op is not None:
        notes += loss_notes(loss_fn, run.clean.loss, totals)
    report = prepared.report(
        "ablate",
        settings,
        totals=totals,
        checks=checks,
        lists={"ablations": rows},
        primary="ablations",
        notes=tuple(notes),
        error=_failure_line(failed),
    )
    logits = run.clean.kind in (CLASSIFIER, LANGUAGE_MODEL)
    code = emit(
        report,
        out,
        _columns(op is not None, grad_op is not None, logits),
        _totals_lines(run, key, passes),
    )
    if failed:
        raise RunError(report.error or "", module=failed[0].target.name)
    return code


_EFFECT = ("rel_l2", "cosine", "max_abs", "top1_agreement", "kl")


def _failure_line(failed: list[Outcome]) -> str | None:
    """The report's error line when some ablation made the model raise."""
    if not failed:
        return None
    first = failed[0]
    return (
        f"{len(failed)} ablation(s) made the model raise; first: "
        f"{first.target.name or '(root)'}: {first.error}"
    )


def _row(rank_no: int, o: Outcome, with_grads: bool) -> Row:
    from hookcli.report import Row, shapes_list

    data: dict[str, Any] = {
        "rank": rank_no,
        "name": o.target.name,
        "type": o.target.type,
        "modules": [n for n, _ in o.target.modules],
        "calls": o.calls,
        "output_shapes": shapes_list(o.output_shapes),
        "tensors": o.tensors,
    }
    for k in _EFFECT:
        data[k] = o.metric(k)
    display: dict[str, Any] = {}
    if with_grads:
        data["grad_norm"] = o.grad_norm
        data["grad_rel_l2"] = o.grad_rel_l2
        data["grad_groups"] = [g.to_dict() for g in o.groups]
        changed = [g.group for g in o.groups if g.changed]
        display["feeds"] = _cut(changed, 3) if o.groups else None
        display["groups_changed"] = f"{len(changed)}/{len(o.groups)}" if o.groups else None
    data["note"] = o.note
    data["error"] = o.error
    if o.error is not None:
        display["mark"] = "<- raised"
    return Row.of(data, display)


def _cut(names: list[str], limit: int) -> str:
    if not names:
        return "-"
    more = f" (+{len(names) - limit})" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _columns(with_op: bool, with_grads: bool, logits: bool) -> list[Column]:
    from hookcli.render import fmt_float, fmt_int, fmt_shapes, fmt_text
    from hookcli.report import Column

    cols = [
        Column("rank", "#", fmt_int, "right"),
        Column("name", "Layer"),
        Column("type", "Type"),
        Column("calls", "Calls", fmt_int, "right"),
        Column("output_shapes", "Output shape", fmt_shapes),
    ]
    if with_op:
        cols += [
            Column("rel_l2", "Rel L2", fmt_float, "right"),
            Column("cosine", "Cosine", fmt_float, "right"),
            Column("max_abs", "Max |diff|", fmt_float, "right"),
        ]
        if logits:
            cols += [
                Column("top1_agreement", "Top-1 agree", fmt_float, "right"),
                Column("kl", "KL", fmt_float, "right"),
            ]
    if with_grads:
        cols += [
            Column("grad_rel_l2", "Grad rel L2", fmt_float, "right"),
            Column("groups_changed", "Groups changed", fmt_text, "right"),
            Column("feeds", "Grads changed in"),
        ]
    return cols


def _shapes_text(shapes: Any) -> str:
    from hookcli.render import fmt_shapes

    return fmt_shapes(shapes)


def _op_line(op: Op | None, grad_op: Op | None, together: bool, n: int) -> str:
    how = f"all {n} module(s) in one pass" if together else f"each of {n} module(s) on its own"
    parts = []
    if op is not None:
        parts.append(f"op {op.text}")
    if grad_op is not None:
        parts.append(f"grad-op {grad_op.text}")
    return f"ablation: {' + '.join(parts)}, {how}"


def _totals_lines(run: AblationRun, key: str, passes: int) -> list[tuple[str, str]]:
    from hookcli.ablate.passes import ASCENDING, CLASSIFIER
    from hookcli.render import fmt_float, fmt_shapes

    c = run.clean
    desc = (
        f"{fmt_shapes(list(c.shapes))} {c.dtype} ({c.kind}, {c.compared}): norm "
        f"{fmt_float(c.norm)}, mean {fmt_float(c.mean)}, std {fmt_float(c.std)}, "
        f"min {fmt_float(c.min)}, max {fmt_float(c.max)}"
    )
    lines = [("Clean output", desc)]
    if c.kind == CLASSIFIER and c.top1 is not None:
        lines.append(("Clean top-1", _cut([str(v) for v in c.top1], 8)))
    if c.loss is not None:
        lines.append(("Clean loss", fmt_float(c.loss)))
        lines.append(("Clean grad norm", fmt_float(c.grad_norm)))
    order = "smallest first" if key in ASCENDING else "largest first"
    lines.append(("Ranked by", f"{key} ({order}: the largest effect leads)"))
    lines.append(("Forward passes", f"{passes} (1 clean + {passes - 1} ablated)"))
    if run.not_called:
        lines.append(("Never called", _cut(list(run.not_called), 6)))
    return lines
