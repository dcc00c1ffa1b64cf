"""``GradProbe``: gradient flow per module call, from backward and tensor hooks.

What each hook kind fills (docs/grads.md):

- ``backward-pre`` (full backward pre-hooks): ``grad_output_norm`` per call;
- ``backward`` (full backward hooks): ``grad_input_norm`` per call;
- ``tensor`` (``Tensor.register_hook`` on every parameter): the parameter grads
  as autograd produces them, giving ``grad_norm``, ``weight_norm``,
  ``grad_weight_ratio`` and ``unused_params`` per row and the total
  ``grad_norm``; with ``output_hooks`` also hooks on every module output (a
  non-leaf activation, whose gradient autograd otherwise frees):
  ``output_grad_norm``.

Every figure stays a 0-dim tensor on the model's device until ``finish``, which
moves them all to the host at once: no hook synchronizes with the device.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hookcli.modelinfo import param_fields
from hookcli.norms import blocked_norm
from hookcli.options import HookKind
from hookcli.render import fmt_float, fmt_text
from hookcli.report import Column
from hookcli.session import Probe
from hookcli.structures import iter_tensors

if TYPE_CHECKING:
    from hookcli.report import Report, Row
    from hookcli.session import CallRecord, Frame, HookSession

_FALSE = torch.zeros((), dtype=torch.bool)
_FINITE_NONZERO = torch.tensor([False, False, True])  # shared, never written
_FINITE_ZERO = torch.tensor([False, False, False])  # shared, never written


def _forward_flags(t: torch.Tensor) -> torch.Tensor:
    """[holds NaN, holds Inf, holds a non-zero] of one output, as a bool tensor.

    On the CPU one sum decides all three in the common case: a finite sum rules out NaN
    and Inf (either makes the sum NaN or infinite), and a non-zero sum proves a non-zero
    element. A sum reads the tensor once, as aminmax does, at less than half its cost.
    A sum that is exactly 0 (all zeros, or values that cancel, as a batch norm's output
    in train mode can) or not finite takes one aminmax: finite min and max rule out NaN
    and Inf, and then a non-zero min or max proves a non-zero. Only a min or max that
    is not finite runs the exact scans. On other devices the exact scans run without a
    read, so no hook synchronizes.
    """
    if t.device.type == "cpu":
        total = float(t.sum())
        if math.isfinite(total) and total != 0:
            return _FINITE_NONZERO
        lo, hi = (v.item() for v in torch.aminmax(t))
        if math.isfinite(lo) and math.isfinite(hi):
            return _FINITE_NONZERO if (lo != 0 or hi != 0) else _FINITE_ZERO
    return torch.stack([torch.isnan(t).any(), torch.isinf(t).any(), (t != 0).any()])


_SPARSE_COMPRESSED = (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)


def norm_values(t: torch.Tensor) -> torch.Tensor | None:
    """The dense values whose L2 norm is ``t``'s, or None where ``t`` has no norm.

    Floating and complex tensors are their own values (a complex element counts by its
    modulus); sparse and nested ones their stored values (COO coalesced first, so
    duplicate indices add up as in the dense tensor, which is never built). Integer,
    bool and quantized tensors hold no gradient: None. Full backward hooks put a
    module's integer and bool inputs themselves in ``grad_input``, so every norm that
    a hook takes goes through here.
    """
    t = t.detach()
    if t.is_quantized:
        return None
    if t.layout == torch.sparse_coo:
        t = t.coalesce().values()
    elif t.layout in _SPARSE_COMPRESSED or t.is_nested:
        t = t.values()
    if t.is_floating_point():
        # float8 has no reductions of its own; float32 holds its values exactly
        return t.float() if t.element_size() == 1 else t
    if t.is_complex():
        return t.to(torch.complex64) if t.dtype == torch.complex32 else t
    return None


def tensor_norm(t: torch.Tensor) -> torch.Tensor:
    """L2 norm of one floating, complex or sparse tensor as a 0-dim real tensor.

    TypeError for a tensor with no norm (``norm_values`` gives None): check first where
    such a tensor can come.
    """
    values = norm_values(t)
    if values is None:
        raise TypeError(f"a {t.dtype} tensor has no gradient norm")
    return blocked_norm(values)


def joint_norm(tensors: Iterable[Any]) -> torch.Tensor | None:
    """L2 norm over every tensor that has one (None, integer, bool and quantized entries
    skipped); None when there is none."""
    found = [
        v for t in tensors if isinstance(t, torch.Tensor) and (v := norm_values(t)) is not None
    ]
    if not found:
        return None
    if len(found) == 1:
        return blocked_norm(found[0])
    parts = [blocked_norm(v) for v in found]
    if len({p.device for p in parts}) > 1:
        parts = [p.to(parts[0].device) for p in parts]
    dtype = torch.promote_types(parts[0].dtype, torch.float32)
    return torch.linalg.vector_norm(torch.stack([p.to(dtype) for p in parts]))


def _flag_values(t: torch.Tensor) -> torch.Tensor | None:
    """The real values that ``_forward_flags`` reads (a complex tensor's real and
    imaginary parts), or None for a tensor that holds no floating values."""
    values = norm_values(t)
    if values is None or not values.is_complex():
        return values
    return torch.view_as_real(values.resolve_conj())


def _view_key(t: torch.Tensor) -> tuple[Any, Any]:
    """``(key, owner)``: for a dense tensor, its storage's id, offset, shape, strides and
    dtype, owned by the storage (two tensors with that key read the very same memory);
    for any other (sparse, nested, quantized, a subclass without a storage), its id,
    owned by the tensor itself."""
    if t.layout == torch.strided and not t.is_quantized and not t.is_nested:
        try:
            storage = t.untyped_storage()
        except Exception:  # a tensor subclass without a plain storage
            return id(t), t
        return (id(storage), t.storage_offset(), t.shape, t.stride(), t.dtype), storage
    return id(t), t


class _Gather:
    """Device tensors queued during ``finish``, copied to the host together.

    Each device's tensors are flattened into one float64 vector (float32 on MPS,
    which has no float64) and copied with a single ``tolist()``.
    """

    def __init__(self) -> None:
        self._tensors: list[torch.Tensor] = []
        self._values: list[list[float]] = []

    def add(self, t: torch.Tensor | None) -> int | None:
        """Queue a tensor; its slot number (None for None)."""
        if t is None:
            return None
        self._tensors.append(t.detach().reshape(-1))
        return len(self._tensors) - 1

    def run(self) -> None:
        by_device: dict[torch.device, list[int]] = {}
        for i, t in enumerate(self._tensors):
            by_device.setdefault(t.device, []).append(i)
        values: list[list[float]] = [[] for _ in self._tensors]
        for device, idx in by_device.items():
            dtype = torch.float32 if device.type == "mps" else torch.float64
            # one cat per source dtype, one conversion each, one copy to the host: a few
            # ops for hundreds of small tensors, not a conversion per tensor
            by_dtype: dict[torch.dtype, list[int]] = {}
            for i in idx:
                by_dtype.setdefault(self._tensors[i].dtype, []).append(i)
            order = [i for group in by_dtype.values() for i in group]
            parts = [
                torch.cat([self._tensors[i] for i in group]).to(dtype)
                for group in by_dtype.values()
            ]
            joined = (parts[0] if len(parts) == 1 else torch.cat(parts)).tolist()
            pos = 0
            for i in order:
                n = self._tensors[i].numel()
                values[i] = joined[pos : pos + n]
                pos += n
        self._values = values
        self._tensors = []

    def scalar(self, slot: int | None) -> float | None:
        return None if slot is None else float(self._values[slot][0])

    def vector(self, slot: int | None) -> list[float]:
        return [] if slot is None else self._values[slot]


@dataclass(frozen=True)
class ParamGrad:
    """One parameter tensor (tied tensors once, under their first name)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    requires_grad: bool
    grad_norm: float | None  # None: frozen, no tensor hooks, or no grad arrived (unused)
    weight_norm: float | None  # None: an integer or bool parameter (no norm)
    unused: bool  # requires_grad and .grad stayed None
    nan_count: int | None = None  # counted in per-param mode, when a grad arrived
    inf_count: int | None = None
    has_inf: bool | None = None  # exact Inf flag (``flag_inf``), else None

    @property
    def ratio(self) -> float | None:
        return ratio(self.grad_norm, self.weight_norm)


