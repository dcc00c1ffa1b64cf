"""The CI gates of ``watch``: pure functions from the steps files to ``CheckResult``s.

``--fail-on nan,inf,dead,vanishing,exploding,unused`` with the thresholds named as
``grads`` names them (``--min-grad-norm``, ``--max-grad-norm``) plus
``--max-update-ratio``; a threshold given alone turns its check on. Every check spans
every process (rank) of the run and names the modules (and ranks) that failed it.

A check never passes on data that was not recorded: a run that recorded no step fails
every check asked for (``gate_results``), and a check whose figures a model never got
(``dead`` without activation statistics, ``vanishing``/``exploding`` without a grad
norm, ``unused`` without a record of the parameters' gradients) fails and says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hookcli.checks import make_check
from hookcli.fmt import number
from hookcli.report import CheckResult
from hookcli.watch.config import WatchGates
from hookcli.watch.merge import Process, firsts, nonfinite_kind


def asked_checks(gates: WatchGates, stop_on: Sequence[str]) -> list[str]:
    """The names of the checks a run asked for: ``--fail-on`` and the thresholds', then
    ``stop-on``."""
    return [*gates.checks, *(["stop-on"] if stop_on else [])]


def recorded_a_step(processes: Sequence[Process]) -> bool:
    return any(steps for p in processes for steps in p.steps.values())


def gate_results(
    gates: WatchGates,
    stop_on: Sequence[str],
    processes: Sequence[Process],
    unwatched: Callable[[], str],
) -> list[CheckResult]:
    """The report's checks (``hookcli watch`` and ``hookcli.watch`` alike). Nothing
    watched is never a pass: a run that recorded no step fails every check it asked
    for, "nothing checked: " and ``unwatched()`` (why nothing was recorded)."""
    if not recorded_a_step(processes):
        why = unwatched()
        return [
            CheckResult(name, False, f"nothing checked: {why}")
            for name in asked_checks(gates, stop_on)
        ]
    checks = list(run_checks(gates, processes))
    stopped = stop_check(processes)
    if stopped is not None:
        checks.append(stopped)
    return checks


def _unchecked(result: CheckResult, missing: list[str], what: str, hint: str = "") -> CheckResult:
    """``result`` failed where some models (``missing``) never got ``what``: a check
    that saw no data is no pass."""
    if not missing:
        return result
    detail = f"no {what} recorded for {', '.join(missing)}, so it checked nothing there{hint}"
    if not result.passed:
        detail = f"{result.detail}; {detail}"
    return CheckResult(result.name, False, detail, result.layers)


def _models(p: Process) -> list[str]:
    """The models of ``p`` that recorded a step."""
    return [model for model, steps in p.steps.items() if steps]


def _model(p: Process, model: str, several_procs: bool) -> str:
    return f"{model} ({p.name})" if several_procs else model


def run_checks(gates: WatchGates, processes: Sequence[Process]) -> tuple[CheckResult, ...]:
    """Every requested check, in the order asked."""
    limits = gates.thresholds()
    out = []
    for name in gates.checks:
        if name in ("nan", "inf"):
            out.append(nonfinite_check(name, processes))
        elif name == "dead":
            out.append(dead_check(processes))
        elif name == "vanishing":
            out.append(bound_check(processes, "vanishing", limits["min_grad_norm"], None, None))
        elif name == "exploding":
            out.append(
                bound_check(
                    processes,
                    "exploding",
                    None,
                    limits["max_grad_norm"],
                    limits["max_update_ratio"],
                )
            )
        elif name == "unused":
            out.append(unused_check(processes))
    return tuple(out)


def _label(p: Process, model: str, name: str, several_models: bool, several_procs: bool) -> str:
    label = name or "(root)"
    if several_models:
        label = f"{model}: {label}"
    if several_procs:
        label = f"{label} ({p.name})"
    return label


def _shape(processes: Sequence[Process]) -> tuple[bool, bool]:
    models = {m for p in processes for m in p.models}
    return len(models) > 1, len(processes) > 1


def nonfinite_check(name: str, processes: Sequence[Process]) -> CheckResult:
    """``nan``/``inf``: any NaN (Inf) in a loss or gradient on any rank."""
    word = "NaN" if name == "nan" else "Inf"
    found = firsts(list(processes), name)
    if not found:
        note = _skipped_note(processes, lambda v: nonfinite_kind(v) == name, f"held {word}")
        return CheckResult(name, True, f"no {word} in any loss or gradient{note}")
    several_models, several_procs = _shape(processes)
    first = found[0]
    where = sorted({f.process for f in found}) if several_procs else []
    detail = first.text(several_procs, 2 if several_models else 1)
    if where:
        detail += f"; processes with {word}: {', '.join(where)}"
    # the first one's module, and every other found in the outputs or grads themselves
    # (an estimate from parameter gradients elsewhere, say on a rank that got the value
    # through an all-reduce, is not a module that failed)
    layers = tuple(
        dict.fromkeys(
            f"{f.module or '(root)'}" + (f" ({f.process})" if several_procs else "")
            for f in found
            if f.module is not None and (f is first or f.exact)
        )
    )
    return CheckResult(name, False, detail, layers)


def _skipped_note(processes: Sequence[Process], test: Callable[[float], bool], what: str) -> str:
    """The skipped iterations (no step applied them: not counted) whose loss or grad
    norm passes ``test``, said after a passing check's detail."""
    hits = []
    for p in processes:
        for r in p.discarded:
            values = [number(r.get("loss")), number(r.get("grad_norm"))]
            if any(v is not None and test(v) for v in values):
                hits.append(r)
    if not hits:
        return ""
    first = hits[0]
    how = (
        "GradScaler skipped its step"
        if first.get("by", "GradScaler") == "GradScaler"
        else "the script cleared its gradients"
    )
    return (
        f"; not counted: {len(hits)} skipped iteration(s) {what}, the first after step "
        f"{first.get('after')} ({how}: no step applied it)"
    )


