"""The ``watch`` report: the steps files of a run -> one ``hookcli.report/1`` Report.

Pure functions, no torch. Rows: one per module of each watched model (qualified names
under the model), with its figures over the run (last, min, max of the logged steps)
on the first process (rank 0), and under torchrun the last grad norm of every rank and
their spread. Totals: steps, loss, total grad norm, step time, learning rates, the first
NaN/Inf, per-rank figures. Checks: ``--fail-on`` and the thresholds (``watch.checks``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from hookcli.fmt import fmt_norm_type, number
from hookcli.render import fmt_float, fmt_pct
from hookcli.report import CheckResult, Column, Report, Row
from hookcli.watch.merge import First, Process, finite, firsts

COLUMNS = (
    Column("name", "Module"),
    Column("type", "Type"),
    Column("grad_norm", "Grad norm", fmt_float, "right"),
    Column("grad_norm_min", "min", fmt_float, "right"),
    Column("grad_norm_max", "max", fmt_float, "right"),
    Column("weight_norm", "Weight norm", fmt_float, "right"),
    Column("update_ratio", "Update/weight", fmt_float, "right"),
    Column("act_absmax", "Act absmax", fmt_float, "right"),
    Column("act_zero_frac", "Zeros", fmt_pct, "right"),
)


def models_of(processes: Sequence[Process]) -> list[tuple[str, dict[str, Any]]]:
    """(label, model record) of every watched model, in the order the first process
    that trained it met it."""
    seen: dict[str, dict[str, Any]] = {}
    for p in processes:
        for label, record in sorted(p.models.items(), key=lambda kv: kv[1].get("opt") or 0):
            seen.setdefault(label, record)
    return list(seen.items())


def _module_series(steps: Sequence[dict[str, Any]], name: str, key: str) -> list[float | None]:
    out: list[float | None] = []
    for s in steps:
        entry = (s.get("modules") or {}).get(name)
        if entry is None:
            continue
        value = entry.get("act", {}).get(key[4:]) if key.startswith("act_") else entry.get(key)
        out.append(number(value))
    return out


def _last(values: Sequence[float | None]) -> float | None:
    return values[-1] if values else None


def module_rows(processes: Sequence[Process]) -> list[Row]:
    """One row per module of every watched model."""
    rows = []
    models = models_of(processes)
    several = len(models) > 1
    for label, record in models:
        owners = [p for p in processes if label in p.steps]
        base = owners[0] if owners else None
        steps = [s for s in (base.steps.get(label, []) if base else []) if "modules" in s]
        for m in record.get("modules") or []:
            name = str(m.get("name", ""))
            grad = _module_series(steps, name, "grad_norm")
            data: dict[str, Any] = {
                "name": name,
                "type": m.get("type", ""),
                "depth": m.get("depth", 0),
                "call": 0,
                "called": True,
                "params": m.get("params", 0),
                "own_params": m.get("own_params", 0),
                "trainable_params": m.get("trainable_params", 0),
                "model": label,
                "logged_steps": len(grad) if m.get("stepped") else 0,
            }
            if m.get("stepped"):
                fin = finite(grad)
                ratio = _module_series(steps, name, "update_ratio")
                # every figure but min/max is the last logged step's: a row never puts
                # one step's figure beside another's
                applied = _module_series(steps, name, "grad_norm_applied")
                if _last(applied) is not None:  # a clipped step: as step() applied it
                    data["grad_norm_applied"] = applied[-1]
                data.update(
                    grad_norm=_last(grad),
                    grad_norm_min=min(fin) if fin else None,
                    grad_norm_max=max(fin) if fin else None,
                    weight_norm=_last(_module_series(steps, name, "weight_norm")),
                    update_ratio=_last(ratio),
                    update_ratio_max=max(finite(ratio), default=None),
                )
            for key in ("act_mean", "act_std", "act_absmax", "act_zero_frac"):
                series = _module_series(steps, name, key)
                data[key] = _last(series)
            if len(owners) > 1 and m.get("stepped"):
                per_rank = [
                    _last(
                        _module_series(
                            [s for s in p.steps.get(label, []) if "modules" in s], name, "grad_norm"
                        )
                    )
                    for p in owners
                ]
                data["grad_norm_per_rank"] = per_rank
                data["grad_norm_spread"] = _spread(per_rank)
            display = {"name": f"{label}: {name or '(root)'}"} if several else {}
            rows.append(Row.of(data, display))
    return rows


def _spread(values: Sequence[float | None]) -> float | None:
    """(max - min) / max over the ranks' values: 0 when they agree."""
    fin = finite(values)
    if len(fin) < 2 or max(abs(v) for v in fin) == 0:
        return None if len(fin) < 2 else 0.0
    return (max(fin) - min(fin)) / max(abs(v) for v in fin)