@dataclass(frozen=True)
class ModuleGrad:
    """A module's own trainable parameters, taken together."""

    grad_norm: float | None
    weight_norm: float | None
    unused: tuple[str, ...] = ()  # qualified names of its own params that got no grad
    has_inf: bool | None = None


@dataclass(frozen=True)
class CallGrad:
    """The gradients one module call saw; ``*_inf`` are exact flags (``flag_inf``) or None."""

    grad_output_norm: float | None = None
    grad_input_norm: float | None = None
    output_grad_norm: float | None = None
    grad_output_inf: bool | None = None
    grad_input_inf: bool | None = None
    output_grad_inf: bool | None = None
    output_nan: bool = False  # the forward output held NaN (``watch_forward`` only)
    output_inf: bool = False
    output_dead: bool = False  # every element of its floating outputs is zero


@dataclass(frozen=True)
class GradFindings:
    """Everything the probe measured, on the host, built once in ``finish``."""

    kinds: frozenset[HookKind]
    params: tuple[ParamGrad, ...]
    modules: Mapping[int, ModuleGrad]  # id(module) -> its own params' figures
    module_params: Mapping[int, tuple[str, ...]]  # id(module) -> own trainable param names
    calls: Mapping[int, CallGrad]  # frame index -> figures
    backward_order: tuple[int, ...]  # frame indices as their backward hooks fired
    forward_order: tuple[int, ...]  # frame indices as their forward calls returned
    total_grad_norm: float | None
    total_weight_norm: float | None
    watched_forward: bool = False
    complete: bool = True  # backward ran to the end (else ``unused`` is unknown: empty)

    @property
    def unused(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params if p.unused)


