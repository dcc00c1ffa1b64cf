"""The CPU reduction of ``stats`` (``host_vector``): every branch against plain float64 PyTorch.

``host_vector`` reads min and max and skips the passes they make needless; each
case below lands in one branch (NaN/Inf, one sign, zeros or not, a dominant mean,
odd layouts and sizes) and is compared with the statistics torch computes in
float64 on the same values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hookcli.options import HookKind, Mode, ModelOptions, RunOptions
from hookcli.pipeline import prepare, run_session
from hookcli.stats import probe as stats_mod
from hookcli.stats.probe import (
    Scratch,
    StatsProbe,
    host_all_finite,
    host_vector,
    tensor_vector,
)
from tests.test_stats import capture, ref_stats

KEYS = ("mean", "var", "min", "max", "mean_abs", "zeros", "nan", "inf")
CHUNK = stats_mod._CHUNK


def reference(t: torch.Tensor) -> dict[str, Any]:
    """The 8 figures straight from torch, in float64 (var is the population variance)."""
    x = t.detach().reshape(-1).double()
    return {
        "mean": x.mean().item(),
        "var": x.var(correction=0).item(),
        "min": x.min().item(),
        "max": x.max().item(),
        "mean_abs": x.abs().mean().item(),
        "zeros": int((x == 0).sum()),
        "nan": int(x.isnan().sum()),
        "inf": int(x.isinf().sum()),
    }


def check(got: list[float], want: dict[str, Any], rel: float = 2e-6) -> None:
    for k, g in zip(KEYS, got, strict=True):
        w = want[k]
        if k in ("zeros", "nan", "inf", "min", "max"):
            assert g == w or (g != g and w != w), (k, g, w)  # exact (NaN == NaN here)
        elif w != w:
            assert g != g, (k, g)
        else:
            assert g == pytest.approx(w, rel=rel, abs=1e-9), (k, g, w)


def _g() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=_g())


def _with(x: torch.Tensor, index: int, value: float) -> torch.Tensor:
    x = x.clone()
    x.view(-1)[index] = value
    return x


CASES: dict[str, Callable[[], torch.Tensor]] = {
    "mixed signs, no zero": lambda: _randn(3, 70000),
    "mixed signs, a few zeros": lambda: _with(_with(_randn(5, 60000), 7, 0.0), 299_999, -0.0),
    "relu output": lambda: _randn(8, 16, 33, 33).relu(),
    "all positive": lambda: _randn(4, 1000).exp(),
    "all negative": lambda: -_randn(1001).exp(),
    "non-positive with zeros": lambda: -_randn(2, CHUNK + 3).relu(),
    "all zeros": lambda: torch.zeros(CHUNK * 2 + 1),
    "constant": lambda: torch.full((3, 5), 7.25),
    "one element": lambda: torch.tensor([-3.5]),
    "0-dim": lambda: torch.tensor(2.0),
    "dominant mean (fallback variance)": lambda: _randn(50000) * 1e-3 + 100.0,
    "dominant mean, mixed signs": lambda: _randn(4, 4) + torch.tensor(-100.0),
    "subnormal values": lambda: _with(_randn(1000), 3, 1e-44),
    "large values (squares overflow float32)": lambda: _randn(1000) * 1e25,
    "NaN": lambda: _with(_randn(3, 300), 5, float("nan")),
    "+Inf": lambda: _with(_randn(3, 300), 5, float("inf")),
    "-Inf and zeros": lambda: _with(_randn(300).relu(), 9, float("-inf")),
    "+Inf and -Inf": lambda: _with(_with(_randn(300), 1, float("inf")), 2, float("-inf")),
    "NaN and Inf": lambda: _with(_with(_randn(300), 1, float("nan")), 2, float("inf")),
    "transposed": lambda: _randn(300, 200).relu().t(),
    "channels_last": lambda: (_randn(2, 8, 30, 30) - 0.5).to(memory_format=torch.channels_last),
    "expanded (stride 0)": lambda: _randn(1, 500).expand(40, 500),
    "strided slice": lambda: _randn(400, 300)[::3, 1::2],
    "float64": lambda: _randn(3, 10000).double() * 3 - 1,
    "bfloat16": lambda: _randn(3, 1000).bfloat16(),
    "float16 relu": lambda: _randn(3, 1000).half().relu(),
}


# The real chunk size, and one that divides nothing evenly; the sum of squares by
# torch.dot (where the BLAS is accurate) and by blocked norms (where it is not).
@pytest.mark.parametrize("dot", [True, False], ids=["dot", "norms"])
@pytest.mark.parametrize("chunk", [CHUNK, 1000])
@pytest.mark.parametrize("name", list(CASES))
def test_host_vector_equals_float64_torch(name, chunk, dot, monkeypatch):
    monkeypatch.setattr(stats_mod, "_CHUNK", chunk)
    monkeypatch.setattr(stats_mod, "_dot_is_accurate", lambda n: dot)
    t = CASES[name]()
    check(host_vector(t, Scratch()), reference(t))


def test_a_dot_that_adds_one_element_at_a_time_is_not_trusted(monkeypatch):
    # A BLAS whose dot accumulates sequentially in float32 drifts by ~5e-5 over a chunk;
    # the check must see it and send the sums of squares through the blocked norms.
    def sequential_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        # a float32 running total, one element at a time (numpy's float32 cumsum)
        products = (a * b).numpy()
        return torch.tensor(np.cumsum(products, dtype=np.float32)[-1])

    monkeypatch.setattr(stats_mod, "_dot_accurate", {})
    x = torch.rand(stats_mod._MT_CHUNK, generator=_g())
    want = torch.dot(x.double(), x.double()).item()
    assert abs(sequential_dot(x, x).item() - want) > 2e-6 * want  # it does drift
    with monkeypatch.context() as m:
        m.setattr(torch, "dot", sequential_dot)
        assert stats_mod._dot_is_accurate(stats_mod._MT_CHUNK) is False


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("size", [stats_mod._CHUNK, 2 * stats_mod._CHUNK, stats_mod._MT_CHUNK])
def test_the_dot_decision_is_right_for_this_machine(monkeypatch, threads, size):
    # Whatever this machine's BLAS does (MKL on an AMD EPYC is off by ~6e-6 at one
    # thread over 2**20 elements, by ~5e-7 over 2**17, by ~1e-7 on an Intel Xeon),
    # hookcli trusts torch.dot over a chunk of each size exactly when its error over
    # the probe is within the bound, and the sum of squares it then takes is within the
    # bound of float64 either way.
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        monkeypatch.setattr(stats_mod, "_dot_accurate", {})
        x = torch.rand(size, generator=torch.Generator().manual_seed(0))
        exact = x.double().square().sum().item()
        dot_error = abs(torch.dot(x, x).item() - exact) / exact
        assert stats_mod._dot_is_accurate(size) is (dot_error <= 2e-6)
        # the dot serves at one thread only, where it is accurate; else the norms
        assert stats_mod._dot_serves(size) is (threads == 1 and dot_error <= 2e-6)
        for n in (size, size // 2 + 3, 3 * stats_mod._BLOCK + 7, 100):
            c = torch.randn(n, generator=_g()) * 3 + 1
            want = c.double().square().sum().item()
            assert stats_mod._sum_sq(c, size) == pytest.approx(want, rel=2e-6)
    finally:
        torch.set_num_threads(saved)


def test_the_dot_is_asked_at_the_chunk_size_in_use_and_serves_one_thread_only(monkeypatch):
    # A dot that is trusted over one length need not be over another: host_vector asks
    # about the chunk it takes. With several threads the sum of squares goes through
    # the blocked norms on torch's threads, even where the BLAS dot would pass.
    asked: list[tuple[int, int]] = []
    dots: dict[int, int] = {1: 0, 2: 0}
    real_dot = torch.dot

    def probe(n: int) -> bool:
        asked.append((n, torch.get_num_threads()))
        return True

    def counted_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        dots[torch.get_num_threads()] += 1
        return real_dot(a, b)

    monkeypatch.setattr(stats_mod, "_dot_is_accurate", probe)
    saved = torch.get_num_threads()
    x = torch.randn(stats_mod._MT_CHUNK + 5, generator=_g())
    want = x.double().square().sum().item()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            with monkeypatch.context() as m:
                m.setattr(torch, "dot", counted_dot)
                vec = host_vector(x, Scratch())
            n = x.numel()
            assert vec[1] + vec[0] ** 2 == pytest.approx(want / n, rel=2e-6)
    finally:
        torch.set_num_threads(saved)
    # one thread: chunks that stay in the L2 cache, the dot asked about that length;
    # several: few, large chunks (each op wakes and joins the threads once), no dot
    assert set(asked) == {(stats_mod._CHUNK, 1)}
    assert dots[1] > 0 and dots[2] == 0


# The device reduction's variance overflows float32 where the CPU's falls back to float64.
@pytest.mark.parametrize("name", [n for n in CASES if "overflow" not in n])
def test_device_reduction_equals_float64_torch(name):
    t = CASES[name]()
    check(tensor_vector(t).tolist(), reference(t), rel=2e-5)  # the device's L1 norm: ~5e-6


def test_zero_count_is_exact_past_float32_integers():
    # 2**24 + 3 zeros: float32 cannot hold that count, the chunked float64 total can.
    n = (1 << 24) + 3
    x = torch.zeros(n + 2)
    x[-2:] = torch.tensor([-1.0, 2.0])
    got = host_vector(x, Scratch())
    assert got[5] == n
    assert got[4] == pytest.approx(3.0 / (n + 2))


def test_finite_tensor_takes_no_counting_pass(monkeypatch):
    # A finite tensor of one sign without zeros needs min, max, a sum and a sum of
    # squares per chunk: the NaN/Inf, zero and |x| passes are never run.
    def forbidden(*a: Any, **k: Any) -> Any:
        raise AssertionError("needless pass")

    monkeypatch.setattr(stats_mod, "tensor_vector", forbidden)
    monkeypatch.setattr(stats_mod, "_nonzero_count", forbidden)
    monkeypatch.setattr(stats_mod, "_abs_sum_min", forbidden)
    x = _randn(4, 5000).exp()
    check(host_vector(x, Scratch()), reference(x))


class _AtenCalls(TorchDispatchMode):
    """Every aten op below autograd, by name (what each one costs is its dispatch)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.calls.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _aten_calls(x: torch.Tensor) -> tuple[list[str], list[float]]:
    mode = _AtenCalls()
    with mode:
        vec = host_vector(x, Scratch())
    return mode.calls, vec


