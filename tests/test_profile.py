"""``hookcli profile``: per-module times against independent figures.

The figures the tests compare with are not hookcli's: the sleeps a model is known
to take (``time.sleep`` in forward and in a custom backward), a plain
``perf_counter`` around a bare forward, torch.profiler ``record_function`` spans.
Timing comparisons keep tolerances that a shared, loaded machine meets (each one
says why); the structural checks (nesting, trace, hooks removed) are exact.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import hookcli
from hookcli.errors import RunError, UsageError
from hookcli.pipeline import Prepared
from hookcli.profile.clocks import CUDA_EVENTS, SYNC, Clock, synced
from hookcli.profile.figures import CallTree, Timings, spread
from hookcli.profile.hooks import MemoryHooks
from hookcli.profile.runner import build_report, call_tree, collect, plan_profile, time_passes
from tests.conftest import assert_no_hooks, assert_same_state, invoke, state_snapshot
from tests.fixtures.profile_models import LOG, ROOT_MS, SLEEPS, ChangesCalls, Shared, SleepNet

SLEEP_TOL_MS = 2.0  # the task's bound; a sleep overshoots by scheduler latency only


def _rows(report: hookcli.Report) -> dict[str, dict[str, Any]]:
    return {r["name"]: r.to_dict() for r in report.rows("modules")}


def _live(model: nn.Module, *inputs: Any, mode: str = "eval") -> Prepared:
    from hookcli.api import live
    from hookcli.options import Mode

    return live(model, inputs, None, Mode(mode), None)


# -- sleeps: every row equals its sleep ----------------------------------------------------


@pytest.fixture(scope="module")
def sleep_run() -> Any:
    LOG.clear()
    plan = plan_profile(backward=True, warmup=1, repeat=5)
    m, error = collect(_live(SleepNet()), plan)
    assert error is None and m is not None
    return m, list(LOG)


def _slept(log: list[tuple[str, int, int]], direction: str, start: int, end: int) -> int:
    """The sleeps (as measured around time.sleep) that began inside [start, end]."""
    return sum(d for kind, t0, d in log if kind == direction and start <= t0 <= end)


def _assert_spans_match_sleeps(m: Any, log: list[tuple[str, int, int]], passes: int) -> None:
    """Every call's median self time equals the median of its own sleeps within 2 ms; its
    inclusive time the sleeps inside it within 2 ms per call of its subtree (each call
    adds its own unslept work: hooks, the multiply, the autograd function)."""
    tree, hooks, n = m.tree, m.hooks, m.tree.n
    directions = [("forward", hooks.starts, hooks.ends)]
    if m.timings.bwd_incl is not None:
        directions.append(("backward", hooks.bwd_starts, hooks.bwd_ends))
    size = [1] * n
    for i in range(n - 1, 0, -1):
        size[tree.parents[i]] += size[i]
    for direction, starts, ends in directions:
        for i, name in enumerate(tree.names):
            incl, slept, own, own_slept = [], [], [], []
            for p in range(passes):
                k = p * n + i
                span = ends[k] - starts[k]
                inside = _slept(log, direction, starts[k], ends[k])
                kids = [p * n + c for c in tree.children[i]]
                incl.append(span)
                slept.append(inside)
                own.append(span - sum(ends[c] - starts[c] for c in kids))
                own_slept.append(
                    inside - sum(_slept(log, direction, starts[c], ends[c]) for c in kids)
                )
            got, want = spread(own).median, spread(own_slept).median
            assert got == pytest.approx(want, abs=SLEEP_TOL_MS), (direction, name, "self")
            got, want = spread(incl).median, spread(slept).median
            assert got == pytest.approx(want, abs=SLEEP_TOL_MS * size[i]), (direction, name)
            assert want > 0


def test_sleep_rows_equal_their_sleeps(sleep_run: Any) -> None:
    # "Its sleep" is what the model measured around its own time.sleep calls: on a loaded
    # machine a 20 ms sleep can take 24 ms, and then the row should say 24, not 20.
    m, log = sleep_run
    tree = m.tree
    _assert_spans_match_sleeps(m, log, 5)
    # and the report's rows say the same: medians, never below the nominal sleeps
    report = build_report(_live(SleepNet()), plan_profile(backward=True), m, None)
    rows = _rows(report)
    for name, (fwd, bwd) in SLEEPS.items():
        i = tree.names.index(name)
        assert rows[name]["forward_ms"] == pytest.approx(m.timings.call_median_ms(i))
        assert rows[name]["forward_ms"] >= fwd - 0.1 and rows[name]["backward_ms"] >= bwd - 0.1
        assert rows[name]["forward_self_ms"] == pytest.approx(rows[name]["forward_ms"], abs=0.5)
    assert rows[""]["forward_self_ms"] >= ROOT_MS - 0.1  # a sleep never ends early
    assert rows[""]["forward_pct"] == 100.0 and rows["a"]["calls"] == 1
    assert report.totals["forward_ms"] == rows[""]["forward_ms"]


@pytest.fixture(scope="module")
def sleep_report() -> hookcli.Report:
    return hookcli.profile(SleepNet(), warmup=1, repeat=5)


def test_sleep_root_matches_a_bare_timed_forward(sleep_report: hookcli.Report) -> None:
    # A bare forward timed here with a plain perf_counter, no hookcli involved. The
    # sleeps dominate, so 10% holds even on a loaded machine.
    model, x = SleepNet(), torch.zeros(2, 4)
    times = []
    with torch.inference_mode():
        for _ in range(5):
            t0 = time.perf_counter()
            model(x)
            times.append((time.perf_counter() - t0) * 1e3)
    bare = statistics.median(times)
    assert sleep_report.totals["forward_ms"] == pytest.approx(bare, rel=0.10)
    # the report's own bare forward is the same kind of figure
    assert sleep_report.totals["bare_forward_ms"] == pytest.approx(bare, rel=0.10)


# -- nesting, per call ---------------------------------------------------------------------


def _resnet_small() -> tuple[nn.Module, torch.Tensor]:
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None).eval(), torch.randn(1, 3, 64, 64)


def test_children_inclusive_at_most_parent_per_call() -> None:
    model, x = _resnet_small()
    plan = plan_profile(backward=True, warmup=0, repeat=3)
    m, error = collect(_live(model, x), plan)
    assert error is None and m is not None and m.timings is not None
    t, tree = m.timings, m.tree
    checked = 0
    for p in range(plan.repeat):
        for i, kids in enumerate(tree.children):
            if not kids:
                continue
            assert sum(t.incl[p][c] for c in kids) <= t.incl[p][i], (p, tree.names[i])
            assert t.bwd_incl is not None
            parent_b = t.bwd_incl[p][i]
            kids_b = [t.bwd_incl[p][c] for c in kids]
            if parent_b is not None and None not in kids_b:
                # backward spans nest too (autograd may run siblings in either order)
                assert sum(k for k in kids_b if k is not None) <= parent_b, tree.names[i]
                checked += 1
    assert checked > 10  # residual blocks, layers, the root
    names = set(tree.names)
    assert {"layer4", "layer4.1.conv2", "fc"} <= names


def test_rows_are_per_module_with_calls_summed() -> None:
    model = Shared()
    report = hookcli.profile(model, warmup=0, repeat=3)
    rows = _rows(report)
    assert rows["act"]["calls"] == 3 and rows["fc1"]["calls"] == 1
    assert report.totals["calls"] == 6 and report.totals["modules"] == 4
    # FLOPs from cost's counter, checked against torch's own FlopCounterMode
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        model.fc1(torch.randn(4, 8))
    assert rows["fc1"]["flops"] == counter.get_total_flops() == 2 * 4 * 8 * 8
    assert rows["fc1"]["flops_per_s"] == pytest.approx(
        rows["fc1"]["flops"] / (rows["fc1"]["forward_ms"] / 1e3)
    )


@pytest.mark.parametrize("key", ["self", "inclusive", "calls", "flops"])
def test_sort(key: str) -> None:
    report = hookcli.profile(Shared(), warmup=0, repeat=2, sort=key)
    col = {"self": "forward_self_ms", "inclusive": "forward_ms"}.get(key, key)
    values = [r[col] for r in report.rows("modules")]
    assert values == sorted(values, reverse=True)


# -- torch.profiler record_function spans ------------------------------------------------


@pytest.mark.slow
def test_agrees_with_record_function_spans() -> None:
    # record_function spans opened and closed by hooks of the test's own around the
    # same modules, recorded by torch.profiler over the very passes hookcli times (so
    # machine load hits both alike). Their spans enclose ours and add the profiler's
    # per-op cost to bare and hooked passes alike, which the 10% bound covers.
    import torchvision
    from torch.profiler import ProfilerActivity, profile, record_function

    from hookcli.cost.runner import measure
    from hookcli.options import Mode
    from hookcli.profile.clocks import make_clock

    torch.manual_seed(0)
    model, x = torchvision.models.resnet18(weights=None).eval(), torch.randn(4, 3, 224, 224)
    names = ["conv1", "layer1", "layer2", "layer3", "layer4", "fc", ""]
    prepared = _live(model, x)
    plan = plan_profile(warmup=1, repeat=5)
    probe, records, error = measure(prepared, mode=Mode.EVAL)
    assert error is None
    tree = call_tree(probe, records)
    opened: dict[str, Any] = {}
    handles = []
    for n in names:
        label = f"span:{n or 'root'}"

        def pre(_m: nn.Module, _a: Any, label: str = label) -> None:
            opened[label] = record_function(label)
            opened[label].__enter__()

        def post(_m: nn.Module, _a: Any, _o: Any, label: str = label) -> None:
            opened.pop(label).__exit__(None, None, None)

        mod = model.get_submodule(n)
        handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            m = time_passes(prepared, plan, tree, probe, make_clock("cpu"))
    finally:
        for h in handles:
            h.remove()
    theirs: dict[str, list[tuple[float, float]]] = {}
    for e in prof.events():
        if e.name.startswith("span:"):
            span = (e.time_range.start, e.time_range.elapsed_us())
            theirs.setdefault(e.name.removeprefix("span:"), []).append(span)
    assert m.timings is not None
    # passes in time order: warmup (bare, hooked), then repeats alternating which goes first
    hooked = [2 * plan.warmup + 2 * r + (1 if r % 2 == 0 else 0) for r in range(plan.repeat)]
    for n in names:
        spans = [d for _, d in sorted(theirs["root" if n == "" else n])]
        assert len(spans) == 2 * (plan.warmup + plan.repeat)  # bare and hooked passes
        i = tree.names.index(n)
        ratios = [m.timings.incl[r][i] / 1e3 / spans[k] for r, k in enumerate(hooked)]
        assert statistics.median(ratios) == pytest.approx(1.0, rel=0.10), (n, ratios)
        ours = m.timings.call_median_ms(i)
        assert ours == pytest.approx(statistics.median(spans[k] for k in hooked) / 1e3, rel=0.10)


@pytest.mark.slow
def test_resnet18_root_within_10_percent_of_bare_forward() -> None:
    # slow: a timing comparison on a real model; a busy machine can upset it
    import torchvision

    torch.manual_seed(0)
    model, x = torchvision.models.resnet18(weights=None).eval(), torch.randn(4, 3, 224, 224)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two threads on a busy 2-core machine swing far more
    try:
        report = hookcli.profile(model, x, warmup=2, repeat=7)
        times = []
        with torch.inference_mode():
            for _ in range(7):
                t0 = time.perf_counter()
                model(x)
                times.append((time.perf_counter() - t0) * 1e3)
    finally:
        torch.set_num_threads(threads)
    assert report.totals["forward_ms"] == pytest.approx(statistics.median(times), rel=0.10)


# -- the trace --------------------------------------------------------------------------------


def _check_nesting(events: list[dict[str, Any]]) -> int:
    """Spans of one thread either contain each other or do not overlap; the deepest nest."""
    deepest = 0
    by_tid: dict[int, list[dict[str, Any]]] = {}
    for e in events:
        if e["ph"] == "X":
            by_tid.setdefault(e["tid"], []).append(e)
    for spans in by_tid.values():
        spans.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[float] = []
        for e in spans:
            start, end = e["ts"], e["ts"] + e["dur"]
            while stack and stack[-1] <= start:
                stack.pop()
            if stack:
                assert end <= stack[-1] + 1e-3, e  # inside the open span
            stack.append(end)
            deepest = max(deepest, len(stack))
    return deepest


def test_trace_parses_and_nests(tmp_path: Path) -> None:
    model, x = _resnet_small()
    out = tmp_path / "t.json"
    report = hookcli.profile(model, x, warmup=0, repeat=2, backward=True, trace_out=out)
    trace = json.loads(out.read_text())
    events = trace["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["cat"] for e in spans} == {"forward", "backward", "pass"}
    layer4 = {e["cat"] for e in spans if e["name"] == "layer4"}
    assert layer4 == {"forward", "backward"}
    # one span per call per pass and direction (backward: calls whose inputs need grad)
    calls = report.totals["calls"]  # 76: resnet18's 68 modules, relu called 2-3 times
    assert len([e for e in spans if e["cat"] == "forward"]) == 2 * calls
    # forward pass > root > layer4 > block > conv: at least 5 deep
    assert _check_nesting(events) >= 5
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert any("forward" in s for s in names)
    assert all(isinstance(e["ts"], (int, float)) and e["dur"] >= 0 for e in spans)


# -- clocks: CUDA events and --sync, faked -------------------------------------------------------


class FakeEvent:
    """torch.cuda.Event's interface on the host clock (the event path without a GPU)."""

    created = 0

    def __init__(self) -> None:
        FakeEvent.created += 1
        self.t: int | None = None

    def record(self) -> None:
        self.t = time.perf_counter_ns()

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.t is not None and end.t is not None, "read before recorded"
        return (end.t - self.t) / 1e6


