"""``CostProbe``: FLOPs, saved-for-backward bytes and activation liveness per module call.

Three instruments run together in one forward pass with grad enabled (the
*measured pass*):

- a ``TorchDispatchMode`` sees every aten op below autograd, counts its FLOPs
  with ``hookcli.cost.flops.formula_for`` and books them on the innermost module call
  under way (the module stack is kept from the session's forward-pre/forward
  hooks); ops with no formula are tallied as uncounted, with the calls they ran in;
- ``torch.autograd.graph.saved_tensors_hooks`` sees every tensor autograd saves
  for backward; its storage is booked once on the call that saved it
  (parameters and buffers excluded). The pack hook keeps nothing, so the pass
  frees memory as an inference run would;
- every storage an op creates is followed with a weak reference, so the bytes of
  activations alive at once (and their peak) are known as the run goes.

With ``backward=True`` a second forward (saving for real) and a backward pass
follow; ``torch.autograd.graph.node_creation_hook`` books each autograd node on
the call that created it, and backward ops are counted on the node that runs them.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from hookcli.attention import SwapsAttention
from hookcli.cost.flops import (
    SPARSE_OPERANDS,
    ZERO_FLOP_OPS,
    formula_for,
    op_name,
    sparse_matmul_flops,
    sparse_operands,
    stored,
)
from hookcli.modelinfo import attribute_tensors
from hookcli.session import CallRecord, Frame, Probe
from hookcli.structures import iter_tensors

FORWARD, BACKWARD = "forward", "backward"
REPLAY = "replay"  # the second forward, before backward: storages followed, nothing counted


@dataclass
class Uncounted:
    """An aten op that ran without a FLOP formula: how often and where."""

    op: str
    phase: str
    calls: int = 0
    output_elements: int = 0
    modules: dict[str, None] | None = None  # labels, in first-seen order


@dataclass
class SparseOp:
    """A matrix product with a sparse operand: counted by its nonzeros, not its shape."""

    op: str
    phase: str
    calls: int = 0
    nonzeros: int = 0  # the stored elements of its sparse operands, summed over calls
    flops: int = 0  # counted (by the nonzeros)
    dense_flops: int = 0  # what the shapes alone would have counted
    modules: dict[str, None] | None = None


@dataclass(frozen=True)
class AttributeTensor:
    """A tensor held in a module attribute that is neither a parameter nor a buffer
    (a KV cache, a rotary table): memory the model holds, no activation of the run."""

    module: str
    attribute: str
    shape: tuple[int, ...]
    dtype: str
    bytes: int  # its storage's, counted once where tensors share one


@dataclass(frozen=True)
class CallCost:
    """The figures of one row: inclusive and own FLOPs, memory in bytes."""

    flops: int
    own_flops: int
    backward_flops: int | None
    own_backward_flops: int | None
    saved_bytes: int
    own_saved_bytes: int
    output_bytes: int | None


def _outputs(out: Any) -> Iterator[torch.Tensor]:
    """The tensors an op returned (ops return a tensor, or a tuple/list of them, one deep)."""
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, (tuple, list)):
        for o in out:
            if isinstance(o, torch.Tensor):
                yield o
            elif isinstance(o, (tuple, list)):
                yield from (t for t in o if isinstance(t, torch.Tensor))


def _storage(t: torch.Tensor) -> Any:
    """The untyped storage of ``t``; None for tensors without one (sparse, nested)."""
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def _parts(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The strided tensors a sparse tensor is made of (indices and values); () otherwise."""
    layout = t.layout
    try:
        if layout is torch.sparse_coo:
            return (t._indices(), t._values())
        if layout in (torch.sparse_csr, torch.sparse_bsr):
            return (t.crow_indices(), t.col_indices(), t.values())
        if layout in (torch.sparse_csc, torch.sparse_bsc):
            return (t.ccol_indices(), t.row_indices(), t.values())
    except (RuntimeError, NotImplementedError):
        pass
    return ()


def _storages(t: torch.Tensor) -> list[Any]:
    """The storages holding ``t``'s data: its own, or a sparse tensor's parts'."""
    if t.layout is torch.strided:
        st = _storage(t)
        return [] if st is None else [st]
    return [st for p in _parts(t) if (st := _storage(p)) is not None]


