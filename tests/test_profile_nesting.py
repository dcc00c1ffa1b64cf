"""``profile``'s times add up: self times never negative, a child never longer than its
parent, the children's times together never longer than the parent's, forward and
backward, on models with many branches and tuple outputs.

The oracles: hand-worked timelines for ``backward_times`` (each moment of a backward
counted once, to the innermost call running then), the wall span of a whole backward
(first to last event) for the root, and, on real models (transformers' GPT-2 here,
diffusers' UNet in tests/real), the nesting itself, checked per call and per row, and
on the bars the html icicle draws. The overhead rule is checked with made-up timings:
no assertion here depends on how fast the machine is.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import torch

import hookcli
from hookcli.profile.figures import CallTree, Timings, backward_times, overhead
from hookcli.profile.render import overhead_line

EPS_MS = 1e-5  # rows are rounded to 6 decimals of a millisecond


def _tree(parents: Sequence[int]) -> CallTree:
    depths: list[int] = []
    for p in parents:
        depths.append(depths[p] + 1 if p >= 0 else 0)
    n = len(parents)
    return CallTree(
        tuple(f"m{i}" if i else "" for i in range(n)),
        tuple("T" for _ in range(n)),
        tuple(depths),
        tuple(parents),
        tuple(range(n)),
    )


# -- the timeline, worked by hand --------------------------------------------------------


def test_overlapping_siblings_share_each_moment_once() -> None:
    """P [0, 100] holds A [10, 50] (holding A1 [40, 45]) and B [30, 80], which overlap:
    [10, 30] is A's, [30, 40] and [45, 80] B's (begun last), [40, 45] A1's, the rest P's."""
    tree = _tree([-1, 0, 1, 0])  # P, A, A1, B
    got = backward_times(tree, [0, 10, 40, 30], [100, 50, 45, 80], [1, 1, 1, 1])
    assert got == [100, 25, 5, 45]
    t = Timings(tree, 1, [0] * 4, [1] * 4, [0, 10, 40, 30], [100, 50, 45, 80], [1, 1, 1, 1])
    assert t.bwd_self == [[30, 20, 5, 45]]


def test_a_child_outside_its_parent_extends_the_parent() -> None:
    """The UNet's case: the root's own hooks span [10, 20], a child's [5, 30]. Read as
    spans, the child (25) outlasts the root (10), whose self time is -15; here the root
    spans its subtree's [5, 30] and the child's time is all of it."""
    tree = _tree([-1, 0])
    assert backward_times(tree, [10, 5], [20, 30], [1, 1]) == [25, 25]
    t = Timings(tree, 1, [0, 0], [1, 1], [10, 5], [20, 30], [1, 1])
    assert t.bwd_self == [[0, 25]]


def test_unmeasured_and_idle_calls() -> None:
    """A call without a time (ok 0) has none, its parent's self is unknown, and what ran
    inside it still counts in the parent; an idle call (0 ms, stamps 1) extends nothing."""
    tree = _tree([-1, 0, 1, 0])  # P, U (unmeasured), K inside U, I (idle)
    starts, ends, ok = [100, 0, 120, 1], [200, 0, 130, 1], [1, 0, 1, 1]
    assert backward_times(tree, starts, ends, ok) == [100, None, 10, 0]
    t = Timings(tree, 1, [0] * 4, [1] * 4, starts, ends, ok)
    assert t.bwd_self == [[None, None, 10, 0]]


def test_random_spans_nest_and_the_root_is_the_whole_backward() -> None:
    """Arbitrary (unnested, overlapping) spans on random trees: every property holds, and
    the root's time is its subtree's wall span, from the first event to the last."""
    rng = random.Random(46)
    for _ in range(300):
        n = rng.randint(1, 25)
        parents = [-1] + [rng.randrange(i) for i in range(1, n)]
        tree = _tree(parents)
        starts = [rng.randint(0, 1000) for _ in range(n)]
        ends = [s + rng.randint(0, 300) for s in starts]
        ok = [1] + [int(rng.random() > 0.2) for _ in range(1, n)]
        t = Timings(tree, 1, [0] * n, [1] * n, starts, ends, ok)
        assert t.bwd_incl is not None and t.bwd_self is not None
        incl, own = t.bwd_incl[0], t.bwd_self[0]
        spanned = [i for i in range(n) if ok[i] and ends[i] > starts[i]]
        whole = max(ends[i] for i in spanned) - min(starts[i] for i in spanned) if spanned else 0
        assert incl[0] == whole
        for i in range(n):
            mine, top = own[i], incl[i]
            if mine is not None:
                assert mine >= 0
            kids = [k for c in tree.children[i] if (k := incl[c]) is not None]
            if top is not None:
                assert all(k <= top for k in kids)
                assert sum(kids) <= top


# -- real models ---------------------------------------------------------------------------


def _parent_row(name: str, rows: Mapping[str, Any]) -> str:
    p = name
    while p:
        p = p.rpartition(".")[0]
        if p in rows:
            return p
    return ""


def assert_rows_nest(report: hookcli.Report, phases: Sequence[str]) -> int:
    """Every row: self >= 0, no child above its parent, the children's sum within the
    parent (module rows by their dotted names); returns how many rows had a time."""
    rows = {r["name"]: r.to_dict() for r in report.rows("modules")}
    timed = 0
    for phase in phases:
        kids: dict[str, float] = {}
        for name, r in rows.items():
            value, own = r.get(f"{phase}_ms"), r.get(f"{phase}_self_ms")
            if own is not None:
                assert own >= -EPS_MS, (phase, name, own)
            if value is None:
                continue
            timed += 1
            assert value >= 0, (phase, name, value)
            if not name:
                continue
            parent = _parent_row(name, rows)
            top = rows[parent].get(f"{phase}_ms")
            if top is None:
                continue
            assert value <= top + EPS_MS, (phase, name, value, parent, top)
            kids[parent] = kids.get(parent, 0.0) + value
        for parent, total in kids.items():
            top = rows[parent][f"{phase}_ms"]
            assert total <= top + EPS_MS * 100, (phase, parent, total, top)
    return timed


def assert_icicle_nests(report: hookcli.Report, phase: str) -> None:
    """The html icicle: its frames' children add up within the parent, and every bar
    it draws lies inside a bar of the row above."""
    from hookcli.html.charts import frames, icicle

    rows = [r.to_dict() for r in report.rows("modules")]
    roots = frames(rows, f"{phase}_ms", f"{phase}_self_ms")
    assert roots
    stack = list(roots)
    while stack:
        f = stack.pop()
        assert sum(c.total for c in f.children) <= f.total + EPS_MS * 100, (phase, f.name)
        stack.extend(f.children)

    class Axes:
        def __init__(self) -> None:
            self.bars: list[tuple[int, float, float]] = []

        def barh(self, depth: int, width: float, left: float, **_: Any) -> None:
            self.bars.append((depth, left, width))

        def __getattr__(self, name: str) -> Any:
            return lambda *a, **k: None

    ax = Axes()
    icicle(ax, roots, "ms")
    assert ax.bars
    for depth, left, width in ax.bars:
        assert width >= 0
        if depth == 0:
            continue
        assert any(
            d == depth - 1 and lft - 1e-9 <= left and left + width <= lft + w + 1e-6
            for d, lft, w in ax.bars
        ), (phase, depth, left, width)


def assert_calls_nest(m: Any) -> None:
    """Per call and per pass (``Timings``): the same three properties, forward and backward."""
    t = m.timings
    tree = m.tree
    for incl_table, self_table in ((t.incl, t.self_), (t.bwd_incl, t.bwd_self)):
        for incl, own in zip(incl_table, self_table, strict=True):
            for i in range(tree.n):
                if own[i] is not None:
                    assert own[i] >= 0, (tree.names[i], own[i])
                if incl[i] is None:
                    continue
                kids = [incl[c] for c in tree.children[i] if incl[c] is not None]
                assert all(k <= incl[i] for k in kids), tree.names[i]
                assert sum(kids) <= incl[i], tree.names[i]


def gpt2() -> tuple[torch.nn.Module, torch.Tensor]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=128, n_positions=32)
    return GPT2LMHeadModel(config), torch.randint(0, 128, (2, 16))


def test_gpt2_calls_nest_in_every_pass() -> None:
    """GPT-2's blocks return tuples, its embeddings take token ids: every call's times
    nest in every timed pass."""
    from hookcli.api import live
    from hookcli.options import Mode
    from hookcli.profile.runner import collect, plan_profile

    model, ids = gpt2()
    m, error = collect(live(model, (ids,), None, Mode("eval"), None), plan_profile(
        backward=True, warmup=1, repeat=3))  # fmt: skip
    assert error is None and m is not None
    assert m.timings is not None and m.timings.bwd_incl is not None
    assert any(v for row in m.timings.bwd_incl for v in row if v is not None)
    assert_calls_nest(m)


def test_gpt2_rows_and_icicle_nest() -> None:
    """The report's rows (medians of 2 repeats: the mean, so sums stay sums) and the
    icicle's bars nest, forward and backward."""
    model, ids = gpt2()
    report = hookcli.profile(model, ids, backward=True, warmup=1, repeat=2)
    assert assert_rows_nest(report, ("forward", "backward")) > 20
    for phase in ("forward", "backward"):
        assert_icicle_nests(report, phase)