@pytest.mark.parametrize("kind", ["positive", "mixed", "relu"])
def test_a_chunk_costs_its_reductions_and_their_reads_alone(kind, monkeypatch):
    # What does not change from chunk to chunk (the cut, the scratch buffer's size,
    # whether the dot serves) is settled once per tensor: each further chunk adds
    # exactly its reductions and one read of each, not a slice or a buffer view.
    monkeypatch.setattr(stats_mod, "_CHUNK", 1000)
    monkeypatch.setattr(stats_mod, "_dot_is_accurate", lambda n: True)
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    make = {
        "positive": lambda n: torch.rand(n, generator=_g()) + 0.5,
        "mixed": lambda n: torch.randn(n, generator=_g()),
        "relu": lambda n: torch.randn(n, generator=_g()).relu(),
    }[kind]
    try:
        one, vec1 = _aten_calls(make(1000))
        eight, vec8 = _aten_calls(make(8000))
    finally:
        torch.set_num_threads(saved)
    per_chunk = {  # reductions (each read once) a chunk of this kind needs
        "positive": ["amin", "amax", "sum", "dot"],
        "mixed": ["amin", "amax", "sum", "dot", "abs", "sum", "amin"],
        "relu": ["amin", "amax", "sum", "dot", "ne", "sum"],
    }[kind]
    reads = sum(name not in ("abs", "ne") for name in per_chunk)
    extra = sorted(eight)
    for name in one:
        extra.remove(name)
    extra.remove("split")  # eight chunks are cut in one op
    assert extra == sorted(per_chunk * 7 + ["_local_scalar_dense"] * (reads * 7))
    for x, vec in ((make(1000), vec1), (make(8000), vec8)):
        check(vec, reference(x))


