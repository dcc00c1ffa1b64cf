"""Pure functions that merge the per-rank findings of a ``--ddp`` run on rank 0.

No torch here: the inputs are plain values gathered from every rank.

- ``merge_rows``: rank 0's layer rows, then the calls that ran only on other ranks;
  each row gets ``ranks`` (where the call ran) and ``KEY_per_rank`` arrays;
- ``merge_checks``: a check run on every rank passes when it passed on all of them;
- ``unused_check``: parameters that got no gradient on some rank, worded as
  ``TORCH_DISTRIBUTED_DEBUG=INFO`` words them;
- ``desync_check``: reduced gradients, parameters and buffers that differ from rank 0's
  (buffers that DDP re-broadcasts are a note, not a failure);
- ``unit_desync_message``: the line for ranks whose forwards call different FSDP units.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from hookcli.checks import layer_label
from hookcli.report import CheckResult, Row


@dataclass(frozen=True)
class RankRows:
    """One rank's layer rows: (data, display) pairs, as ``Row`` carries them."""

    rank: int
    rows: tuple[tuple[Mapping[str, Any], Mapping[str, Any]], ...]


def spread(values: Sequence[float | None]) -> float | None:
    """(max - min) / max over ranks; None when a rank has no value or all are 0."""
    if not values or any(v is None for v in values):
        return None
    vals = [float(v) for v in values if v is not None]
    if any(math.isnan(v) for v in vals):
        return math.nan
    top = max(abs(v) for v in vals)
    if top == 0:
        return 0.0
    if math.isinf(top):
        return math.nan if all(math.isinf(v) for v in vals) else math.inf
    return (max(vals) - min(vals)) / top


def _label(data: Mapping[str, Any]) -> str:
    return layer_label(str(data.get("name", "")), int(data.get("call", 0) or 0))


def merge_rows(
    per_rank: Sequence[RankRows],
    per_rank_keys: Sequence[str] = (),
    union_keys: Sequence[str] = (),
    spread_keys: Sequence[str] = (),
) -> tuple[Row, ...]:
    """Rank 0's rows, then rows only other ranks ran (in rank order), with per-rank arrays.

    ``KEY_per_rank`` holds each rank's value of KEY for the same call (None where
    the call did not run on that rank); ``union_keys`` (lists) become the union over
    ranks, in order; ``KEY_spread`` is ``spread(KEY_per_rank)``.
    """
    by_rank = [{_label(d): (d, disp) for d, disp in rr.rows} for rr in per_rank]
    order: list[tuple[str, int]] = []  # (label, rank it is taken from)
    seen: set[str] = set()
    for rr in per_rank:
        for d, _ in rr.rows:
            label = _label(d)
            if label not in seen:
                seen.add(label)
                order.append((label, rr.rank))
    ranks = [rr.rank for rr in per_rank]
    out: list[Row] = []
    for label, src in order:
        data, display = by_rank[ranks.index(src)][label]
        merged = dict(data)
        merged["ranks"] = [r for r, rows in zip(ranks, by_rank, strict=True) if label in rows]
        for key in per_rank_keys:
            merged[f"{key}_per_rank"] = [
                rows[label][0].get(key) if label in rows else None for rows in by_rank
            ]
        for key in union_keys:
            union: list[Any] = []
            for rows in by_rank:
                for v in (rows[label][0].get(key) or ()) if label in rows else ():
                    if v not in union:
                        union.append(v)
            merged[key] = union
        for key in spread_keys:
            merged[f"{key}_spread"] = spread(merged[f"{key}_per_rank"])
        disp = dict(display)
        if src != per_rank[0].rank:
            disp["mark"] = f"(rank {src} only)" if len(merged["ranks"]) == 1 else "(not rank 0)"
        out.append(Row.of(merged, disp))
    return tuple(out)


def merge_checks(per_rank: Sequence[Sequence[CheckResult]]) -> tuple[CheckResult, ...]:
    """One check per name: passed on every rank, or the failing ranks' details and layers."""
    if not per_rank:
        return ()
    out: list[CheckResult] = []
    for i, first in enumerate(per_rank[0]):
        same = [checks[i] for checks in per_rank if i < len(checks)]
        failing = [(r, c) for r, c in enumerate(same) if not c.passed]
        if not failing:
            out.append(CheckResult(first.name, True, f"{first.detail} (on every rank)"))
            continue
        layers: list[str] = []
        for _, c in failing:
            layers.extend(x for x in c.layers if x not in layers)
        detail = "; ".join(f"rank {r}: {c.detail}" for r, c in failing)
        out.append(CheckResult(first.name, False, detail, tuple(layers)))
    return tuple(out)


def unused_check(
    unused: Sequence[Sequence[str]],
    indices: Sequence[Sequence[int]],
    why: str = "DDP without find_unused_parameters=True would fail or hang on them",
) -> CheckResult:
    """Parameters with requires_grad that got no gradient on some rank (per rank).

    Worded as DDP's own error under ``TORCH_DISTRIBUTED_DEBUG=INFO``: names sorted,
    and their DDP parameter indices (positions among the trainable parameters).
    """
    parts: list[str] = []
    layers: list[str] = []
    for rank, (names, idx) in enumerate(zip(unused, indices, strict=True)):
        if not names:
            continue
        parts.append(
            f"Parameters which did not receive grad for rank {rank}: {', '.join(sorted(names))}; "
            f"Parameter indices which did not receive grad for rank {rank}: "
            f"{' '.join(str(i) for i in sorted(idx))}"
        )
        layers.extend(n for n in names if n not in layers)
    if not parts:
        return CheckResult(
            "unused", True, "every parameter with requires_grad got a gradient on every rank"
        )
    n_ranks = sum(1 for names in unused if names)
    head = f"{len(layers)} parameter(s) got no gradient on {n_ranks} rank(s) ({why})"
    return CheckResult("unused", False, "; ".join([head, *parts]), tuple(layers))


