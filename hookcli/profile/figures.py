"""Per-call clock stamps -> per-module medians and spreads. Pure; no torch.

Stamps are nanoseconds in flat arrays, one slot per (pass, call): index
``pass * n + call``. A call's forward *inclusive* time is its end minus its start;
its backward one is nested by construction (``backward_times``). Its *self* time is
that less the inclusive times of the calls made directly inside it (its children in
the call tree): never negative, forward or backward. A module's figure for one pass is the sum
over its calls in that pass; the row shows the median over the timed passes and
the interquartile range (IQR: the 75th less the 25th percentile).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class CallTree:
    """The module calls of one forward pass, in the order they began (depth first).

    ``parents[i]`` is the call ``i`` ran inside (-1 for the root); ``slots[i]``
    the module it called (an index into ``slot_calls``, modules in first-call order).
    """

    names: tuple[str, ...]
    types: tuple[str, ...]
    depths: tuple[int, ...]
    parents: tuple[int, ...]
    module_ids: tuple[int, ...]
    slots: tuple[int, ...] = field(init=False)
    slot_calls: tuple[tuple[int, ...], ...] = field(init=False)
    children: tuple[tuple[int, ...], ...] = field(init=False)

    def __post_init__(self) -> None:
        by_module: dict[int, int] = {}
        calls: list[list[int]] = []
        slots = []
        kids: list[list[int]] = [[] for _ in self.names]
        for i, mid in enumerate(self.module_ids):
            slot = by_module.setdefault(mid, len(by_module))
            if slot == len(calls):
                calls.append([])
            calls[slot].append(i)
            slots.append(slot)
            if self.parents[i] >= 0:
                kids[self.parents[i]].append(i)
        object.__setattr__(self, "slots", tuple(slots))
        object.__setattr__(self, "slot_calls", tuple(tuple(c) for c in calls))
        object.__setattr__(self, "children", tuple(tuple(k) for k in kids))

    @property
    def n(self) -> int:
        return len(self.names)

    def max_depth(self) -> int:
        """The deepest nesting of calls (1 for a root alone)."""
        level = [0] * self.n
        for i, p in enumerate(self.parents):
            level[i] = level[p] + 1 if p >= 0 else 1
        return max(level, default=0)


@dataclass(frozen=True)
class Spread:
    """Median and quartiles of one figure over the timed passes, in milliseconds."""

    median: float
    q1: float
    q3: float
    low: float
    high: float

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1


def spread(values_ns: Sequence[float]) -> Spread:
    """Median, quartiles (inclusive method), min and max of nanosecond values, in ms."""
    ms = sorted(v / 1e6 for v in values_ns)
    if len(ms) == 1:
        return Spread(ms[0], ms[0], ms[0], ms[0], ms[0])
    q1, _, q3 = statistics.quantiles(ms, n=4, method="inclusive")
    return Spread(statistics.median(ms), q1, q3, ms[0], ms[-1])


def backward_times(
    tree: CallTree, starts: Sequence[int], ends: Sequence[int], ok: Sequence[int]
) -> list[int | None]:
    """One pass's backward time per call, nested by construction (None: not measured).

    Backward hooks do not nest the way forward hooks do: a call's span runs from the
    first of its backward events to the last, and with branches, skip connections and
    tuple outputs a parent's span can end before a child's, and sibling spans overlap.
    So a call's *span* here is extended to cover its subtree's spans (from the first
    backward event of the call or anything inside it to the last), and every moment of
    the backward is counted once: inside the spans it goes to the innermost call
    running then (of the spans covering it, the one that began last; a child before its
    parent on a tie). A call's time is what its subtree was given: never more than its
    parent's, the children's times add up to at most the parent's, and the rest (its
    self time) is never negative. A call with ``ok`` 0 has no time; what ran inside it
    counts for the calls around it. A measured span of zero length (a call nothing of
    which runs in backward) is 0.
    """
    import heapq
    import itertools

    n = tree.n
    kids = tree.children
    lo: list[int | None] = [None] * n
    hi: list[int | None] = [None] * n
    for i in range(n - 1, -1, -1):  # children come after their parent in call order
        a, b = (starts[i], ends[i]) if ok[i] and ends[i] > starts[i] else (None, None)
        for c in kids[i]:
            ca, cb = lo[c], hi[c]
            if ca is not None and cb is not None:
                a = ca if a is None or ca < a else a
                b = cb if b is None or cb > b else b
        lo[i], hi[i] = a, b
    spans = sorted(
        (lo_i, i, hi_i)
        for i, (lo_i, hi_i) in enumerate(zip(lo, hi, strict=True))
        if ok[i] and lo_i is not None and hi_i is not None
    )
    cuts = sorted({t for s, _, e in spans for t in (s, e)})
    given = [0] * n
    running: list[tuple[int, int, int]] = []  # (-start, -call, end): the last begun on top
    k = 0
    for t0, t1 in itertools.pairwise(cuts):
        while k < len(spans) and spans[k][0] <= t0:
            s, i, e = spans[k]
            heapq.heappush(running, (-s, -i, e))
            k += 1
        while running and running[0][2] <= t0:
            heapq.heappop(running)
        if running:
            given[-running[0][1]] += t1 - t0
    sub = list(given)
    for i in range(n - 1, -1, -1):
        for c in kids[i]:
            sub[i] += sub[c]
    return [sub[i] if ok[i] else None for i in range(n)]


def overhead(bare_ns: Sequence[int], hooked_ns: Sequence[int]) -> dict[str, float | bool | None]:
    """The hooks' overhead and its noise, from interleaved bare and hooked forwards.

    ``overhead_ratio``: the median hooked forward over the median bare one. Its spread:
    the ratio of each repeat's pair (hooked over bare, run back to back), its median,
    min and max. ``overhead_shown`` is False when that spread (max - min) is larger
    than the figure's distance from 1: the noise could make it either side of 1, so
    the figure says nothing about the hooks.
    """
    bare, hooked = statistics.median(bare_ns), statistics.median(hooked_ns)
    ratio = hooked / bare if bare > 0 else None
    pairs = [h / b for b, h in zip(bare_ns, hooked_ns, strict=True) if b > 0]
    if ratio is None or not pairs:
        return {
            "overhead_ratio": None,
            "overhead_ratio_repeat_median": None,
            "overhead_ratio_min": None,
            "overhead_ratio_max": None,
            "overhead_shown": False,
        }
    low, high = min(pairs), max(pairs)
    return {
        "overhead_ratio": round(ratio, 4),
        "overhead_ratio_repeat_median": round(statistics.median(pairs), 4),
        "overhead_ratio_min": round(low, 4),
        "overhead_ratio_max": round(high, 4),
        "overhead_shown": high - low <= abs(ratio - 1.0),
    }


class Timings:
    """Inclusive and self times of every call in every timed pass, forward and backward.

    ``ok[k]`` (backward) is 1 where the call's backward hook saw an input gradient:
    a module whose inputs need no gradient has its backward hook fired as soon as the
    gradients of its outputs are ready, so its span says nothing; such calls are None.
    """

    def __init__(
        self,
        tree: CallTree,
        passes: int,
        starts: Sequence[int],
        ends: Sequence[int],
        bwd_starts: Sequence[int] | None = None,
        bwd_ends: Sequence[int] | None = None,
        bwd_ok: Sequence[int] | None = None,
    ) -> None:
        self.tree = tree
        self.passes = passes
        n = tree.n
        self.incl = [[ends[p * n + i] - starts[p * n + i] for i in range(n)] for p in range(passes)]
        self.self_ = [self._self(row) for row in self.incl]
        self.bwd_incl: list[list[int | None]] | None = None
        self.bwd_self: list[list[int | None]] | None = None
        if bwd_starts is not None and bwd_ends is not None and bwd_ok is not None:
            self.bwd_incl = [
                backward_times(
                    tree,
                    bwd_starts[p * n : (p + 1) * n],
                    bwd_ends[p * n : (p + 1) * n],
                    bwd_ok[p * n : (p + 1) * n],
                )
                for p in range(passes)
            ]
            self.bwd_self = [self._self_opt(row) for row in self.bwd_incl]

    def _self(self, incl: list[int]) -> list[int]:
        kids = self.tree.children
        return [incl[i] - sum(incl[c] for c in kids[i]) for i in range(len(incl))]

    def _self_opt(self, incl: list[int | None]) -> list[int | None]:
        kids = self.tree.children
        out: list[int | None] = []
        for i, v in enumerate(incl):
            inner = [incl[c] for c in kids[i]]
            known = [x for x in inner if x is not None]
            # a child whose backward was not measured: its share cannot be taken out
            out.append(None if v is None or len(known) < len(inner) else v - sum(known))
        return out

    def per_pass(self, table: list[list[int]], slot: int) -> list[int]:
        """A module's figure in each pass: the sum over its calls."""
        calls = self.tree.slot_calls[slot]
        return [sum(row[i] for i in calls) for row in table]

    def per_pass_opt(self, table: list[list[int | None]] | None, slot: int) -> list[int] | None:
        if table is None:
            return None
        calls = self.tree.slot_calls[slot]
        out = []
        for row in table:
            vals = [row[i] for i in calls]
            if any(v is None for v in vals):
                return None
            out.append(sum(v for v in vals if v is not None))
        return out

    def call_median_ms(self, i: int) -> float:
        """The median inclusive time of call ``i`` over the passes (validation, tests)."""
        return spread([row[i] for row in self.incl]).median