# -- the overhead line ---------------------------------------------------------------------


def test_overhead_figure_with_its_spread() -> None:
    """Every repeat 1.49x-1.52x: the spread (0.03) is far inside the distance from 1."""
    bare = [100, 100, 100, 100, 100]
    hooked = [150, 151, 149, 150, 152]
    o = overhead(bare, hooked)
    assert o == {
        "overhead_ratio": 1.5,
        "overhead_ratio_repeat_median": 1.5,
        "overhead_ratio_min": 1.49,
        "overhead_ratio_max": 1.52,
        "overhead_shown": True,
    }
    line = overhead_line({**o, "profiled_forward_ms": 1.5e-4, "bare_forward_ms": 1e-4})
    assert line.startswith("1.500x (per repeat 1.49x-1.52x): hooked forward"), line


def test_overhead_within_the_noise_is_not_shown() -> None:
    """The issue's case: one repeat 0.61x, another 1.4x. A ratio of 1.2 (median hooked
    120 over median bare 100) with per-repeat ratios 0.45x-2.5x says nothing."""
    bare = [100, 200, 100, 200, 100]
    hooked = [110, 120, 250, 90, 130]
    o = overhead(bare, hooked)
    assert o["overhead_ratio"] == 1.2
    assert (o["overhead_ratio_min"], o["overhead_ratio_max"]) == (0.45, 2.5)
    assert o["overhead_ratio_repeat_median"] == 1.1
    assert o["overhead_shown"] is False
    line = overhead_line({**o, "profiled_forward_ms": 1.2e-4, "bare_forward_ms": 1e-4})
    assert line.startswith("within the noise (per repeat 0.45x-2.50x"), line
    assert "1.200x:" not in line


@pytest.mark.parametrize(
    ("bare", "hooked", "shown"),
    [([100, 100], [120, 119], True), ([100, 100], [100, 120], False), ([100], [97], True)],
)
def test_overhead_rule_at_the_edges(bare: list[int], hooked: list[int], shown: bool) -> None:
    """Shown exactly when max - min of the per-repeat ratios <= |ratio - 1|; one repeat
    has no spread, and says so."""
    o = overhead(bare, hooked)
    ratios = [h / b for b, h in zip(bare, hooked, strict=True)]
    ratio = sorted(hooked)[len(hooked) // 2] if len(hooked) % 2 else sum(hooked) / len(hooked)
    assert o["overhead_shown"] is shown
    assert shown == (max(ratios) - min(ratios) <= abs(ratio / (sum(bare) / len(bare)) - 1))
    if len(bare) == 1:
        line = overhead_line({**o, "profiled_forward_ms": 1.0, "bare_forward_ms": 1.0})
        assert "(one repeat: no spread)" in line


def test_overhead_without_a_bare_time() -> None:
    assert overhead([0, 0], [5, 5])["overhead_ratio"] is None
    assert overhead_line({"overhead_ratio": None}) == "-"
