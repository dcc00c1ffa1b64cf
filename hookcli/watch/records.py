"""The steps-file records of a step, from its figures read on the host: the ``step``
record and the ``nonfinite`` event (with the origin module found from a logged step's
activation statistics). Pure functions of a track, a step and its values."""

from __future__ import annotations

import math
from typing import Any

import torch

from hookcli.watch.figures import _hypot
from hookcli.watch.merge import nonfinite_kind
from hookcli.watch.track import _Step, _Track

MAX_NAMES = 20  # names listed in one event
# where a step's losses begin among its host values: after the grad norms, the weight
# norms, the pre-clip grad norms and the whole model's pre-clip norm (a sharded clip's)
LOSSES = 4


def nonfinite_event(
    track: _Track,
    step: _Step,
    what: str,
    bad_loss: bool,
    bad_params: list[int],
    values: list[list[float]],
) -> dict[str, Any]:
    """The first NaN (or Inf) of a track: step, phase, origin module and how sure."""
    bad = set(bad_params)
    modules = [m.name for m in track.modules if bad & set(m.params)]
    phase = "forward" if bad_loss else "backward"
    module: str | None = None
    exact = False
    how = "unknown"
    # a NaN may come from an Inf made first (inf - inf, 0 * inf): either kind of
    # non-finite output is the origin of a NaN; only an Inf is the origin of an Inf
    origin = step.origin if step.origin and what in ("nan", step.origin["what"]) else None
    act_origin = origin_from_stats(track, step, what, values)
    if origin is not None:
        phase, module, exact = origin["phase"], origin["module"], True
        how = "input" if origin.get("input") else "nan-origin"
    elif act_origin is not None:
        phase, module, exact, how = "forward", act_origin, True, "activations"
    elif phase == "backward" and modules:
        # the first module in backward order (the last in forward order) whose
        # own gradients hold it: the origin or the nearest module before it
        order = track.forward_order or list(range(len(track.modules)))
        rank = {m: i for i, m in enumerate(order)}
        named = {m.name: i for i, m in enumerate(track.modules)}
        module = max(modules, key=lambda n: rank.get(named[n], -1))
        how = "parameter gradients"
    return {
        "kind": "nonfinite",
        "model": track.label,
        "opt": track.index,
        "step": step.step,
        "what": what,
        "phase": phase,
        "module": module,
        "exact": exact,
        "found_by": how,
        "loss": (
            sum(v[0] for v in values[LOSSES : LOSSES + len(step.losses)]) if step.losses else None
        ),
        "modules": modules[:MAX_NAMES],
        "params": [track.param_names[i] for i in bad_params[:MAX_NAMES]],
        "time": step.time,
    }


def origin_from_stats(
    track: _Track, step: _Step, what: str, values: list[list[float]]
) -> str | None:
    """On a logged step: the first module (in the order calls returned) whose output
    held the value, from its min and max."""
    if not step.act_order:
        return None
    for i, vec in zip(step.act_order, act_values(step, values), strict=True):
        mn, mx = vec[2], vec[3]
        if what == "nan" and not all(math.isfinite(v) for v in vec[:4]):
            return track.modules[i].name
        if what == "inf" and "inf" in (nonfinite_kind(mn), nonfinite_kind(mx)):
            return track.modules[i].name
    return None


def act_values(step: _Step, values: list[list[float]]) -> list[list[float]]:
    """[sum, norm, min, max, non-zero count] of each measured module, in
    ``step.act_order``, from the host values (``figures._act_parts``: the last two)."""
    n = len(step.act_order)
    if not n:
        return []
    floats, counts = values[-2], values[-1]
    return [[*floats[4 * j : 4 * j + 4], counts[j]] for j in range(n)]


def step_record(
    track: _Track, step: _Step, values: list[list[float]], updates: list[float] | None
) -> dict[str, Any]:
    norms, weights = values[0], values[1]
    clipped = step.pre_pos is not None
    pre_norms = values[2] if clipped else norms
    pre_pos = step.pre_pos if step.pre_pos is not None else step.pos
    n_loss = len(step.losses)
    losses = [v[0] for v in values[LOSSES : LOSSES + n_loss]]
    tensor_lrs = iter(v[0] for v in values[LOSSES + n_loss :])
    lrs = [next(tensor_lrs) if isinstance(lr, torch.Tensor) else _num(lr) for lr in step.lrs]
    applied = _hypot(norms) if step.pos else None
    pre = (_hypot(pre_norms) if clipped else applied) if pre_pos else None
    # gradients the clipping call left as they were: applied is the same norm as its
    unchanged = clipped and pre_pos == step.pos and pre_norms == norms
    if unchanged and values[3] and step.pre_type == 2.0:
        applied = values[3][0]
    record: dict[str, Any] = {
        "kind": "step",
        "model": track.label,
        "opt": track.index,
        "step": step.step,
        "time": step.time,
        "step_time": step.step_time,
        "loss": _sum(losses) if losses else None,
        "backwards": n_loss,
        "grad_norm": values[3][0] if values[3] else pre,
        "grad_norm_applied": applied,
        "lr": lrs,
    }
    if step.by is not None:
        record["optimizers"] = step.by
    if values[3] and step.pre_type != 2.0:
        record["norm_type"] = step.pre_type  # (inf: the sinks write "inf")
        record["clipped"] = not unchanged  # (grad_norm and the applied L2 differ anyway)
    if step.logged:
        grad_of = dict(zip(pre_pos, pre_norms, strict=True))
        applied_of = dict(zip(step.pos, norms, strict=True)) if clipped else None
        act = dict(zip(step.act_order, act_values(step, values), strict=True))
        counts = {i: step.act[i][1] for i in step.act_order}
        modules: dict[str, Any] = {}
        for i, m in enumerate(track.modules):
            entry: dict[str, Any] = {}
            if m.params:
                got = [grad_of[p] for p in m.params if p in grad_of]
                entry["grad_norm"] = _hypot(got) if got else None
                if applied_of is not None:
                    got = [applied_of[p] for p in m.params if p in applied_of]
                    entry["grad_norm_applied"] = _hypot(got) if got else None
                w = _hypot([weights[p] for p in m.params]) if weights else None
                entry["weight_norm"] = w
                if updates is not None and w is not None:
                    u = _hypot([updates[p] for p in m.params])
                    # null only where ||w_before|| is 0; NaN weights give NaN
                    entry["update_ratio"] = None if w == 0 else u / w
                else:
                    entry["update_ratio"] = None
            if i in act:
                total, norm, mn, mx, nonzero = act[i]
                n = counts[i]
                mean = total / n
                var = norm * norm / n - mean * mean
                entry["act"] = {
                    "mean": mean,
                    "std": math.sqrt(var) if var > 0 else (0.0 if var == var else var),
                    "absmax": math.nan if math.isnan(mn + mx) else max(abs(mn), abs(mx)),
                    "zero_frac": 1.0 - nonzero / n,
                }
            if entry:
                modules[m.name] = entry
        record["modules"] = modules
        if step.act_order:
            track.forward_order = list(step.act_order)
        record["unused"] = [track.param_names[i] for i in sorted(track.never)][:MAX_NAMES]
    return record


def _num(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _sum(values: list[float]) -> float:
    total = values[0]
    for v in values[1:]:
        total += v
    return total
