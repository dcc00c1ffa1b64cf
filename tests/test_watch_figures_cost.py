"""The cheaper figures of ``hookcli watch``'s logged steps, each against a plain
computation: the one row-norm implementation (``hookcli.norms``: ``blocked_norm`` for
``hookcli grads``, ``RowNorms`` for ``watch``) against float64 on the shapes that take
each kind of row, and the activation statistics (half types reduced without a copy, a
container's unchanged output read once, an output changed in place read again, -0.0
counted as a zero) against plain float64 forward hooks. The cost guards count what the
monitor runs per module output (aten operations, reads), not time."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import hookcli
from hookcli.norms import BLOCK, BLOCKED_FROM, MIN_ROW, RowNorms, blocked_norm, row_dims


def _tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) / 10 + 0.01

    return {
        "conv": randn(128, 128, 3, 3),  # rows of 1,152: its output channels
        "linear": randn(1024, 4096),  # rows of 4,096
        "wide": randn(64, 40000),  # a row over BLOCK: rows of the flat view
        "narrow": randn(40000, 3),  # a row under MIN_ROW: rows of the flat view
        "flat": randn(3 * BLOCK + 77),  # one dimension, a last shorter row
        "channels_last": randn(64, 128, 4, 4).to(memory_format=torch.channels_last),
        "transposed": randn(300, 700).t(),  # rows of 300 elements, not contiguous
        "float64": randn(512, 512).double(),
    }


def _exact(t: torch.Tensor) -> float:
    if t.is_complex():
        return float(torch.linalg.vector_norm(t.to(torch.complex128)))
    return float(t.double().square().sum().sqrt())


def test_row_kinds_are_what_the_docs_say() -> None:
    t = _tensors()
    assert row_dims(t["conv"].shape) == (1, 2, 3)
    assert row_dims(t["linear"].shape) == (1,)
    assert row_dims(t["wide"].shape) is None and BLOCK < 40000
    assert row_dims(t["narrow"].shape) is None and MIN_ROW > 3
    assert row_dims(t["flat"].shape) is None
    assert all(x.numel() >= BLOCKED_FROM for x in t.values())


def test_blocked_norm_is_float64_accurate_on_every_kind_of_row() -> None:
    """``hookcli grads``' norm of one tensor: within 1e-6 of float64 (float32 inputs),
    in the dtype ``torch.linalg.vector_norm`` gives; half types and complex too."""
    for name, t in _tensors().items():
        got = blocked_norm(t)
        assert got.dim() == 0 and got.dtype == torch.linalg.vector_norm(t).dtype, name
        assert math.isclose(float(got), _exact(t), rel_tol=1e-6), name
    big = _tensors()["linear"]
    half = big.bfloat16()
    got = blocked_norm(half)
    assert got.dtype == torch.float32
    assert math.isclose(float(got), _exact(half.float()), rel_tol=1e-6)
    z = torch.complex(big, big.flip(0))
    got = blocked_norm(z)
    assert got.dtype == torch.float32 and math.isclose(float(got), _exact(z), rel_tol=1e-6)
    small = torch.randn(100)
    assert float(blocked_norm(small)) == float(torch.linalg.vector_norm(small))


def test_blocked_norm_passes_nan_and_inf_through() -> None:
    t = _tensors()["conv"].clone()
    t[5, 7, 1, 1] = math.inf
    assert float(blocked_norm(t)) == math.inf
    t[9, 0, 0, 0] = math.nan
    assert math.isnan(float(blocked_norm(t)))


def test_row_norms_of_several_tensors_are_each_tensors_norm() -> None:
    """``watch``'s fused reading: one float64 vector, each entry within 1e-6 of float64,
    ``each(j)`` called once per tensor before it is read, a changed shape refused."""
    tensors = list(_tensors().values())
    rows = RowNorms.of(tensors)
    seen: list[int] = []
    got = rows.norms(tensors, seen.append)
    assert got.dtype == torch.float64 and seen == list(range(len(tensors)))
    for value, t in zip(got.tolist(), tensors, strict=True):
        assert math.isclose(value, _exact(t), rel_tol=1e-6)
    with pytest.raises(RuntimeError):
        rows.norms([t.reshape(-1) for t in tensors])


class _Doubled(nn.Module):
    """A wrapper that changes its child's output in place before returning it."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        y = self.inner(x)
        y.mul_(2)
        return y


class _NegZero(nn.Module):
    def forward(self, x):
        return torch.where(x > 0, x, -0.0 * x.abs())  # -0.0 where x <= 0


