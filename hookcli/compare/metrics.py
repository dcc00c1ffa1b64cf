"""Per output tensor: how far B's value is from A's (A is the reference).

The figures come from passes over the pair a piece at a time (256Ki elements: nothing as
large as the pair is made) in float32 (float64 where a side is float64; B's cast to A's
device): ``|b - a|`` once (rounded once, to half an ulp of the difference), norms of
rows of a, b and b - a squared and summed in float64 (each sum to about 1e-7 relative),
the largest ``|b - a|`` and where, and the count beyond the tolerance; a pair of at most
16Ki elements is read in float64; a pair with a NaN or Inf (or a sum past float32's
range) takes a chunked float64 sweep. A pair whose sides lie alike in memory
(channels-last, transposed) is read in that order, where it lies (``_flat_pair``):

    max_abs  = max |b - a|
    rel_l2   = ||b - a|| / ||a||          (0 when both are zero, inf when only a is)
    cosine   = <a, b> / (||a|| ||b||)     (1 when both are zero, 0 when one is)
    sqnr_db  = 10 log10(||a||^2 / ||b - a||^2)   (inf when b == a)

An element passes when ``|b - a| <= atol + rtol * |a|`` (``torch.isclose(b, a)``, NaN
equal to NaN), as ``torch.testing.assert_close(b, a)`` tests it; the default tolerances
are assert_close's for the less precise of the two dtypes. A complex tensor is compared in
complex128 by ``_sweep``, as ``torch.isclose`` does: ``|.|`` is the modulus, the cosine
the real part of ``<a, b>`` over the norms, the worst element's values its moduli.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# torch.testing.assert_close's defaults (torch/testing/_comparison.py), by dtype name
_TOLERANCES = {
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "float32": (1.3e-6, 1e-5),
    "float64": (1e-7, 1e-7),
    "complex32": (1e-3, 1e-5),
    "complex64": (1.3e-6, 1e-5),
    "complex128": (1e-7, 1e-7),
}


def dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


# the dtype a run computes in below what its outputs show (``--vs amp=bf16``: autocast
# runs float32 ops in bfloat16): every floating pair's default is at least its
# (``computed_in``); integers stay exact
_computed_in: list[str] = []


@contextlib.contextmanager
def computed_in(dtype: str | None) -> Iterator[None]:
    """Within it, the default tolerance of every floating pair is at least ``dtype``'s."""
    if dtype is None:
        yield
        return
    _computed_in.append(dtype)
    try:
        yield
    finally:
        _computed_in.pop()


def default_tolerance(dtype_a: Any, dtype_b: Any) -> tuple[float, float]:
    """(rtol, atol): assert_close's for the looser of the two dtypes (and of the dtype
    the run computes in, ``computed_in``); integers exact."""
    names = [dtype_name(d) for d in (dtype_a, dtype_b)]
    if _computed_in and any(n in _TOLERANCES for n in names):
        names.append(_computed_in[-1])
    pairs = [_TOLERANCES.get(n, (0.0, 0.0)) for n in names]
    return max(p[0] for p in pairs), max(p[1] for p in pairs)


_DIVERGING = ("shape", "no grad in B", "no grad in A")


@dataclass(frozen=True)
class TensorDiff:
    """One output tensor of one call, A against B."""

    index: int
    shape_a: tuple[int, ...] | None
    shape_b: tuple[int, ...] | None
    dtype_a: str | None
    dtype_b: str | None
    rtol: float
    atol: float
    max_abs: float | None = None
    rel_l2: float | None = None
    cosine: float | None = None
    sqnr_db: float | None = None
    nonfinite_a: int = 0
    nonfinite_b: int = 0
    mismatched: int = 0  # elements beyond the tolerance
    worst: tuple[int, ...] | None = None  # where |b - a| is largest
    value_a: float | None = None
    value_b: float | None = None
    # "shape" (B's differs beyond dims of size 1, which are compared as A's shape),
    # "missing in B", "missing in A", "no grad in B", "no grad in A"
    problem: str | None = None

    @property
    def diverged(self) -> bool:
        """Values beyond the tolerance, shapes that differ, or a gradient one side's
        backward left None (a tensor one side has and the other lacks is listed, not
        counted: the structures differ, not the numbers)."""
        return self.problem in _DIVERGING or self.mismatched > 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "shape_a": None if self.shape_a is None else list(self.shape_a),
            "shape_b": None if self.shape_b is None else list(self.shape_b),
            "dtype_a": self.dtype_a,
            "dtype_b": self.dtype_b,
            "max_abs": self.max_abs,
            "rel_l2": self.rel_l2,
            "cosine": self.cosine,
            "sqnr_db": self.sqnr_db,
            "nonfinite_a": self.nonfinite_a,
            "nonfinite_b": self.nonfinite_b,
            "mismatched": self.mismatched,
            "rtol": self.rtol,
            "atol": self.atol,
            "worst": None if self.worst is None else list(self.worst),
            "value_a": self.value_a,
            "value_b": self.value_b,
            "problem": self.problem,
            "diverged": self.diverged,
        }


