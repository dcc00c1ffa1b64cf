"""The live-bytes tracker: every storage an op makes, until it is freed, and the peak.

``LiveBytes`` is a ``TorchDispatchMode``: each aten op's outputs that own a new storage
are added (views and in-place results share one already known, and are not); a weak
reference on the storage takes its bytes out again when the last tensor on it goes.
The tensors alive before (parameters, buffers, gradients, optimizer state, inputs) are
``hold``-en first, by kind. Each storage has a kind that can change as the step goes
(an activation packed for backward becomes *saved*, a gradient that autograd puts in
``.grad`` becomes *grads*), so the bytes alive by kind are known at every op, and kept
at the peak with where it is: the phase (forward, backward, step), the module, the op.

Kernels allocate what the dispatcher never sees, alive while the op runs. On the CPU,
the ops whose kernels do (oneDNN's convolutions, forward and backward, and its bfloat16
and float16 matmuls) are measured: each distinct call (shapes, strides, dtypes, thread
count) runs once more under the legacy profiler, whose memory records give the bytes
it took beyond its outputs (``measured_scratch``). On CUDA cuDNN's convolutions are
measured in the call itself: the caching allocator's count of the bytes it took back
grows by the workspace the kernel held (``cuda_freed_bytes``). Two are modelled, where nothing is
measured: a matmul's copy of an operand BLAS cannot read in place (an expanded
gradient, stride 0), and the blocked-layout buffers of a CPU float32 2-D convolution's
forward (a torch whose legacy profiler gives no records). On meta nothing runs, so
neither is known. Works on meta (no data) as on a real device.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

KINDS = (
    "params",
    "buffers",
    "inputs",
    "grads",
    "optimizer_state",
    "saved",
    "activations",  # outputs not saved, activation gradients, op temporaries
)
# under FSDP2 (hookcli.memory.fsdp): parameters all-gathered for a unit's forward or
# backward, and the all-gather and reduce-scatter buffers
FSDP_KINDS = ("unsharded_params", "comm_buffers")

_aten = torch.ops.aten
_MATMULS = {_aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default}


@dataclass
class Peak:
    """The most bytes alive at once, where, and by kind."""

    bytes: int = 0
    phase: str = ""
    module: str = ""
    op: str = ""
    by_kind: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "bytes": self.bytes,
            "phase": self.phase,
            "module": self.module,
            "op": self.op,
            "by_kind": {
                k: self.by_kind.get(k, 0)
                for k in (*KINDS, *(k for k in self.by_kind if k not in KINDS))
            },
        }


def _tensors(out: Any) -> Iterator[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, (tuple, list)):
        for o in out:
            yield from _tensors(o)


def _storage(t: torch.Tensor) -> Any:
    if t.layout is not torch.strided:
        return None
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def _blas_copy_bytes(t: Any) -> int:
    """Bytes a matmul kernel copies ``t`` into when BLAS cannot read it in place: neither
    it nor its transpose has a unit stride in its last two dims with a leading stride that
    covers a row (an expanded tensor, stride 0, is the common case: ``sum``'s gradient)."""
    if not isinstance(t, torch.Tensor) or t.dim() < 2:
        return 0
    rows, cols = t.shape[-2], t.shape[-1]
    s0, s1 = t.stride()[-2], t.stride()[-1]
    if (s1 == 1 and s0 >= max(1, cols)) or (s0 == 1 and s1 >= max(1, rows)):
        return 0
    if rows == 1 or cols == 1:
        return 0
    return t.numel() * t.element_size()


_SEQ_LEAF: list[torch.Tensor] = []  # the leaf whose views number the throwaway nodes


def next_sequence_nr() -> int:
    """The sequence number the next autograd node will get (one throwaway node: a view
    of a 0-d leaf made once, Python's function and dispatch modes skipped by C++ guards)."""
    if not _SEQ_LEAF:
        with (
            torch.inference_mode(False),
            torch._C.DisableTorchFunction(),
            torch._C._DisableTorchDispatch(),
        ):
            _SEQ_LEAF.append(torch.zeros((), device="cpu", requires_grad=True))
    # grad on, inference mode off: a forward under @torch.inference_mode() has spans too
    if torch.is_inference_mode_enabled():
        with torch.inference_mode(False):
            return _throwaway_nr(_SEQ_LEAF[0])
    return _throwaway_nr(_SEQ_LEAF[0])


def _throwaway_nr(leaf: torch.Tensor) -> int:
    grad = torch.is_grad_enabled()
    torch._C._set_grad_enabled(True)
    try:
        with torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch():
            node = leaf.view(()).grad_fn
    finally:
        torch._C._set_grad_enabled(grad)
    assert node is not None
    return int(node._sequence_nr()) + 1


def _onednn_conv_bytes(args: Any, out: Any) -> int:
    """Bytes a CPU float32 2-D convolution takes from the allocator beyond its output
    (oneDNN): a blocked-layout output, then the plain one it is copied to; before that,
    copies of the weight and (from 16 input channels) of the input in the blocked layout.
    So ``max(input + weight, output)`` more than the output, measured with the
    allocator oracle on an AMD EPYC with torch 2.15 (tests/test_memory_tracker.py)."""
    x, w = args[0], args[1]
    if not (
        isinstance(x, torch.Tensor)
        and isinstance(w, torch.Tensor)
        and isinstance(out, torch.Tensor)
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and x.dim() == 4
        and x.is_contiguous()
        and torch.backends.mkldnn.is_available()
        and torch.backends.mkldnn.enabled
    ):
        return 0
    size = x.element_size()
    copies = (x.numel() * size if x.shape[1] >= 16 else 0) + w.numel() * size
    return max(copies, out.numel() * out.element_size())


# ops whose CPU kernels take memory from the allocator that no tensor holds (oneDNN's
# convolutions and its low-precision matmuls): measured once per distinct call
_MEASURED = {
    _aten.convolution.default,
    _aten.convolution_backward.default,
    *_MATMULS,
}
# on CUDA: cuDNN's convolutions, whose workspaces come from the caching allocator for
# the call (checked against the allocator on an H100); read at every call
_CUDA_MEASURED = {_aten.convolution.default, _aten.convolution_backward.default}
_scratch_cache: dict[Any, int] = {}


def _key(func: Any, args: Any, kwargs: Any) -> Any:
    # no requires_grad: the kernel runs below autograd and is measured under no_grad, so
    # an inference forward's convolution takes the measurement of the step's
    def one(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return ("T", tuple(a.shape), a.stride(), a.dtype)
        if isinstance(a, (list, tuple)):
            return tuple(one(x) for x in a)
        return a

    return (
        func,
        one(args),
        tuple(sorted((k, one(v)) for k, v in kwargs.items())),
        torch.get_num_threads(),
        torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled,
        torch.get_float32_matmul_precision(),
        torch.are_deterministic_algorithms_enabled(),
    )


def measured_scratch(func: Any, args: Any, kwargs: Any) -> int | None:
    """Bytes the CPU kernel of ``func`` takes from the allocator beyond its outputs,
    measured on one more call with the same arguments (the legacy profiler's memory
    records: quiet, a few milliseconds); cached per shapes, strides, dtypes and thread
    count and oneDNN's settings. None where it is not measured: not the CPU, float32
    matmuls (BLAS takes nothing more than the operand copies modelled above), a
    profiler already on."""
    tensors = list(_tensors(list(args)))
    if not tensors or any(t.device.type != "cpu" for t in tensors):
        return None
    if func in _MATMULS and tensors[0].dtype in (torch.float32, torch.float64):
        return None
    if torch._C._autograd._profiler_enabled():
        return None  # the user's own profiler is on: not measured (modelled, as on a torch
        # whose legacy profiler gives no records)
    key = _key(func, args, kwargs)
    if key not in _scratch_cache:
        try:
            _scratch_cache[key] = _measure(func, args, kwargs)
        except Exception:  # a torch without the legacy profiler's records: not measured
            return None
    return _scratch_cache[key]


def _cuda_device(args: Any) -> torch.device | None:
    """The CUDA device of the first CUDA tensor among ``args``, where the workspace can
    be read (``cuda_freed_bytes``): PyTorch's own caching allocator (``cudaMallocAsync``
    keeps no such count), and cuDNN not autotuning (``cudnn.benchmark`` tries several
    algorithms, each with its workspace, on a shape's first call). Else None."""
    for t in _tensors(list(args)):
        if t.device.type == "cuda":
            if torch.backends.cudnn.benchmark or _allocator_backend() != "native":
                return None
            return t.device
    return None


@functools.cache
def _allocator_backend() -> str:
    return str(torch.cuda.get_allocator_backend())


def cuda_freed_bytes(device: torch.device) -> int:
    """Bytes CUDA's caching allocator has taken back on ``device`` over the process: a
    counter kept on the host, so reading it waits for nothing on the GPU.

    Around one call of a kernel that takes a workspace from the allocator and gives it
    back before it returns (cuDNN's convolutions, forward and backward), the counter
    grows by that workspace: the bytes alive during the call beyond its outputs, which
    no tensor holds. (The peak counter would say it too, but only after a reset of the
    statistics the user's own code may be reading.) Several temporaries of one call
    count as their sum, an upper bound on what they held at once."""
    stats = torch.cuda.memory_stats_as_nested_dict(device)
    return int(stats.get("allocated_bytes", {}).get("all", {}).get("freed", 0))


def _measure(func: Any, args: Any, kwargs: Any) -> int:
    from torch._C._autograd import _disable_profiler_legacy, _enable_profiler_legacy
    from torch.autograd.profiler_legacy import profile
    from torch.utils._python_dispatch import _disable_current_modes

    config = profile(profile_memory=True).config()
    with _disable_current_modes(), torch.no_grad():
        _enable_profiler_legacy(config)
        try:
            again = func(*args, **kwargs)
        finally:
            records = _disable_profiler_legacy()
        outs = sum(st.nbytes() for t in _tensors(again) if (st := _storage(t)) is not None)
        del again
    live = rise = 0
    for thread in records:
        for event in thread:
            if event.kind() == "memory_alloc":
                live += event.cpu_memory_usage()
                rise = max(rise, live)
    return max(0, rise - outs)


class LiveBytes(TorchDispatchMode):
    """Bytes alive by kind at every op; the peak (see the module's doc)."""

    measure = True  # the kernels of _MEASURED on the CPU, _CUDA_MEASURED on CUDA (False:
    # tensors only, as on meta)

    def __init__(self, extra_kinds: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.live: dict[int, list[Any]] = {}  # cdata -> [bytes, kind, weakref]
        self.by_kind: dict[str, int] = dict.fromkeys((*KINDS, *extra_kinds), 0)
        self.out_kind = "activations"  # the kind of storages ops make now
        self.ignored: set[int] = set()  # storages never counted (FSDP's unsharded params)
        self.live_bytes = 0
        self.peak = Peak()
        self.phase = "forward"
        self.modules: list[str] = []  # the forward's module stack
        # (sequence nr of the next autograd node, module) each time the forward enters
        # or leaves a module: a backward node's module is the last one at or below its nr
        self.spans: list[tuple[int, str]] = []
        self.spanning = True  # False: no backward follows (an inference forward), no spans
        self.param_names: dict[int, str] = {}  # cdata -> parameter name (for step)
        self.step_param = ""
        self.open = True

    # -- storages --------------------------------------------------------------------

    def _free(self, key: int, ref: Any) -> None:
        entry = self.live.get(key)
        if self.open and entry is not None and entry[2] is ref:
            del self.live[key]
            self.live_bytes -= entry[0]
            self.by_kind[entry[1]] -= entry[0]

    def _add(self, st: Any, kind: str) -> bool:
        key = st._cdata
        if key in self.live or key in self.ignored:
            return False
        nbytes = st.nbytes()
        entry = [nbytes, kind, None]
        entry[2] = weakref.ref(st, functools.partial(self._free, key))
        self.live[key] = entry
        self.live_bytes += nbytes
        self.by_kind[kind] += nbytes
        return True

    def hold(self, tensors: Iterable[Any], kind: str) -> None:
        """Tensors alive before the tracked work (each storage once, the first kind kept)."""
        for t in tensors:
            if isinstance(t, torch.Tensor) and (st := _storage(t)) is not None:
                self._add(st, kind)

    def mark(self, t: Any, kind: str) -> None:
        """The storage under ``t`` is of ``kind`` from now on (a tensor saved for backward,
        a gradient put in ``.grad``); added if unknown."""
        if not isinstance(t, torch.Tensor) or (st := _storage(t)) is None:
            return
        entry = self.live.get(st._cdata)
        if entry is None:
            self._add(st, kind)
            self._check_peak("")
        elif entry[1] in ("activations", "saved") and entry[1] != kind:
            self.by_kind[entry[1]] -= entry[0]
            self.by_kind[kind] += entry[0]
            entry[1] = kind

    def ignore(self, tensors: Iterable[Any]) -> None:
        """Storages that are not counted, whatever uses them (each held alive by the caller)."""
        for t in tensors:
            if isinstance(t, torch.Tensor) and (st := _storage(t)) is not None:
                self.ignored.add(st._cdata)

    @contextlib.contextmanager
    def making(self, kind: str) -> Iterator[None]:
        """Storages the ops make inside are of ``kind`` from the start."""
        before, self.out_kind = self.out_kind, kind
        try:
            yield
        finally:
            self.out_kind = before

    def close(self) -> None:
        self.open = False
        self.live.clear()

    # -- where -----------------------------------------------------------------------

    def _where(self, args: Any) -> str:
        if self.phase == "step":  # the parameter the optimizer updates now
            return self.step_param
        if self.modules:
            return self.modules[-1]
        if self.phase == "backward":
            node = torch._C._current_autograd_node()
            if node is not None and self.spans:
                i = bisect.bisect_right(self.spans, (node._sequence_nr(), "\uffff")) - 1
                return self.spans[i][1] if i >= 0 else ""
        return ""

    def enter(self, name: str) -> None:
        """The forward enters module ``name``."""
        self.modules.append(name)
        if self.spanning and self.phase == "forward":
            self.spans.append((next_sequence_nr(), name))

    def leave(self) -> None:
        """The forward leaves the innermost module."""
        if self.modules:
            self.modules.pop()
        if self.spanning and self.phase == "forward":
            self.spans.append((next_sequence_nr(), self.modules[-1] if self.modules else ""))

    def _check_peak(self, op: Any, extra: int = 0, args: Any = (), extra_kind: str = "") -> None:
        """``op``: its name, or the aten op whose name it is (made only at a new peak)."""
        total = self.live_bytes + extra
        if total > self.peak.bytes:
            by_kind = dict(self.by_kind)
            if extra:
                by_kind[extra_kind or "activations"] += extra
            name = op if isinstance(op, str) else str(op.overloadpacket)
            self.peak = Peak(total, self.phase, self._where(args), name, by_kind)

    # -- the mode --------------------------------------------------------------------

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        # one look-up of the op (an OpOverload's hash is Python): _CUDA_MEASURED is in it
        measured = self.measure and self.open and func in _MEASURED
        cuda = _cuda_device(args) if measured and func in _CUDA_MEASURED else None
        freed_before = cuda_freed_bytes(cuda) if cuda is not None else 0
        out = func(*args, **kwargs)
        if cuda is not None:  # what the kernel took and gave back during the call, read
            # before any Python work here could free a tensor
            workspace = max(0, cuda_freed_bytes(cuda) - freed_before)
        if not self.open:
            return out
        if self.phase == "step" and func.__name__.startswith("_foreach"):
            self.step_param = "(every parameter: foreach)"
        elif self.phase == "step":  # the parameter (or its grad, its state) the op is about
            for t in _tensors(args):
                st = _storage(t)
                if st is not None and (name := self.param_names.get(st._cdata)):
                    self.step_param = name
                    break
        if isinstance(out, torch.Tensor):
            if (st := _storage(out)) is not None:
                self._add(st, self.out_kind)
        else:
            for t in _tensors(out):
                st = _storage(t)
                if st is not None:
                    self._add(st, self.out_kind)
        scratch: int | None = None
        if cuda is not None:
            scratch = workspace
        elif measured:
            scratch = measured_scratch(func, args, kwargs)
        if scratch is None:  # not measured: modelled where there is a model
            if func is _aten.convolution.default:
                scratch = _onednn_conv_bytes(args, out)
            elif (measured or not self.measure) and func in _MATMULS:
                scratch = sum(_blas_copy_bytes(a) for a in args[-2:])
            else:
                scratch = 0
        self._check_peak(func, scratch, args)
        return out