def ratio(grad: float | None, weight: float | None) -> float | None:
    """grad / weight, None when either is missing or weight is 0."""
    if grad is None or weight is None or weight == 0:
        return None
    return grad / weight


# One sighting of a gradient: its L2 norm and, with ``flag_inf``, whether it holds Inf.
_Stat = tuple[torch.Tensor, torch.Tensor | None]


class GradProbe(Probe):
    """Gradient norms per call and per parameter, from the backward hook kinds given.

    ``per_param`` also counts NaN and Inf elements of each parameter grad;
    ``output_hooks`` (tensor kind only) hooks every module output; ``watch_forward``
    flags forward outputs holding NaN, Inf or only zeros; ``flag_inf`` records, for
    every gradient seen, whether it holds Inf (a norm cannot tell when NaN is there
    too, or when the sum of squares overflows).
    """

    def __init__(
        self,
        kinds: frozenset[HookKind] | Iterable[HookKind],
        *,
        per_param: bool = False,
        output_hooks: bool = True,
        watch_forward: bool = False,
        flag_inf: bool = False,
        depth: int | None = None,
    ) -> None:
        self.kinds = frozenset(k for k in kinds if k.is_backward)
        # --depth: a row at that depth stands for its subtree (its hidden descendants' too)
        self.depth = depth
        self._cut: dict[int, nn.Module] = {}
        self.per_param = per_param
        self.output_hooks = output_hooks and HookKind.TENSOR in self.kinds
        self.watch_forward = watch_forward
        self.flag_inf = flag_inf
        self.findings: GradFindings | None = None
        self._session: HookSession | None = None
        self._params: list[tuple[str, nn.Parameter]] = []
        self._by_param: dict[int, ParamGrad] = {}
        self._pstat: dict[int, _Stat] = {}
        self._pcounts: dict[int, torch.Tensor] = {}
        self._pfired: dict[int, int] = {}
        self._gout: dict[int, _Stat | None] = {}
        self._gin: dict[int, _Stat | None] = {}
        self._ograd: dict[int, list[_Stat]] = {}
        self._fwd_flags: dict[int, torch.Tensor] = {}
        self._bw_order: list[int] = []
        self._fwd_order: list[int] = []
        # Full backward hooks pass gradient tensors on unchanged, so a parent and its
        # last child, or one module's grad_input and the previous one's grad_output,
        # often see the very same tensor: its figures are computed once. The weak
        # reference rules out a new tensor at a reused address, the version counter a
        # tensor that autograd has since accumulated into in place.
        self._seen: dict[int, tuple[weakref.ref[torch.Tensor], int, _Stat]] = {}
        self._fseen: dict[Any, tuple[weakref.ref[Any], int, torch.Tensor]] = {}

    def _one(self, t: torch.Tensor) -> _Stat | None:
        """The figures of one tensor; None for one with no norm (``norm_values``)."""
        cached = self._seen.get(id(t))
        if cached is not None and cached[0]() is t and cached[1] == t._version:
            return cached[2]
        d = norm_values(t)
        if d is None:
            return None
        norm = blocked_norm(d)
        inf = None
        if self.flag_inf:
            # On the CPU a read costs nothing: a finite norm rules out Inf (and NaN), so
            # the exact scan runs only when the norm is not (Inf, NaN, or an overflow).
            if d.device.type == "cpu" and math.isfinite(norm.item()):
                inf = _FALSE
            else:
                inf = torch.isinf(d).any()
        stat = (norm, inf)
        with contextlib.suppress(TypeError):  # a tensor subclass without weak references
            self._seen[id(t)] = (weakref.ref(t), t._version, stat)
        return stat

    def _flags_of(self, t: torch.Tensor) -> torch.Tensor | None:
        """``_forward_flags`` once per view of memory and version: a block returns its
        last layer's output, a ``Sequential`` its last child's, and with backward hooks
        on each behind a new detached alias (the session's: the same storage, view and
        version counter, another tensor object). So a dense tensor's figures are kept by
        its storage (alive: weakly referenced), offset, shape, strides and dtype, with its
        version; any other tensor's by the object. None for a tensor that holds no
        floating values; a sparse one's implicit zeros count as zeros."""
        key, owner = _view_key(t)
        cached = self._fseen.get(key)
        if cached is not None and cached[0]() is owner and cached[1] == t._version:
            return cached[2]
        values = _flag_values(t)
        if values is None:
            return None
        flags = _forward_flags(values) if values.numel() else _FINITE_ZERO
        with contextlib.suppress(TypeError):  # a tensor subclass without weak references
            self._fseen[key] = (weakref.ref(owner), t._version, flags)
        return flags

    def _stat(self, tensors: Iterable[Any]) -> _Stat | None:
        stats = [
            s for t in tensors if isinstance(t, torch.Tensor) and (s := self._one(t)) is not None
        ]
        if len(stats) <= 1:
            return stats[0] if stats else None
        norm = joint_norm([n for n, _ in stats])
        assert norm is not None
        infs = [f for _, f in stats if f is not None]
        inf = torch.stack([f.to(norm.device) for f in infs]).any() if infs else None
        return norm, inf

    # -- hooks -------------------------------------------------------------------
    def attach(self, session: HookSession) -> None:
        self._session = session
        seen: set[int] = set()
        for name, p in session.model.named_parameters():
            if id(p) not in seen:
                seen.add(id(p))
                self._params.append((name, p))
        if HookKind.TENSOR not in self.kinds:
            return
        for i, (_, p) in enumerate(self._params):
            if p.requires_grad:
                session.keep(p.register_hook(self._param_hook(i)))

    def _param_hook(self, i: int) -> Any:
        def hook(grad: torch.Tensor) -> None:
            self._pfired[i] = self._pfired.get(i, 0) + 1
            stat = self._one(grad)
            if stat is not None:
                self._pstat[i] = stat
            g = norm_values(grad) if self.per_param else None
            if g is not None:  # a sparse grad: NaN and Inf among its stored values
                self._pcounts[i] = torch.stack([torch.isnan(g).sum(), torch.isinf(g).sum()])

        return hook

    def on_forward(
        self, frame: Frame, module: nn.Module, args: Any, kwargs: Any, output: Any
    ) -> None:
        if frame.failed:
            return
        self._fwd_order.append(frame.index)
        if self.watch_forward:
            flags = [
                f
                for t in iter_tensors(output)
                if t.numel() and (f := self._flags_of(t)) is not None
            ]
            if flags:
                self._fwd_flags[frame.index] = torch.cat([f.to(flags[0].device) for f in flags])
        if not self.output_hooks or not torch.is_grad_enabled() or self._session is None:
            return
        for t in iter_tensors(output):
            if t.requires_grad:
                self._session.keep(t.register_hook(self._output_hook(frame.index)))

    def _output_hook(self, index: int) -> Any:
        def hook(grad: torch.Tensor) -> None:
            stat = self._one(grad)
            if stat is not None:
                self._ograd.setdefault(index, []).append(stat)

        return hook

    def on_backward_pre(self, frame: Frame, module: nn.Module, grad_output: Any) -> None:
        if HookKind.BACKWARD_PRE in self.kinds:
            self._gout[frame.index] = self._stat(grad_output)
        if HookKind.BACKWARD not in self.kinds:
            self._bw_order.append(frame.index)

    def on_backward(
        self, frame: Frame, module: nn.Module, grad_input: Any, grad_output: Any
    ) -> None:
        if HookKind.BACKWARD in self.kinds:
            self._gin[frame.index] = self._stat(grad_input)
            self._bw_order.append(frame.index)

    # -- results -----------------------------------------------------------------
    def finish(self, session: HookSession) -> None:
        """Weight norms, then every figure to the host in one transfer per device."""
        g = _Gather()

        def add_stat(stat: _Stat | None) -> tuple[int | None, int | None]:
            return (None, None) if stat is None else (g.add(stat[0]), g.add(stat[1]))

        def merged(stats: list[_Stat]) -> _Stat | None:
            norm = joint_norm([s[0] for s in stats])
            if norm is None:
                return None
            infs = [s[1] for s in stats if s[1] is not None]
            inf = torch.stack([f.to(norm.device) for f in infs]).any() if infs else None
            return norm, inf

        with torch.no_grad():
            weight_slots = [g.add(joint_norm((p,))) for _, p in self._params]
            grad_slots: list[tuple[int | None, int | None]] = []
            for i, (_, p) in enumerate(self._params):
                fired = self._pfired.get(i, 0)
                if fired == 1 and i in self._pstat:
                    grad_slots.append(add_stat(self._pstat[i]))
                elif fired > 1 and p.grad is not None:  # the accumulated grad, over the fires
                    grad_slots.append(add_stat(self._stat((p.grad,))))
                else:
                    grad_slots.append((None, None))
            count_slots = {i: g.add(c) for i, c in self._pcounts.items()}
            gout = {k: add_stat(v) for k, v in self._gout.items()}
            gin = {k: add_stat(v) for k, v in self._gin.items()}
            ograd = {k: add_stat(merged(v)) for k, v in self._ograd.items()}
            fwd = {k: g.add(v) for k, v in self._fwd_flags.items()}
            g.run()
        val = g.scalar

        def flag(slot: int | None) -> bool | None:
            v = g.scalar(slot)
            return None if v is None else bool(v)

        tensor_kind = HookKind.TENSOR in self.kinds
        # Which parameters stayed without a grad is known only once a backward is over:
        # one that raised (wherever: in the model, or in a hook with no module open)
        # leaves the grads of everything before the failure missing.
        complete = session.backward_done and session.failure is None
        params: list[ParamGrad] = []
        for i, (name, p) in enumerate(self._params):
            counts = g.vector(count_slots.get(i))
            norm_slot, inf_slot = grad_slots[i]
            params.append(
                ParamGrad(
                    **param_fields(name, p),
                    grad_norm=val(norm_slot),
                    weight_norm=val(weight_slots[i]),
                    unused=complete and p.requires_grad and p.grad is None,
                    nan_count=int(counts[0]) if counts else None,
                    inf_count=int(counts[1]) if counts else None,
                    has_inf=flag(inf_slot),
                )
            )
        by_id = {id(p): params[i] for i, (_, p) in enumerate(self._params)}
        self._by_param = by_id
        if self.depth is not None:  # the modules whose rows the depth cuts below
            self._cut = {id(m): m for m in session.model.modules() if next(m.children(), None)}
        modules: dict[int, ModuleGrad] = {}
        module_params: dict[int, tuple[str, ...]] = {}
        for mname, m in session.model.named_modules():
            own = [
                (f"{mname}.{n}" if mname else n, by_id[id(p)])
                for n, p in m.named_parameters(recurse=False)
                if p.requires_grad and id(p) in by_id
            ]
            module_params[id(m)] = tuple(n for n, _ in own)
            if not own:
                modules[id(m)] = ModuleGrad(None, None)
                continue
            grads = [pg.grad_norm for _, pg in own if pg.grad_norm is not None]
            infs = [pg.has_inf for _, pg in own if pg.has_inf is not None]
            modules[id(m)] = ModuleGrad(
                grad_norm=_l2(grads) if grads and tensor_kind else None,
                weight_norm=_l2([pg.weight_norm for _, pg in own if pg.weight_norm is not None]),
                unused=tuple(n for n, pg in own if pg.unused),
                has_inf=any(infs) if infs else None,
            )
        calls: dict[int, CallGrad] = {}
        for index in {*gout, *gin, *ograd, *fwd}:
            flags = g.vector(fwd.get(index))  # [nan, inf, nonzero] per output tensor
            go, gi, og = (d.get(index, (None, None)) for d in (gout, gin, ograd))
            calls[index] = CallGrad(
                grad_output_norm=val(go[0]),
                grad_input_norm=val(gi[0]),
                output_grad_norm=val(og[0]),
                grad_output_inf=flag(go[1]),
                grad_input_inf=flag(gi[1]),
                output_grad_inf=flag(og[1]),
                output_nan=any(flags[0::3]),
                output_inf=any(flags[1::3]),
                output_dead=bool(flags) and not any(flags[2::3]),
            )
        trainable = [pg for pg in params if pg.requires_grad]
        grads = [pg.grad_norm for pg in trainable if pg.grad_norm is not None]
        self.findings = GradFindings(
            kinds=self.kinds,
            params=tuple(params),
            modules=modules,
            module_params=module_params,
            calls=calls,
            backward_order=tuple(self._bw_order),
            forward_order=tuple(self._fwd_order),
            total_grad_norm=_l2(grads) if grads and tensor_kind else None,
            total_weight_norm=(
                _l2([pg.weight_norm for pg in trainable if pg.weight_norm is not None])
                if trainable
                else None
            ),
            watched_forward=self.watch_forward,
            complete=complete,
        )
        # Drop the device tensors: the findings are all the report needs.
        for store in (self._pstat, self._pcounts, self._gout, self._gin, self._ograd, self._seen):
            store.clear()
        self._fwd_flags.clear()
        self._fseen.clear()
        self._session = None

    def columns(self, record: CallRecord) -> dict[str, Any]:
        f = self.findings
        if f is None:
            return {}
        out: dict[str, Any] = {}
        call = f.calls.get(record.index, CallGrad())
        cut = self._cut.get(record.module_id) if record.depth == self.depth else None
        if cut is not None:  # children hidden by --depth: the norms of the whole subtree
            out.update(self.container_columns(cut))
        elif HookKind.TENSOR in self.kinds:
            mod = f.modules.get(record.module_id, ModuleGrad(None, None, ()))
            out["grad_norm"] = mod.grad_norm
            out["weight_norm"] = mod.weight_norm
            out["grad_weight_ratio"] = ratio(mod.grad_norm, mod.weight_norm)
            out["unused_params"] = list(mod.unused)
        if HookKind.BACKWARD_PRE in self.kinds:
            out["grad_output_norm"] = call.grad_output_norm
        if HookKind.BACKWARD in self.kinds:
            out["grad_input_norm"] = call.grad_input_norm
        if self.output_hooks:
            out["output_grad_norm"] = call.output_grad_norm
        return out

    def container_columns(self, module: nn.Module) -> dict[str, Any]:
        """The joint grad and weight norms of the subtree's trainable parameters."""
        if self.findings is None or HookKind.TENSOR not in self.kinds:
            return {}
        own = [self._by_param[id(p)] for p in module.parameters() if id(p) in self._by_param]
        own = [pg for pg in own if pg.requires_grad]
        grads = [pg.grad_norm for pg in own if pg.grad_norm is not None]
        grad_norm = _l2(grads) if grads else None
        weight_norm = (
            _l2([pg.weight_norm for pg in own if pg.weight_norm is not None]) if own else None
        )
        return {
            "grad_norm": grad_norm,
            "weight_norm": weight_norm,
            "grad_weight_ratio": ratio(grad_norm, weight_norm),
            "unused_params": [pg.name for pg in own if pg.unused],
        }

    def totals(self) -> dict[str, Any]:
        f = self.findings
        if f is None or HookKind.TENSOR not in self.kinds:
            return {}
        return {
            "grad_norm": f.total_grad_norm,
            "weight_norm": f.total_weight_norm,
            "unused_params": list(f.unused) if f.complete else None,
        }

    @property
    def table_columns(self) -> list[Column]:
        """The human-table columns of the kinds attached."""
        cols: list[Column] = []
        if HookKind.TENSOR in self.kinds:
            cols += [
                Column("grad_norm", "Grad norm", fmt_float, "right"),
                Column("weight_norm", "Weight norm", fmt_float, "right"),
                Column("grad_weight_ratio", "Grad/weight", fmt_float, "right"),
            ]
        if HookKind.BACKWARD_PRE in self.kinds:
            cols.append(Column("grad_output_norm", "Grad output", fmt_float, "right"))
        if HookKind.BACKWARD in self.kinds:
            cols.append(Column("grad_input_norm", "Grad input", fmt_float, "right"))
        if self.output_hooks:
            cols.append(Column("output_grad_norm", "Output grad", fmt_float, "right"))
        if HookKind.TENSOR in self.kinds:
            cols.append(Column("unused_params", "Unused", _fmt_unused))
        return cols