def model_totals(processes: Sequence[Process], label: str) -> dict[str, Any]:
    """Steps, loss, total grad norm, step time and learning rates of one model."""
    owners = [p for p in processes if label in p.steps]
    base = owners[0] if owners else None
    steps = base.steps.get(label, []) if base else []
    losses = [number(s.get("loss")) for s in steps]
    grads = [number(s.get("grad_norm")) for s in steps]
    applied = [number(s.get("grad_norm_applied")) for s in steps]
    clipped = sum(
        1
        for s in steps
        if s.get("grad_norm_applied") is not None
        and s.get("clipped", s.get("grad_norm_applied") != s.get("grad_norm"))
    )
    times = finite(number(s.get("step_time")) for s in steps)
    out: dict[str, Any] = {
        "model": label,
        "steps": steps[-1]["step"] if steps else 0,
        "loss_first": next((v for v in losses if v is not None), None),
        "loss_last": _last([v for v in losses if v is not None]),
        "loss_min": min(finite(losses), default=None),
        "grad_norm_last": _last([v for v in grads if v is not None]),
        "grad_norm_max": max(finite(grads), default=None),
        "grad_norm_applied_last": _last([v for v in applied if v is not None]),
        "clipped_steps": clipped,
        "skipped_steps": base.skipped.get(label, 0) if base else 0,
        "skipped_by": _skipped_by(base, label),
        "norm_type": next((s["norm_type"] for s in reversed(steps) if "norm_type" in s), None),
        "step_time_median": statistics.median(times) if times else None,
        "lr_last": steps[-1].get("lr") if steps else None,
    }
    if len(owners) > 1:
        out["ranks"] = [
            {
                "process": p.name,
                "rank": p.rank,
                "steps": p.steps[label][-1]["step"] if p.steps.get(label) else 0,
                "loss_last": _last(
                    [number(s.get("loss")) for s in p.steps[label] if s.get("loss") is not None]
                ),
                "grad_norm_last": _last(
                    [
                        number(s.get("grad_norm"))
                        for s in p.steps[label]
                        if s.get("grad_norm") is not None
                    ]
                ),
            }
            for p in owners
        ]
        out["loss_spread"] = _spread([r["loss_last"] for r in out["ranks"]])
        out["grad_norm_spread"] = _spread([r["grad_norm_last"] for r in out["ranks"]])
    return out


def _skipped_by(base: Process | None, label: str) -> dict[str, int]:
    """Skipped iterations by who skipped them: ``GradScaler`` (its ``step()`` did not
    step) or ``zero_grad`` (the script cleared the gradients instead of stepping)."""
    out: dict[str, int] = {}
    for r in base.discarded if base else []:
        if str(r.get("model")) == label:
            by = str(r.get("by") or "GradScaler")
            out[by] = out.get(by, 0) + 1
    return out


def _skipped_text(t: dict[str, Any]) -> str:
    by = t.get("skipped_by") or {}
    words = {
        "GradScaler": "GradScaler skipped the step",
        "zero_grad": "the script cleared the gradients instead of stepping",
    }
    if len(by) == 1:
        return f"{t['skipped_steps']} ({words.get(next(iter(by)), next(iter(by)))})"
    parts = ", ".join(f"{k} {v}" for k, v in sorted(by.items()))
    return f"{t['skipped_steps']} ({parts})" if parts else str(t["skipped_steps"])


def _first_dict(first: First | None) -> dict[str, Any] | None:
    if first is None:
        return None
    return {
        "what": first.what,
        "step": first.step,
        "model": first.model,
        "process": first.process,
        "rank": first.rank,
        "phase": first.phase,
        "module": first.module,
        "exact": first.exact,
        "found_by": first.found_by,
    }