def _ratio(num: float, den: float, both_zero: float, den_zero: float) -> float:
    if den > 0:
        return num / den
    return both_zero if num == 0 else den_zero


_CHUNK = 1 << 16  # elements per step: the float64 buffers stay small, reused and in cache


_FAST = ("float16", "bfloat16", "float32", "float64")
_SCALES = 16.0  # |a|^2 / |b|^2 (or its inverse) past which <a, b> is read by rows
_SMALL = 1 << 14  # pairs up to this many elements take ``_reduce_small``
_PIECE = 1 << 18  # elements per piece of ``_reduce``: a multiple of ``_ROW``
_ROW = 1024  # sums of squares by rows of this length: each row's norm is exact to ~1e-7
_scratch: dict[tuple[Any, Any, int], torch.Tensor] = {}  # (device, dtype, slot) -> buffer


def release_scratch() -> None:
    """Drop the buffers ``_reduce`` reuses from pair to pair (compare's run ends)."""
    _scratch.clear()


def _buffer(n: int, device: Any, dtype: Any, slot: int) -> torch.Tensor:
    """``n`` elements of a buffer kept between pairs (no fresh pages for each pair)."""
    import torch

    key = (device, dtype, slot)
    buf = _scratch.get(key)
    if buf is None or buf.numel() < n:
        with torch.inference_mode(False):  # (a normal tensor serves in and out of it)
            buf = _scratch[key] = torch.empty(n, dtype=dtype, device=device)
    return buf if buf.numel() == n else buf[:n]


