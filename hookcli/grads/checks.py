"""The CI gates of ``grads``: pure functions from ``GradFindings`` to ``CheckResult``s.

``--fail-on nan,inf,unused,zero-grad,dead``, ``--max-grad-norm X``,
``--min-grad-norm X`` (docs/reference.md "Checks"). Layers are named with
``layer_label`` (``block#1`` for a second call); parameters by their qualified
name (``spare.weight``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hookcli.checks import layer_label, make_check
from hookcli.checks.origin import nonfinite_origin
from hookcli.options import HookKind
from hookcli.report import CheckResult

if TYPE_CHECKING:
    from hookcli.grads.probe import CallGrad, GradFindings
    from hookcli.session import CallRecord

FAIL_ON = ("nan", "inf", "unused", "zero-grad", "dead")
# The gates that read parameter grad norms, which only the tensor hook kind captures.
NEED_PARAM_GRADS = ("zero-grad",)


@dataclass(frozen=True)
class GradGates:
    """The gates a run asked for."""

    fail_on: tuple[str, ...] = ()
    max_grad_norm: float | None = None
    min_grad_norm: float | None = None

    @property
    def any(self) -> bool:
        return (
            bool(self.fail_on) or self.max_grad_norm is not None or self.min_grad_norm is not None
        )


def run_checks(
    gates: GradGates,
    findings: GradFindings,
    records: Sequence[CallRecord],
    loss: float | None,
) -> tuple[CheckResult, ...]:
    """Every requested check, in the order of ``--fail-on``, then the norm bounds."""
    out: list[CheckResult] = []
    for name in gates.fail_on:
        if name in ("nan", "inf"):
            out.append(nonfinite_check(name, findings, records, loss))
        elif name == "unused":
            out.append(unused_check(findings))
        elif name == "zero-grad":
            out.append(zero_grad_check(findings))
        elif name == "dead":
            out.append(dead_check(findings, records))
    if gates.max_grad_norm is not None:
        out.append(bound_check("max-grad-norm", gates.max_grad_norm, findings, records))
    if gates.min_grad_norm is not None:
        out.append(bound_check("min-grad-norm", gates.min_grad_norm, findings, records))
    return tuple(out)


def _isnan(value: float | None) -> bool:
    return value is not None and math.isnan(value)


def _holds(name: str, norm: float | None, inf_flag: bool | None) -> bool:
    """Whether a gradient holds NaN (its norm is NaN, exactly) or Inf.

    A norm is NaN exactly when an element is; Inf is read from the exact flag
    when the probe recorded one, else from an infinite norm.
    """
    if name == "nan":
        return _isnan(norm)
    if inf_flag is not None:
        return inf_flag
    return norm is not None and math.isinf(norm)


def _call_grads(call: CallGrad) -> dict[str, tuple[float | None, bool | None]]:
    return {
        "grad_input": (call.grad_input_norm, call.grad_input_inf),
        "grad_output": (call.grad_output_norm, call.grad_output_inf),
        "output grad": (call.output_grad_norm, call.output_grad_inf),
    }


def nonfinite_check(
    name: str,
    findings: GradFindings,
    records: Sequence[CallRecord],
    loss: float | None,
) -> CheckResult:
    """``nan`` (or ``inf``) in any gradient: per-call grad_input/grad_output, parameter grads.

    Failing layers are listed in backward order (the order their backward hooks
    fired), then the module whose forward output first held the value (when the
    forward was watched). The detail names the first grad_input, in backward
    order, that holds it and whether the loss itself was finite.
    """
    word = "NaN" if name == "nan" else "Inf"
    by_index = {r.index: r for r in records}

    def bad_params(rec: CallRecord) -> bool:
        mod = findings.modules.get(rec.module_id)
        return mod is not None and _holds(name, mod.grad_norm, mod.has_inf)

    layers: list[str] = []
    first_input: str | None = None
    first_any: str | None = None
    order = list(dict.fromkeys(findings.backward_order))
    in_order = set(order)
    rest = [r.index for r in reversed(records) if r.index not in in_order]
    for index in [*order, *rest]:
        rec = by_index.get(index)
        if rec is None:
            continue
        call = findings.calls.get(index)
        label = layer_label(rec.name, rec.call)
        where = [k for k, v in _call_grads(call).items() if _holds(name, *v)] if call else []
        if rec.call == 0 and bad_params(rec):
            where.append("parameter grads")
        if not where:
            continue
        layers.append(label)
        if first_any is None:
            first_any = f"{label} ({', '.join(where)})"
        if first_input is None and "grad_input" in where:
            first_input = label
    bad_params_names = [
        p.name
        for p in findings.params
        if _holds(name, p.grad_norm, p.has_inf)
        or ((p.nan_count if name == "nan" else p.inf_count) or 0) > 0
    ]
    origin: str | None = None
    if findings.watched_forward:

        def output_holds(index: int) -> bool:
            call = findings.calls.get(index)
            return call is not None and (call.output_nan if name == "nan" else call.output_inf)

        # The grads probe does not watch inputs: every call counts as fed finite values.
        first = nonfinite_origin(findings.forward_order, output_holds)
        if first is not None and (rec := by_index.get(first)) is not None:
            origin = layer_label(rec.name, rec.call)
    loss_bad = loss is not None and (math.isnan(loss) if name == "nan" else math.isinf(loss))
    if not layers and not bad_params_names and not loss_bad:
        return CheckResult(name, True, f"no {word} in any gradient; the loss is {_loss_text(loss)}")
    parts = []
    if layers:
        parts.append(f"{word} in the gradients of {len(layers)} layer(s), first: {first_any}")
    else:
        parts.append(f"no gradient holds {word}")
    if HookKind.BACKWARD in findings.kinds:
        parts.append(
            f"first grad_input holding {word} in backward order: {first_input}"
            if first_input
            else f"no grad_input holds {word}"
        )
    if bad_params_names:
        shown = ", ".join(bad_params_names[:5])
        more = f" (+{len(bad_params_names) - 5})" if len(bad_params_names) > 5 else ""
        parts.append(f"parameter grads: {shown}{more}")
    parts.append(f"the loss is {_loss_text(loss)}")
    if origin is not None:
        parts.append(f"the forward pass first produced {word} in {origin}")
        if origin not in layers:
            layers.append(origin)
    return CheckResult(name, False, "; ".join(parts), tuple(layers))


def _loss_text(loss: float | None) -> str:
    if loss is None:
        return "unknown"
    if math.isnan(loss):
        return "nan"
    if math.isinf(loss):
        return "inf" if loss > 0 else "-inf"
    return "finite"


def unused_check(findings: GradFindings) -> CheckResult:
    """Parameters with requires_grad whose ``.grad`` stayed None after backward."""
    return make_check(
        "unused",
        findings.unused,
        "every parameter with requires_grad got a gradient",
        "{n} parameter(s) with requires_grad got no gradient",
    )


def zero_grad_check(findings: GradFindings) -> CheckResult:
    """Parameters whose gradient arrived but is zero everywhere (norm exactly 0)."""
    zero = [p.name for p in findings.params if p.grad_norm == 0.0]
    return make_check(
        "zero-grad",
        zero,
        "every gradient that arrived has a non-zero element",
        "{n} parameter(s) got an all-zero gradient",
    )


def dead_check(findings: GradFindings, records: Sequence[CallRecord]) -> CheckResult:
    """Module calls whose floating-point outputs are all zero (in call order)."""
    dead = [
        layer_label(r.name, r.call)
        for r in records
        if (call := findings.calls.get(r.index)) is not None and call.output_dead
    ]
    return make_check(
        "dead",
        dead,
        "every module output has a non-zero element",
        "{n} module call(s) output only zeros",
    )


def bound_check(
    name: str, bound: float, findings: GradFindings, records: Sequence[CallRecord]
) -> CheckResult:
    """Every per-layer grad_norm within ``bound`` (NaN fails either bound)."""
    upper = name == "max-grad-norm"
    failing: list[str] = []
    seen: set[int] = set()
    for r in records:
        if r.module_id in seen:
            continue
        seen.add(r.module_id)  # the grad_norm is the module's, the same for every call
        mod = findings.modules.get(r.module_id)
        if mod is None or mod.grad_norm is None:
            continue
        g = mod.grad_norm
        ok = g <= bound if upper else g >= bound
        if not ok:
            failing.append(layer_label(r.name))
    op = "<=" if upper else ">="
    return make_check(
        name,
        failing,
        f"every layer grad_norm {op} {bound:g}",
        f"{{n}} layer(s) with grad_norm not {op} {bound:g}",
    )
