"""The checks of ``hookcli stats``: ``nan``, ``inf``, ``dead`` (``--fail-on``).

Pure functions over per-call statistics; every call counts, also those that
``--depth`` hides from the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from hookcli.checks import make_check
from hookcli.report import CheckResult

STATS_CHECKS = ("nan", "inf", "dead")


class _Stats(Protocol):
    @property
    def zero_fraction(self) -> float: ...
    @property
    def nan(self) -> int: ...
    @property
    def inf(self) -> int: ...


@dataclass(frozen=True)
class CallStats:
    """What the checks need of one module call."""

    label: str  # layer_label(name, call)
    output: _Stats | None  # None: no floating output (or forward stats not collected)
    grads: Sequence[_Stats] = ()  # grad_output / grad_input / parameter-grad statistics


def _escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def _nonfinite_check(
    name: str, calls: Sequence[CallStats], origin: str | None, with_grads: bool
) -> CheckResult:
    word = "NaN" if name == "nan" else "Inf"

    def count(s: _Stats) -> int:
        return s.nan if name == "nan" else s.inf

    in_out = [c.label for c in calls if c.output is not None and count(c.output) > 0]
    in_grad = [c.label for c in calls if any(count(g) > 0 for g in c.grads)]
    failing = [c.label for c in calls if c.label in in_out or c.label in in_grad]
    if not failing:
        where = "module output or gradient" if with_grads else "module output"
        return make_check(name, (), f"no {word} in any {where}", "")
    parts = []
    if in_out:
        parts.append(f"the outputs of {len(set(in_out))} module call(s)")
    if in_grad:
        parts.append(f"the gradients of {len(set(in_grad))} module call(s)")
    first = f"; NaN/Inf first produced by {_escape(origin)}" if origin and in_out else ""
    return make_check(name, failing, "", f"{word} in {' and '.join(parts)}{first}")


def dead_check(calls: Sequence[CallStats], threshold: float | None) -> CheckResult:
    """``dead``: outputs all zero, or at least ``threshold`` of them zero."""
    if threshold is None:
        failing = [c.label for c in calls if c.output is not None and c.output.zero_fraction >= 1]
        return make_check(
            "dead",
            failing,
            "no module outputs only zeros",
            "{n} module call(s) output only zeros",
        )
    failing = [
        c.label for c in calls if c.output is not None and c.output.zero_fraction >= threshold
    ]
    pct = f"{100 * threshold:g}%"
    return make_check(
        "dead",
        failing,
        f"no module outputs {pct} zeros or more",
        f"{{n}} module call(s) output {pct} zeros or more",
    )


def stats_checks(
    calls: Sequence[CallStats],
    fail_on: Sequence[str],
    *,
    origin: str | None = None,
    dead_threshold: float | None = None,
    with_grads: bool = False,
) -> tuple[CheckResult, ...]:
    """The requested checks, in the order asked."""
    out: list[CheckResult] = []
    for name in fail_on:
        if name in ("nan", "inf"):
            out.append(_nonfinite_check(name, calls, origin, with_grads))
        elif name == "dead":
            out.append(dead_check(calls, dead_threshold))
    return tuple(out)
