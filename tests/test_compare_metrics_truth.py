"""compare's per-tensor figures on many kinds of pairs, each against float64 (complex128)
arithmetic by hand: the sums, the worst element and its values, the count beyond the
tolerance (``torch.isclose`` in float64, NaN equal to NaN) and the NaN/Inf counts.

The kinds: nearly equal pairs (b = a * (1 + 1e-7), where relative L2 and SQNR hang on
the difference's own norm), pairs far apart, one side a scaled copy of the other (norms
1e-8 to 1e5 apart), float16/bfloat16/float64 sides, NaN and Inf (on one side, on both at
one place), complex, 0-d, empty and one-element tensors, transposed and channels-last
tensors, shapes that differ by a dim of 1, and sizes on either side of the small path
(``metrics._SMALL``) and of a piece (``metrics._PIECE``), with a short last row."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from hookcli.compare import metrics

REL = 1e-6  # every figure within this (relative) of float64's


def _truth(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float) -> dict[str, Any]:
    cplx = a.is_complex() or b.is_complex()
    wide = torch.complex128 if cplx else torch.float64
    a64 = a.to(wide).reshape(-1)
    b64 = b.to(wide).reshape(a64.shape)
    close = torch.isclose(b64, a64, rtol=rtol, atol=atol, equal_nan=True)
    same = close & ~torch.isfinite(a64)  # equal NaN/Inf pairs: out of the figures
    ka, kb = a64.masked_fill(same, 0), b64.masked_fill(same, 0)
    d = kb - ka
    mag = d.abs()
    # the worst: a pair that isclose fails where |b - a| is NaN first, else the largest
    keys = torch.where(torch.isnan(mag), torch.where(close, -1.0, math.inf), mag)
    k = int(keys.argmax())  # (the first of equal largest)
    na, nb, nd = (float(torch.linalg.vector_norm(x)) for x in (ka, kb, d))
    dot = float(torch.vdot(ka, kb).real) if cplx else float(ka @ kb)
    return {
        "max_abs": float(mag[k]),
        "rel_l2": nd / na if na > 0 else (0.0 if nd == 0 else math.inf),
        "cosine": dot / (na * nb) if na > 0 and nb > 0 else (1.0 if na == nb == 0 else 0.0),
        "sq": (na, nd),
        "mismatched": int((~close).sum()),
        "nonfinite_a": int((~torch.isfinite(a64)).sum()),
        "nonfinite_b": int((~torch.isfinite(b64)).sum()),
        "k": k,
        "value_a": float(a64[k].abs() if cplx else a64[k]),
        "value_b": float(b64[k].abs() if cplx else b64[k]),
    }


def _near(got: float | None, want: float, rel: float = REL, abs_: float = 0.0) -> bool:
    assert got is not None
    if math.isnan(want) or math.isinf(want):
        return got == want or (math.isnan(got) and math.isnan(want))
    return abs(got - want) <= max(rel * abs(want), abs_)


def _check(a: torch.Tensor, b: torch.Tensor) -> None:
    got = metrics.tensor_diff(0, a, b)
    want = _truth(a, b, got.rtol, got.atol)
    assert got.mismatched == want["mismatched"]
    assert (got.nonfinite_a, got.nonfinite_b) == (want["nonfinite_a"], want["nonfinite_b"])
    assert _near(got.max_abs, want["max_abs"])
    assert _near(got.rel_l2, want["rel_l2"])
    # the cosine's error is one of |a| |b| (an angle's), not of the cosine itself
    assert _near(got.cosine, want["cosine"], abs_=REL)
    na, nd = want["sq"]
    if math.isfinite(na) and math.isfinite(nd) and na > 0 and nd > 0:
        want_db = 10 * math.log10(na * na / (nd * nd))
        assert got.sqnr_db is not None
        assert _near(got.sqnr_db, want_db, abs_=1e-5)  # (the dB of a ratio within 2e-6)
    if a.numel():
        flat = want["k"]
        assert got.worst == tuple(torch.unravel_index(torch.tensor(flat), a.shape))
        assert _near(got.value_a, want["value_a"], rel=0)
        assert _near(got.value_b, want["value_b"], rel=0)


def _randn(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


SIZES = [1, 1000, metrics._SMALL, metrics._SMALL + 1, 49152, metrics._PIECE + 777]


@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize(
    "kind", ["nearly equal", "noise 1e-3", "relu-like", "scaled 1e5", "scaled 1e-8", "sparse"]
)
def test_float32_pairs_equal_float64_by_hand(numel: int, kind: str) -> None:
    a = _randn(numel)
    noise = _randn(numel, seed=1)
    if kind == "nearly equal":
        b = a * (1 + 1e-7)
    elif kind == "noise 1e-3":
        b = a + 1e-3 * noise
    elif kind == "relu-like":  # all positive, far from zero: long sums of one sign
        a = a.relu() + 3
        b = a * (1 + 2e-6) + 1e-5 * noise
    elif kind == "scaled 1e5":
        b = a * 1e5
    elif kind == "scaled 1e-8":
        b = a * 1e-8
    else:  # a few elements differ, two equally far (the first is named)
        b = a.clone()
        for i in {numel // 3, numel - 1, numel // 2}:
            b[i] = a[i] + 0.25
    _check(a, b)


@pytest.mark.parametrize("numel", [1000, 49152, metrics._PIECE + 5])
@pytest.mark.parametrize(
    "dtypes",
    [
        (torch.float32, torch.float16),
        (torch.float32, torch.bfloat16),
        (torch.bfloat16, torch.bfloat16),
        (torch.float16, torch.float32),
        (torch.float64, torch.float64),
        (torch.float32, torch.float64),
    ],
)
def test_other_dtypes_equal_float64_by_hand(numel: int, dtypes: tuple[Any, Any]) -> None:
    a = _randn(numel).to(dtypes[0])
    b = (a.double() * (1 + 1e-3) + 1e-4 * _randn(numel, seed=1).double()).to(dtypes[1])
    _check(a, b)


@pytest.mark.parametrize("numel", [7, 49152])
@pytest.mark.parametrize(
    "plant",
    ["nan in b", "inf in b", "inf in a", "equal nans", "equal infs", "opposite infs", "nan in a"],
)
def test_nan_and_inf_equal_float64_by_hand(numel: int, plant: str) -> None:
    a = _randn(numel)
    b = a * (1 + 1e-3)
    i, j = 2, numel - 3
    if plant == "nan in b":
        b[j] = math.nan
    elif plant == "inf in b":
        b[i] = math.inf
    elif plant == "inf in a":
        a[j] = -math.inf
    elif plant == "equal nans":
        a[i] = b[i] = math.nan
    elif plant == "equal infs":
        a[j] = b[j] = math.inf
    elif plant == "opposite infs":
        a[i], b[i] = math.inf, -math.inf
    else:
        a[i] = math.nan
    _check(a, b)


@pytest.mark.parametrize("numel", [30, 49152])
def test_complex_pairs_equal_complex128_by_hand(numel: int) -> None:
    a = torch.complex(_randn(numel), _randn(numel, seed=2))
    b = torch.complex(a.real * (1 + 1e-4), a.imag * (1 - 3e-4))
    _check(a, b)
    _check(a.real.contiguous(), b)  # a real side against a complex one


@pytest.mark.parametrize(
    "make",
    [
        lambda: (torch.tensor(1.5), torch.tensor(1.5 + 1e-3)),
        lambda: (torch.tensor([2.0]), torch.tensor([2.0])),
        lambda: (torch.zeros(50_000), torch.zeros(50_000)),
        lambda: (torch.zeros(50_000), _randn(50_000)),
        lambda: (_randn(50_000), torch.zeros(50_000)),
    ],
    ids=["0-d", "one element", "both zero", "a zero", "b zero"],
)
def test_edge_pairs_equal_float64_by_hand(make: Any) -> None:
    a, b = make()
    _check(a, b)


def test_empty_pairs() -> None:
    got = metrics.tensor_diff(0, torch.zeros(0, 3), torch.zeros(0, 3))
    assert (got.max_abs, got.rel_l2, got.cosine, got.mismatched) == (0.0, 0.0, 1.0, 0)


@pytest.mark.parametrize("layout", ["transposed", "channels_last", "one side transposed"])
def test_strided_pairs_are_compared_by_logical_index(layout: str) -> None:
    """The worst element is named by its index in the tensor's shape, whatever the
    memory order of either side."""
    if layout == "channels_last":
        a = _randn(4, 64, 28, 28).contiguous(memory_format=torch.channels_last)
        b = (a * (1 + 1e-4)).contiguous(memory_format=torch.channels_last)
        b[1, 3, 5, 7] += 1.0
    else:
        a = _randn(600, 300).t()
        b = a * (1 + 1e-4)
        b[17, 401] += 1.0
        if layout == "one side transposed":
            b = b.contiguous()
    _check(a, b)
    got = metrics.tensor_diff(0, a, b)
    assert got.worst == ((1, 3, 5, 7) if layout == "channels_last" else (17, 401))


def test_shapes_that_differ_by_a_dim_of_one() -> None:
    a = _randn(1, 49152)
    b = (a * (1 + 1e-3)).reshape(49152)
    b[100] += 1.0
    _check(a, b.reshape(1, 49152))
    got = metrics.tensor_diff(0, a, b)
    assert got.worst == (0, 100) and got.problem is None