def _logged(p: Process) -> list[tuple[str, dict]]:
    return [(model, s) for model, steps in p.steps.items() for s in steps if "modules" in s]


def dead_check(processes: Sequence[Process]) -> CheckResult:
    """``dead``: a module whose output was all zeros on its last logged step."""
    several_models, several_procs = _shape(processes)
    failing = []
    missing = []
    for p in processes:
        last: dict[tuple[str, str], float | None] = {}
        for model, s in _logged(p):
            for name, entry in s["modules"].items():
                if "act" in entry:
                    last[(model, name)] = number(entry["act"].get("zero_frac"))
        for (model, name), frac in last.items():
            if frac is not None and frac >= 1.0:
                failing.append(_label(p, model, name, several_models, several_procs))
        seen = {model for model, _ in last}
        missing += [_model(p, m, several_procs) for m in _models(p) if m not in seen]
    result = make_check(
        "dead",
        failing,
        "every module output had a non-zero element on the last logged step",
        "{n} module(s) output only zeros on the last logged step",
    )
    return _unchecked(
        result,
        missing,
        "activation statistics were",
        " (no logged step had a training forward: a run shorter than --every whose "
        "step 1 has none, or compiled modules)",
    )


def bound_check(
    processes: Sequence[Process],
    name: str,
    low: float | None,
    high: float | None,
    ratio: float | None,
) -> CheckResult:
    """``vanishing`` (a module grad_norm below ``low``) or ``exploding`` (above ``high``,
    or an update/weight ratio above ``ratio``; also the total grad norm of any step), at
    any logged step of any rank."""
    several_models, several_procs = _shape(processes)
    failing: list[str] = []
    first: str | None = None
    missing: list[str] = []
    for p in processes:
        for model, steps in p.steps.items():
            seen = False  # a grad norm this check reads, on any step of this model
            for s in steps:
                total = number(s.get("grad_norm"))
                seen = seen or (high is not None and total is not None)
                if high is not None and total is not None and total > high:
                    label = _label(p, model, "(total)", several_models, several_procs)
                    failing.append(label)
                    first = first or f"total grad norm {total:.4g} at step {s['step']}"
                for mod, entry in (s.get("modules") or {}).items():
                    g = number(entry.get("grad_norm"))
                    u = number(entry.get("update_ratio"))
                    seen = seen or g is not None
                    why = None
                    if low is not None and g is not None and g < low:
                        why = f"grad norm {g:.4g} < {low:g}"
                    elif high is not None and g is not None and g > high:
                        why = f"grad norm {g:.4g} > {high:g}"
                    elif ratio is not None and u is not None and u > ratio:
                        why = f"update/weight {u:.4g} > {ratio:g}"
                    if why is not None:
                        label = _label(p, model, mod, several_models, several_procs)
                        failing.append(label)
                        first = first or f"{label}: {why} at step {s['step']}"
            if steps and not seen:
                missing.append(_model(p, model, several_procs))
    if name == "vanishing":
        ok = f"every module grad norm >= {low:g} on the logged steps"
        bad = f"{{n}} module(s) with a grad norm below {low:g}"
    else:
        ok = (
            f"every grad norm <= {high:g} and every update/weight ratio <= {ratio:g} "
            "on the logged steps"
        )
        bad = (
            f"{{n}} module(s) with a grad norm above {high:g} "
            f"or an update/weight ratio above {ratio:g}"
        )
    result = make_check(name, failing, ok, bad)
    if result.passed and high is not None:
        note = _skipped_note(processes, lambda v: v > high, f"had a grad norm above {high:g}")
        result = CheckResult(result.name, True, result.detail + note, result.layers)
    if not result.passed and first is not None:
        result = CheckResult(result.name, False, f"{result.detail}; first: {first}", result.layers)
    what = "module grad norm was" if name == "vanishing" else "grad norm was"
    return _unchecked(result, missing, what, " (no parameter of it got a gradient)")


def unused_check(processes: Sequence[Process]) -> CheckResult:
    """``unused``: a stepped parameter whose grad stayed None on every step."""
    several_models, several_procs = _shape(processes)
    failing: list[str] = []
    missing: list[str] = []
    for p in processes:
        unused: dict[str, list[str]] = {}
        for model, steps in p.steps.items():
            logged = [s for s in steps if "unused" in s]
            if logged:
                unused[model] = list(logged[-1]["unused"])
        if p.end is not None:
            unused.update({k: list(v) for k, v in (p.end.get("unused") or {}).items()})
        for model, names in unused.items():
            failing.extend(_label(p, model, n, several_models, several_procs) for n in names)
        missing += [_model(p, m, several_procs) for m in _models(p) if m not in unused]
    result = make_check(
        "unused",
        failing,
        "every stepped parameter got a gradient",
        "{n} stepped parameter(s) never got a gradient",
    )
    return _unchecked(result, missing, "record of which parameters got a gradient was")


def stop_check(processes: Sequence[Process]) -> CheckResult | None:
    """``stop-on``: the run was ended at its first NaN/Inf (always a failure)."""
    stops = [(p, s) for p in processes for s in p.stops]
    if not stops:
        return None
    p, s = min(stops, key=lambda ps: (ps[1].get("step") or 0, ps[0].rank or 0))
    word = "NaN" if s.get("what") == "nan" else "Inf"
    where = f" on {p.name}" if len(processes) > 1 else ""
    return CheckResult(
        "stop-on",
        False,
        f"stopped the run at the first {word}: step {s.get('step')} of {s.get('model')}{where}",
        (),
    )
