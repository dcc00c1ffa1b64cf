"""How the monitor takes its figures: fused norms by (device, dtype) group, by rows for
a large CPU tensor, parameter copies for the update ratio, module output statistics,
and the host read of them (at once on the CPU, through pinned memory on CUDA)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from hookcli.norms import BLOCKED_FROM, LOW_PRECISION, RowNorms


@dataclass(frozen=True)
class _Plan:
    """How to take the norms of a list of tensors: one fused ``_foreach_norm`` per
    (device, dtype) group of dense floating tensors, as ``clip_grad_norm_`` does (half
    types in float32), except that a large CPU tensor is read by rows
    (``hookcli.norms.RowNorms``: closer to the exact norm, and on every thread); sparse
    and other tensors one by one."""

    groups: tuple[tuple[bool, tuple[int, ...]], ...]  # (low precision, fused indices)
    others: tuple[int, ...]
    single: bool  # every tensor of one device and dtype (the fused copies below)
    blocked: tuple[int, ...] = ()  # large CPU tensors, out of their groups: norms by rows
    rows: RowNorms | None = None  # how ``blocked`` is read
    # where each tensor's norm is in _norms' vector (None: in order already)
    inverse: torch.Tensor | None = field(default=None, compare=False)
    # one group and large CPU tensors, nothing else: the tensor (in the tensors' order)
    # of each value that ``_norms`` adds up in one float64 sum: the group's norms, then
    # the large tensors' row norms (``RowNorms.segments``)
    gather: torch.Tensor | None = field(default=None, compare=False)

    @staticmethod
    def of(tensors: list[torch.Tensor]) -> _Plan:
        groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
        others = []
        blocked = []
        for i, t in enumerate(tensors):
            if t.layout != torch.strided or not t.is_floating_point():
                others.append(i)
            elif t.device.type == "cpu" and t.numel() >= BLOCKED_FROM:
                blocked.append(i)
                groups.setdefault((t.device, t.dtype), [])
            else:
                groups.setdefault((t.device, t.dtype), []).append(i)
        plan = tuple((dtype in LOW_PRECISION, tuple(idx)) for (_, dtype), idx in groups.items())
        rows = RowNorms.of([tensors[i] for i in blocked]) if blocked else None
        order = [i for _, idx in plan for i in idx] + blocked + others
        inverse = None
        if order != sorted(order):
            inverse = torch.empty(len(order), dtype=torch.long)
            inverse[torch.tensor(order, dtype=torch.long)] = torch.arange(len(order))
        single = len(plan) == 1 and not others
        gather = None
        dtype = next(iter(groups))[1] if groups else None
        if single and rows is not None and dtype in (torch.float32, *LOW_PRECISION):
            big = torch.tensor(blocked, dtype=torch.long)
            gather = torch.cat([torch.tensor(plan[0][1], dtype=torch.long), big[rows.segments]])
        return _Plan(plan, tuple(others), single, tuple(blocked), rows, inverse, gather)


def _copies(
    params: list[torch.Tensor], plans: dict[Any, _Plan], kept: list[torch.Tensor] | None
) -> list[torch.Tensor]:
    """Copies of the parameters (one fused multiply by 1 where they share a dtype and
    device: exact, NaN and -0.0 included), into ``kept`` when given (the same shapes)."""
    plan = plans.get("weights") or _Plan.of(params)
    if kept is not None and len(kept) == len(params) and plan.single:
        torch._foreach_copy_(kept, params)
        return kept
    if plan.single:
        return list(torch._foreach_mul(params, 1.0))
    return [p.detach().clone() for p in params]


def _differences(
    params: list[torch.Tensor], before: list[torch.Tensor], plans: dict[Any, _Plan]
) -> list[torch.Tensor]:
    """``before - params``, written into ``before`` (hookcli's own copies; a new tensor of
    the parameters' size would cost its allocation again): the update's norm is its
    difference's, whichever the sign."""
    plan = plans.get("weights") or _Plan.of(params)
    if plan.single:
        torch._foreach_sub_(before, params)
        return before
    for b, p in zip(before, params, strict=True):
        b.sub_(p.detach())
    return before


def _fused_plan(params: list[torch.Tensor], plans: dict[Any, _Plan]) -> _Plan | None:
    """The parameters' plan where a copy or difference and its norm can go tensor by
    tensor (large CPU tensors of one dtype, shapes as planned); else None."""
    plan = plans.get("weights")
    if plan is None:
        plan = plans["weights"] = _Plan.of(params)
    if plan.rows is None or not plan.single:
        return None
    shapes = plan.rows.shapes
    if len(params) != len(plan.blocked) + len(plan.groups[0][1]) or any(
        params[i].shape != s for i, s in zip(plan.blocked, shapes, strict=True)
    ):
        return None
    return plan


def _copies_normed(
    params: list[torch.Tensor], plans: dict[Any, _Plan], kept: list[torch.Tensor] | None
) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
    """``_norm_vector(params, plans, "weights")`` and ``_copies(params, plans, kept)``,
    the same values; on the CPU each large parameter is normed just after its copy,
    while it is in the cache (read from memory once, not twice)."""
    plan = _fused_plan(params, plans)
    if plan is None:
        return _norm_vector(params, plans, "weights"), _copies(params, plans, kept)
    small = plan.groups[0][1]
    big = plan.blocked
    out: list[torch.Tensor]
    if kept is not None and len(kept) == len(params):
        out = kept
        if small:
            torch._foreach_copy_([kept[i] for i in small], [params[i] for i in small])

        def each(j: int) -> None:
            kept[big[j]].copy_(params[big[j]])

    else:
        out = list(params)  # every entry replaced below
        if small:
            copies = torch._foreach_mul([params[i] for i in small], 1.0)
            for i, c in zip(small, copies, strict=True):
                out[i] = c

        def each(j: int) -> None:
            out[big[j]] = params[big[j]].mul(1.0)

    return _norms(params, plan, each), out


def _updates_normed(
    params: list[torch.Tensor], before: list[torch.Tensor], plans: dict[Any, _Plan]
) -> torch.Tensor | None:
    """``_norm_vector(_differences(params, before, plans), plans, "weights")``, the same
    values; on the CPU each large difference is normed just after it is made."""
    plan = _fused_plan(params, plans)
    if plan is None or len(before) != len(params):
        return _norm_vector(_differences(params, before, plans), plans, "weights")
    small = plan.groups[0][1]
    big = plan.blocked
    if small:
        torch._foreach_sub_([before[i] for i in small], [params[i] for i in small])

    def each(j: int) -> None:
        before[big[j]].sub_(params[big[j]])

    return _norms(before, plan, each)


def _foreach(group: list[torch.Tensor], low: bool) -> tuple[torch.Tensor, ...]:
    if low:
        return tuple(torch._foreach_norm(group, 2, dtype=torch.float32))
    return tuple(torch._foreach_norm(group, 2))


def _norm_vector(
    tensors: list[torch.Tensor], cache: dict[Any, _Plan], key: Any
) -> torch.Tensor | None:
    """The L2 norm of each tensor, one vector (``_Plan``; the plan of ``key`` is kept:
    the tensors of a track keep their dtypes, devices and sizes from step to step)."""
    if not tensors:
        return None
    plan = cache.get(key)
    if plan is None or len(cache) > 64:
        if len(cache) > 64:
            cache.clear()
        plan = cache[key] = _Plan.of(tensors)
    try:
        return _norms(tensors, plan)
    except RuntimeError:  # a layout or dtype changed since: plan again
        fresh = cache[key] = _Plan.of(tensors)
        if fresh == plan:
            raise
        return _norms(tensors, fresh)


def _norms(
    tensors: list[torch.Tensor], plan: _Plan, each: Callable[[int], Any] | None = None
) -> torch.Tensor:
    """The norm vector of ``_norm_vector`` (``each``: see ``RowNorms.norms``)."""
    if plan.single and not plan.blocked:
        return torch.stack(_foreach(tensors, plan.groups[0][0]))
    if plan.gather is not None and plan.rows is not None:
        # float32 or half-type tensors, one group of them and large CPU ones: the
        # group's norms and the large tensors' row norms (float32 all) squared into one
        # float64 sum per tensor, in the tensors' order. A float32 norm comes back
        # exactly (its square is exact in float64, and so is the square root of an
        # exact square), the rows add up in the order ``RowNorms.norms`` adds them:
        # ``_norms``' vector in five operations fewer
        low, idx = plan.groups[0]
        parts = [torch.stack(_foreach([tensors[i] for i in idx], low))] if idx else []
        parts += plan.rows.rows([tensors[i] for i in plan.blocked], each)
        squares = torch.cat(parts).to(torch.float64).square_()
        out = torch.zeros(len(tensors), dtype=torch.float64)
        return out.index_add_(0, plan.gather, squares).sqrt_()
    # one float64 vector in the plan's order (its groups, the large CPU tensors, the
    # others), then in the tensors' order
    pieces: list[torch.Tensor] = []
    for low, idx in plan.groups:
        if idx:
            pieces.append(torch.stack(_foreach([tensors[i] for i in idx], low)))
    if plan.rows is not None:
        pieces.append(plan.rows.norms([tensors[i] for i in plan.blocked], each))
    if plan.others:
        from hookcli.grads.probe import tensor_norm

        pieces.append(torch.stack([tensor_norm(tensors[i]).float() for i in plan.others]))
    device = pieces[0].device
    flat = torch.cat([p.to(device=device, dtype=torch.float64) for p in pieces])
    return flat if plan.inverse is None else flat[plan.inverse.to(device)]


class _Host:
    """Tensors read on the host, each as a list of its values: on the CPU at once
    (``tolist``: exact floats); on CUDA copied together into pinned memory without a
    sync, read when ``values`` is called (an event says when they are there)."""

    def __init__(self, parts: list[torch.Tensor | None]) -> None:
        self.sizes = [0 if p is None else p.numel() for p in parts]
        self._lists: list[list[float]] | None = None
        self._flat: list[float] | None = None
        self._event: Any = None
        self._buffer: torch.Tensor | None = None
        if all(p is None or p.is_cpu for p in parts):
            self._lists = [_listed(p) for p in parts]
            return
        present = [p.reshape(-1).to(torch.float64) for p in parts if p is not None]
        devices = {p.device for p in present}
        if len(devices) > 1:
            present = [p.cpu() for p in present]
        flat = torch.cat(present) if len(present) > 1 else present[0]
        if flat.device.type == "cuda":
            self._buffer = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
            self._buffer.copy_(flat, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._flat = flat.tolist()

    def ready(self) -> bool:
        return self._event is None or bool(self._event.query())

    def values(self) -> list[list[float]]:
        """The parts' values, each a list (empty for a None part)."""
        if self._lists is not None:
            return self._lists
        if self._flat is None:
            self._event.synchronize()
            assert self._buffer is not None
            self._flat = self._buffer.tolist()
        out = []
        pos = 0
        for n in self.sizes:
            out.append(self._flat[pos : pos + n])
            pos += n
        self._lists = out
        return out


def _listed(p: torch.Tensor | None) -> list[float]:
    """A CPU tensor's values, one list (a 0-dim or 1-D tensor without a reshape)."""
    if p is None:
        return []
    n = p.dim()
    if n == 1:
        return p.tolist()
    return [p.item()] if n == 0 else p.reshape(-1).tolist()


def _hypot(values: list[float]) -> float:
    return math.hypot(*values) if values else 0.0


def _first_float(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output if output.is_floating_point() else None
    from hookcli.structures import iter_tensors

    for t in iter_tensors(output):
        if t.is_floating_point():
            return t
    return None


def _stats(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(sum, L2 norm, min, max, non-zero count) of a module output, five 0-dim tensors
    read from a detached tensor (no autograd node); the host makes the mean and the
    population std of them (``std_mean`` itself costs some 30 times more on the CPU).
    Half types are reduced in float32 without a converted copy; a step's figures are
    stacked once, when they go to the host (``_act_parts``). The count is
    ``count_nonzero(t.bool())``: NaN and -0.0 count as ``ne(0)`` counts them, and on the
    CPU the conversion to bool and its count took a third of ``ne(0).sum()``'s time over
    resnet18's outputs (1 thread, torch 2.15), which was the largest of the five."""
    t = t.detach()
    if t.element_size() == 1:  # float8 has no reductions of its own
        t = t.float()
    dtype = torch.float32 if t.dtype in LOW_PRECISION else None
    mn, mx = torch.aminmax(t)
    nonzero = t.bool()
    # a tensor subclass (a DTensor) by the sum that every one of them has
    count = torch.count_nonzero(nonzero) if type(t) is torch.Tensor else nonzero.sum()
    return (t.sum(dtype=dtype), torch.linalg.vector_norm(t, dtype=dtype), mn, mx, count)


def _act_parts(act: dict[int, tuple[Any, int]], order: list[int]) -> list[torch.Tensor | None]:
    """A step's activation statistics as two vectors for the host: [sum, norm, min,
    max] of each module in ``order`` (one dtype: the widest of theirs), and the
    non-zero counts (int64); two Nones where no module was measured."""
    if not order:
        return [None, None]
    floats = [x for i in order for x in act[i][0][:4]]
    counts = [act[i][0][4] for i in order]
    return [_stacked(floats), _stacked(counts)]


def _stacked(scalars: list[torch.Tensor]) -> torch.Tensor:
    try:
        return torch.stack(scalars)
    except RuntimeError:  # on several devices
        return torch.stack([x.cpu() for x in scalars])


def _nonfinite_flag(t: torch.Tensor) -> Any:
    """0 finite, 1 NaN, 2 Inf (3: both): a Python int on the CPU, where one sum decides
    the common case; a device tensor elsewhere (read at the step, one sync)."""
    t = t.detach()
    if t.device.type == "cpu":
        if math.isfinite(float(t.sum())):
            return 0
        return int(bool(torch.isnan(t).any())) + 2 * int(bool(torch.isinf(t).any()))
    return torch.isnan(t).any().to(torch.int64) + 2 * torch.isinf(t).any().to(torch.int64)


def _either(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        return a | b
    return torch.as_tensor(a) | torch.as_tensor(b)


def _grad_hook(events: list[tuple[int, str, Any]], call: int, which: str) -> Callable[..., None]:
    def hook(grad: torch.Tensor) -> None:
        with contextlib.suppress(Exception):
            if grad is not None and grad.is_floating_point() and grad.numel():
                events.append((call, which, _nonfinite_flag(grad)))
        return None

    return hook


class NanOrigin:
    """``--nan-origin``: every watched module call's output and input flags this step,
    and tensor hooks on them for the backward: the first module whose output (forward)
    or whose input's grad (backward) turned non-finite from finite values."""

    def __init__(self) -> None:
        self.calls: dict[int, list[Any]] = {}  # call id -> [track, module, out_bad, in_bad]
        self.call_ids = 0
        self.checked: dict[tuple[int, int], Any] = {}  # (id, version) -> bad flag
        self.backward_events: list[tuple[int, str, Any]] = []  # (call, "in"/"out", bad)

    def watch_call(self, track: Any, index: int, args: Any, output: Any) -> None:
        from hookcli.structures import iter_tensors

        self.call_ids += 1
        call = self.call_ids
        out_bad = None
        for t in iter_tensors(output):
            if t.is_floating_point() and t.numel():
                flag = _nonfinite_flag(t)
                if not t.is_inference():  # (an inference tensor has no version counter)
                    self.checked[(id(t), t._version)] = flag
                out_bad = flag if out_bad is None else _either(out_bad, flag)
                if t.requires_grad:
                    t.register_hook(_grad_hook(self.backward_events, call, "out"))
        in_bad = None
        for t in iter_tensors(args):
            if t.is_floating_point() and t.numel():
                flag = None if t.is_inference() else self.checked.get((id(t), t._version))
                if flag is None:
                    flag = _nonfinite_flag(t)
                in_bad = flag if in_bad is None else _either(in_bad, flag)
                if t.requires_grad:
                    t.register_hook(_grad_hook(self.backward_events, call, "in"))
        self.calls[call] = [track, index, out_bad, in_bad]

    def of_step(self, track: Any) -> dict[str, Any] | None:
        """--nan-origin: the first module whose output (forward) or whose input's grad
        (backward) turned non-finite from finite values, this step."""
        calls = {c: v for c, v in self.calls.items() if v[0] is track}
        for c in calls:
            del self.calls[c]
        events = [e for e in self.backward_events if e[0] in calls]
        self.backward_events = [e for e in self.backward_events if e[0] in self.calls]
        self.checked = {}

        def kind(flag: Any) -> str | None:
            if flag is None:
                return None
            if isinstance(flag, torch.Tensor):
                flag = int(flag)
            return {0: None, 1: "nan", 2: "inf", 3: "nan"}[int(flag)]

        came_in: list[tuple[str, str]] = []  # (module, kind): its input held it already
        for entry in calls.values():
            out, inp = kind(entry[2]), kind(entry[3])
            if out is not None and inp is None and not came_in:
                return {"what": out, "phase": "forward", "module": track.modules[entry[1]].name}
            if inp is not None:
                came_in.append((track.modules[entry[1]].name, inp))
        if came_in:
            # no module made it: it was in an input already (the batch). Named: the
            # outermost module called with it around the first that returned with it
            first = came_in[0][0]
            name, what = min(
                (c for c in came_in if c[0] in ("", first) or first.startswith(c[0] + ".")),
                key=lambda c: len(c[0]),
            )
            return {"what": what, "phase": "forward", "module": name, "input": True}
        out_seen: dict[int, str | None] = {}
        for call, which, flag in events:
            k = kind(flag)
            if which == "out":
                out_seen[call] = out_seen.get(call) or k
            elif k is not None and out_seen.get(call) is None:
                name = track.modules[calls[call][1]].name
                return {"what": k, "phase": "backward", "module": name}
        return None