class StorageLedger:
    """Storages seen in the measured pass: a serial number each, bytes alive, the peak.

    Keyed by the StorageImpl address (``_cdata``), which a freed storage may hand
    on to a new one: the weak reference's callback forgets the old entry first.
    Parameter and buffer storages are *static*: never activations, never saved.
    """

    def __init__(self) -> None:
        self.static: set[int] = set()
        self.live: dict[int, tuple[int, int, Any]] = {}  # cdata -> (serial, bytes, weakref)
        self.live_bytes = 0
        self.peak_bytes = 0
        self.serial = 0
        self.open = True
        # +serial when a counted storage appears, -serial when it is freed: replayed to
        # take storages out of the peak afterwards (those the model kept in attributes)
        self.events: list[int] = []
        self.sizes: dict[int, int] = {}  # serial -> bytes, counted storages
        self._transient: list[Any] = []  # weak references to attribute storages

    def add_static(self, t: torch.Tensor) -> None:
        st = _storage(t)
        if st is not None:
            self.static.add(st._cdata)

    def add_transient(self, st: Any) -> None:
        """A storage that is no activation while it lives (a tensor in a module attribute),
        but that the model may drop during the run (``self.cache = self.cache.to(x)``):
        its address may then serve a new storage, which must not pass for it."""
        key = st._cdata
        if key not in self.static:
            self.static.add(key)
            self._transient.append(weakref.ref(st, functools.partial(self._unstatic, key)))

    def _unstatic(self, key: int, _ref: Any) -> None:
        self.static.discard(key)

    def _forget(self, key: int, serial: int, _ref: Any) -> None:
        entry = self.live.get(key)
        if self.open and entry is not None and entry[0] == serial:
            del self.live[key]
            self.live_bytes -= entry[1]
            if entry[1]:
                self.events.append(-serial)

    def track(self, st: Any, counted: bool = True) -> tuple[int, int] | None:
        """(serial, bytes) of a storage, registering it when new; None when static."""
        key = st._cdata
        if key in self.static:
            return None
        entry = self.live.get(key)
        if entry is None:
            self.serial += 1
            serial, nbytes = self.serial, st.nbytes()
            ref = weakref.ref(st, functools.partial(self._forget, key, serial))
            self.live[key] = (serial, nbytes if counted else 0, ref)
            if counted:
                self.live_bytes += nbytes
                self.peak_bytes = max(self.peak_bytes, self.live_bytes)
                if nbytes:
                    self.events.append(serial)
                    self.sizes[serial] = nbytes
            return serial, nbytes
        return entry[0], st.nbytes()

    def live_serial(self, st: Any) -> int | None:
        """The serial of a storage alive now that the run created (None: static or unseen)."""
        entry = self.live.get(st._cdata)
        return None if entry is None else entry[0]

    def exclude(self, serials: set[int]) -> None:
        """Take these storages out of the peak, as if they had never been activations."""
        if not serials:
            return
        live = peak = 0
        sizes = self.sizes
        for e in self.events:
            if e > 0:
                if e not in serials:
                    live += sizes[e]
                    if live > peak:
                        peak = live
            elif -e not in serials:
                live -= sizes[-e]
        self.peak_bytes = peak

    def close(self) -> None:
        """Stop following frees (the measured pass is over)."""
        self.open = False
        self.live.clear()


_COMPOSITE: dict[Any, bool] = {}


def _decomposable(func: Any) -> bool:
    """Whether an op has a CompositeImplicitAutograd kernel (cached: asked per op call)."""
    known = _COMPOSITE.get(func)
    if known is None:
        key = torch._C.DispatchKey.CompositeImplicitAutograd
        try:
            # the two cases OpOverload.decompose handles: a Python kernel, a C++ one
            known = key in getattr(func, "py_kernels", {}) or (
                torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), key)
            )
        except (AttributeError, RuntimeError):
            known = hasattr(func, "decompose")
        _COMPOSITE[func] = known
    return known