def _sleep_measured(clock: Clock, backward: bool = True) -> Any:
    from hookcli.cost.runner import measure
    from hookcli.options import Mode

    prepared = _live(SleepNet())
    plan = plan_profile(backward=backward, warmup=0, repeat=3)
    probe, records, error = measure(prepared, mode=Mode.EVAL, backward=backward)
    assert error is None
    tree = call_tree(probe, records)
    LOG.clear()
    return tree, time_passes(prepared, plan, tree, probe, clock)


def test_event_clock_gives_the_sleeps() -> None:
    syncs = []
    FakeEvent.created = 0
    clock = Clock(CUDA_EVENTS, event=FakeEvent, synchronize=lambda: syncs.append(1))
    tree, m = _sleep_measured(clock)
    # events made once (start and end, forward and backward, per call), plus one origin
    # per timed forward and backward of each hooked pass: none per call per pass
    assert FakeEvent.created == 4 * tree.n + 2 * 3
    _assert_spans_match_sleeps(m, list(LOG), 3)
    # synchronize only at pass boundaries: 2 per forward (bare and hooked), 2 per backward
    assert len(syncs) == 3 * (2 + 2 + 2)


def test_sync_clock_synchronizes_in_every_hook() -> None:
    calls = []
    fake_sync = lambda: calls.append(1)  # noqa: E731
    clock = Clock(SYNC, now=synced(fake_sync), synchronize=fake_sync)
    tree, m = _sleep_measured(clock, backward=False)
    # per hooked pass: one in each pre and forward hook of every call, plus the 2 at the
    # pass's ends; per bare pass: those 2
    assert len(calls) == 3 * (2 * tree.n + 2 + 2)
    _assert_spans_match_sleeps(m, list(LOG), 3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_events_real() -> None:
    model = SleepNet().cuda()
    report = hookcli.profile(model, torch.zeros(2, 4, device="cuda"), warmup=1, repeat=3)
    assert report.settings["timer"] == CUDA_EVENTS
    rows = _rows(report)
    assert rows["block.1"]["forward_ms"] == pytest.approx(30.0, abs=SLEEP_TOL_MS)
    assert rows["block.1"]["memory_bytes"] is not None


def test_memory_hooks_fold_nested_peaks() -> None:
    # a fake allocator: each Alloc module allocates n bytes, frees `keep`-less of them
    state = {"cur": 1000, "peak": 1000}

    class Alloc(nn.Module):
        def __init__(self, n: int, keep: int) -> None:
            super().__init__()
            self.n, self.keep = n, keep

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            state["cur"] += self.n
            state["peak"] = max(state["peak"], state["cur"])
            state["cur"] -= self.n - self.keep
            return x

    model = nn.Sequential(Alloc(500, 100), nn.Sequential(Alloc(300, 0), Alloc(800, 50)))
    names = ["", "0", "1", "1.0", "1.1"]
    mods = [model.get_submodule(n) for n in names]
    tree = CallTree(
        names=tuple(names),
        types=tuple(type(m).__name__ for m in mods),
        depths=(0, 1, 1, 2, 2),
        parents=(-1, 0, 0, 2, 2),
        module_ids=tuple(id(m) for m in mods),
    )

    def reset() -> None:
        state["peak"] = state["cur"]

    mem = MemoryHooks(mods, tree, lambda: state["cur"], lambda: state["peak"], reset)
    mem.attach()
    try:
        model(torch.zeros(1))
    finally:
        mem.detach()
    # by hand: start 1000; "0" peaks at 1500 (delta 500) and leaves 1100; "1.0" peaks at
    # 1400 (delta 300) and leaves 1100; "1.1" peaks at 1900 (delta 800); "1" started at
    # 1100 and peaked at 1900 (800); the root started at 1000 and peaked at 1900 (900)
    assert mem.per_module() == [900, 500, 800, 300, 800]
    assert_no_hooks(model)


# -- figures -------------------------------------------------------------------------------------


def test_figures_self_and_spread_by_hand() -> None:
    tree = CallTree(
        names=("", "a", "b"), types=("R", "A", "B"), depths=(0, 1, 1),
        parents=(-1, 0, 0), module_ids=(1, 2, 2),
    )  # fmt: skip
    # two passes; "a" and "b" are two calls of one module (slot 1)
    starts = [0, 10, 50, 0, 20, 60]
    ends = [100, 40, 70, 200, 50, 90]
    t = Timings(tree, 2, starts, ends)
    assert t.self_[0] == [100 - 30 - 20, 30, 20]
    assert t.per_pass(t.incl, 1) == [50, 60]
    s = spread([1_000_000, 2_000_000, 3_000_000, 4_000_000])
    assert (s.median, s.q1, s.q3, s.low, s.high) == (2.5, 1.75, 3.25, 1.0, 4.0)


# -- the CLI ---------------------------------------------------------------------------------------


def test_cli_json_and_trace(tmp_path: Path) -> None:
    trace = tmp_path / "t.json"
    result = invoke(
        "profile", "tests.fixtures.profile_models:Shared", "--repeat", "3", "--warmup", "1",
        "--backward", "--trace-out", str(trace), "-f", "json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["command"] == "profile"
    keys = {"forward_ms", "forward_self_ms", "backward_ms", "calls", "flops_per_s"}
    assert all(keys <= set(r) for r in report["modules"])
    assert {"forward_ms", "backward_ms", "overhead_ratio"} <= set(report["totals"])
    assert report["totals"]["overhead_ratio"] > 0
    assert "trace written" in result.stderr and json.loads(trace.read_text())["traceEvents"]


def test_cli_table_and_depth() -> None:
    result = invoke("profile", "tests.fixtures.profile_models:SleepNet", "--repeat", "1",
                    "--warmup", "0", "--depth", "1", "--sort", "inclusive")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "Fwd ms" in out and "Overhead:" in out and "block.0" not in out
    lines = [ln for ln in out.splitlines() if ln.startswith(("(root)", "block ", "a "))]
    assert [ln.split()[0] for ln in lines] == ["(root)", "block", "a"]
    assert result.stderr == ""  # no progress bar in a pipe


def test_max_ms_gate() -> None:
    base = ["profile", "tests.fixtures.profile_models:SleepNet", "--repeat", "1", "--warmup", "0"]
    over = invoke(*base, "--max-ms", "block.*:5", "--max-ms", "(root):10000", "-f", "json")
    assert over.exit_code == 1
    checks = {c["name"]: c for c in json.loads(over.stdout)["checks"]}
    assert not checks["max-ms block.*"]["passed"]
    assert checks["max-ms block.*"]["layers"] == ["block.0", "block.1"]
    assert checks["max-ms (root)"]["passed"]
    ok = invoke(*base, "--max-ms", "Sleep:1000")
    assert ok.exit_code == 0, ok.stdout
    typo = invoke(*base, "--max-ms", "nosuch*:1000")
    assert typo.exit_code == 1 and "no module matches" in typo.stdout


def _hand_run(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Plain PyTorch: calls per module (forward hooks of the test's own) and the FLOPs
    torch's FlopCounterMode counts, for one forward."""
    from torch.utils.flop_counter import FlopCounterMode

    calls: dict[str, int] = {}
    handles = [
        m.register_forward_hook(lambda *_, n=name: calls.__setitem__(n, calls.get(n, 0) + 1))
        for name, m in model.named_modules()
    ]
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return calls, counter.get_total_flops()


def _profiled(report: dict[str, Any]) -> tuple[dict[str, int], int]:
    return {r["name"]: r["calls"] for r in report["modules"]}, report["totals"]["flops"]


def test_cli_input_file_keyword_dict_runs_that_forward(tmp_path: Path) -> None:
    from tests.fixtures import inputs_models as im

    g = torch.Generator().manual_seed(11)
    x, scale = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g)
    kwargs = {"x": x, "steps": torch.tensor(3), "scale": scale}
    path = tmp_path / "kw.pt"
    torch.save(kwargs, path)
    result = invoke(
        "profile", "tests.fixtures.inputs_models:Looped", "--input-file", str(path),
        "--repeat", "2", "--warmup", "0", "-f", "json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    torch.manual_seed(0)  # --seed 0 before the build, as hookcli does
    calls, flops = _hand_run(im.Looped().eval(), (), kwargs)
    assert calls == {"": 1, "fc": 3, "act": 4}  # 3 steps, and scale given
    assert _profiled(report) == (calls, flops)
    assert flops == 3 * 2 * 5 * 4 * 4
    assert report["inputs"] == [
        {"name": k, "shape": list(v.shape), "dtype": str(v.dtype).removeprefix("torch.")}
        for k, v in kwargs.items()
    ]
    assert report["settings"]["inputs"] == f"--input-file {path}"


def test_cli_inputs_from_runs_that_forward() -> None:
    from tests.fixtures import inputs_models as im

    spec = "tests.fixtures.inputs_models:looped_inputs"
    result = invoke(
        "profile", "tests.fixtures.inputs_models:Looped", "--inputs-from", spec, "--seed", "4",
        "--repeat", "2", "--warmup", "0", "-f", "json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    torch.manual_seed(4)
    model = im.Looped().eval()
    torch.manual_seed(4)  # right before the function, as documented
    args, kwargs = im.looped_inputs()
    calls, flops = _hand_run(model, args, kwargs)
    assert calls == {"": 1, "fc": 2, "act": 3}
    assert _profiled(report) == (calls, flops)
    assert [(i["name"], i["shape"]) for i in report["inputs"]] == [
        ("x", [6, 4]),
        ("steps", []),
        ("scale", [6, 4]),
    ]
    assert report["settings"]["inputs"] == f"--inputs-from {spec}"


def test_cli_one_input_source() -> None:
    base = ["profile", "tests.fixtures.inputs_models:Looped"]
    both = invoke(*base, "-i", "2x4", "--inputs-from", "tests.fixtures.inputs_models:looped_inputs")
    assert both.exit_code == 2 and "--input and --inputs-from" in both.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-ms", "layer1"], "expected GLOB:MS"),
        (["--max-ms", "layer1:-3"], "expected GLOB:MS"),
        (["--repeat", "0"], "--repeat"),
        (["--sort", "speed"], "--sort"),
        (["--device", "meta"], "no time"),
    ],
)
def test_bad_options_exit_2(args: list[str], message: str) -> None:
    result = invoke("profile", "sample_models:LeNet", *args)
    assert result.exit_code == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_model_that_raises_exits_4_naming_the_module() -> None:
    result = invoke("profile", "tests.fixtures.broken:RaisesInMiddle")
    assert result.exit_code == 4
    assert "block.1" in result.stderr and "Traceback" not in result.stderr


def test_changing_calls_are_reported() -> None:
    model = ChangesCalls()
    with pytest.raises(RunError, match="differ from pass to pass"):
        hookcli.profile(model, warmup=0, repeat=2)
    assert_no_hooks(model)


def test_model_left_as_found() -> None:
    model, x = _resnet_small()
    model.train()
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    before = state_snapshot(model)
    flags = [m._is_full_backward_hook for m in model.modules()]
    hookcli.profile(model, x, warmup=0, repeat=1, backward=True, mode="eval")
    assert_no_hooks(model)
    assert_same_state(before, state_snapshot(model))
    assert [m._is_full_backward_hook for m in model.modules()] == flags
    assert not x.requires_grad and x.grad is None


def test_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "p.png"
    hookcli.profile(Shared(), warmup=0, repeat=1, plot=png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_api_rejects_bad_options() -> None:
    with pytest.raises(UsageError):
        hookcli.profile(Shared(), repeat=0)


def test_hooks_keep_nothing_per_call() -> None:
    # Storage is allocated before the passes; a timed pass leaves no new object behind
    # that was allocated in the hooks' file (a list growing per call would show here).
    import tracemalloc

    from hookcli.profile.hooks import TimingHooks

    model = nn.Sequential(*[nn.Sequential(nn.Identity(), nn.Identity()) for _ in range(100)])
    mods = list(model.modules())
    names = [n for n, _ in model.named_modules()]
    parents = [-1] + [0 if "." not in n else names.index(n.rpartition(".")[0]) for n in names[1:]]
    tree = CallTree(
        names=tuple(names),
        types=tuple(type(m).__name__ for m in mods),
        depths=tuple(0 if not n else n.count(".") + 1 for n in names),
        parents=tuple(parents),
        module_ids=tuple(id(m) for m in mods),
    )
    hooks = TimingHooks(mods, tree, 3, now=time.perf_counter_ns)
    x = torch.zeros(1)
    hooks.begin_pass(0)
    hooks.attach()
    model(x)  # warm: first calls may intern or cache
    hooks.detach()
    tracemalloc.start()
    try:
        for p in (1, 2):
            hooks.begin_pass(p)
            hooks.attach()
            before = tracemalloc.take_snapshot()
            model(x)
            after = tracemalloc.take_snapshot()
            hooks.end_forward()
            hooks.detach()
            only = [tracemalloc.Filter(True, "*hookcli/profile/hooks.py")]
            grown = after.filter_traces(only).compare_to(before.filter_traces(only), "lineno")
            # the state's current ints (call counter, stack top) may be new objects: a few
            # dozen bytes; one object kept per call would be 301 x 28 bytes and more
            assert sum(max(s.size_diff, 0) for s in grown) <= 128, grown[:3]
    finally:
        tracemalloc.stop()
    assert all(
        hooks.ends[2 * tree.n + i] >= hooks.starts[2 * tree.n + i] > 0 for i in range(tree.n)
    )


def test_progress_bar_only_for_long_runs(capsys: pytest.CaptureFixture[str]) -> None:
    from hookcli.profile.runner import _Progress

    quick = _Progress(True, 10)
    quick.update(1, 0.1)  # 10 x 0.1 s: under ~2 s, no bar
    quick.close()
    assert capsys.readouterr().err == ""
    slow = _Progress(True, 10)
    slow.update(1, 0.5)
    slow.close()  # and the line is cleared
    err = capsys.readouterr().err
    assert "repeat 1/10" in err and err.endswith("\r")
    off = _Progress(False, 10)  # not a terminal
    off.update(1, 5.0)
    assert capsys.readouterr().err == ""


class InterruptedOnThirdForward(nn.Module):
    """Raises KeyboardInterrupt (Ctrl-C) in its third forward."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.n = 0
        self.example_input_array = torch.randn(2, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.n += 1
        if self.n == 3:
            raise KeyboardInterrupt
        return self.fc(x)


def test_ctrl_c_leaves_no_hooks() -> None:
    model = InterruptedOnThirdForward()
    with pytest.raises(KeyboardInterrupt):
        hookcli.profile(model, warmup=1, repeat=2, backward=True)
    assert_no_hooks(model)
    assert all(p.grad is None for p in model.parameters())