@pytest.mark.parametrize("cpu_reads", [True, False], ids=["cpu", "device"])
@pytest.mark.parametrize("spec", ["resnet18", "sample_models:InfModel"])
def test_both_paths_equal_plain_pytorch_on_a_model(spec, cpu_reads):
    prepared = prepare(
        ModelOptions(spec), RunOptions(inputs=("1x3x48x48",) if spec == "resnet18" else ())
    )
    probe = StatsProbe((HookKind.FORWARD,), cpu_reads=cpu_reads)
    outcome = run_session(prepared, [probe], mode=Mode.EVAL)
    assert outcome.error is None
    assert prepared.inputs is not None
    ref = capture(prepared.model.eval(), prepared.inputs.args)
    assert len(outcome.records) == len(ref)
    for rec in outcome.records:
        got = probe.forward_stats(rec.index)
        want = ref_stats(ref[(rec.name, rec.call)]["out"])
        assert got is not None and want is not None
        for k, w in want.items():
            g = getattr(got, k)
            if w != w:
                assert g != g, (rec.name, k)
            else:
                assert g == pytest.approx(w, rel=2e-5, abs=1e-6), (rec.name, rec.call, k, g, w)
    if spec.endswith("InfModel"):
        assert probe.origin is not None and probe.origin.name == "blowup"


