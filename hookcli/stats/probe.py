"""``StatsProbe``: activation (and gradient) statistics per module call.

Each hook reduces the floating tensors it sees to a handful of scalars (mean,
population variance, min, max, mean |x|, zero/NaN/Inf counts) and drops the
tensor. Several floating tensors in one output (an LSTM's ``(out, (h, c))``)
are pooled as if concatenated.

Two ways to reduce, with the same figures:

- on an accelerator (``tensor_vector``), the scalars stay on the device until
  ``finish``, which concatenates them and copies them to the host in one transfer:
  no hook waits for the device;
- on the CPU (``host_vector``), where reading a scalar waits for nothing, the hook
  works through the tensor one cache-sized chunk at a time and takes every figure of
  a chunk while it is in the cache. It reads the chunk's min and max first and skips
  the passes they make needless: finite min and max mean no NaN/Inf to count; min > 0
  or max < 0 means no zero to count; one sign throughout makes |x| sum to |sum|. The
  variance comes from one sum and one sum of squares unless the mean dominates it
  (see ``_CANCEL``). docs/stats-speed.md has the measurements behind each choice.

Hook kinds and the columns they fill (``--hooks``):

- ``forward``: the module's output: ``mean``, ``std``, ``min``, ``max``,
  ``mean_abs``, ``zero_fraction``, ``nan``, ``inf``; also the NaN/Inf origin.
- ``backward-pre``: the same for grad_output, prefixed ``grad_output_``.
- ``backward``: the same for grad_input, prefixed ``grad_input_``.
- ``tensor``: the same for the grads of the module's own parameters (tensor
  hooks), prefixed ``param_grad_``, on the module's first call only.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hookcli.checks import layer_label
from hookcli.checks.origin import nonfinite_origin
from hookcli.norms import LOW_PRECISION, flat_view
from hookcli.options import HookKind
from hookcli.render import fmt_float, fmt_int, fmt_pct
from hookcli.report import Column
from hookcli.session import CallRecord, Frame, HookSession, Probe
from hookcli.structures import iter_tensors

STAT_KEYS = ("mean", "std", "min", "max", "mean_abs", "zero_fraction", "nan", "inf")
STAT_KINDS = (HookKind.FORWARD, HookKind.BACKWARD_PRE, HookKind.BACKWARD, HookKind.TENSOR)
PREFIX = {
    HookKind.FORWARD: "",
    HookKind.BACKWARD_PRE: "grad_output_",
    HookKind.BACKWARD: "grad_input_",
    HookKind.TENSOR: "param_grad_",
}
_TABLE_PREFIX = {
    HookKind.BACKWARD_PRE: "gout ",
    HookKind.BACKWARD: "gin ",
    HookKind.TENSOR: "pgrad ",
}


@dataclass(frozen=True)
class TensorStats:
    """Statistics of the floating elements one hook saw, pooled over its tensors."""

    numel: int
    mean: float
    std: float  # unbiased (Bessel), as torch.std; 0 for a single element
    min: float
    max: float
    mean_abs: float
    zero_fraction: float
    nan: int
    inf: int

    @property
    def nonfinite(self) -> bool:
        return self.nan > 0 or self.inf > 0

    def to_dict(self, prefix: str = "") -> dict[str, Any]:
        return {prefix + k: getattr(self, k) for k in STAT_KEYS}


def empty_stats(prefix: str = "") -> dict[str, Any]:
    """The columns of a row with no floating tensor to describe."""
    return {prefix + k: None for k in STAT_KEYS}


def _stat_tensors(obj: Any) -> list[torch.Tensor]:
    """The non-empty dense floating tensors in ``obj`` that hold values (not on ``meta``).

    Sparse and nested tensors are left out: their stored values alone would misstate
    the mean, the spread and the share of zeros.
    """
    return [
        t
        for t in iter_tensors(obj)
        if t.is_floating_point()
        and t.layout == torch.strided
        and not t.is_nested
        and t.numel() > 0
        and t.device.type != "meta"
    ]


def _acc_dtype(device: torch.device) -> torch.dtype:
    # MPS has no float64; counts stay exact there up to 2**24 elements.
    return torch.float32 if device.type == "mps" else torch.float64


def tensor_vector(t: torch.Tensor) -> torch.Tensor:
    """The 8 statistics of one tensor as a small device tensor (no host sync).

    The reduction for accelerators, and for CPU tensors holding NaN/Inf. Each
    statistic is one or two kernels, whatever the values; min, max, mean and
    mean |x| propagate NaN/Inf as torch does.
    """
    x = t.detach()
    if x.dtype in LOW_PRECISION:
        x = x.float()  # reduce half types in float32
    n = x.numel()
    mean = x.mean()  # not var_mean's: its Welford mean turns an Inf into NaN
    var = x.var(correction=0)
    mean_abs = torch.linalg.vector_norm(x, 1) / n
    zeros = n - torch.count_nonzero(x)  # NaN counts as non-zero, rightly
    # x - x is 0 where x is finite and NaN where it is NaN or +-Inf; x == x is False
    # only at NaN. Two cheap kernels instead of isnan and isinf (abs, then compare).
    nan = n - torch.count_nonzero(x == x)
    inf = torch.count_nonzero(x - x) - nan
    acc = _acc_dtype(x.device)
    values = (mean, var, x.min(), x.max(), mean_abs, zeros, nan, inf)
    return torch.stack([v.to(acc) for v in values])


def all_finite(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """A device bool: no NaN/Inf in any of ``tensors`` (min and max propagate both)."""
    device = tensors[0].device
    flags = [
        torch.isfinite(torch.stack([t.detach().min(), t.detach().max()])).to(device)
        for t in tensors
    ]
    return torch.cat(flags).all()


# Elements per chunk on the CPU at one torch thread. Every statistic of a chunk is taken
# while it sits in the L2 cache (this many float32 are 512 KiB, and the scratch buffer
# as much again): the first reduction brings it in from memory, the others read it from
# the cache, and the elementwise steps (|x|, x != 0) write into the reused scratch
# buffer instead of a full-size temporary (page faults on every call). A tensor is read
# from memory once, not once per statistic (docs/stats-speed.md has the timings).
_CHUNK = 1 << 17
# With several torch threads, a chunk this large: each op on a chunk pays for waking the
# threads and joining them, and over 2**17 elements per thread that cost outweighed what
# the cache saved (resnet50 b8 at 2 threads on AMD EPYC, stats / floor in interleaved
# rounds: 1.33 to 1.46 with 2**18-element chunks, 1.22 to 1.36 with 2**22). The scratch
# buffer stays at most this size (16 MiB of float32), however large the tensor.
_MT_CHUNK = 1 << 22


def _chunk_size() -> int:
    """Elements per chunk at the thread count in use (``_CHUNK`` on one thread)."""
    threads = torch.get_num_threads()
    return _CHUNK if threads <= 1 else _MT_CHUNK


# Rows of this length for the sum of squares where torch.dot cannot be trusted to
# accumulate in several lanes (``_dot_is_accurate``): a float32 L2 norm accumulates
# lane by lane, and over rows of 512 its square is off by ~5e-8 (relative).
_BLOCK = 512
# var = E[x^2] - mean^2 loses about log10(E[x^2] / var) digits to cancellation. Up to
# this ratio the error stays below ~1e-6 (relative); past it the two-pass torch.var.
_CANCEL = 4.0

# (elements, torch threads) -> whether torch.dot over that many is trusted
_dot_accurate: dict[tuple[int, int], bool] = {}


def _dot_is_accurate(n: int) -> bool:
    """Whether ``torch.dot`` keeps the float32 sum of squares of ``n`` elements (a chunk,
    at the thread count in use) within 2e-6.

    The BLAS that torch ships with (MKL, OpenBLAS) accumulates in vector lanes, and it
    is the fastest reduction torch has. How well it does depends on the CPU, the thread
    count and the length: over 2**20 squares MKL is off by ~1e-7 (relative) on an Intel
    Xeon but by 2.5e-6 (2 threads) to 6.4e-6 (1 thread) on an AMD EPYC, and on that
    AMD EPYC by ~5e-7 over the 2**17 of a one-thread chunk; a dot
    that adds one element at a time would be off by ~5e-5 over 2**20. This is asked
    once per length and thread count, on seeded uniform values, against float64; the
    blocked norms (about 1.6x the dot's time on a cache-resident chunk) serve where the
    answer is no.
    """
    key = (n, torch.get_num_threads())
    accurate = _dot_accurate.get(key)
    if accurate is None:
        x = torch.rand(n, generator=torch.Generator().manual_seed(0))
        exact = x.double().square().sum().item()
        accurate = _dot_accurate[key] = abs(torch.dot(x, x).item() - exact) <= 2e-6 * exact
    return accurate


def _dot_serves(chunk: int) -> bool:
    """Whether a float32 chunk's sum of squares is taken by ``torch.dot``: at one torch
    thread, where the machine's dot is accurate over ``chunk`` elements.

    With several threads the blocked norms serve whatever the BLAS: they run on torch's
    own threads, like the other reductions of the chunk, where the BLAS dot runs on
    its own. Forced at 2 threads on an AMD EPYC, whose MKL dot fails the check there
    (an Intel Xeon's passes), the dot made stats slower against its floor in three runs
    of five, up to 2x with the other core busy, and 3-5% faster in the two quietest
    (resnet50 b8; docs/performance.md, "stats on either CPU").
    """
    return torch.get_num_threads() == 1 and _dot_is_accurate(chunk)


def _sum_sq(c: torch.Tensor, chunk: int) -> float:
    """Sum of squares of a 1-D chunk of at most ``chunk`` elements, as a Python float."""
    n = c.numel()
    if c.dtype == torch.float64 or (n >= _BLOCK and _dot_serves(chunk)):
        return float(torch.dot(c, c).item())
    if n < 2 * _BLOCK:
        return float(torch.linalg.vector_norm(c).double().square().item())
    k = n // _BLOCK
    rows = torch.linalg.vector_norm(c[: k * _BLOCK].view(k, _BLOCK), dim=1)
    q = rows.double().square().sum()
    if k * _BLOCK < n:
        q = q + torch.linalg.vector_norm(c[k * _BLOCK :]).double().square()
    return float(q.item())


class Scratch:
    """Reusable buffers (one per dtype) for the CPU's chunked elementwise steps."""

    def __init__(self) -> None:
        self._bufs: dict[torch.dtype, torch.Tensor] = {}

    def get(self, dtype: torch.dtype, size: int) -> torch.Tensor:
        buf = self._bufs.get(dtype)
        if buf is None or buf.numel() < size:
            # a normal tensor even when first asked for inside a forward the model runs
            # under @torch.inference_mode(): an inference tensor could not be written to
            # by the hooks that run after that forward returns
            with torch.inference_mode(False):
                buf = self._bufs[dtype] = torch.empty(size, dtype=dtype)
        return buf


def _abs_sum_min(c: torch.Tensor, buf: torch.Tensor) -> tuple[float, float]:
    """Sum and min of |x| over one chunk, through ``buf`` (of the chunk's length)."""
    torch.abs(c, out=buf)
    return buf.sum().item(), buf.amin().item()


def _nonzero_count(c: torch.Tensor, buf: torch.Tensor) -> int:
    """How many elements of one chunk are not zero, through ``buf`` (of its length)."""
    torch.ne(c, 0, out=buf)  # 1.0 or 0.0: a chunk's sum is an exact integer
    return round(buf.sum().item())


def host_vector(t: torch.Tensor, scratch: Scratch) -> list[float]:
    """The 8 statistics of one CPU tensor, as ``tensor_vector`` gives them.

    One chunk (``_chunk_size``) at a time, every figure of the chunk
    while it is in the cache: its min and max first, then its sum and sum of squares,
    then only the passes that its min and max leave open (see the module docstring).
    A finite chunk of one sign without zeros takes four reductions; one whose sign
    changes, an |x| step more. The chunks' figures add up in float64.

    What does not change from chunk to chunk is settled once per tensor: the chunks
    are cut in one ``split``, the scratch buffer is sized once (again only for a
    shorter last chunk), and whether ``torch.dot`` serves is asked once. A chunk then
    costs its reductions and their reads alone (docs/stats-speed.md counts them).
    """
    x = t.detach()
    if x.dtype in LOW_PRECISION:
        x = x.float()  # reduce half types in float32
    f = flat_view(x)
    n = f.numel()
    chunk = _chunk_size()
    size = min(n, chunk)
    full = scratch.get(f.dtype, size)
    if full.numel() != size:
        full = full[:size]
    # the dot for every chunk of at least _BLOCK elements (float64: always); a tensor
    # shorter than that never asks whether the dot serves
    serves = size >= _BLOCK and _dot_serves(chunk)
    dot_from = 0 if f.dtype == torch.float64 else _BLOCK if serves else n + 1
    lo, hi = math.inf, -math.inf
    s = q = abs_sum = 0.0
    zeros = 0
    for c in f.split(chunk) if n > chunk else (f,):
        m = c.numel()
        buf = full if m == size else full[:m]
        # amin and amax propagate NaN and show any Inf. Two ops, yet less time than one
        # aminmax, whose CPU kernel is slower than the two together (on AMD EPYC
        # 20 us against 13 us for 2**17 float32 at one thread; docs/stats-speed.md).
        c_lo, c_hi = c.amin().item(), c.amax().item()
        if not (math.isfinite(c_lo) and math.isfinite(c_hi)):
            return tensor_vector(x).tolist()  # NaN/Inf to count: every exact pass
        if c_lo < lo:
            lo = c_lo
        if c_hi > hi:
            hi = c_hi
        c_sum = c.sum().item()
        s += c_sum
        q += torch.dot(c, c).item() if m >= dot_from else _sum_sq(c, chunk)
        if c_lo >= 0 or c_hi <= 0:  # one sign: |x| sums to |sum|
            abs_sum += abs(c_sum)
            if c_lo == 0 or c_hi == 0:
                zeros += m - _nonzero_count(c, buf)
        else:
            c_abs, c_abs_min = _abs_sum_min(c, buf)
            abs_sum += c_abs
            if c_abs_min == 0:
                zeros += m - _nonzero_count(c, buf)
    mean = s / n
    var = q / n - mean * mean
    if not (math.isfinite(q) and q / n <= _CANCEL * var):
        var = f.var(correction=0).item()  # the mean dominates: two passes
        if not math.isfinite(var):  # (x - mean)^2 overflows float32
            var = f.double().var(correction=0).item()
    return [mean, var, lo, hi, abs_sum / n, float(zeros), 0.0, 0.0]


def _version(t: torch.Tensor) -> int:
    """``t``'s in-place modification counter; -1 where it has none (inference tensors)."""
    try:
        return int(t._version)
    except RuntimeError:
        return -1


def host_all_finite(tensors: Sequence[torch.Tensor]) -> bool:
    """No NaN/Inf in any of the CPU ``tensors``.

    One sum each: a NaN or an Inf makes the sum NaN or infinite, so a finite sum rules
    both out. Only a sum that is not finite (a NaN, an Inf, or finite values whose sum
    overflows) is asked again of amin and amax, which tell for sure.
    """
    for t in tensors:
        x = t.detach()
        if math.isfinite(x.sum().item()):
            continue
        if not (math.isfinite(x.amin().item()) and math.isfinite(x.amax().item())):
            return False
    return True


def pool(parts: Sequence[tuple[int, Sequence[float]]]) -> TensorStats:
    """Pool per-tensor vectors ``(numel, [mean, var, min, max, mean_abs, zeros, nan, inf])``."""
    n = sum(count for count, _ in parts)
    if len(parts) == 1:  # the common case: no pooling rounding
        mean = parts[0][1][0]
        m2 = parts[0][1][1] * n
    else:  # Chan et al.: pooled sum of squared deviations
        mean = sum(count * v[0] for count, v in parts) / n
        m2 = sum(count * v[1] + count * (v[0] - mean) ** 2 for count, v in parts)
    std = math.sqrt(m2 / (n - 1)) if n > 1 else 0.0
    lows = [v[2] for _, v in parts]
    highs = [v[3] for _, v in parts]
    return TensorStats(
        numel=n,
        mean=mean,
        std=std,
        min=math.nan if any(math.isnan(x) for x in lows) else min(lows),
        max=math.nan if any(math.isnan(x) for x in highs) else max(highs),
        mean_abs=sum(count * v[4] for count, v in parts) / n,
        zero_fraction=sum(v[5] for _, v in parts) / n,
        nan=round(sum(v[6] for _, v in parts)),
        inf=round(sum(v[7] for _, v in parts)),
    )


@dataclass(frozen=True)
class Origin:
    """The first module call that turned finite inputs into NaN/Inf."""

    index: int
    name: str
    type: str
    call: int

    @property
    def label(self) -> str:
        return layer_label(self.name, self.call)


class StatsProbe(Probe):
    """Statistics of outputs (and grads) per call; NaN/Inf origin; one host transfer.

    ``cpu_reads`` (default True) lets hooks read scalars of CPU tensors to skip
    passes (``host_vector``); False reduces CPU tensors the accelerator way, with
    no host read before ``finish``.
    """

    def __init__(
        self, kinds: Iterable[HookKind] = (HookKind.FORWARD,), *, cpu_reads: bool = True
    ) -> None:
        self.kinds = frozenset(k for k in kinds if k in STAT_KINDS)
        self.cpu_reads = cpu_reads
        self.needs_versions = cpu_reads  # the reuse below reads ``_version``
        self._scratch = Scratch()
        # CPU figures already read, by tensor object: a module's output is often the
        # very tensor another hook just reduced (a block returns its last ReLU's
        # output, a Sequential its last child's, an in-place ReLU's input is the
        # output before it), so its figures are reused while the object is alive and
        # unmodified (same ``_version``). Weak references: no activation is kept.
        self._seen: dict[int, tuple[weakref.ref[torch.Tensor], int, list[float]]] = {}
        # Per chunk: a device vector, or (CPU) the host floats already read.
        self._chunks: list[torch.Tensor | list[float]] = []
        # (kind, key, numel) per chunk: key is a frame index (a parameter id for
        # TENSOR); kind None marks a one-element "inputs were finite" flag.
        self._where: list[tuple[HookKind | None, int, int]] = []
        self._done_order: dict[int, int] = {}
        self._param_owners: dict[int, list[int]] = {}
        self.stats: dict[tuple[HookKind, int], TensorStats] = {}
        self.param_stats: dict[int, TensorStats] = {}  # id(module) -> its own params' grads
        self.inputs_finite: dict[int, bool] = {}
        self.origin: Origin | None = None
        self.nonfinite_calls = 0

    # -- hooks ------------------------------------------------------------------------
    def _known(self, t: torch.Tensor) -> list[float] | None:
        """The figures of ``t`` if this probe read them from this object unmodified."""
        hit = self._seen.get(id(t))
        if hit is not None and hit[0]() is t and hit[1] == _version(t):
            return hit[2]
        return None

    def _host(self, t: torch.Tensor) -> list[float]:
        vals = self._known(t)
        if vals is None:
            vals = host_vector(t, self._scratch)
            if (version := _version(t)) >= 0:
                self._seen[id(t)] = (weakref.ref(t), version, vals)
        return vals

    def _add(self, kind: HookKind, key: int, tensors: Sequence[torch.Tensor]) -> None:
        for t in tensors:
            if self.cpu_reads and t.device.type == "cpu":
                self._chunks.append(list(self._host(t)))
            else:
                self._chunks.append(tensor_vector(t))
            self._where.append((kind, key, t.numel()))

    def attach(self, session: HookSession) -> None:
        if HookKind.TENSOR not in self.kinds:
            return
        seen: set[int] = set()
        for m in session.model.modules():
            for p in m.parameters(recurse=False):
                self._param_owners.setdefault(id(p), []).append(id(m))
                if id(p) in seen or not p.requires_grad:
                    continue
                seen.add(id(p))
                session.keep(p.register_hook(self._param_hook(id(p))))

    def _param_hook(self, pid: int) -> Any:
        def hook(grad: torch.Tensor) -> None:
            self._add(HookKind.TENSOR, pid, _stat_tensors(grad))

        return hook

    def on_forward_pre(self, frame: Frame, module: nn.Module, args: Any, kwargs: Any) -> None:
        if HookKind.FORWARD not in self.kinds:
            return
        inputs = _stat_tensors((args, kwargs))
        if not inputs:
            return
        if self.cpu_reads and all(t.device.type == "cpu" for t in inputs):
            known = [self._known(t) for t in inputs]
            finite = all(math.isfinite(v[2]) and math.isfinite(v[3]) for v in known if v)
            rest = [t for t, v in zip(inputs, known, strict=True) if v is None]
            if finite and rest:
                finite = host_all_finite(rest)
            self.inputs_finite[frame.index] = finite
        else:
            flag = all_finite(inputs)
            self._chunks.append(flag.to(_acc_dtype(flag.device)).reshape(1))
            self._where.append((None, frame.index, 0))

    def on_forward(
        self, frame: Frame, module: nn.Module, args: Any, kwargs: Any, output: Any
    ) -> None:
        if HookKind.FORWARD not in self.kinds or frame.failed:
            return
        self._done_order[frame.index] = len(self._done_order)
        self._add(HookKind.FORWARD, frame.index, _stat_tensors(output))

    def on_backward_pre(self, frame: Frame, module: nn.Module, grad_output: Any) -> None:
        if HookKind.BACKWARD_PRE in self.kinds:
            self._add(HookKind.BACKWARD_PRE, frame.index, _stat_tensors(grad_output))

    def on_backward(
        self, frame: Frame, module: nn.Module, grad_input: Any, grad_output: Any
    ) -> None:
        if HookKind.BACKWARD in self.kinds:
            self._add(HookKind.BACKWARD, frame.index, _stat_tensors(grad_input))

    # -- results ----------------------------------------------------------------------
    def _transfer(self) -> list[list[float]]:
        """Every chunk as host floats, with one device-to-host copy per device."""
        values: list[list[float]] = [[] for _ in self._chunks]
        on_device: dict[torch.device, list[torch.Tensor]] = {}
        slots: dict[torch.device, list[int]] = {}
        for i, c in enumerate(self._chunks):
            if isinstance(c, list):
                values[i] = c  # read in the hook already
            else:
                on_device.setdefault(c.device, []).append(c)
                slots.setdefault(c.device, []).append(i)
        for device, chunks in on_device.items():
            flat = torch.cat(chunks).cpu().tolist()
            pos = 0
            for i, c in zip(slots[device], chunks, strict=True):
                values[i] = flat[pos : pos + c.numel()]
                pos += c.numel()
        return values

    def finish(self, session: HookSession) -> None:
        values = self._transfer()
        self._chunks.clear()
        self._seen.clear()
        parts: dict[tuple[HookKind, int], list[tuple[int, list[float]]]] = {}
        for (kind, key, numel), vals in zip(self._where, values, strict=True):
            if kind is None:
                self.inputs_finite[key] = bool(vals[0])
            else:
                parts.setdefault((kind, key), []).append((numel, vals))
        param_parts: dict[int, list[tuple[int, list[float]]]] = {}
        for (kind, key), items in parts.items():
            if kind is HookKind.TENSOR:
                for owner in self._param_owners.get(key, ()):
                    param_parts.setdefault(owner, []).extend(items)
            else:
                self.stats[(kind, key)] = pool(items)
        self.param_stats = {mid: pool(items) for mid, items in param_parts.items()}
        self._find_origin(session.frames)

    def _find_origin(self, frames: Sequence[Frame]) -> None:
        """The origin (``checks.origin``) and how many calls output NaN/Inf."""
        if HookKind.FORWARD not in self.kinds:
            return

        def output_holds(index: int) -> bool:
            s = self.stats.get((HookKind.FORWARD, index))
            return s is not None and s.nonfinite

        by_index = {f.index: f for f in frames}
        self.nonfinite_calls = sum(output_holds(i) for i in by_index)
        # _done_order's keys are in the order the calls returned.
        completed = [i for i in self._done_order if i in by_index]
        first = nonfinite_origin(completed, output_holds, lambda i: self.inputs_finite.get(i, True))
        if first is not None:
            f = by_index[first]
            self.origin = Origin(f.index, f.name, f.type, f.call)

    def forward_stats(self, index: int) -> TensorStats | None:
        """The output statistics of call ``index`` (None: no floating output)."""
        return self.stats.get((HookKind.FORWARD, index))

    def grad_stats(self, record: CallRecord) -> list[TensorStats]:
        """Every gradient statistic of one call (grad_output, grad_input, param grads)."""
        out = [
            s
            for k in (HookKind.BACKWARD_PRE, HookKind.BACKWARD)
            if (s := self.stats.get((k, record.index))) is not None
        ]
        if record.call == 0 and (p := self.param_stats.get(record.module_id)) is not None:
            out.append(p)
        return out

    def columns(self, record: CallRecord) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for kind in STAT_KINDS:
            if kind not in self.kinds:
                continue
            prefix = PREFIX[kind]
            if kind is HookKind.TENSOR:
                s = self.param_stats.get(record.module_id) if record.call == 0 else None
            else:
                s = self.stats.get((kind, record.index))
            data.update(s.to_dict(prefix) if s is not None else empty_stats(prefix))
        return data

    def totals(self) -> dict[str, Any]:
        if HookKind.FORWARD not in self.kinds:
            return {}
        return {
            "nonfinite_origin": self.origin.label if self.origin else None,
            "nonfinite_calls": self.nonfinite_calls,
        }

    @property
    def table_columns(self) -> list[Column]:
        """The human table's statistic columns (every key stays in JSON/CSV)."""
        cols: list[Column] = []
        if HookKind.FORWARD in self.kinds:
            cols += [
                Column("mean", "Mean", fmt_float, "right"),
                Column("std", "Std", fmt_float, "right"),
                Column("min", "Min", fmt_float, "right"),
                Column("max", "Max", fmt_float, "right"),
                Column("mean_abs", "Mean|x|", fmt_float, "right"),
                Column("zero_fraction", "Zeros", fmt_pct, "right"),
                Column("nan", "NaN", fmt_int, "right"),
                Column("inf", "Inf", fmt_int, "right"),
            ]
        for kind in (HookKind.BACKWARD_PRE, HookKind.BACKWARD, HookKind.TENSOR):
            if kind not in self.kinds:
                continue
            key, head = PREFIX[kind], _TABLE_PREFIX[kind]
            cols += [
                Column(key + "mean", head + "mean", fmt_float, "right"),
                Column(key + "std", head + "std", fmt_float, "right"),
                Column(key + "mean_abs", head + "mean|x|", fmt_float, "right"),
                Column(key + "nan", head + "NaN", fmt_int, "right"),
                Column(key + "inf", head + "Inf", fmt_int, "right"),
            ]
        return cols