@dataclass(frozen=True)
class Divergence:
    """A tensor that differs between ``rank`` and rank 0 (from ``DistContext.compare``)."""

    kind: str  # "grad" (after the all-reduce), "param" (after the step) or "buffer"
    name: str
    rank: int
    max_abs_diff: float
    relative: float  # max |x_rank - x_0| / max |x_0|
    why: str = "values"

    def to_dict(self) -> dict[str, Any]:
        """Every field but ``why``, in order."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "why"}


def desync_check(
    found: Sequence[Divergence],
    tolerance: float,
    compared: str = "reduced gradients, parameters and buffers",
    buffers_resynced: bool = False,
) -> CheckResult:
    """Tensors whose relative difference from rank 0's is above ``tolerance`` (0: exact).

    With ``buffers_resynced`` (DDP's ``broadcast_buffers=True``), buffers that differ
    do not fail the check: DDP overwrites them with rank 0's at the next forward.
    They are named in the detail as a note instead.
    """
    over = [d for d in found if d.relative > tolerance or d.why != "values"]
    drift = [d for d in over if buffers_resynced and d.kind == "buffer"]
    bad = [d for d in over if d not in drift]
    within = "exactly" if tolerance == 0 else f"within relative {tolerance:g}"
    note = ""
    if drift:
        n_drift = len({d.name for d in drift})
        note = (
            f"; note: {n_drift} buffer(s) differ from rank 0's after the step (first: "
            f"{drift[0].name}), which DDP overwrites with rank 0's at the next forward "
            "(broadcast_buffers=True): not a desync"
        )
    if not bad:
        what = compared
        if buffers_resynced:
            what = compared.replace(", parameters and buffers", " and parameters")
            what = what.replace("parameters and buffers", "parameters")
        return CheckResult("desync", True, f"{what} are equal on every rank ({within}){note}")
    names: list[str] = []
    for d in bad:
        if d.name not in names:
            names.append(d.name)
    shown = []
    for d in bad[:3]:
        what = {"grad": "grad of ", "param": "parameter "}.get(d.kind, "buffer ") + d.name
        if d.why != "values":
            shown.append(f"{what} (rank {d.rank}: {d.why})")
        else:
            shown.append(
                f"{what} (rank {d.rank}: max |diff| {d.max_abs_diff:.3g}, "
                f"relative {d.relative:.3g})"
            )
    counts = []
    for kind, label in (
        ("grad", "reduced gradient(s)"),
        ("param", "parameter(s)"),
        ("buffer", "buffer(s)"),
    ):
        n = len({d.name for d in bad if d.kind == kind})
        if n:
            counts.append(f"{n} {label}")
    head = f"{' and '.join(counts)} differ from rank 0's (compared {within})"
    detail = f"{head}; first: {', '.join(shown)}{note}"
    return CheckResult("desync", False, detail, tuple(names))


def _unit(name: str) -> str:
    return name or "(root)"


def unit_desync_message(history: Sequence[str], calls: Sequence[str | None]) -> str:
    """The one line for ranks whose forwards call different FSDP units (``--fsdp``).

    ``history``: the unit calls every rank made alike, in order ("" is the root);
    ``calls``: each rank's next unit call, in rank order (None: that rank ended its
    forward there).
    """
    groups: dict[str | None, list[int]] = {}
    for rank, call in enumerate(calls):
        groups.setdefault(call, []).append(rank)
    parts = []
    for call, ranks in groups.items():
        who = f"rank{'s' if len(ranks) > 1 else ''} {', '.join(str(r) for r in ranks)}"
        if call is None:
            parts.append(f"{who} ended {'their forwards' if len(ranks) > 1 else 'its forward'}")
        else:
            again = " again" if call in history else ""
            parts.append(f"{who} went on to call {_unit(call)}{again}")
    if history:
        last = _unit(history[-1])
        where = f"after {len(history)} unit call(s) alike on every rank (the last: {last})"
    else:
        where = "at the first unit call"
    return (
        f"the ranks' forwards ran different FSDP units: {where}, {'; '.join(parts)}; "
        "FSDP needs every rank to run the same units in the same order (it pairs their "
        "all-gathers by order), so hookcli stopped every rank before that unit: run the "
        "rank-dependent branch on every rank, or inside a unit every rank runs (--shard)"
    )


# -- cells of the merged rows --------------------------------------------------------------


def l2(values: Sequence[float | None]) -> float | None:
    """The norm of norms (None where no value is known)."""
    vals = [v for v in values if v is not None]
    return math.sqrt(math.fsum(v * v for v in vals)) if vals else None


def fmt_per_rank(fmt: Callable[[Any], str]) -> Callable[[Any], str]:
    """A cell of one value per rank: ``a | b | ...``."""

    def cell(values: Any) -> str:
        if not values:
            return "-"
        return " | ".join(fmt(v) for v in values)

    return cell


def fmt_ranks(value: Any) -> str:
    return ",".join(str(v) for v in value) if value else "-"


def fmt_unused_per_rank(values: Any) -> str:
    if not values or not any(values):
        return ""
    return "; ".join(
        f"r{r}: {', '.join(str(n).rsplit('.', 1)[-1] for n in names)}"
        for r, names in enumerate(values)
        if names
    )