def _fmt_unused(value: Any) -> str:
    if not value:
        return ""
    return fmt_text([str(v).rsplit(".", 1)[-1] for v in value])


def _l2(values: Sequence[float]) -> float:
    """sqrt(sum of squares) in Python floats (inf/nan propagate)."""
    import math

    return math.sqrt(math.fsum(v * v for v in values)) if values else 0.0


def render_table_with_params(report: Report) -> str:
    """The grads table with the per-parameter table between the layers and the totals."""
    import dataclasses

    from hookcli.render import render_table

    head = render_table(dataclasses.replace(report, checks=(), error=None), report.columns, ())
    tail = render_table(dataclasses.replace(report, layers=(), notes=()), [], report.table_totals)
    tail = tail.split("\n", 3)[-1]  # drop the header line, blank line and "(no layers)"
    return head + "\nParameters:\n" + param_table(report.lists["params"]) + "\n" + tail


def param_table(rows: Sequence[Row]) -> str:
    """One line per parameter: shape, grad and weight norms, their ratio, NaN/Inf counts."""
    import tabulate

    from hookcli.errors import printable
    from hookcli.render import fmt_int, fmt_shape

    body = [
        [
            printable(r.data["name"]),  # a module name may hold a newline
            fmt_shape(r.data["shape"]),
            fmt_float(r.data["grad_norm"]),
            fmt_float(r.data["weight_norm"]),
            fmt_float(r.data["grad_weight_ratio"]),
            fmt_int(r.data["nan_count"]),
            fmt_int(r.data["inf_count"]),
        ]
        for r in rows
    ]
    headers = ["Parameter", "Shape", "Grad norm", "Weight norm", "Grad/weight", "NaN", "Inf"]
    align = ["left", "left", "right", "right", "right", "right", "right"]
    return tabulate.tabulate(
        body, headers=headers, colalign=align, tablefmt="simple", disable_numparse=True
    )


def backward_probes(kinds: Sequence[HookKind]) -> list[Probe]:
    """The gradient probes for the backward kinds among ``kinds`` (may be empty)."""
    wanted = [k for k in kinds if k.is_backward]
    if not wanted:
        return []
    return [GradProbe(frozenset(wanted))]
