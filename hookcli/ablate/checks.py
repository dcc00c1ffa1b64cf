"""The gates of ``hookcli ablate --fail-on``: ``[GLOB:]METRIC<X`` (or ``<=``, ``>``, ``>=``).

A gate names the failing condition: ``fc:top1_agreement>0.99`` fails the run
when ablating ``fc`` leaves at least 99% of the top-1 predictions as they were
(a layer that does nothing). Without ``GLOB:`` a gate applies to every ablation.
Pure functions over the ranked rows; no torch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hookcli.errors import UsageError
from hookcli.report import CheckResult

GATE_GRAMMAR = "[GLOB:]METRIC<X (or <=, >, >=), e.g. fc:top1_agreement>0.99 or rel_l2<0.001"
_GATE = re.compile(r"^(?:(?P<glob>.*):)?(?P<key>[A-Za-z0-9_-]+)\s*(?P<cmp><=|>=|<|>)\s*(?P<x>.+)$")
_COMPARE = {
    "<": lambda v, x: v < x,
    "<=": lambda v, x: v <= x,
    ">": lambda v, x: v > x,
    ">=": lambda v, x: v >= x,
}


def metric_key(text: str, allowed: Sequence[str], option: str) -> str:
    """``rel-l2`` or ``rel_l2`` -> ``rel_l2``; an unknown metric is exit 2."""
    key = text.strip().lower().replace("-", "_")
    if key not in allowed:
        raise UsageError(f"unknown metric {text!r} in {option}; choose from {', '.join(allowed)}")
    return key


@dataclass(frozen=True)
class Gate:
    """One ``--fail-on`` condition."""

    text: str
    glob: str | None
    key: str
    cmp: str
    value: float

    def fails(self, v: float | None) -> bool:
        """True when the condition holds, or the value could not be measured (None, NaN)."""
        if v is None or math.isnan(v):
            return True
        return bool(_COMPARE[self.cmp](v, self.value))


def parse_gates(texts: Iterable[str], allowed: Sequence[str]) -> tuple[Gate, ...]:
    """Every ``--fail-on`` value (repeatable, comma-separated) -> gates."""
    gates: list[Gate] = []
    for text in texts:
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            m = _GATE.match(part)
            if m is None:
                raise UsageError(f"bad --fail-on {part!r}; write {GATE_GRAMMAR}")
            key = metric_key(m["key"], allowed, "--fail-on")
            try:
                value = float(m["x"])
            except ValueError:
                raise UsageError(
                    f"bad --fail-on {part!r}: {m['x'].strip()!r} is not a number"
                ) from None
            if math.isnan(value):
                raise UsageError(
                    f"bad --fail-on {part!r}: the threshold is NaN, which no value is below or "
                    "above, so the gate could never fail; give a number"
                )
            if (m["cmp"], value) in (("<", -math.inf), (">", math.inf)):
                raise UsageError(
                    f"bad --fail-on {part!r}: no value is {m['cmp']} {value:g}, so the gate "
                    "could never fail; give a finite number"
                )
            glob = m["glob"]
            if glob is not None:
                glob = glob.strip()
            gates.append(Gate(part, glob, key, m["cmp"], value))
    return tuple(gates)


@dataclass(frozen=True)
class GateRow:
    """What a gate sees of one ablation."""

    name: str  # the row's label
    modules: tuple[str, ...]  # qualified names of the modules ablated in this pass
    values: Mapping[str, Any]
    error: str | None = None


def run_gates(
    gates: Sequence[Gate], rows: Sequence[GateRow], scopes: Mapping[str, frozenset[str]]
) -> tuple[CheckResult, ...]:
    """One check per gate; ``scopes`` maps a gate's GLOB to the module names it matches."""
    results = []
    for gate in gates:
        scope = None if gate.glob is None else scopes[gate.glob]
        applies = [r for r in rows if scope is None or scope & set(r.modules)]
        failing = [
            r.name or "(root)"
            for r in applies
            if r.error is not None or gate.fails(r.values.get(gate.key))
        ]
        condition = f"{gate.key} {gate.cmp} {gate.value:g}"
        where = "" if gate.glob is None else f" of {gate.glob}"
        if failing:
            detail = f"{len(failing)} of {len(applies)} ablation(s){where} with {condition}"
            results.append(CheckResult(gate.text, False, detail, tuple(failing)))
        else:
            detail = f"no ablation{where} has {condition} ({len(applies)} checked)"
            results.append(CheckResult(gate.text, True, detail, ()))
    return tuple(results)