@pytest.mark.parametrize("name", list(CASES))
def test_host_all_finite_equals_isfinite(name):
    t = CASES[name]()
    finite = _randn(7)
    assert host_all_finite([finite, t]) == bool(torch.isfinite(t).all())


@pytest.mark.parametrize(
    "values, finite",
    [
        ([3e38, 3e38], True),
        ([-3e38, -3e38, 1.0], True),
        ([3e38, float("inf")], False),
        ([float("inf"), float("-inf")], False),
        ([0.0, float("nan")], False),
    ],
)
def test_host_all_finite_when_the_sum_overflows(values, finite):
    # finite values whose float32 sum overflows are still finite; Inf - Inf is NaN
    t = torch.tensor(values, dtype=torch.float32)
    assert bool(torch.isfinite(t).all()) is finite
    assert host_all_finite([t]) is finite


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_a_stats_run_leaves_torch_threads_as_found(two_threads):
    prepared = prepare(ModelOptions("sample_models:NaNModel"), RunOptions())
    probe = StatsProbe((HookKind.FORWARD, HookKind.BACKWARD_PRE))
    outcome = run_session(prepared, [probe], mode=Mode.EVAL, backward=True)
    assert outcome.error is None and probe.origin is not None
    assert torch.get_num_threads() == 2


class _InPlace(torch.nn.Module):
    """Outputs changed in place after their hook ran: by an in-place ReLU (a module),
    by the parent's own code (``y.mul_``), and a child's output returned as is."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        self.relu = torch.nn.ReLU(inplace=True)
        self.tail = torch.nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        y = self.relu(y)  # the same tensor object as lin's output, changed
        y.mul_(-3.0)  # changed again, by no module
        return self.tail(y) if self.training is False else y


def test_reused_figures_follow_in_place_changes():
    # The probe reuses the figures of a tensor object it already reduced; a change in
    # place (version counter) must make it reduce again. Plain hooks that clone the
    # outputs are the oracle.
    torch.manual_seed(0)
    model = _InPlace().eval()
    x = torch.randn(5, 6, generator=_g())
    ref = capture(model, (x,))
    import hookcli

    report = hookcli.stats(model, x)
    rows = {(r["name"], r["call"]): r for r in report.to_dict()["layers"]}
    assert set(rows) == set(ref)
    for key, row in rows.items():
        want = ref_stats(ref[key]["out"])
        assert want is not None
        for k, w in want.items():
            assert row[k] == pytest.approx(w, rel=1e-5, abs=1e-7), (key, k, row[k], w)
    # the root and tail rows saw -3 * relu(lin(x)); relu's row saw relu(lin(x)) >= 0
    assert rows[("", 0)]["max"] <= 0 and rows[("relu", 0)]["min"] == 0
