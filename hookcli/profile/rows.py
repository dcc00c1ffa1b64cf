"""Rows a ``--depth`` cut shows: container rows, and folded time. Pure; no torch.

Two things the per-module rows (one per module called) miss:

- a *container* never called itself (``ModuleList``, ``ModuleDict``, a holder), whose
  descendants ran, has no row: Whisper's ``encoder.blocks`` holds most of the
  encoder's time. It gets one (``called: false``) whose time per pass is the sum of
  the outermost calls inside it, at every depth, like inspect's and cost's rows;
- with ``--depth N``, the rows below N are hidden. A row at depth N then *carries its
  subtree's time*: each hidden call's self time is added to the self time of its
  ancestor row at depth N (``folded: true``), so the Self column of the shown rows
  adds up to the root, and ``--plot`` and ``--sort self`` see where the time goes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hookcli.profile.figures import CallTree

if TYPE_CHECKING:
    from hookcli.profile.plan import Measured


def _depth(name: str) -> int:
    return 0 if not name else name.count(".") + 1


def _ancestors(name: str) -> list[str]:
    """Module-tree ancestors of ``name``, innermost first, the root ("") last."""
    out = []
    while name:
        name = name.rpartition(".")[0]
        out.append(name)
    return out


@dataclass(frozen=True)
class Container:
    """A module never called whose descendants ran: the outermost calls inside it."""

    name: str
    type: str
    depth: int
    top_calls: tuple[int, ...]  # calls inside its subtree whose caller is outside it


def containers(tree: CallTree, types: dict[str, str]) -> list[Container]:
    """The uncalled ancestors of the calls (by module name), in first-call order.

    ``types``: module name -> type name, for every module of the model.
    """
    called = set(tree.names)
    found: dict[str, list[int]] = {}
    for name in tree.names:
        if name not in types:
            continue  # a module outside the model's tree
        for anc in _ancestors(name):
            if anc in called or anc not in types:
                continue
            found.setdefault(anc, [])
    for name in found:
        prefix = name + "."
        inside = [
            i for i, n in enumerate(tree.names) if n.startswith(prefix)
        ]  # calls of its descendants
        members = set(inside)
        found[name] = [i for i in inside if tree.parents[i] not in members]
    return [Container(n, types[n], _depth(n), tuple(c)) for n, c in found.items()]


def owners(tree: CallTree, depth: int | None, rows: dict[str, int]) -> list[int]:
    """Per call, the row its self time is shown on: its own module's row when shown,
    else (hidden under ``--depth``) the row of its module-tree ancestor at ``depth``;
    else the row its caller's time is shown on. ``rows``: module name -> row index."""
    out: list[int] = []
    for i, name in enumerate(tree.names):
        if depth is None or _depth(name) <= depth:
            out.append(rows[name])
            continue
        cut = name
        while cut and _depth(cut) > depth:
            cut = cut.rpartition(".")[0]
        if cut in rows and cut != name:
            out.append(rows[cut])
        else:
            parent = tree.parents[i]
            out.append(out[parent] if parent >= 0 else rows[name])
    return out


def fold(
    per_call: Sequence[Sequence[int | None]], owner: Sequence[int], nrows: int
) -> list[list[int | None]]:
    """Per pass, per row: the sum of the values of the calls it owns (None if any is)."""
    out: list[list[int | None]] = []
    for row in per_call:
        sums: list[int | None] = [0] * nrows
        for i, v in enumerate(row):
            r = owner[i]
            cur = sums[r]
            sums[r] = None if v is None or cur is None else cur + v
        out.append(sums)
    return out


def per_pass_sum(
    per_call: Sequence[Sequence[int | None]], calls: Sequence[int]
) -> list[int] | None:
    """Per pass: the sum over ``calls`` (None when any call has no value in any pass)."""
    out = []
    for row in per_call:
        total = 0
        for i in calls:
            v = row[i]
            if v is None:
                return None
            total += v
        out.append(total)
    return out


def _ms(values: Sequence[int] | None) -> float | None:
    from hookcli.profile.figures import spread

    return round(spread(values).median, 6) if values else None


def table_rows(
    m: Measured,
    slot_rows: list[dict[str, Any]],
    *,
    backward: bool,
    depth: int | None,
    types: dict[str, str],
) -> list[dict[str, Any]]:
    """The module rows (one per slot, in slot order) plus container rows, with self times
    folded at ``depth``: every row of the model, shown or not (the caller cuts at depth)."""
    from hookcli.profile.figures import spread

    t = m.timings
    assert t is not None
    tree = m.tree
    rows = [dict(r) for r in slot_rows]
    for r in rows:
        r.setdefault("called", True)
    index = {tree.names[calls[0]]: s for s, calls in enumerate(tree.slot_calls)}
    root = spread(t.per_pass(t.incl, 0)).median
    for c in containers(tree, types):
        index[c.name] = len(rows)
        fwd = per_pass_sum(t.incl, c.top_calls)
        assert fwd is not None
        sp = spread(fwd)
        flops = sum(m.probe.call_cost(i).flops for i in c.top_calls)
        row: dict[str, Any] = {
            "name": c.name,
            "type": c.type,
            "depth": c.depth,
            "calls": 0,
            "called": False,
            "forward_ms": round(sp.median, 6),
            "forward_iqr_ms": round(sp.iqr, 6),
            "forward_min_ms": round(sp.low, 6),
            "forward_max_ms": round(sp.high, 6),
            "forward_self_ms": 0.0,
            "forward_pct": round(100.0 * sp.median / root, 3) if root > 0 else None,
            "forward_self_pct": 0.0,
            "flops": flops,
            "flops_per_s": flops / (sp.median / 1e3) if sp.median > 0 and flops else None,
        }
        if backward:
            b = per_pass_sum(t.bwd_incl, c.top_calls) if t.bwd_incl is not None else None
            bflops = sum(m.probe.call_cost(i).backward_flops or 0 for i in c.top_calls)
            bsp = spread(b) if b else None
            row["backward_ms"] = round(bsp.median, 6) if bsp else None
            row["backward_iqr_ms"] = round(bsp.iqr, 6) if bsp else None
            row["backward_self_ms"] = 0.0 if bsp else None
            row["backward_flops"] = bflops
            row["backward_flops_per_s"] = (
                bflops / (bsp.median / 1e3) if bsp and bsp.median > 0 and bflops else None
            )
        else:
            row["backward_ms"] = None
        row["memory_bytes"] = None
        rows.append(row)
    if depth is None:
        for r in rows:
            r["folded"] = False
        return rows
    owner = owners(tree, depth, index)
    own_row = [index[name] for name in tree.names]
    folded_rows = {owner[i] for i in range(tree.n) if owner[i] != own_row[i]}
    fwd_self = fold(t.self_, owner, len(rows))
    bwd_self = fold(t.bwd_self, owner, len(rows)) if backward and t.bwd_self else None
    for k, r in enumerate(rows):
        r["folded"] = k in folded_rows
        if not r["folded"]:
            continue
        own = _ms([p[k] for p in fwd_self])  # type: ignore[misc]
        r["forward_self_ms"] = own
        r["forward_self_pct"] = round(100.0 * own / root, 3) if own is not None and root else None
        if bwd_self is not None:
            vals = [p[k] for p in bwd_self]
            r["backward_self_ms"] = None if any(v is None for v in vals) else _ms(vals)  # type: ignore[arg-type]
    return rows