class _CountingMode(TorchDispatchMode):
    """Counts every aten op below autograd for the probe (forward or backward phase)."""

    def __init__(self, probe: CostProbe, phase: str) -> None:
        super().__init__()
        self.probe = probe
        self.phase = phase

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        packet = func._overloadpacket
        formula = formula_for(packet)
        if formula is None and packet not in ZERO_FLOP_OPS and _decomposable(func):
            # a CompositeImplicit op reaching here whole (linear, softmax under
            # inference mode): count the ops it is made of, as autograd would run them
            with self:
                r = func.decompose(*args, **kwargs)
            if r is not NotImplemented:
                return r
        out = func(*args, **kwargs)
        self.probe._on_op(packet, formula, args, kwargs, out, self.phase)
        return out


def _cpu_stand_in(t: Any) -> Any:
    """A CPU tensor with ``t``'s shape, dtype, last-dim stride and requires_grad, over one
    row of storage (the other strides 0): enough for the kernel choice, which reads
    metadata only, at no allocation worth the name."""
    if not isinstance(t, torch.Tensor):
        return t
    if t.dim() == 0:
        return torch.zeros((), dtype=t.dtype)
    last = t.stride(-1)
    strides = [0] * t.dim()
    strides[-1] = 1 if last == 1 else 0
    base = torch.zeros(t.shape[-1] if last == 1 else 1, dtype=t.dtype)
    view = base.as_strided(tuple(t.shape), strides)
    if t.requires_grad and t.dtype.is_floating_point:
        view = view.detach().requires_grad_(True)
    return view


_FLASH = 1  # sdp::SDPBackend::flash_attention