def step_series(processes: Sequence[Process]) -> tuple[Row, ...]:
    """The per-step series of the first process (rank 0 under torchrun), every model of
    it: one row per recorded step with its loss and total grad norm, and on the steps
    that logged per-module figures each module's grad norm (the html page's charts)."""
    if not processes:
        return ()
    out: list[Row] = []
    for label, steps in processes[0].steps.items():
        for rec in steps:
            row: dict[str, Any] = {
                "model": label,
                "step": rec.get("step"),
                "loss": rec.get("loss"),
                "grad_norm": rec.get("grad_norm"),
                "grad_norm_applied": rec.get("grad_norm_applied"),
            }
            if "norm_type" in rec:  # grad_norm is a clipping call's of another norm
                row["norm_type"] = rec["norm_type"]
            modules = rec.get("modules")
            if isinstance(modules, dict):
                row["modules"] = {
                    name: {"grad_norm": figures.get("grad_norm")}
                    for name, figures in modules.items()
                    if isinstance(figures, dict)
                }
            out.append(Row.of(row))
    return tuple(out)


def build_report(
    processes: Sequence[Process],
    checks: Sequence[CheckResult],
    settings: dict[str, Any],
    spec: str,
    extra_totals: dict[str, Any] | None = None,
    error: str | None = None,
) -> Report:
    """The ``watch`` report of a run."""
    models = models_of(processes)
    rows = module_rows(processes)
    per_model = [model_totals(processes, label) for label, _ in models]
    all_firsts = sorted(
        [*firsts(list(processes), "nan"), *firsts(list(processes), "inf")],
        key=lambda f: (f.step, f.phase != "forward", f.rank or 0),
    )
    first = all_firsts[0] if all_firsts else None
    totals: dict[str, Any] = {
        "processes": len(processes),
        "ranks": sorted(p.rank for p in processes if p.rank is not None),
        "models": per_model,
        "first_nonfinite": _first_dict(first),
        **(extra_totals or {}),
    }
    table_totals: list[tuple[str, str]] = []
    several_procs = len(processes) > 1
    for t in per_model:
        prefix = f"{t['model']} " if len(per_model) > 1 else ""
        table_totals.append((f"{prefix}steps", str(t["steps"])))
        table_totals.append(
            (
                f"{prefix}loss",
                f"{fmt_float(t['loss_first'])} -> {fmt_float(t['loss_last'])} "
                f"(min {fmt_float(t['loss_min'])})",
            )
        )
        grad = f"{fmt_float(t['grad_norm_last'])} (max {fmt_float(t['grad_norm_max'])})"
        kind = t["norm_type"]
        if kind is not None:  # not L2: as the script's clip_grad_norm_ took it
            grad += f" ({fmt_norm_type(kind)}-norm)"
        if t["clipped_steps"]:
            grad += (
                f" before clipping; {fmt_float(t['grad_norm_applied_last'])} as applied "
                f"({'L2, ' if kind is not None else ''}{t['clipped_steps']} clipped steps)"
            )
        table_totals.append((f"{prefix}grad norm", grad))
        if t["skipped_steps"]:
            table_totals.append((f"{prefix}skipped", _skipped_text(t)))
        if t.get("ranks"):
            table_totals.append(
                (
                    f"{prefix}ranks",
                    ", ".join(
                        f"{r['process']}: loss {fmt_float(r['loss_last'])} "
                        f"grad norm {fmt_float(r['grad_norm_last'])}"
                        for r in t["ranks"]
                    )
                    + f" (spread {fmt_float(t.get('grad_norm_spread'))})",
                )
            )
    if first is not None:
        table_totals.append(("first NaN/Inf", first.text(several_procs, len(models))))
    files = (extra_totals or {}).get("files") or {}
    if files.get("out"):
        table_totals.append(("files", str(files["out"])))
    if not processes:
        notes: tuple[str, ...] = (
            "no process stepped an optimizer over module parameters or ran a backward: "
            "nothing was recorded",
        )
    else:
        notes = ()
    return Report(
        command="watch",
        model={"spec": spec, "class": models[0][0] if models else None},
        settings=settings,
        layers=tuple(rows),
        totals=totals,
        checks=tuple(checks),
        lists={"steps": step_series(processes)},
        notes=notes,
        error=error,
        columns=COLUMNS,
        table_totals=tuple(table_totals),
    )