def _reduce(a: torch.Tensor, b: torch.Tensor, rt: float, at: float) -> list[float]:
    """The figures of one pair, from passes over pieces of ``_PIECE`` elements in float32
    (float64 where either side is float64) where every value is finite, else from the
    float64 sweep (``_sweep``). Per piece: ``b - a`` once (rounded once, to half an ulp
    of the difference itself) into a buffer reused from piece to piece; the norms of its
    rows (``_ROW`` elements) and of a's and b's, and its rows' largest magnitude, into
    one small table of the pair's rows; and, only where the piece's largest ``|b - a|``
    passes atol, the count of elements beyond the tolerance (into the table's last row),
    while ``|b - a|`` is still in the buffer. After the last piece: the norms of the
    rows' norms in float64, squared; the first row with the largest ``|b - a|`` and the
    first place in it (from the buffer where that row is in the last piece, else
    that row's difference taken again). Nothing as large as the pair is made (a piece's
    buffers, 1 MiB each); each call costs a few microseconds, so they are few (about 30
    for a pair of one piece)."""
    import torch

    if dtype_name(a.dtype) not in _FAST or dtype_name(b.dtype) not in _FAST:
        return _sweep(a, b, rt, at)
    if a.numel() <= _SMALL:
        return _reduce_small(a, b, rt, at)
    wide = torch.float64 if torch.float64 in (a.dtype, b.dtype) else torch.float32
    af, bf = a.reshape(-1), b.reshape(-1)
    numel = af.numel()
    rows = -(-numel // _ROW)  # the last one may be short
    # per row: ||a||, ||b||, ||b - a||, max |b - a|; per piece (in row 4): the count
    table = torch.zeros((5, rows), dtype=wide, device=af.device)
    norms, tops, counts = table[:3], table[3], table[4]
    whole = numel <= _PIECE
    buf = _buffer(min(numel, _PIECE), af.device, wide, 0)
    s = 0
    for i, s in enumerate(range(0, numel, _PIECE)):
        pa, pb = _piece(af, bf, s, wide, whole)
        n = pa.numel()
        d = torch.sub(pb, pa, out=buf if n == buf.numel() else buf[:n])
        main = n - n % _ROW  # whole rows; a short one only in the last piece
        r0 = s // _ROW
        r1 = r0 + main // _ROW
        if main == n:
            out = norms[:, r0:r1]
            for j, x in enumerate((pa, pb, d)):
                torch.linalg.vector_norm(x.view(-1, _ROW), dim=1, out=out[j])
            d.abs_()
            torch.amax(d.view(-1, _ROW), dim=1, out=tops[r0:r1])
            top = tops[r0:r1].max()
        else:
            for j, x in enumerate((pa, pb, d)):
                if main:
                    torch.linalg.vector_norm(x[:main].view(-1, _ROW), dim=1, out=norms[j, r0:r1])
                torch.linalg.vector_norm(x[main:], out=norms[j, r1])
            d.abs_()
            if main:
                torch.amax(d[:main].view(-1, _ROW), dim=1, out=tops[r0:r1])
            torch.amax(d[main:], dim=0, out=tops[r1])
            top = tops[r0 : r1 + 1].max()
        if float(top) > at:  # else no element can pass atol + rtol * |a|
            tol = torch.abs(pa, out=_buffer(n, af.device, wide, 1))
            torch.sub(d, tol, alpha=rt, out=tol)  # |b - a| - rtol * |a|
            # the elements past atol, 1.0 each (exact in the piece's float sum; a
            # comparison to bool is a slow kernel), into the piece's slot
            torch.sum(torch.gt(tol, at, out=tol), dim=0, out=counts[i])
    # the rows' norms squared and summed in float64 (the norm of the rows' norms)
    sq_a, sq_b, sq_d = (
        x * x for x in torch.linalg.vector_norm(norms, dim=1, dtype=torch.float64).tolist()
    )
    if not (math.isfinite(sq_a) and math.isfinite(sq_b) and math.isfinite(sq_d)):
        return _sweep(a, b, rt, at)  # NaN or Inf somewhere (or a sum past float's range)
    bad = float(counts.sum(dtype=torch.float64))  # (each piece's count exact)
    top, row = tops.max(dim=0)  # (the first row that holds it)
    raw, lo = float(top), int(row) * _ROW
    if lo >= s:  # in the last piece: its |b - a| is still in the buffer
        k = lo + int(buf[lo - s : lo - s + _ROW].argmax())  # the first place in the row
    else:
        ra, rb = af[lo : lo + _ROW].to(wide), bf[lo : lo + _ROW].to(device=af.device, dtype=wide)
        k = lo + int(torch.sub(rb, ra).abs_().argmax())
    va, vb = float(af[k]), float(bf[k])
    # <a, b> from the three sums: (|a|^2 + |b|^2 - |b - a|^2) / 2, whose error (the sums',
    # ~1e-7 of the larger square) is ~1e-7 of |a| |b| where the norms are alike; where
    # they are not (one side a scaled copy of the other), <a, b> read by rows instead
    low, high = min(sq_a, sq_b), max(sq_a, sq_b)
    if low > 0 and high > _SCALES * low:
        dot = _dot_by_rows(af, bf, wide)
    else:
        dot = (sq_a + sq_b - sq_d) / 2.0
    return [raw, sq_a, sq_b, sq_d, dot, 0, 0, int(bad), va, vb, k]


def _piece(
    af: torch.Tensor, bf: torch.Tensor, s: int, wide: Any, whole: bool = False
) -> tuple[Any, Any]:
    """The pair's piece from element ``s`` (``whole``: the pair is one piece), in
    ``wide``, B's on A's device: a side of another dtype or device is copied into a buffer
    reused from piece to piece (a fresh tensor that size would take fresh pages each time)."""
    pa, pb = (af, bf) if whole else (af[s : s + _PIECE], bf[s : s + _PIECE])
    if pa.dtype != wide:
        pa = _buffer(pa.numel(), af.device, wide, 2).copy_(pa)
    if pb.dtype != wide or pb.device != af.device:
        pb = _buffer(pb.numel(), af.device, wide, 3).copy_(pb)
    return pa, pb


def _dot_by_rows(af: torch.Tensor, bf: torch.Tensor, wide: Any) -> float:
    """<a, b> a piece at a time: products into a reused buffer, summed by rows of
    ``_ROW`` in ``wide``, the rows' sums added in float64."""
    import torch

    total = 0.0
    for s in range(0, af.numel(), _PIECE):
        pa, pb = _piece(af, bf, s, wide)
        prod = torch.mul(pa, pb, out=_buffer(pa.numel(), af.device, wide, 0))
        main = prod.numel() - prod.numel() % _ROW
        rows = prod[:main].view(-1, _ROW).sum(dim=1).to(torch.float64).sum()
        total += float(rows + prod[main:].to(torch.float64).sum())
    return total


def _reduce_small(a: torch.Tensor, b: torch.Tensor, rt: float, at: float) -> list[float]:
    """``_reduce`` for a pair of at most ``_SMALL`` elements, where the calls, not the
    passes, are the cost: in float64 (the sums exact to ~1e-16), about fifteen calls and
    one read to the host; ``_sweep`` where a value is not finite."""
    import torch

    a64 = a.reshape(-1).to(torch.float64)
    b64 = b.reshape(-1).to(device=a.device, dtype=torch.float64)
    d = torch.sub(b64, a64)
    sq_d = d.dot(d)
    worst, at_k = d.abs_().max(dim=0)  # (the first of equal largest, as argmax)
    bad = torch.gt(d, a64.abs().mul_(rt).add_(at)).sum()  # |b - a| > atol + rtol * |a|
    figures = [a64.dot(a64), b64.dot(b64), sq_d, a64.dot(b64), worst]
    figures += [bad.to(torch.float64), at_k.to(torch.float64)]
    sq_a, sq_b, sq_d_, dot, raw, n_bad, k_ = torch.stack(figures).tolist()
    if not all(math.isfinite(v) for v in (sq_a, sq_b, sq_d_, dot)):
        return _sweep(a, b, rt, at)
    k = int(k_)
    return [raw, sq_a, sq_b, sq_d_, dot, 0, 0, int(n_bad), float(a64[k]), float(b64[k]), k]


def _sweep(a: torch.Tensor, b: torch.Tensor, rt: float, at: float) -> list[float]:
    """The figures of one pair in one sweep over it, a chunk at a time: sums of squares
    of a, b and b - a, <a, b> (its real part for complex tensors), max |b - a| and where,
    the non-finite and mismatched counts. Each chunk is cast to float64 (complex128 where
    a side is complex: |.| is then the modulus, as isclose takes it) once, into buffers
    reused from chunk to chunk: nothing as large as the pair is made."""
    import torch

    af, bf = a.reshape(-1), b.reshape(-1)
    numel = af.numel()
    size = min(numel, _CHUNK)
    cplx = a.is_complex() or b.is_complex()
    wide = torch.complex128 if cplx else torch.float64
    bufs = torch.empty((3, size), dtype=wide, device=af.device)
    flags = torch.empty(size, dtype=torch.bool, device=af.device)

    def dot(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.vdot(x, y).real if cplx else torch.dot(x, y)

    sq_a = sq_b = sq_d = dot_ab = 0.0
    bad = nfa = nfb = 0
    best, best_at, best_raw = -1.0, 0, 0.0
    for start in range(0, numel, _CHUNK):
        n = min(_CHUNK, numel - start)
        a64, b64, d = bufs[0, :n], bufs[1, :n], bufs[2, :n]
        a64.copy_(af[start : start + n])  # (a real side: imaginary parts of zero)
        b64.copy_(bf[start : start + n])
        torch.sub(b64, a64, out=d)
        sums = torch.stack([dot(a64, a64), dot(b64, b64), dot(a64, b64), dot(d, d)])
        absd = d.abs() if cplx else d.abs_()
        s = sums.tolist()
        if all(math.isfinite(v) for v in s):  # (float64 sums of these values: finite
            # exactly when every element is) the common case
            k = int(absd.argmax())
            raw = key = float(absd[k])
            n_bad = 0
            if raw > at:  # else no element can pass atol + rtol * |a|
                tol = a64.abs().mul_(rt) if cplx else a64.abs_().mul_(rt)
                n_bad = int(torch.gt(absd - tol, at, out=flags[:n]).sum())
            n_fa = n_fb = 0
        else:  # NaN or Inf somewhere: as isclose(b, a, equal_nan=True) decides
            close = torch.isclose(b64, a64, rtol=rt, atol=at, equal_nan=True)
            # the worst: a pair isclose fails where |b - a| is NaN (NaN on one side, or
            # Infs of opposite signs) before any finite difference; equal pairs (both
            # NaN, the same Inf) are not candidates
            nan_d = torch.isnan(absd)
            keys = torch.where(nan_d, torch.where(close, -1.0, math.inf), absd)
            k = int(keys.argmax())
            raw = float(absd[k])
            key = float(keys[k])
            n_bad = int((~close).sum())
            n_fa = int((~torch.isfinite(a64)).sum())
            n_fb = int((~torch.isfinite(b64)).sum())
            same = close & ~torch.isfinite(a64)  # equal non-finite pairs: out of the sums
            if bool(same.any()):
                for x in (a64, b64, d):
                    x.masked_fill_(same, 0)
                s = torch.stack([dot(a64, a64), dot(b64, b64), dot(a64, b64), dot(d, d)]).tolist()
        sq_a, sq_b, dot_ab, sq_d = sq_a + s[0], sq_b + s[1], dot_ab + s[2], sq_d + s[3]
        bad, nfa, nfb = bad + n_bad, nfa + n_fa, nfb + n_fb
        if key > best:
            best, best_at, best_raw = key, start + k, raw
    va, vb = (_value(x[best_at]) for x in (af, bf))
    return [best_raw, sq_a, sq_b, sq_d, dot_ab, nfa, nfb, bad, va, vb, best_at]


def _value(x: torch.Tensor) -> float:
    """One element as a float: a complex one's modulus."""
    import torch

    return float(x.to(torch.complex128).abs() if x.is_complex() else x.to(torch.float64))


def tensor_diff(
    index: int,
    a: torch.Tensor | None,
    b: torch.Tensor | None,
    rtol: float | None = None,
    atol: float | None = None,
) -> TensorDiff:
    """A against B for one tensor (either may be missing: the structures differ)."""
    import torch

    da = None if a is None else dtype_name(a.dtype)
    db = None if b is None else dtype_name(b.dtype)
    d_rtol, d_atol = default_tolerance(da or db, db or da)
    rt = d_rtol if rtol is None else rtol
    at = d_atol if atol is None else atol
    sa = None if a is None else tuple(a.shape)
    sb = None if b is None else tuple(b.shape)
    base: dict[str, Any] = {
        "index": index,
        "shape_a": sa,
        "shape_b": sb,
        "dtype_a": da,
        "dtype_b": db,
    }
    if a is None or b is None:
        missing = "missing in B" if b is None else "missing in A"
        return TensorDiff(**base, rtol=rt, atol=at, problem=missing)
    if sa != sb:
        if [d for d in sa or () if d != 1] != [d for d in sb or () if d != 1]:
            return TensorDiff(**base, rtol=rt, atol=at, problem="shape")
        b = b.reshape(a.shape)  # the same values, a leading (or inner) 1 more or less
    if a.is_meta or b.is_meta:
        return TensorDiff(**base, rtol=rt, atol=at)
    if a.numel() == 0:
        return TensorDiff(**base, rtol=rt, atol=at, max_abs=0.0, rel_l2=0.0, cosine=1.0,
                          sqnr_db=math.inf)  # fmt: skip
    with torch.no_grad():
        af, bf, order = _flat_pair(a.detach(), b.detach())
        figures = _reduce(af, bf, rt, at)
    max_abs, sq_a, sq_b, sq_d, dot, nfa, nfb, bad, va, vb, k = figures
    na, nb, nd = math.sqrt(sq_a), math.sqrt(sq_b), math.sqrt(sq_d)
    rel = _ratio(nd, na, 0.0, math.inf)
    cosine = dot / (na * nb) if na > 0 and nb > 0 else (1.0 if na == nb == 0 else 0.0)
    if not math.isnan(cosine):
        cosine = min(1.0, max(-1.0, cosine))  # (rounding never takes it past +-1)
    if nd == 0 or math.isnan(nd):
        sqnr = math.inf if nd == 0 else math.nan
    elif na == 0:
        sqnr = -math.inf
    elif not math.isfinite(na):
        sqnr = math.nan
    elif math.isinf(nd):  # an Inf in B where A is finite: no signal left
        sqnr = -math.inf
    else:
        ratio = (na * na) / (nd * nd)
        sqnr = 10.0 * math.log10(ratio) if ratio > 0 else -math.inf
    if order is None:
        worst = _unravel(int(k), sa or ())
    else:  # k counts in memory order: its index in each of A's dims
        in_order = _unravel(int(k), tuple(a.shape[p] for p in order))
        worst = tuple(in_order[order.index(i)] for i in range(a.dim()))
    return TensorDiff(
        **base,
        rtol=rt,
        atol=at,
        max_abs=max_abs,
        rel_l2=rel,
        cosine=cosine,
        sqnr_db=sqnr,
        nonfinite_a=int(nfa),
        nonfinite_b=int(nfb),
        mismatched=int(bad),
        worst=worst,
        value_a=va,
        value_b=vb,
    )


def _flat_pair(a: torch.Tensor, b: torch.Tensor) -> tuple[Any, Any, list[int] | None]:
    """A and B as 1-D views in one order: their memory order where both lie alike
    (channels-last or transposed the same way: read where they are, not copied), with the
    dims in that order; else A's shape's order (None), a side that lies otherwise copied."""
    if a.is_contiguous() and b.is_contiguous():
        return a.reshape(-1), b.reshape(-1), None
    order = sorted(range(a.dim()), key=a.stride, reverse=True)
    pa, pb = a.permute(order), b.permute(order)
    if pa.is_contiguous() and pb.is_contiguous():
        return pa.reshape(-1), pb.reshape(-1), order
    return a.reshape(-1), b.reshape(-1), None


def _unravel(k: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for dim in reversed(shape):
        out.append(k % dim if dim else 0)
        k = k // dim if dim else 0
    return tuple(reversed(out))


@dataclass(frozen=True)
class CallDiff:
    """Every output tensor of one aligned call, and the call's worst figures."""

    tensors: tuple[TensorDiff, ...]
    # None: the call's outputs; else what was measured instead (local mode: "input of
    # CHILD", an input the call's own code handed to that child)
    at: str | None = None

    @property
    def diverged(self) -> bool:
        return any(t.diverged for t in self.tensors)

    def _pick(self, key: str, worst: Any) -> float | None:
        values = [getattr(t, key) for t in self.tensors if getattr(t, key) is not None]
        if not values:
            return None
        nan = [v for v in values if math.isnan(v)]
        return nan[0] if nan else worst(values)

    @property
    def max_abs(self) -> float | None:
        return self._pick("max_abs", max)

    @property
    def rel_l2(self) -> float | None:
        return self._pick("rel_l2", max)

    @property
    def cosine(self) -> float | None:
        return self._pick("cosine", min)

    @property
    def sqnr_db(self) -> float | None:
        return self._pick("sqnr_db", min)

    def first_bad(self) -> TensorDiff | None:
        """The tensor that diverged with the largest error (the first if none has values)."""
        bad = [t for t in self.tensors if t.diverged]
        if not bad:
            return None
        return max(bad, key=lambda t: -1.0 if t.rel_l2 is None else _finite_key(t.rel_l2))

    def summary(self, prefix: str = "") -> dict[str, Any]:
        return {
            f"{prefix}max_abs": self.max_abs,
            f"{prefix}rel_l2": self.rel_l2,
            f"{prefix}cosine": self.cosine,
            f"{prefix}sqnr_db": self.sqnr_db,
            f"{prefix}diverged": self.diverged,
        }


def _finite_key(v: float) -> float:
    return math.inf if math.isnan(v) else v


def call_diff(
    outs_a: list[torch.Tensor],
    outs_b: list[torch.Tensor],
    rtol: float | None,
    atol: float | None,
    cache: dict[tuple[int, int, int], TensorDiff] | None = None,
) -> CallDiff:
    """Pair the flattened output tensors by position; extra ones on a side are listed.
    ``cache``: figures of a pair already measured (a container's output that is its last
    child's, the same copies on both sides) are reused."""
    n = max(len(outs_a), len(outs_b))
    diffs = []
    for i in range(n):
        a = outs_a[i] if i < len(outs_a) else None
        b = outs_b[i] if i < len(outs_b) else None
        key = (i, id(a), id(b))
        if cache is not None and a is not None and b is not None and key in cache:
            diffs.append(cache[key])
            continue
        d = tensor_diff(i, a, b, rtol, atol)
        if cache is not None and a is not None and b is not None:
            cache[key] = d
        diffs.append(d)
    return CallDiff(tuple(diffs))