def _cpu_choice(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """The SDPA backend the CPU would pick for these arguments (None: unknown)."""
    choose = getattr(torch.ops.aten, "_fused_sdp_choice", None)
    if choose is None:
        return None
    from torch.utils._python_dispatch import _disable_current_modes

    try:
        with _disable_current_modes():
            return int(
                choose(
                    *(_cpu_stand_in(a) for a in args),
                    **{k: _cpu_stand_in(v) for k, v in kwargs.items()},
                )
            )
    except (RuntimeError, TypeError, ValueError):
        return None


def _fused_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor | None:
    """SDPA on meta through the kernel the CPU would pick; None where that is the math
    decomposition (which the meta device runs by itself) or cannot be told.

    The choice is the CPU's own (``aten._fused_sdp_choice`` asked with CPU stand-ins of
    the same metadata); the flash kernel is then called as the CPU's composite
    ``scaled_dot_product_attention`` calls it, a boolean mask first turned into an
    additive one.
    """
    if not (isinstance(query, torch.Tensor) and query.is_meta):
        return None
    extra: dict[str, Any] = {"scale": scale}
    if enable_gqa:
        extra["enable_gqa"] = True
    choice = _cpu_choice((query, key, value, attn_mask, dropout_p, is_causal), extra)
    if choice != _FLASH:
        return None
    mask = attn_mask
    if mask is not None and mask.dtype == torch.bool:
        mask = torch.zeros_like(mask, dtype=query.dtype).masked_fill_(
            mask.logical_not(), float("-inf")
        )
    try:
        op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        out: torch.Tensor = op(
            query, key, value, dropout_p, is_causal, attn_mask=mask, scale=scale
        )[0]
        return out
    except (RuntimeError, TypeError, AttributeError):
        return None


class _FusedAttentionOnMeta(SwapsAttention, TorchFunctionMode):
    """On meta, run F.scaled_dot_product_attention through the kernel the CPU picks.

    The meta device has no fused attention and falls back to the math
    decomposition, which keeps the [seq, seq] attention matrices for backward;
    the CPU picks a flash kernel that keeps q, k, v, the output and a log-sum-exp.
    The FLOPs are the same either way; the saved bytes and the activation peak
    are those of the CPU's kernel, so that cpu and meta agree.

    A torch-function mode sees the calls the model makes itself, but not those
    made inside another torch function that the mode handles (the mode is off
    while its handler runs): ``F.multi_head_attention_forward`` calls SDPA so.
    ``torch.nn.functional.scaled_dot_product_attention`` is therefore also
    replaced while the mode is on, and put back after (``SwapsAttention``).
    """

    def __init__(self) -> None:
        super().__init__()
        self._original = torch.nn.functional.scaled_dot_product_attention

    def _attention(self, *args: Any, **kwargs: Any) -> Any:
        out = _fused_sdpa(*args, **kwargs)
        return out if out is not None else self._original(*args, **kwargs)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is self._original:
            out = _fused_sdpa(*args, **kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)


_NO_SEQUENCE = 1 << 62  # AccumulateGrad nodes carry UINT64_MAX


def _next_sequence_nr() -> int:
    """The sequence number the next autograd node will get (one throwaway node)."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes(), torch.enable_grad():
        node = torch.zeros((), requires_grad=True).view(()).grad_fn
    assert node is not None
    return int(node._sequence_nr()) + 1


class _Dropped:
    """What the measured pass gives autograd to keep instead of a saved tensor."""

    __slots__ = ()


_DROPPED = _Dropped()


def _no_unpack(_packed: Any) -> torch.Tensor:
    raise RuntimeError(
        "hookcli cost: the model ran backward inside its forward; saved tensors are not "
        "kept during the measured pass"
    )


class CostProbe(Probe):
    """Per-call FLOPs, saved bytes and output bytes; the activation peak of the run."""

    def __init__(self, model: nn.Module, fused_attention: bool = False) -> None:
        self.model = model
        self.fused_attention = fused_attention  # meta: SDPA as CPU/CUDA run it
        self.ledger = StorageLedger()
        self.train_ledger = StorageLedger()  # the second forward and the backward
        self._stack: list[int] = []  # measured-pass frame indices of the calls under way
        self.parent: list[int] = []
        self.module_ids: list[int] = []
        self.names: list[str] = []
        self.calls: list[int] = []
        self.own_flops: list[int] = []
        self.own_bwd: list[int] = []
        self.own_saved: list[dict[int, int]] = []
        self.output_bytes: list[int | None] = []
        self.uncounted: dict[tuple[str, str], Uncounted] = {}
        self.measured_calls: int | None = None  # frames of the measured pass, once it ended
        self.backward_ran = False
        self._second_offset = 0
        self._walk = False  # book autograd nodes by walking the graph (older torch)
        self._starts: list[int] = []  # per call under way: the sequence number at its start
        self._nodes: dict[int, tuple[Any, int]] = {}  # id(node) -> (node, frame)
        self._incl: tuple[list[int], list[int], list[dict[int, int]]] | None = None
        self.input_bytes = 0
        self.sparse: dict[tuple[str, str], SparseOp] = {}
        # tensors in plain module attributes as the measured pass left them, and the
        # storages of those the run itself made (kept out of activations and saved bytes)
        self.attributes: list[AttributeTensor] = []
        self.attribute_serials: set[int] = set()

    # -- the passes -----------------------------------------------------------------
    def _open(self, ledger: StorageLedger, inputs: Sequence[Any]) -> int:
        """Parameters, buffers and attribute tensors static, inputs live: the bytes of the
        inputs."""
        for t in (*self.model.parameters(), *self.model.buffers()):
            ledger.add_static(t)
        for _, _, t in attribute_tensors(self.model):
            for st in _storages(t):
                ledger.add_transient(st)
        seen: set[int] = set()
        total = 0
        for t in iter_tensors(list(inputs)):
            for st in _storages(t):
                if st._cdata not in seen:
                    seen.add(st._cdata)
                    tracked = ledger.track(st)
                    total += tracked[1] if tracked else 0
        return total

    def _settle_attributes(self, ledger: StorageLedger, record: bool) -> None:
        """After a pass: storages the run made that the model keeps in attributes (a cache
        made by ``self.cache_k.to(x)``) leave the activation peak; with ``record``, the
        attribute tensors as the pass left them are the report's."""
        found = attribute_tensors(self.model)
        serials: set[int] = set()
        # a view of a parameter or buffer kept in an attribute (``self.w_t = w.T``) is
        # that tensor's memory, already counted: not listed
        owned = {
            st._cdata
            for t in (*self.model.parameters(), *self.model.buffers())
            for st in _storages(t)
        }
        seen: set[int] = set()
        rows: list[AttributeTensor] = []
        for module, attr, t in found:
            parts = _storages(t)
            if parts and all(st._cdata in owned for st in parts):
                continue
            size = 0
            for st in parts:
                serial = ledger.live_serial(st)
                if serial is not None:
                    serials.add(serial)
                if st._cdata not in seen:
                    seen.add(st._cdata)
                    size += st.nbytes()
            rows.append(
                AttributeTensor(
                    module or "(root)",
                    attr,
                    tuple(t.shape),
                    str(t.dtype).removeprefix("torch."),
                    size,
                )
            )
        ledger.exclude(serials)
        if record:
            self.attributes = rows
            self.attribute_serials = serials
            for saved in self.own_saved:
                for serial in serials & saved.keys():
                    del saved[serial]

    @contextlib.contextmanager
    def measuring(self, inputs: Sequence[Any]) -> Iterator[None]:
        """The measured pass: count ops, book saved tensors, follow storages."""
        self.input_bytes = self._open(self.ledger, inputs)
        try:
            with (
                torch.autograd.graph.saved_tensors_hooks(self._pack, _no_unpack),
                self._attention(),
                _CountingMode(self, FORWARD),
            ):
                yield
        finally:
            self.measured_calls = len(self.parent)
            self._settle_attributes(self.ledger, record=True)
            self.ledger.close()

    @contextlib.contextmanager
    def mapping_nodes(self, inputs: Sequence[Any]) -> Iterator[None]:
        """The second forward: book each autograd node on the call that created it,
        and follow storages (kept for backward now) into the training peak."""
        assert self.measured_calls is not None
        self._second_offset = -1
        self._open(self.train_ledger, inputs)
        hook_cm = getattr(torch.autograd.graph, "node_creation_hook", None)
        self._walk = hook_cm is None  # older torch: walk each call's graph instead
        with contextlib.ExitStack() as stack:
            if hook_cm is not None:
                stack.enter_context(hook_cm(self._on_node))
            stack.enter_context(self._attention())
            stack.enter_context(_CountingMode(self, REPLAY))
            yield

    @contextlib.contextmanager
    def counting_backward(self) -> Iterator[None]:
        """The backward pass: count its ops on the calls whose nodes run them."""
        self.backward_ran = True
        try:
            with _CountingMode(self, BACKWARD):
                yield
        finally:
            self._nodes.clear()
            self._settle_attributes(self.train_ledger, record=False)
            self.train_ledger.close()

    def _attention(self) -> contextlib.AbstractContextManager[Any]:
        return _FusedAttentionOnMeta() if self.fused_attention else contextlib.nullcontext()

    # -- hooks ---------------------------------------------------------------------
    def on_forward_pre(self, frame: Frame, module: nn.Module, args: Any, kwargs: Any) -> None:
        if self.measured_calls is None:
            idx = frame.index
            self.parent.append(self._stack[-1] if self._stack else -1)
            self.module_ids.append(frame.module_id)
            self.names.append(frame.name)
            self.calls.append(frame.call)
            self.own_flops.append(0)
            self.own_bwd.append(0)
            self.own_saved.append({})
            self.output_bytes.append(None)
            self._stack.append(idx)
            return
        if self._second_offset < 0:
            self._second_offset = frame.index  # the second forward's first call
        idx = frame.index - self._second_offset
        valid = idx < self.measured_calls and self.names[idx] == frame.name
        self._stack.append(idx if valid else (self._stack[-1] if self._stack else 0))
        if self._walk:
            self._starts.append(_next_sequence_nr())

    def on_forward(
        self, frame: Frame, module: nn.Module, args: Any, kwargs: Any, output: Any
    ) -> None:
        if self._walk and self.measured_calls is not None and self._stack and self._starts:
            self._book_graph(self._stack[-1], self._starts.pop(), output)
        if self._stack:
            self._stack.pop()
        if self.measured_calls is None and frame.done:
            seen: set[int] = set()
            total = 0
            for t in iter_tensors(output):
                if id(t) not in seen:
                    seen.add(id(t))
                    total += t.numel() * t.element_size()
            self.output_bytes[frame.index] = total

    def _current(self) -> int:
        return self._stack[-1] if self._stack else -1

    def _book_graph(self, frame: int, start: int, output: Any) -> None:
        """Book on ``frame`` every autograd node its call created (torch without
        ``node_creation_hook``): the nodes behind its outputs whose sequence number is
        at least the one current when the call began, not booked on an inner call yet."""
        todo = [t.grad_fn for t in iter_tensors(output) if t.grad_fn is not None]
        # the nodes themselves are kept while walking: Python wrappers of C++ nodes are
        # made afresh by next_functions, and a freed one's id can come back for another
        seen: dict[int, Any] = {}
        while todo:
            node = todo.pop()
            if id(node) in seen:
                continue
            seen[id(node)] = node
            try:
                seq = node._sequence_nr()
            except (AttributeError, RuntimeError):
                continue
            if seq < start or seq >= _NO_SEQUENCE:  # made earlier; AccumulateGrad
                continue
            if id(node) not in self._nodes:
                self._nodes[id(node)] = (node, frame)
            todo.extend(n for n, _ in node.next_functions if n is not None)

    def _on_node(self, node: Any) -> None:
        if self._stack:
            self._nodes[id(node)] = (node, self._stack[-1])

    def _pack(self, t: torch.Tensor) -> Any:
        frame = self._current()
        if frame >= 0:
            if t.layout is torch.strided:
                storages = _storages(t)
            else:
                # saved-tensor hooks run above dispatch: a sparse tensor's parts are read
                # with the counting mode off, so that reading them is no op of the model's
                from torch.utils._python_dispatch import _disable_current_modes

                with _disable_current_modes():
                    storages = _storages(t)
            for st in storages:
                # a storage no op of the run created is saved memory all the same, but no
                # activation of this run (parameters, buffers and attribute tensors are
                # static: counted on their own lines)
                tracked = self.ledger.track(st, counted=False)
                if tracked is not None:
                    self.own_saved[frame][tracked[0]] = tracked[1]
        return _DROPPED

    def _on_op(
        self, packet: Any, formula: Any, args: Any, kwargs: Any, out: Any, phase: str
    ) -> None:
        ledger = self.ledger if phase == FORWARD else self.train_ledger
        for t in _outputs(out):
            if t.layout is torch.strided:
                st = _storage(t)
                if st is not None:
                    ledger.track(st)
            else:
                for st in _storages(t):
                    ledger.track(st)
        if phase == FORWARD:
            frame = self._current()
        else:
            if phase == REPLAY:
                return
            node = torch._C._current_autograd_node()
            entry = self._nodes.get(id(node)) if node is not None else None
            if entry is None:
                return  # the loss and the graph root: not the model's work
            frame = entry[1]
        if frame < 0:
            return
        if formula is not None:
            pair = sparse_operands(packet, args) if packet in SPARSE_OPERANDS else None
            if pair is None:
                flops = int(formula(*args, **kwargs, out_val=out))
            else:
                flops = sparse_matmul_flops(*pair)
                dense = int(formula(*args, **kwargs, out_val=out))
                self._book_sparse(packet, phase, frame, pair, flops, dense)
            if phase == FORWARD:
                self.own_flops[frame] += flops
            else:
                self.own_bwd[frame] += flops
            return
        if packet in ZERO_FLOP_OPS:
            return
        key = (op_name(packet), phase)
        entry_u = self.uncounted.get(key)
        if entry_u is None:
            entry_u = self.uncounted[key] = Uncounted(key[0], phase, modules={})
        entry_u.calls += 1
        entry_u.output_elements += sum(t.numel() for t in _outputs(out))
        assert entry_u.modules is not None
        entry_u.modules[self._label(frame)] = None

    def _book_sparse(
        self, packet: Any, phase: str, frame: int, pair: tuple[Any, Any], flops: int, dense: int
    ) -> None:
        key = (op_name(packet), phase)
        entry = self.sparse.get(key)
        if entry is None:
            entry = self.sparse[key] = SparseOp(key[0], phase, modules={})
        entry.calls += 1
        entry.nonzeros += sum(stored(t) for t in pair if t.layout is not torch.strided)
        entry.flops += flops
        entry.dense_flops += dense
        assert entry.modules is not None
        entry.modules[self._label(frame)] = None

    def sparse_ops(self) -> list[SparseOp]:
        """Products with a sparse operand, forward first, then by FLOPs (most first)."""
        return sorted(self.sparse.values(), key=lambda u: (u.phase != FORWARD, -u.flops, u.op))

    def attribute_bytes(self) -> int:
        """The bytes of the attribute tensors, each storage once."""
        return sum(a.bytes for a in self.attributes)

    def _label(self, frame: int) -> str:
        from hookcli.checks import layer_label

        return layer_label(self.names[frame], self.calls[frame])

    # -- figures -------------------------------------------------------------------
    def _inclusive(self) -> tuple[list[int], list[int], list[dict[int, int]]]:
        if self._incl is None:
            n = len(self.parent)
            flops, bwd = list(self.own_flops), list(self.own_bwd)
            saved = [dict(s) for s in self.own_saved]
            for i in range(n - 1, -1, -1):  # a call's children come after it
                p = self.parent[i]
                if p >= 0:
                    flops[p] += flops[i]
                    bwd[p] += bwd[i]
                    saved[p].update(saved[i])
            self._incl = (flops, bwd, saved)
        return self._incl

    def call_cost(self, index: int) -> CallCost:
        """The figures of one measured call (inclusive of the calls inside it)."""
        flops, bwd, saved = self._inclusive()
        return CallCost(
            flops=flops[index],
            own_flops=self.own_flops[index],
            backward_flops=bwd[index] if self.backward_ran else None,
            own_backward_flops=self.own_bwd[index] if self.backward_ran else None,
            saved_bytes=sum(saved[index].values()),
            own_saved_bytes=sum(self.own_saved[index].values()),
            output_bytes=self.output_bytes[index],
        )

    def module_cost(self, module: nn.Module) -> CallCost:
        """Figures of a module that was never called itself: the sum of its subtree's calls.

        The calls summed are those of descendant modules not inside another call
        of the subtree (so nothing counts twice); saved storages are united.
        """
        flops, bwd, saved = self._inclusive()
        subtree = {id(m) for m in module.modules()}
        own = {id(module)}
        total = total_bwd = own_f = own_b = 0
        storages: dict[int, int] = {}
        own_storages: dict[int, int] = {}
        for i in range(len(self.parent)):
            if self.module_ids[i] not in subtree:
                continue
            if self.module_ids[i] in own:
                own_f += self.own_flops[i]
                own_b += self.own_bwd[i]
                own_storages.update(self.own_saved[i])
            p = self.parent[i]
            if p >= 0 and self.module_ids[p] in subtree:
                continue  # inside a call already summed
            total += flops[i]
            total_bwd += bwd[i]
            storages.update(saved[i])
        return CallCost(
            flops=total,
            own_flops=own_f,
            backward_flops=total_bwd if self.backward_ran else None,
            own_backward_flops=own_b if self.backward_ran else None,
            saved_bytes=sum(storages.values()),
            own_saved_bytes=sum(own_storages.values()),
            output_bytes=None,
        )

    def total_flops(self) -> int:
        return sum(self.own_flops)

    def total_backward_flops(self) -> int | None:
        return sum(self.own_bwd) if self.backward_ran else None

    def total_saved_bytes(self) -> int:
        storages: dict[int, int] = {}
        for s in self.own_saved:
            storages.update(s)
        return sum(storages.values())

    def uncounted_ops(self) -> list[Uncounted]:
        """Uncounted ops, forward first, then by calls (most first)."""
        return sorted(self.uncounted.values(), key=lambda u: (u.phase != FORWARD, -u.calls, u.op))

    def record_cost(self, rec: CallRecord, modules: dict[int, nn.Module]) -> CallCost | None:
        """The figures of a layer row: its measured call, or its subtree for a container row."""
        called = getattr(rec, "called", True)
        n = self.measured_calls if self.measured_calls is not None else len(self.parent)
        if called and 0 <= rec.index < n and self.module_ids[rec.index] == rec.module_id:
            return self.call_cost(rec.index)
        module = modules.get(rec.module_id)
        return None if module is None else self.module_cost(module)
