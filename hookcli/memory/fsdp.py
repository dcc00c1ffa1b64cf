"""One rank's memory under FSDP2 (``fully_shard``), followed through the tracked step.

The model runs unsharded, as it was built; what FSDP2 would hold on one rank is made
beside it as meta tensors, at the moments FSDP2 makes and frees it, so the live-bytes
tracker (``hookcli.memory.tracker``) counts it where it is alive:

- **sharded parameters**: each parameter's dim-0 chunk, padded to the same number of
  rows on every rank (FSDP2's ``torch.chunk`` split; the padding stays allocated).
  The model's own, unsharded parameters are not counted.
- **all-gather**: before a unit's forward, an all-gather output of its padded
  unsharded parameters, then the unsharded parameters copied out of it. In forward
  the output is kept until the next unit's all-gather is copied out (FSDP2 overlaps
  the two); the root's last one until the root's forward ends. After a unit's
  forward its unsharded parameters are freed, except the root's (kept for backward).
- **backward**: when the gradient reaches a unit's outputs, its parameters are
  all-gathered again (the output freed after the copy-out), and the unit before it
  in forward order is all-gathered in advance (FSDP2's backward prefetch). When the
  unit's backward is done (its inputs' gradient, or the end of backward): its
  unsharded parameters are freed, the autograd gradients are copied into a
  reduce-scatter input of the padded unsharded size and freed, and the reduce-scatter
  output (the padded shard) becomes the sharded gradients (or is added to them and
  freed, with ``zero_grad`` zeros). One reduce-scatter input stays alive until the
  next unit's is made, the last until backward ends.
- **the optimizer step** runs on the sharded parameters (meta tensors of each
  rank's local shape), so its state and temporaries are per rank.

No process group is needed: every rank's figures follow from the plan (the units,
world size and rank), which is how this works on meta for models no machine holds.
These are FSDP2's own allocations, which NCCL's collectives work in place on; gloo
(the CPU's backend) copies each collective's buffer once more on its own thread and
frees it when that thread is done, which is not modelled. Mixed-precision policies,
CPU offload and HSDP are not modelled either.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from hookcli.memory.tracker import LiveBytes

META = torch.device("meta")


def _frees_before_copy_out() -> bool:
    """Whether this torch's FSDP2 frees the previous unit's kept all-gather output before
    the next unit's copy-out (torch 2.15, which releases it in a method of its own,
    ``release_all_gather_state_for_comm_reuse``) or after it (torch 2.14 and before)."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPCommContext
    except Exception:  # no torch.distributed in this build: the newest behaviour
        return True
    return hasattr(FSDPCommContext, "release_all_gather_state_for_comm_reuse")


@dataclass(frozen=True)
class FsdpPlan:
    """What fixes one rank's FSDP2 memory: the units (``fully_shard``-ed modules, the
    root "" last), the world size and the rank."""

    units: tuple[str, ...]
    world: int
    rank: int


def _dims(p: torch.Tensor) -> tuple[int, int]:
    """(dim 0, elements per row); a 0-d parameter is one row of one."""
    shape = tuple(p.shape) or (1,)
    return shape[0], math.prod(shape[1:])