def _model(dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Sequential(nn.Linear(16, 64), nn.ReLU()),  # returns its last child's output
        _Doubled(nn.Linear(64, 64)),  # returns its child's output, changed
        _NegZero(),
        nn.Linear(64, 1),
    ).to(dtype)


class _Plain:
    """Plain forward hooks: each module's first training output, in float64."""

    def __init__(self, model: nn.Module) -> None:
        self.stats: dict[str, dict[str, float]] = {}
        for name, m in model.named_modules():
            m.register_forward_hook(self._hook(name))

    def _hook(self, name: str) -> Any:
        def hook(module: nn.Module, args: Any, out: torch.Tensor) -> None:
            if name in self.stats or not torch.is_grad_enabled():
                return
            t = out.detach().double()
            self.stats[name] = {
                "mean": float(t.mean()),
                "std": float(t.std(unbiased=False)),
                "absmax": float(t.abs().max()),
                "zero_frac": float((t == 0).double().mean()),
            }

        return hook


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_activation_statistics_equal_plain_float64_hooks(dtype: torch.dtype) -> None:
    model = _model(dtype)
    plain = _Plain(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 16).to(dtype)
    with hookcli.watch(model, opt, every=1) as w:
        for _ in range(2):
            plain.stats.clear()
            model(x).float().square().mean().backward()
            opt.step()
            opt.zero_grad()
    record = [r for r in w.records if r["kind"] == "step"][1]  # step 2: a full forward
    assert set(plain.stats) == {n for n, m in record["modules"].items() if "act" in m}
    for name, want in plain.stats.items():
        got = record["modules"][name]["act"]
        for key, value in want.items():
            assert math.isclose(got[key], value, rel_tol=1e-5, abs_tol=1e-6), (name, key)
    # the container's figures are its last child's; the in-place change is seen
    assert record["modules"]["0"]["act"] == record["modules"]["0.1"]["act"]
    assert record["modules"]["1"]["act"]["absmax"] == pytest.approx(
        2 * record["modules"]["1.inner"]["act"]["absmax"], rel=1e-6
    )
    assert 0.2 < record["modules"]["2"]["act"]["zero_frac"] < 0.8  # the -0.0 entries


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_a_module_output_costs_five_reductions_and_a_repeat_none() -> None:
    """The cost guard of the forward hook on a logged step: per module output at most
    six aten operations (the bool view of the zero count and five reductions, no
    converted copy of a half-type output, no stack), and an output that a container
    returns unchanged is not read again."""
    from hookcli.watch import figures, monitor

    for dtype in (torch.float32, torch.bfloat16):
        out = torch.randn(8, 64).to(dtype)
        with _Count() as count:
            figures._stats(out)
        # (a detach is a view, no pass over the data: some torch versions dispatch one)
        passes = [op for op in count.ops if not op.startswith("aten.detach")]
        assert len(passes) <= 6, count.ops
        assert sum("_to_copy" in op for op in count.ops) == 1, count.ops  # the bool one
    calls = []
    real = monitor._stats

    def counted(t: torch.Tensor) -> Any:
        calls.append(t)
        return real(t)

    model = _model(torch.float32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor._stats = counted  # type: ignore[assignment]
    try:
        with hookcli.watch(model, opt, every=1):
            for _ in range(2):
                calls.clear()
                model(torch.randn(4, 16)).square().mean().backward()
                opt.step()
                opt.zero_grad()
    finally:
        monitor._stats = real  # type: ignore[assignment]
    # 8 modules; the outer Sequential returns its last Linear's output and "0" its
    # ReLU's: 6 reads ("1" returns its child's output changed in place: read again)
    assert len(calls) == 6


def test_the_forward_hook_keeps_no_module_output_alive() -> None:
    """The output read last (kept to spot a container returning it again) is held
    weakly: once the script drops it, it is freed before the step, as unwatched."""
    import gc
    import weakref

    model = _model(torch.float32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with hookcli.watch(model, opt, every=1) as w:
        for _ in range(2):
            out = model(torch.randn(4, 16))
            gone = weakref.ref(out)
            out.square().mean().backward()
            del out
            gc.collect()
            assert gone() is None
            opt.step()
            opt.zero_grad()
    assert [r["step"] for r in w.records if r["kind"] == "step"] == [1, 2]


class _Rotary(nn.Module):
    """A table built under inference_mode at construction, returned as it is (a rotary
    or positional cache): an inference tensor, which has no version counter."""

    def __init__(self):
        super().__init__()
        with torch.inference_mode():
            self.table = torch.randn(8, 16)

    def forward(self, x):
        return self.table


class _WithTable(nn.Module):
    def __init__(self):
        super().__init__()
        self.rot = _Rotary()
        self.lin = nn.Linear(16, 1)

    def forward(self, x):
        return self.lin(x + self.rot(x).clone())


@pytest.mark.parametrize("nan_origin", [False, True])
def test_an_inference_tensor_output_is_measured_and_the_watch_goes_on(nan_origin: bool) -> None:
    torch.manual_seed(0)
    model = _WithTable()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 16)
    with hookcli.watch(model, opt, every=1, nan_origin=nan_origin) as w:
        for _ in range(3):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    steps = [r for r in w.records if r["kind"] == "step"]
    assert len(steps) == 3  # (the monitor went on past step 1)
    want = float(model.rot.table.double().abs().max())
    # (the first step's forward ran before the monitor knew a step was logged)
    got = [s["modules"]["rot"]["act"]["absmax"] for s in steps[1:]]
    assert got == [pytest.approx(want)] * 2


def test_the_watchs_norm_vector_is_each_tensors_norm_in_fewer_operations() -> None:
    """A model's norms, small and large CPU tensors interleaved (float32, half types):
    a small tensor's norm is ``torch._foreach_norm``'s (what ``clip_grad_norm_``
    computes) exactly, a large one's within 1e-6 of float64, NaN and Inf through,
    ``each(j)`` once per large tensor, in the tensors' order."""
    from hookcli.watch.figures import _norms, _Plan

    big = [t.contiguous() for t in _tensors().values() if t.dtype == torch.float32]
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        gen = torch.Generator().manual_seed(1)
        small = [torch.randn(n, generator=gen) for n in (10, 300, 7, 2000, 1)]
        tensors = [t.to(dtype) for pair in zip(small, big, strict=False) for t in pair]
        tensors += [t.to(dtype) for t in big[len(small) :]]
        tensors[2] = tensors[2].clone().fill_(float("nan"))  # a small one
        tensors[3] = tensors[3].clone()
        tensors[3].view(-1)[5] = float("inf")  # a large one
        tensors[4] = torch.zeros_like(tensors[4])
        plan = _Plan.of(tensors)
        assert plan.gather is not None  # the fused reading
        seen: list[int] = []
        got = _norms(tensors, plan, seen.append).tolist()
        assert seen == list(range(len(plan.blocked)))
        for i, (value, t) in enumerate(zip(got, tensors, strict=True)):
            if t.numel() < BLOCKED_FROM:
                low = torch.float32 if dtype != torch.float32 else None
                (want,) = torch._foreach_norm([t], 2, dtype=low)
                assert value == float(want) or (math.isnan(value) and math.isnan(want)), i
            elif i == 3:
                assert value == math.inf
            else:
                assert math.isclose(
                    value, _exact(t), rel_tol=1e-6 if dtype == torch.float32 else 1e-3
                ), i


def test_the_parameters_copy_is_reused_then_let_go_when_the_watch_ends() -> None:
    """On the CPU a logged step's copy of the parameters (for the update ratio) serves
    every logged step of the watch, and is freed when its block ends while ``w`` (the
    records) lives on. Each step's update ratio equals a plain copy's ||w1 - w0|| /
    ||w0||."""
    import gc
    import weakref

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    plain: list[float] = []
    copies: list[list[weakref.ref[torch.Tensor]]] = []
    with hookcli.watch(model, opt, every=1) as w:
        for _ in range(3):
            model(torch.randn(4, 256)).square().mean().backward()
            before = [p.detach().clone() for p in model[0].parameters()]
            opt.step()
            after = list(model[0].parameters())
            du = math.sqrt(
                sum(
                    float((a.detach().double() - b.double()).square().sum())
                    for a, b in zip(after, before, strict=True)
                )
            )
            w0 = math.sqrt(sum(float(b.double().square().sum()) for b in before))
            plain.append(du / w0)
            track = w._monitor._all_tracks[0]  # type: ignore[union-attr]
            assert track.kept is not None
            copies.append([weakref.ref(t) for t in track.kept])
            opt.zero_grad()
    # one buffer for the three logged steps
    assert all(a() is b() for step in copies[1:] for a, b in zip(step, copies[0], strict=True))
    gc.collect()
    assert all(ref() is None for ref in copies[0])
    ratios = [r["modules"]["0"]["update_ratio"] for r in w.records if r["kind"] == "step"]
    assert len(ratios) == 3
    for got, want in zip(ratios, plain, strict=True):
        assert math.isclose(got, want, rel_tol=1e-5)
