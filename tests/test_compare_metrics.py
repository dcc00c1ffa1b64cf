"""compare's per-tensor figures on tensors of several pieces (``metrics._PIECE``), against
a float64 computation by hand: the sums, the worst element and the count beyond the
tolerance come out as on one piece, wherever in the tensor they are."""

from __future__ import annotations

import math

import pytest
import torch

from hookcli.compare import metrics


def _by_hand(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float) -> dict[str, float]:
    a64, b64 = a.double().reshape(-1), b.double().reshape(-1)
    d = b64 - a64
    na, nd = float(a64.norm()), float(d.norm())
    return {
        "max_abs": float(d.abs().max()),
        "rel_l2": nd / na,
        "cosine": float(a64 @ b64) / (na * float(b64.norm())),
        "sqnr_db": 10 * math.log10(na * na / (nd * nd)),
        "mismatched": int((~torch.isclose(b64, a64, rtol=rtol, atol=atol)).sum()),
        "worst": int(d.abs().argmax()),
    }


@pytest.mark.parametrize("dtype_b", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_figures_over_several_pieces_equal_float64_by_hand(
    dtype_b: torch.dtype, where: str
) -> None:
    piece = metrics._PIECE
    n = 3 * piece + 1234  # three whole pieces and a short one (not a multiple of a row)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, generator=gen)
    b = (a + 1e-7 * torch.randn(n, generator=gen)).to(dtype_b)
    spot = {"first": 5, "middle": 2 * piece + 77, "last": n - 3}[where]
    b[spot] += 0.5  # the worst element, in one piece only
    b[piece + 10 : piece + 20] += 1e-3  # beyond atol in the second piece as well
    shape = (n // 2, 2) if n % 2 == 0 else (n,)
    got = metrics.tensor_diff(0, a.reshape(shape), b.reshape(shape))
    rtol, atol = got.rtol, got.atol
    want = _by_hand(a, b.float(), rtol, atol)
    assert got.max_abs == pytest.approx(want["max_abs"], rel=1e-6)
    assert got.rel_l2 == pytest.approx(want["rel_l2"], rel=1e-5)
    assert got.cosine == pytest.approx(want["cosine"], rel=1e-9)
    assert got.sqnr_db == pytest.approx(want["sqnr_db"], rel=1e-5)
    assert got.mismatched == want["mismatched"]
    flat = want["worst"]
    assert got.worst == ((flat // 2, flat % 2) if len(shape) == 2 else (flat,))
    assert got.value_a == float(a[flat]) and got.value_b == float(b[flat].float())


def test_nonfinite_in_a_later_piece_takes_the_float64_sweep() -> None:
    n = 2 * metrics._PIECE + 5
    a = torch.ones(n)
    b = a.clone()
    b[metrics._PIECE + 3] = float("nan")
    got = metrics.tensor_diff(0, a, b)
    assert got.nonfinite_b == 1 and got.nonfinite_a == 0
    assert got.mismatched == 1
    assert got.worst == (metrics._PIECE + 3,)


def test_the_count_beyond_tolerance_is_exact_past_float32_integers() -> None:
    """Each piece counts in float32 (exact up to 2**24 a piece); the pieces' counts add up
    exactly past 2**24 elements."""
    n = (1 << 24) + 3
    got = metrics.tensor_diff(0, torch.zeros(n), torch.ones(n))
    assert got.mismatched == n


@pytest.mark.parametrize("size", [1, 777, "small", "small+1", "piece+1"])
@pytest.mark.parametrize("dtype_b", [torch.float32, torch.float16])
def test_small_and_large_pairs_equal_float64_by_hand(size: int | str, dtype_b: torch.dtype) -> None:
    """Pairs up to ``_SMALL`` elements take the float64 path, larger ones the pieces: both
    give float64's figures, the count isclose's and the first of equal worst elements."""
    n = {"small": metrics._SMALL, "small+1": metrics._SMALL + 1, "piece+1": metrics._PIECE + 1}
    numel = n.get(str(size), size)
    assert isinstance(numel, int)
    gen = torch.Generator().manual_seed(numel)
    a = torch.randn(numel, generator=gen)
    b = (a * (1 + 3e-6) + 1e-6 * torch.randn(numel, generator=gen)).to(dtype_b)
    if numel > 3:  # two equal worst elements (exact in either dtype): the first is named
        for i in (numel // 3, numel - 2):
            a[i], b[i] = 1.0, 1.25
    got = metrics.tensor_diff(0, a, b)
    want = _by_hand(a, b.float(), got.rtol, got.atol)
    assert got.max_abs == pytest.approx(want["max_abs"], rel=1e-6)
    assert got.rel_l2 == pytest.approx(want["rel_l2"], rel=1e-5)
    assert got.cosine == pytest.approx(want["cosine"], rel=1e-9)
    assert got.mismatched == want["mismatched"]
    assert got.worst == (want["worst"],)
    if numel > 3:
        assert want["worst"] == numel // 3
    assert got.value_a == float(a[want["worst"]])
    assert got.value_b == float(b[want["worst"]].float())


def test_complex_pairs_are_compared_by_modulus_as_isclose() -> None:
    """A difference in the imaginary parts alone is measured (not cast away), against
    complex128 arithmetic by hand: |.| is the modulus, the count isclose's (as
    assert_close decides); a real side against a complex one has imaginary parts of 0."""
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(6, 5, dtype=torch.complex64, generator=gen)
    b = torch.complex(a.real, a.imag * 1.35)  # the real parts equal
    got = metrics.tensor_diff(0, a, b)
    a128, b128 = a.to(torch.complex128), b.to(torch.complex128)
    d = b128 - a128
    assert got.rel_l2 == pytest.approx(float(d.norm() / a128.norm()), rel=1e-6)
    assert got.cosine == pytest.approx(
        float(torch.vdot(a128.flatten(), b128.flatten()).real / (a128.norm() * b128.norm())),
        rel=1e-9,
    )
    assert got.max_abs == pytest.approx(float(d.abs().max()), rel=1e-9)
    flat = int(d.abs().flatten().argmax())
    assert got.worst == (flat // 5, flat % 5)
    assert got.value_b == pytest.approx(float(b128.flatten()[flat].abs()), rel=1e-9)
    want_bad = int((~torch.isclose(b128, a128, rtol=got.rtol, atol=got.atol)).sum())
    assert got.mismatched == want_bad > 0 and got.diverged
    # within isclose's modulus tolerance, though one part alone is not
    near = metrics.tensor_diff(0, torch.full((3,), 1000 + 0.001j), torch.full((3,), 1000 + 0.0011j))
    assert near.mismatched == 0 and not near.diverged
    real = metrics.tensor_diff(0, a.real.contiguous(), a)
    assert real.rel_l2 == pytest.approx(float(a.imag.norm() / a.real.norm()), rel=1e-6)


@pytest.mark.parametrize("scale", [1e-8, 1e-6, 1e-3, 1e3, 1e5])
@pytest.mark.parametrize("numel", [300, 300_000])
def test_the_cosine_of_a_scaled_copy_is_one(scale: float, numel: int) -> None:
    """B a scaled copy of A (the cosine 1 in float64 by hand), small and large pairs."""
    a = torch.randn(numel, generator=torch.Generator().manual_seed(1))
    b = a * scale
    got = metrics.tensor_diff(0, a, b)
    a64, b64 = a.double(), b.double()
    want = float(a64 @ b64 / (a64.norm() * b64.norm()))
    # (within the sums' documented ~1e-7; the three-sum formula was 1e-6 to 1 off here)
    assert got.cosine == pytest.approx(want, abs=1e-7) and got.cosine <= 1.0


@pytest.mark.parametrize("numel", [4, 300_000])
def test_an_inf_in_b_where_a_is_finite(numel: int) -> None:
    a = torch.ones(numel)
    b = a.clone()
    b[1] = float("inf")
    got = metrics.tensor_diff(0, a, b)
    assert got.sqnr_db == -math.inf and got.rel_l2 == math.inf
    assert got.nonfinite_b == 1 and got.mismatched == 1 and got.worst == (1,)


def test_a_nan_on_both_sides_is_not_the_worst_element() -> None:
    """isclose(equal_nan=True) takes a NaN pair as equal: the worst is the real mismatch."""
    got = metrics.tensor_diff(0, torch.tensor([math.nan, 1.0]), torch.tensor([math.nan, 2.0]))
    assert got.worst == (1,) and got.mismatched == 1 and got.max_abs == 1.0
    assert (got.value_a, got.value_b) == (1.0, 2.0)


@pytest.mark.parametrize("numel", [20_000, 300_000])
def test_equal_nans_leave_the_figures_of_the_rest(numel: int) -> None:
    """A NaN (and an Inf) at the same place on both sides is equal, as isclose(equal_nan)
    takes it: the figures are those of the other elements, by hand."""
    gen = torch.Generator().manual_seed(2)
    a = torch.randn(numel, generator=gen)
    b = a * (1 + 1e-3)
    a[3] = b[3] = math.nan
    a[numel - 7] = b[numel - 7] = math.inf
    got = metrics.tensor_diff(0, a, b)
    keep = torch.isfinite(a)
    a64, b64 = a[keep].double(), b[keep].double()
    d = b64 - a64
    assert got.nonfinite_a == got.nonfinite_b == 2
    assert got.rel_l2 == pytest.approx(float(d.norm() / a64.norm()), rel=1e-9)
    assert got.cosine == pytest.approx(1.0, abs=1e-9)
    assert got.max_abs == pytest.approx(float(d.abs().max()), rel=1e-9)
    flat = int(torch.nonzero(keep).flatten()[int(d.abs().argmax())])
    assert got.worst == (flat,)