def padded_rows(dim0: int, world: int) -> int:
    """Rows of one rank's padded shard: ``ceil(dim0 / world)`` (at least 1)."""
    return max(1, -(-dim0 // world))


def shard_rows(dim0: int, world: int, rank: int) -> int:
    """Rows of dim 0 that ``rank`` holds: FSDP2 splits like ``torch.chunk(world)``."""
    if dim0 <= 0:
        return 0
    chunk = -(-dim0 // world)
    return max(0, min(dim0, (rank + 1) * chunk) - rank * chunk)


def unit_params(model: nn.Module, units: Sequence[str]) -> dict[str, list[nn.Parameter]]:
    """unit -> the parameters it manages: its subtree's, less those of units inside it."""
    taken: set[int] = set()
    out: dict[str, list[nn.Parameter]] = {}
    for name in units:  # deepest first, the root ("") last
        m = model.get_submodule(name) if name else model
        mine = [p for p in m.parameters() if id(p) not in taken]
        taken.update(id(p) for p in mine)
        out[name] = mine
    return out


def _padded_bytes(p: torch.Tensor, world: int) -> int:
    """Bytes of one rank's padded shard of ``p``."""
    dim0, rest = _dims(p)
    return padded_rows(dim0, world) * rest * p.element_size()


def _refuse_shared(model: nn.Module, units: tuple[str, ...]) -> None:
    """A parameter two units use (tied weights across them): ``fully_shard`` refuses
    it, so the plan cannot run; said in one line, with what would."""
    from hookcli.errors import UsageError

    def unit_of(path: str) -> str:
        inside = [u for u in units if u and (path == u or path.startswith(u + "."))]
        return max(inside, key=len) if inside else ""

    owner: dict[int, tuple[str, str]] = {}  # id(param) -> (unit, its name there)
    for path, m in model.named_modules(remove_duplicate=False):
        unit = unit_of(path)
        for pname, p in m._parameters.items():
            if p is None:
                continue
            name = f"{path}.{pname}" if path else pname
            first = owner.setdefault(id(p), (unit, name))
            if first[0] != unit:
                raise UsageError(
                    f"--fsdp: one parameter is both {first[1]} (unit {first[0] or '(root)'}) "
                    f"and {name} (unit {unit or '(root)'}); FSDP2 cannot shard a parameter "
                    "two units share (fully_shard refuses it): --shard a class whose "
                    "modules hold both"
                )


def _bytes(n: int) -> torch.Tensor:
    """A meta storage of ``n`` bytes (FSDP2's flat buffers, as the tracker sees them)."""
    return torch.empty(n, dtype=torch.uint8, device=META)


@dataclass(eq=False)
class _Unit:
    name: str
    module: nn.Module
    params: list[nn.Parameter]  # the model's own (unsharded) parameters it manages
    shards: list[nn.Parameter]  # this rank's sharded parameters (meta, local shape)
    padded_full: int  # bytes: the all-gather output, the unsharded params
    unsharded: torch.Tensor | None = None
    gathered: torch.Tensor | None = None  # an all-gather output not yet copied out
    in_backward: bool = False
    reduced: bool = False
    forward_indices: list[int] = field(default_factory=list)


def _shard(p: nn.Parameter, world: int, rank: int) -> nn.Parameter:
    """This rank's shard of ``p`` on meta: a view of the local rows into a padded storage."""
    dim0, rest = _dims(p)
    rows = padded_rows(dim0, world)
    local = shard_rows(dim0, world, rank)
    shape = (local, *tuple(p.shape)[1:]) if p.dim() else (local,)
    storage = torch.empty(rows * rest, dtype=p.dtype, device=META)
    t = storage[: local * rest].view(shape)
    return nn.Parameter(t, requires_grad=p.requires_grad)


class FsdpMemory:
    """FSDP2's buffers on one rank, made and freed as the step goes (see the module doc)."""

    def __init__(self, model: nn.Module, plan: FsdpPlan) -> None:
        _refuse_shared(model, plan.units)
        self.plan = plan
        self.units: list[_Unit] = []
        self.names: dict[int, str] = {}  # shard param id -> the model's parameter name
        names = {id(p): n for n, p in model.named_parameters()}
        for name, mine in unit_params(model, plan.units).items():  # the root ("") last
            m = model.get_submodule(name) if name else model
            shards = [_shard(p, plan.world, plan.rank) for p in mine]
            for p, s in zip(mine, shards, strict=True):
                self.names[id(s)] = names.get(id(p), "")
            full = sum(_padded_bytes(p, plan.world) for p in mine)
            self.units.append(_Unit(name, m, mine, shards, full * plan.world))
        self.by_module = {id(u.module): u for u in self.units}
        self.root = self.units[-1] if self.units and self.units[-1].name == "" else None
        self.tracker: LiveBytes | None = None
        self.kept_gather: torch.Tensor | None = None  # forward: the last copied-out output
        self.free_before_copy_out = _frees_before_copy_out()
        self.kept_reduce: torch.Tensor | None = None  # the last reduce-scatter input
        self.forward_order: list[_Unit] = []
        self.set_to_none = True
        self.grad_buffers: dict[int, torch.Tensor] = {}  # unit -> its sharded grads' storage
        self.handles: list[Any] = []  # tensor hooks on the units' outputs

    # -- what the step holds -----------------------------------------------------------

    @property
    def shard_params(self) -> list[nn.Parameter]:
        return [s for u in self.units for s in u.shards]

    def fill_grads(self, with_grad: set[int]) -> None:
        """Sharded gradients, as after a reduce-scatter, of the parameters (ids of the
        model's own) that had a gradient: views of one buffer per unit."""
        for u in self.units:
            which = [i for i, p in enumerate(u.params) if id(p) in with_grad]
            nbytes = sum(_padded_bytes(u.params[i], self.plan.world) for i in which)
            if which:
                self._set_grads(u, torch.zeros(nbytes, dtype=torch.uint8, device=META), which)

    def _set_grads(self, u: _Unit, buffer: torch.Tensor, which: list[int]) -> None:
        """The shards ``which`` (indices into the unit's parameters) get their gradients as
        views of ``buffer``, in order (FSDP2 reduces only the parameters that have one)."""
        offset = 0
        for i in which:
            s = u.shards[i]
            nbytes = _padded_bytes(u.params[i], self.plan.world)
            flat = buffer[offset : offset + nbytes].view(s.dtype)
            s.grad = flat[: s.numel()].view(s.shape)
            offset += nbytes
        self.grad_buffers[id(u)] = buffer

    def _new(self, nbytes: int, kind: str) -> torch.Tensor:
        """A meta buffer of ``nbytes`` the tracker counts as ``kind`` from the start."""
        if self.tracker is None:
            return _bytes(nbytes)
        with self.tracker.making(kind):
            return _bytes(nbytes)

    # -- FSDP2's moments ---------------------------------------------------------------

    def _all_gather(self, u: _Unit) -> None:
        if u.unsharded is None and u.gathered is None:
            u.gathered = self._new(u.padded_full, "comm_buffers")

    def _copy_out(self, u: _Unit, forward: bool) -> None:
        if u.unsharded is not None:
            return
        self._all_gather(u)
        if forward and self.free_before_copy_out:  # the previous unit's output goes
            self.kept_gather = None  # once this one's has arrived
        u.unsharded = self._new(u.padded_full, "unsharded_params")
        gathered, u.gathered = u.gathered, None
        if forward:  # (older torch: the previous one goes only now)
            self.kept_gather = gathered
        del gathered

    def pre_forward(self, module: nn.Module, args: Any, kwargs: Any) -> Any:
        u = self.by_module.get(id(module))
        if u is None or self.tracker is None or self.tracker.phase != "forward":
            return None  # a checkpointed forward recomputed in backward: already unsharded
        self._copy_out(u, forward=True)
        from hookcli.structures import _rebuildable, rebuild

        def leaf(t: Any) -> Any:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                return _PostBackward.apply(self, u, t)
            return t

        return rebuild((args, kwargs), leaf, _rebuildable)

    def post_forward(self, module: nn.Module, _args: Any, output: Any) -> None:
        u = self.by_module.get(id(module))
        if u is None or self.tracker is None or self.tracker.phase != "forward":
            return
        if u is not self.root:
            u.unsharded = None  # resharded after forward
        u.forward_indices.append(len(self.forward_order))
        self.forward_order.append(u)
        from hookcli.structures import iter_tensors

        for t in iter_tensors(output):
            if t.requires_grad:
                self.handles.append(t.register_hook(lambda _g, u=u: self.pre_backward(u)))
        if u is self.root:
            self.kept_gather = None

    def pre_backward(self, u: _Unit) -> None:
        if u.in_backward:
            return
        u.in_backward = True
        self._copy_out(u, forward=False)
        if u.forward_indices:  # prefetch the unit that ran before this call in forward
            i = u.forward_indices.pop()
            if i > 0:
                self._all_gather(self.forward_order[i - 1])

    def post_backward(self, u: _Unit) -> None:
        if u.reduced:
            return
        u.reduced = True
        u.unsharded = None  # resharded after backward
        self.kept_reduce = None
        which = [i for i, p in enumerate(u.params) if p.grad is not None]
        if not which:
            return
        shard = sum(_padded_bytes(u.params[i], self.plan.world) for i in which)
        reduce_in = self._new(shard * self.plan.world, "comm_buffers")
        for p in u.params:  # copied in, the autograd gradients are freed
            p.grad = None
        out = self._new(shard, "grads")
        if self.set_to_none or id(u) not in self.grad_buffers:
            self._set_grads(u, out, which)
        del out  # added to the sharded gradients, with zero_grad zeros
        self.kept_reduce = reduce_in

    def finish_backward(self) -> None:
        """The end of backward: units whose inputs had no gradient, then the last buffers."""
        for u in reversed(self.forward_order):
            self.post_backward(u)
        self.kept_reduce = None
        self.kept_gather = None
        for u in self.units:
            u.gathered = None
            if u is not self.root or u.reduced:
                u.unsharded = None

    def reset(self) -> None:
        self.forward_order.clear()
        self.kept_gather = self.kept_reduce = None
        for u in self.units:
            u.unsharded = u.gathered = None
            u.in_backward = u.reduced = False
            u.forward_indices.clear()

    @contextlib.contextmanager
    def installed(self, tracker: LiveBytes, set_to_none: bool) -> Iterator[None]:
        """FSDP2's hooks on every unit while the tracked step runs."""
        self.tracker = tracker
        self.set_to_none = set_to_none
        self.reset()
        handles = []
        for u in self.units:
            handles.append(u.module.register_forward_pre_hook(self.pre_forward, with_kwargs=True))
            handles.append(u.module.register_forward_hook(self.post_forward, prepend=True))
        try:
            yield
        finally:
            for h in [*handles, *self.handles]:
                h.remove()
            self.handles.clear()
            self.reset()
            self.tracker = None


class _PostBackward(torch.autograd.Function):
    """Identity on a unit's input; its backward is the unit's post-backward (FSDP2's)."""

    @staticmethod
    def forward(ctx: Any, memory: FsdpMemory, unit: _Unit, t: torch.Tensor) -> torch.Tensor:
        ctx.memory, ctx.unit = memory, unit
        return t.view_as(t)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, torch.Tensor]:
        ctx.memory.post_backward(ctx.unit)
        return None, None, grad
