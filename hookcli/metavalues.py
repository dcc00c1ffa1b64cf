"""Values on the meta device: what a model reads from tensors that hold none.

Meta tensors have shapes but no values, so an op whose result depends on values
(``.item()``, ``.tolist()``, ``nonzero``, boolean-mask indexing, ``bincount``,
``histc`` offsets, ``torch._grouped_mm`` with routing offsets) cannot run there.
``MetaValues`` is a dispatch mode that gives such ops values by one documented
synthesis (docs/models.md#values-on-meta), in three parts:

1. **Shadows, exact.** A small meta tensor whose values are known keeps a CPU
   copy (its shadow): integer and boolean inputs drawn as they are on the CPU
   (``input_ids``, masks, ``image_grid_thw``), and every small tensor made by a
   factory (``arange``, ``zeros``, ``full``, ``linspace``). An op whose meta
   operands all have shadows also runs on the shadows, so positions, masks,
   token counts and offsets computed from them are exact, and ``.item()``,
   ``.tolist()`` and ``nonzero`` on them return the real values.
2. **Stand-ins, stated.** Where a value comes from data meta does not hold
   (activations, weights), the value is synthesized and the report lists it in
   ``settings.meta_assumptions``:
   - ``routing``: indices chosen from values (``topk``, ``sort``, ``argmax``,
     ``max``/``min`` over a dim) spread evenly: row ``t`` of a top-``k`` over
     ``n`` picks ``(t*k + j) mod n``. MoE routing is therefore balanced across
     experts (per-expert token counts differ by at most one), which fixes the
     ``bincount``/``histc`` counts and the grouped-matmul offsets;
   - ``bool``: a data-dependent boolean check (``if mask.all():``) is true;
   - ``mask``: ``nonzero``/``masked_select``/boolean indexing on a mask with no
     shadow takes the mask as all true;
   - ``counts``: a floating value with no shadow cast to integers (a duration
     predictor's ``.long()``) is taken as 1 per element.
3. ``torch._grouped_mm`` runs group by group as matrix products (its meta kernel
   takes bfloat16 only), so shapes and FLOP counts follow the offsets.

A numeric ``.item()`` on a value with no shadow has no stand-in: it fails with
``NeedsValues``, which is the one case hookcli reports as "needs tensor values".
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakTensorKeyDictionary

aten = torch.ops.aten

SHADOW_NUMEL = 1 << 20  # an integer or boolean meta tensor with more elements gets no shadow
FLOAT_SHADOW_NUMEL = 1 << 18  # the same for floating tensors (masks: 512 x 512, rotary tables)
# boolean masks: a token mask expanded over the hidden size (1 byte an element)
BOOL_SHADOW_NUMEL = 1 << 24
# every shadow, by meta tensor; weak, so a shadow lives as long as its meta tensor
KNOWN: WeakTensorKeyDictionary = WeakTensorKeyDictionary()

# kind -> the sentence the report states for it
ASSUMPTIONS = {
    "routing": "indices chosen from values meta does not hold (topk, sort, argmax, max/min "
    "over a dim) are spread evenly: row t of a top-k over n picks (t*k + j) mod n, so MoE "
    "routing is balanced across experts",
    "bool": "data-dependent boolean checks on values meta does not hold are taken as true",
    "mask": "nonzero / masked_select / boolean indexing on a mask meta does not hold "
    "takes the mask as all true",
    "grouped_mm": "torch._grouped_mm runs group by group as matrix products, split at "
    "the routing offsets",
    "counts": "integers cast from floating values meta does not hold (predicted durations, "
    "rounded lengths) are taken as 1",
}

_SCALAR = (aten._local_scalar_dense.default, aten.item.default, aten.is_nonzero.default)
_INDEX_OPS = {
    aten.topk.default,
    aten.sort.default,
    aten.sort.stable,
    aten.argsort.default,
    aten.argsort.stable,
    aten.argmax.default,
    aten.argmin.default,
    aten.max.dim,
    aten.min.dim,
    aten.kthvalue.default,
}
_MASK_OPS = {
    aten.nonzero.default,
    aten.masked_select.default,
    aten.argwhere.default,
    aten.nonzero_static.default,
}
_RANDOM_WORDS = ("rand", "normal", "bernoulli", "uniform", "exponential", "multinomial", "cauchy")
_OP_WORDS = {
    "aten::_local_scalar_dense": "Tensor.item()",
    "aten::is_nonzero": "bool(Tensor)",
    "aten::item": "Tensor.item()",
    "aten::_to_copy": "a copy off meta (.tolist(), .cpu(), .numpy())",
}


_NONZERO_NUMPY = getattr(getattr(aten, "nonzero_numpy", None), "default", None)
# ``torch.where(cond)``, one operand: ``cond.nonzero(as_tuple=True)`` by another name
_WHERE_ONE = getattr(aten.where, "default", None)
# ops that take a 0-d CPU tensor beside tensors on another device
_CPU_SCALAR_OPS = {
    aten.masked_fill.Tensor,
    aten.masked_fill_.Tensor,
    aten.where.self,
}


def _cpu_scalar(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "cpu" and x.dim() == 0


# dtype casts (under inference mode ``.long()`` reaches dispatch as ``to.dtype``)
_CASTS = {
    aten._to_copy.default,
    aten.to.dtype,
    aten.to.dtype_layout,
    aten.to.device,
    aten.to.other,
}
# ops that read their second operand's shape only -> the op taking that shape
_AS_SHAPE = {
    aten.expand_as.default: aten.expand.default,
    aten.view_as.default: aten.view.default,
    aten.reshape_as.default: aten.reshape.default,
}


class NeedsValues(RuntimeError):
    """An op needs tensor values that meta does not hold and that have no stand-in."""


def _is_meta(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "meta"


def _random(func: Any) -> bool:
    """Random fills and uninitialized tensors: their values mean nothing, keep no shadow."""
    name = func.__name__
    return name.startswith(("empty", "new_empty")) or any(w in name for w in _RANDOM_WORDS)


def _too_big(t: torch.Tensor) -> bool:
    if t.dtype == torch.bool:
        return t.numel() > BOOL_SHADOW_NUMEL
    limit = FLOAT_SHADOW_NUMEL if t.is_floating_point() or t.is_complex() else SHADOW_NUMEL
    return t.numel() > limit


def _meta_leaves(values: Any, found: list[torch.Tensor]) -> list[torch.Tensor]:
    """The meta tensors among an aten op's arguments (tensors, in lists, tuples and dicts:
    the leaves ``tree_flatten`` gives there), in order, without building its spec."""
    if isinstance(values, torch.Tensor):
        if values.device.type == "meta":
            found.append(values)
    elif isinstance(values, (list, tuple)):
        for v in values:
            _meta_leaves(v, found)
    elif isinstance(values, dict):
        for v in values.values():
            _meta_leaves(v, found)
    return found


def _device_is_meta(kwargs: dict[str, Any]) -> bool:
    dev = kwargs.get("device")
    return dev is not None and torch.device(dev).type == "meta"


# torch.ops.aten._grouped_mm (torch 2.8 and later); None where the installed torch lacks it
_GROUPED_MM = getattr(getattr(aten, "_grouped_mm", None), "default", None)


class MetaValues(TorchDispatchMode):
    """Dispatch mode for a run (or a build) on meta: shadows, stand-ins, grouped mm."""

    def __init__(self) -> None:
        super().__init__()
        self.shadows = KNOWN
        self.assumed: Counter[str] = Counter()
        self.last: Any = None
        self.needs_values = False  # set when this mode (not the model) found no value
        self.op_errors: list[tuple[Any, BaseException]] = []  # (op, error) a meta op raised
        self.building = False  # set by building_on_meta: every device is meta there

    def __enter__(self) -> MetaValues:
        self._data = _MetaData(self)
        self._data.__enter__()
        try:
            super().__enter__()
        except BaseException:
            self._data.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._data.__exit__(*exc)

    # -- public ------------------------------------------------------------------
    def give(self, meta: torch.Tensor, values: torch.Tensor) -> None:
        """Attach known values (a CPU tensor of the same shape) to a meta tensor."""
        if meta.shape == values.shape:
            self.shadows[meta] = values

    def assumptions(self) -> list[str]:
        """The stand-ins this run used, one sentence each, with how often."""
        return [f"{ASSUMPTIONS[k]} ({n}x)" for k, n in sorted(self.assumed.items())]

    def reading(self, err: BaseException) -> str | None:
        """hookcli's reading of ``err`` when an op on meta raised it (directly or as the
        cause of the model's error); None when the model itself raised it."""
        chain: list[BaseException] = []
        e: BaseException | None = err
        while e is not None and len(chain) < 8:
            chain.append(e)
            e = e.__cause__ or e.__context__
        if any(isinstance(e, NeedsValues) for e in chain):
            return "meta tensors hold no values and hookcli has no stand-in for this one"
        for func, op_err in reversed(self.op_errors):
            if any(e is op_err for e in chain):
                name = func.name().split(".")[0]
                text = str(op_err)
                if "meta" in text.lower() or isinstance(op_err, NotImplementedError):
                    return f"{name} cannot run on meta tensors"
                return None  # a shape or argument error: the same on any device
        return None

    def op_name(self) -> str:
        if self.last is None:
            return "an op"
        name = self.last.name().split(".")[0]
        return _OP_WORDS.get(name, name)

    # -- dispatch ----------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        metas = _meta_leaves(kwargs, _meta_leaves(args, []))
        if not metas and not _device_is_meta(kwargs):
            return func(*args, **kwargs)
        self.last = func
        if func in _SCALAR:
            return self._scalar(func, args[0])
        if func is aten._to_copy.default and _is_meta(args[0]):
            dev = kwargs.get("device")
            if dev is not None and torch.device(dev).type != "meta":
                return self._copy_out(func, args, kwargs)
        if func is _GROUPED_MM:
            return self._grouped_mm(*args, **kwargs)
        if func is _NONZERO_NUMPY or (func is _WHERE_ONE and len(args) == 1 and not kwargs):
            # nonzero(as_tuple=True), undecomposed under inference mode; torch.where(cond)
            where = self.__torch_dispatch__(aten.nonzero.default, types, (args[0],))
            return tuple(
                self.__torch_dispatch__(aten.select.int, types, (where, 1, d))
                for d in range(args[0].dim())
            )
        if func in _AS_SHAPE and len(args) == 2 and isinstance(args[1], torch.Tensor):
            # ``x.expand_as(y)`` reads only y's shape (under inference mode it reaches
            # here undecomposed): x's values carry over as they do through ``expand``
            return self.__torch_dispatch__(_AS_SHAPE[func], types, (args[0], list(args[1].shape)))

        if func in _CPU_SCALAR_OPS and any(_cpu_scalar(a) for a in args):
            # ``x.masked_fill(m, torch.tensor(v))`` with a meta ``x``: on the CPU or a GPU
            # a 0-d CPU value is taken, the meta kernel wants one device; the value moves
            # to meta, keeping its shadow
            args = tuple(self._to_meta(a) if _cpu_scalar(a) else a for a in args)
        if func is aten.repeat_interleave.self_Tensor and kwargs.get("output_size") is None:
            # ``x.repeat_interleave(repeats, dim)`` (undecomposed under inference mode):
            # with known repeats, the output size is known too
            size = self._repeated_size(args, kwargs)
            if size is not None:
                kwargs = {**kwargs, "output_size": size}
        if func is aten.copy_.default and _is_meta(args[0]) and not _too_big(args[0]):
            return self._copy_in(func, args, kwargs)
        known = all(t in self.shadows for t in metas)
        meta_out: Any = None
        meta_err: Exception | None = None
        try:
            meta_out = func(*args, **kwargs)
        except Exception as err:  # a data-dependent output shape, or the model's own error
            meta_err = err
        if known and not _random(func) and self._small(metas, meta_out):
            try:
                # the twin computation is hookcli's, not the model's: the modes below
                # (cost's counter, its storage ledger) must not see it
                with _disable_current_modes():
                    cpu_out = func(*self._to_cpu(args), **self._to_cpu(kwargs))
            except Exception:
                if meta_err is not None:
                    raise meta_err from None
                return meta_out
            if meta_out is None:
                meta_out = tree_map(_meta_like, cpu_out)
            self._pair(meta_out, cpu_out)
            return meta_out
        if meta_err is None:
            if func in _INDEX_OPS and not known:
                self._balanced(func, args, kwargs, meta_out)
            elif func in _CASTS and not known:
                self._counts(args[0], meta_out)
            return meta_out
        if func in _MASK_OPS:
            return self._all_true(func, args, kwargs)
        if func is aten.index.Tensor:
            return self._index_all_true(args, kwargs)
        self.op_errors.append((func, meta_err))
        raise meta_err

    # -- pieces ------------------------------------------------------------------
    def _small(self, metas: list[torch.Tensor], out: Any) -> bool:
        if any(_too_big(t) for t in metas):
            return False
        if out is not None:
            return not any(_too_big(t) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
        return True

    def _to_cpu(self, tree: Any) -> Any:
        def conv(x: Any) -> Any:
            if _is_meta(x):
                return self.shadows[x]
            if isinstance(x, torch.device) and x.type == "meta":
                return torch.device("cpu")
            return x

        out = tree_map(conv, tree)
        if isinstance(out, dict) and "device" in out and _device_is_meta(tree):
            out["device"] = torch.device("cpu")
        return out

    def _pair(self, meta_out: Any, cpu_out: Any) -> None:
        metas = tree_flatten(meta_out)[0]
        cpus = tree_flatten(cpu_out)[0]
        for m, c in zip(metas, cpus, strict=False):
            if _is_meta(m) and isinstance(c, torch.Tensor) and m.shape == c.shape:
                self.shadows[m] = c

    def _scalar(self, func: Any, t: torch.Tensor) -> Any:
        if t in self.shadows:
            return func(self.shadows[t])
        if t.dtype == torch.bool:
            self.assumed["bool"] += 1
            return True
        self.needs_values = True
        raise NeedsValues(
            f"{_OP_WORDS.get(func.name().split('.')[0], func.name())} needs the value of a "
            f"{t.dtype} tensor of shape {list(t.shape)}, which meta tensors do not hold"
        )

    def _copy_out(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        t = args[0]
        if t in self.shadows:
            return func(self.shadows[t], *args[1:], **kwargs)
        self.needs_values = True
        raise NeedsValues(
            f"copying a {t.dtype} tensor of shape {list(t.shape)} off meta (.tolist(), .cpu()) "
            "needs values meta tensors do not hold"
        )

    def _copy_in(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """``meta.copy_(src)``: the destination takes the source's values where known."""
        dest, src = args[0], args[1]
        out = func(*args, **kwargs)
        values = self.shadows.get(src) if _is_meta(src) else src
        if isinstance(values, torch.Tensor) and values.device.type != "meta":
            with _disable_current_modes():
                shadow = torch.empty(dest.shape, dtype=dest.dtype)
                shadow.copy_(values)
            self.shadows[dest] = shadow
        else:
            self.shadows.pop(dest, None)
        return out

    def _grouped_mm(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        offs: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        out_dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        """``out[rows of group g] = a[rows] @ b[g]`` as one mm per group, so FLOPs are counted."""
        self.assumed["grouped_mm"] += 1
        dtype = out_dtype or a.dtype
        if a.dim() == 3 and b.dim() == 3:
            out = torch.bmm(a, b.to(a.dtype))
        elif a.dim() == 2 and b.dim() == 3:
            ends = self._offsets(offs, b.shape[0], a.shape[0])
            parts, start = [], 0
            for g, end in enumerate(ends):
                parts.append(torch.mm(a[start:end], b[g].to(a.dtype)))
                start = end
            if start < a.shape[0]:  # rows past the last offset are left as they are
                parts.append(a.new_zeros((a.shape[0] - start, b.shape[-1])))
            out = torch.cat(parts)
        elif a.dim() == 3 and b.dim() == 2:
            ends = self._offsets(offs, a.shape[0], b.shape[-1])
            parts, start = [], 0
            for g, end in enumerate(ends):
                parts.append(torch.mm(a[g], b[:, start:end].to(a.dtype)))
                start = end
            out = torch.cat(parts, dim=1)
        else:  # 2D x 2D: groups along K, one output per group
            ends = self._offsets(offs, offs.shape[0] if offs is not None else 1, a.shape[1])
            outs, start = [], 0
            for end in ends:
                outs.append(torch.mm(a[:, start:end], b[start:end].to(a.dtype)))
                start = end
            out = torch.stack(outs)
        if bias is not None:
            out = out + bias.unsqueeze(-2) if out.dim() == 3 else out
        return out.to(dtype)

    def _offsets(self, offs: torch.Tensor | None, groups: int, total: int) -> list[int]:
        """The cumulative ends of each group: the shadow's, else an even split."""
        if offs is not None and offs in self.shadows:
            return [min(int(v), total) for v in self.shadows[offs].tolist()]
        self.assumed["routing"] += 1
        return [round(total * (g + 1) / groups) for g in range(groups)]

    def _balanced(self, func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
        """Index outputs of topk/sort/argmax on values meta lacks: spread evenly."""
        src = args[0]
        outs = out if isinstance(out, tuple) else (out,)
        idx = next((t for t in outs if _is_meta(t) and t.dtype == torch.int64), None)
        if idx is None or _too_big(idx) or src.dim() == 0:
            return
        dim = _dim_of(func, args, kwargs)
        if dim is None:  # argmax/argmin over the flattened tensor
            self.shadows[idx] = torch.zeros(idx.shape, dtype=torch.int64)
            self.assumed["routing"] += 1
            return
        dim = dim % src.dim()
        n = src.shape[dim]
        shape = list(idx.shape)
        keep = idx.dim() == src.dim()
        k = shape[dim] if keep else 1
        moved = [s for i, s in enumerate(shape) if i != dim] if keep else shape
        rows = 1
        for s in moved:
            rows *= s
        t = torch.arange(rows).unsqueeze(1)
        j = torch.arange(k).unsqueeze(0)
        vals = ((t * k + j) % max(n, 1)).reshape(*moved, k)
        vals = vals.movedim(-1, dim) if keep else vals.reshape(shape)
        self.shadows[idx] = vals.contiguous()
        self.assumed["routing"] += 1

    def _to_meta(self, t: torch.Tensor) -> torch.Tensor:
        """A CPU tensor as a meta one whose shadow it is."""
        with _disable_current_modes():
            meta = torch.empty(t.shape, dtype=t.dtype, device="meta")
        self.shadows[meta] = t
        return meta

    def _repeated_size(self, args: Any, kwargs: dict[str, Any]) -> int | None:
        """The output length of ``repeat_interleave(self, repeats, dim)`` whose repeats
        have a shadow; None where they have none."""
        src, repeats = args[0], args[1]
        dim = args[2] if len(args) > 2 else kwargs.get("dim")
        values = self.shadows.get(repeats) if _is_meta(repeats) else repeats
        if not isinstance(values, torch.Tensor) or values.device.type == "meta":
            return None
        length = src.numel() if dim is None else src.shape[dim]
        if values.numel() == 1:
            return int(values.reshape(())) * length
        return int(values.sum())

    def _counts(self, src: Any, out: Any) -> None:
        """A floating value meta does not hold, cast to integers (``durations.long()``):
        each element is taken as 1, a length that any count or repeat accepts."""
        if not (_is_meta(src) and _is_meta(out) and src.is_floating_point()):
            return
        if out.is_floating_point() or out.is_complex() or out.dtype == torch.bool:
            return
        if _too_big(out):
            return
        self.shadows[out] = torch.ones(out.shape, dtype=out.dtype)
        self.assumed["counts"] += 1

    def _all_true(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        mask = args[0]
        self.assumed["mask"] += 1
        if func is aten.masked_select.default:
            src, m = args[0], args[1]
            n = torch.broadcast_shapes(src.shape, m.shape)
            numel = 1
            for d in n:
                numel *= d
            return torch.empty(numel, dtype=src.dtype, device="meta")
        full = torch.ones(mask.shape, dtype=torch.bool)
        cpu = torch.nonzero(full) if mask.numel() <= SHADOW_NUMEL else None
        count = mask.numel()
        out = torch.empty((count, mask.dim()), dtype=torch.int64, device="meta")
        if cpu is not None:
            self.shadows[out] = cpu
        if func is aten.argwhere.default:
            return out
        return out

    def _index_all_true(self, args: Any, kwargs: dict[str, Any]) -> Any:
        """``x[mask]`` where ``x`` holds no values: a mask with a shadow selects exactly its
        true elements; a mask meta does not hold selects every element (stated)."""
        src, indices = args[0], args[1]
        new: list[Any] = []
        for ix in indices:
            shadow = self.shadows.get(ix) if _is_meta(ix) else None
            if ix is not None and ix.dtype in (torch.bool, torch.uint8) and shadow is not None:
                with _disable_current_modes():
                    where = torch.nonzero(shadow.bool(), as_tuple=True)
                for pos in where:
                    meta = torch.empty(pos.shape, dtype=pos.dtype, device="meta")
                    self.shadows[meta] = pos
                    new.append(meta)
            elif ix is not None and ix.dtype in (torch.bool, torch.uint8):
                self.assumed["mask"] += 1
                grids = torch.meshgrid(
                    *[torch.arange(d, device="meta") for d in ix.shape], indexing="ij"
                )
                new.extend(g.reshape(-1) for g in grids)
            else:
                new.append(ix)
        return aten.index.Tensor(src, new)


def _dim_of(func: Any, args: Any, kwargs: dict[str, Any]) -> int | None:
    """The dimension an index op works along (None: argmax/argmin over everything)."""
    packet = func._overloadpacket
    if packet in (aten.topk, aten.kthvalue):  # (self, k, dim=-1)
        return args[2] if len(args) > 2 else kwargs.get("dim", -1)
    if packet in (aten.argmax, aten.argmin):  # (self, dim=None, keepdim=False)
        return args[1] if len(args) > 1 else kwargs.get("dim")
    if packet in (aten.max, aten.min):  # .dim: (self, dim, keepdim=False)
        return args[1]
    # sort/argsort: (self, dim=-1, descending) or .stable (self, *, stable, dim=-1, ...)
    if len(args) > 1 and isinstance(args[1], int) and not isinstance(args[1], bool):
        return args[1]
    return kwargs.get("dim", -1)


def _meta_like(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    return x


_READ_OUT = {
    torch.Tensor.tolist,
    torch.Tensor.numpy,
    torch.Tensor.cpu,
    torch.Tensor.item,
    torch.Tensor.__int__,
    torch.Tensor.__float__,
    torch.Tensor.__bool__,
    torch.Tensor.__index__,
    # ``f"expert_{idx}"``: a meta 0-d tensor formats as its repr, a CPU one as its number
    torch.Tensor.__format__,
}


class _MetaData(TorchFunctionMode):
    """``torch.tensor(data, device=meta)``: made on the cpu, kept as the meta tensor's shadow."""

    def __init__(self, values: MetaValues) -> None:
        super().__init__()
        self.values = values

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _READ_OUT and args and _is_meta(args[0]):
            # under inference mode these read the storage before any op is dispatched
            shadow = self.values.shadows.get(args[0])
            if shadow is not None:
                return func(shadow, *args[1:], **kwargs)
        if func is torch.Tensor.__getitem__ and len(args) == 2 and _is_meta(args[0]):
            # ``x[:, [0, 2, 1]]``: the list becomes a meta tensor with no values; made
            # here on the CPU, it keeps them as its shadow
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            if any(isinstance(i, list) for i in index):
                index = tuple(self._listed(i) if isinstance(i, list) else i for i in index)
                args = (args[0], index if isinstance(args[1], tuple) else index[0])
        data = args[0] if args else None
        if func in (torch.tensor, torch.as_tensor) and args and not isinstance(data, torch.Tensor):
            # a list of meta scalars (``torch.tensor([len_a, len_b])``): their shadows
            flat = tree_flatten(data)[0]
            if any(_is_meta(x) for x in flat):
                if not all(x in self.values.shadows for x in flat if _is_meta(x)):
                    return func(*args, **kwargs)
                data = tree_map(lambda x: self.values.shadows[x] if _is_meta(x) else x, data)
                args = (data, *args[1:])
                if kwargs.get("device") is None and torch.get_default_device().type != "meta":
                    kwargs = {**kwargs, "device": "meta"}
            dev = kwargs.get("device")
            if self.values.building or (dev is None and torch.get_default_device().type == "meta"):
                dev = "meta"  # building: an explicit device (``device="cpu"``) goes to meta too
            if dev is not None and _meta_device(dev) and not isinstance(dev, torch.dtype):
                with torch._C.DisableTorchFunction():  # below: the build's meta redirect
                    cpu = func(*args, **{**kwargs, "device": "cpu"})
                meta = cpu.to("meta")
                if not _too_big(cpu):
                    self.values.shadows[meta] = cpu
                return meta
        return func(*args, **kwargs)

    def _listed(self, items: list[Any]) -> Any:
        """A list index as a meta tensor keeping its values (a list of plain ints or
        bools); any other list as it is."""
        if not all(isinstance(i, (int, bool)) for i in items):
            return items
        cpu = torch.tensor(items)
        meta = cpu.to("meta")
        self.values.shadows[meta] = cpu
        return meta


class _MetaFactories(TorchFunctionMode):
    """While building on meta: a factory or ``.to`` given an explicit device makes it on meta."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if isinstance(func, torch._ops.OpOverload):  # aten ops hookcli's own modes call
            return func(*args, **kwargs)
        dev = kwargs.get("device")
        if dev is not None and not _meta_device(dev):
            kwargs["device"] = torch.device("meta")
            kwargs.pop("pin_memory", None)
        if func in (torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu) and args:
            if func is not torch.Tensor.to:
                return args[0]
            args = tuple(
                torch.device("meta")
                if (isinstance(a, (str, torch.device)) and not _meta_device(a) and i > 0)
                else a
                for i, a in enumerate(args)
            )
        return func(*args, **kwargs)


def _meta_device(dev: Any) -> bool:
    try:
        return torch.device(dev).type == "meta"
    except (RuntimeError, TypeError):
        return True  # not a device at all (a dtype passed positionally to .to): leave it


# The legacy typed constructors (``torch.FloatTensor(r, c)``, pygcn's parameters) and
# the dtype each makes.
_LEGACY_TYPES = {
    "FloatTensor": torch.float32,
    "DoubleTensor": torch.float64,
    "HalfTensor": torch.float16,
    "BFloat16Tensor": torch.bfloat16,
    "LongTensor": torch.int64,
    "IntTensor": torch.int32,
    "ShortTensor": torch.int16,
    "CharTensor": torch.int8,
    "ByteTensor": torch.uint8,
    "BoolTensor": torch.bool,
}


def _legacy_sizes(args: tuple[Any, ...]) -> tuple[int, ...] | None:
    """The sizes of a legacy ``Tensor(*sizes)`` / ``Tensor(torch.Size)`` call; None for data."""
    if len(args) == 1 and isinstance(args[0], torch.Size):
        return tuple(args[0])
    if all(isinstance(a, int) and not isinstance(a, bool) for a in args):
        return tuple(args)  # () too: ``torch.Tensor()`` is an empty tensor
    return None


def _legacy_make(dtype: torch.dtype, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A legacy constructor's tensor on meta (sizes: uninitialized; data: with a shadow);
    None where the call is neither (``torch.Tensor(other_tensor)``, storages)."""
    if set(kwargs) - {"device"}:
        return None
    sizes = _legacy_sizes(args)
    if sizes is not None:
        return torch.empty(sizes if args else (0,), dtype=dtype, device="meta")
    if len(args) == 1 and isinstance(args[0], (list, tuple)):
        return torch.tensor(args[0], dtype=dtype, device="meta")  # _MetaData keeps values
    return None


class _LegacyTypeMeta(type):
    """A stand-in for ``torch.FloatTensor`` and its kin while building on meta: calling it
    makes the tensor on meta; ``isinstance`` still asks the real type."""

    _real: Any
    _dtype: torch.dtype

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        made = _legacy_make(cls._dtype, args, kwargs)
        return made if made is not None else cls._real(*args, **kwargs)

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls._real)

    def __subclasscheck__(cls, sub: Any) -> bool:
        return issubclass(sub, cls._real)


@contextlib.contextmanager
def _legacy_constructors_on_meta() -> Iterator[None]:
    """``torch.Tensor(r, c)`` and ``torch.FloatTensor(r, c)`` (fairscale's llama, pygcn) on
    meta: the legacy constructors ignore the default device and would allocate on the CPU
    (27 GB for a 7B llama)."""
    base_new = torch._C.TensorBase.__new__
    had_own = "__new__" in torch.Tensor.__dict__
    own = torch.Tensor.__dict__.get("__new__")

    def tensor_new(cls: Any, *args: Any, **kwargs: Any) -> Any:
        if cls is torch.Tensor:
            made = _legacy_make(torch.get_default_dtype(), args, kwargs)
            if made is not None:
                return made
        return base_new(cls, *args, **kwargs)

    saved = {name: getattr(torch, name) for name in _LEGACY_TYPES if hasattr(torch, name)}
    setattr(torch.Tensor, "__new__", staticmethod(tensor_new))  # noqa: B010
    for name, real in saved.items():
        stand_in = _LegacyTypeMeta(name, (), {"_real": real, "_dtype": _LEGACY_TYPES[name]})
        setattr(torch, name, stand_in)
    try:
        yield
    finally:
        for name, real in saved.items():
            setattr(torch, name, real)
        if had_own:
            setattr(torch.Tensor, "__new__", own)  # noqa: B010
        else:
            delattr(torch.Tensor, "__new__")


@contextlib.contextmanager
def building_on_meta() -> Iterator[MetaValues]:
    """Build a model on meta: nothing is allocated, explicit devices included.

    Factories default to meta (``torch.device("meta")``), an explicit ``device=``
    or ``.to(device)`` in ``__init__`` is redirected there, the legacy constructors
    (``torch.Tensor(r, c)``, ``torch.FloatTensor(n)``) make meta tensors, and small
    tensors keep shadows so construction code that reads them
    (``linspace(...).tolist()``) works.
    """
    # a dispatch mode's first call imports torch._dynamo, which checks torch.Tensor.__new__
    # against its own copy (and, on torch 2.6, runs ops): imported before anything is
    # patched or redirected (the build's modes would import it anyway)
    import torch._dynamo

    values = MetaValues()
    values.building = True
    with torch.device("meta"), _MetaFactories(), _legacy_constructors_on_meta(), values:
        yield values


@contextlib.contextmanager
def plain() -> Iterator[None]:
    """Inside ``building_on_meta``: ordinary CPU tensors again (input values drawn by a source)."""
    from torch.utils._python_dispatch import _disable_current_modes

    with torch._C.DisableTorchFunction(), _disable_current_modes():
        yield
