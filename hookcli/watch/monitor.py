"""The in-process monitor of ``hookcli watch`` (and of ``hookcli.watch(model)``).

Installed once per process (``install``), it adds:

- global optimizer step hooks (``register_optimizer_step_pre_hook`` / ``_post_hook``):
  one *step* is one ``optimizer.step()``, numbered from 1 per optimizer;
- a wrapper around ``torch.autograd.backward`` (which ``Tensor.backward`` calls): it
  notes the tensor backward was called on (the loss) and, in a process with no
  optimizer, makes each completed outermost backward a step.

Nothing else runs until a process trains: its first ``optimizer.step()`` over module
parameters (or, with no optimizer in the process, its first backward) *activates* the
monitor. Activation finds the model that owns the stepped parameters (one scan of the
garbage collector's objects for ``nn.Module`` instances, once per optimizer) and adds
one global forward hook, which does nothing but on the steps that log per-module
figures (``--every``) or under ``--nan-origin``.

Per step, before ``step()`` (the gradients it uses, after any clipping): the grad norm
of every stepped parameter in one fused ``torch._foreach_norm`` per device and dtype,
copied to the host as one vector; from it the total grad norm (as ``clip_grad_norm_``
measures it) and, on logged steps, each module's. Logged steps add the weight norms
(one more fused norm), the update ratio (a copy of the stepped parameters before
``step()``, the norm of the difference after it) and, from the forward hook, each
module's activation statistics. Hooks only read: no tensor the training uses is
written, no random number is drawn, no autograd node is added (statistics are taken
on detached tensors; ``--nan-origin`` adds tensor hooks that return None).

On CUDA the figures are copied to pinned host memory without a sync and read at the
next step; ``--stop-on`` and ``--nan-origin`` read them at the step itself (one sync
per step). docs/watch.md holds the whole contract.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import math
import os
import socket
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from hookcli.norms import BLOCKED_FROM, LOW_PRECISION, blocked_norm
from hookcli.watch.config import STEPS_SCHEMA, WatchConfig, logged

_MAX_NAMES = 20  # names listed in one event


class StopTraining(RuntimeError):
    """Raised out of ``optimizer.step()`` by ``--stop-on`` / ``stop_on=`` when no
    ``hookcli watch`` parent ends the process for it."""


# -- sinks ------------------------------------------------------------------------------


def _rank() -> tuple[int | None, int | None, int | None]:
    """(rank, world size, local rank) from torchrun's or Slurm's environment."""
    env = os.environ

    def num(*keys: str) -> int | None:
        for key in keys:
            with contextlib.suppress(KeyError, ValueError):
                return int(env[key])
        return None

    return (
        num("RANK", "SLURM_PROCID"),
        num("WORLD_SIZE", "SLURM_NTASKS"),
        num("LOCAL_RANK", "SLURM_LOCALID"),
    )


def _plain(value: Any) -> Any:
    """JSON-ready: non-finite floats as the strings "nan", "inf", "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class MemorySink:
    """Records kept in a list (the Python API)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def write(self, record: dict[str, Any]) -> None:
        self.records.append(_plain(record))

    def close(self) -> None:
        pass


class FileSink:
    """One ``steps.jsonl`` per process under the run's folder, a line per record,
    flushed as written: a run that is killed keeps every line written before."""

    def __init__(self, config: WatchConfig) -> None:
        self.folder = config.out
        self.path: str | None = None
        self._file: Any = None
        self._lock = threading.Lock()

    def _open(self) -> Any:
        assert self.folder is not None
        os.makedirs(self.folder, exist_ok=True)
        rank = _rank()[0]
        names = ([f"steps.rank{rank}.jsonl"] if rank is not None else ["steps.jsonl"]) + [
            f"steps.pid{os.getpid()}.jsonl"
        ]
        for name in names:
            path = os.path.join(self.folder, name)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                continue
            self.path = path
            return fd
        raise FileExistsError(f"every steps file name is taken in {self.folder}")

    def write(self, record: dict[str, Any]) -> None:
        try:  # the common case: every number finite, nothing to convert
            line = json.dumps(record, separators=(",", ":"), allow_nan=False)
        except ValueError:
            line = json.dumps(_plain(record), separators=(",", ":"), allow_nan=False)
        data = (line + "\n").encode()
        with self._lock:
            if self._file is None:
                self._file = self._open()
            while data:  # one write per record, no buffer a kill could lose
                data = data[os.write(self._file, data) :]

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                with contextlib.suppress(OSError):
                    os.close(self._file)
                self._file = None


# -- the figures of one model/optimizer --------------------------------------------------


@dataclass
class _Module:
    name: str
    type: str
    params: list[int]  # indices into the track's params (its own stepped ones)
    numel: int  # elements of the module and its descendants
    own: int
    trainable: int
    depth: int


@dataclass
class _Step:
    """The figures of one step between its pre- and post-hook (device tensors)."""

    step: int
    logged: bool
    pos: list[int]  # indices of the params that have a grad
    norms: torch.Tensor | None  # their grad norms, one vector
    losses: list[torch.Tensor]
    lrs: list[Any]
    weights: torch.Tensor | None = None  # weight norms of every param (logged)
    before: list[torch.Tensor] | None = None  # copies for the update ratio (logged)
    updates: torch.Tensor | None = None  # ||w_after - w_before|| per param (logged)
    act: dict[int, tuple[torch.Tensor, int]] = field(default_factory=dict)
    act_order: list[int] = field(default_factory=list)
    origin: dict[str, Any] | None = None  # --nan-origin's finding for this step
    step_time: float | None = None
    time: float = 0.0


@dataclass
class _Track:
    index: int
    label: str
    mode: str  # "optimizer" or "backward"
    optimizer: Any  # a weakref to the optimizer (None in backward mode)
    root_class: str
    params: list[torch.Tensor]
    param_names: list[str]
    modules: list[_Module]
    n_params: int  # what the optimizer held when the track was built
    steps: int = 0
    last_post: float | None = None
    next_logged: bool = True
    pending: _Step | None = None
    never: set[int] = field(default_factory=set)  # params that never had a grad
    act: dict[int, tuple[torch.Tensor, int]] = field(default_factory=dict)
    act_order: list[int] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)  # non-finite kinds already reported
    forward_order: list[int] = field(default_factory=list)  # modules, last logged step
    refs: list[nn.Module] = field(default_factory=list)  # the modules, kept alive
    plans: dict[Any, _Plan] = field(default_factory=dict)  # how to take the norms
    kept: list[torch.Tensor] | None = None  # the parameter copies, reused (CPU)


@dataclass(frozen=True)
class _Plan:
    """How to take the norms of a list of tensors: one fused ``_foreach_norm`` per
    (device, dtype) group of dense floating tensors, as ``clip_grad_norm_`` does (half
    types in float32), except that a large CPU tensor is read by rows
    (``hookcli.norms.blocked_norm``: closer to the exact norm, and on both threads);
    sparse and other tensors one by one."""

    groups: tuple[tuple[bool, tuple[int, ...]], ...]  # (low precision, fused indices)
    others: tuple[int, ...]
    single: bool  # every tensor of one device and dtype (the fused copies below)
    blocked: tuple[int, ...] = ()  # large CPU tensors, out of their groups: norms by rows

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
        return _Plan(plan, tuple(others), len(plan) == 1 and not others, tuple(blocked))


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


def _norms(tensors: list[torch.Tensor], plan: _Plan) -> torch.Tensor:
    if plan.single and not plan.blocked:
        return torch.stack(_foreach(tensors, plan.groups[0][0]))
    out: list[torch.Tensor | None] = [None] * len(tensors)
    for low, idx in plan.groups:
        if idx:
            for i, n in zip(idx, _foreach([tensors[i] for i in idx], low), strict=True):
                out[i] = n
    for i in plan.blocked:
        out[i] = blocked_norm(tensors[i])
    if plan.others:
        from hookcli.grads.probe import tensor_norm

        for i in plan.others:
            out[i] = tensor_norm(tensors[i]).float()
    norms = [n for n in out if n is not None]
    device = norms[0].device
    if any(n.device != device for n in norms):
        norms = [n.to(device) for n in norms]
    return torch.stack(norms).to(torch.float64)  # stack promotes float32 to float64


class _Host:
    """1-D tensors read on the host: on the CPU at once (``tolist``: exact floats); on
    CUDA copied together into pinned memory without a sync, read when ``values`` is
    called (an event says when they are there)."""

    def __init__(self, parts: list[torch.Tensor | None]) -> None:
        self.sizes = [0 if p is None else p.numel() for p in parts]
        self._lists: list[list[float]] | None = None
        self._flat: list[float] | None = None
        self._event: Any = None
        self._buffer: torch.Tensor | None = None
        if all(p is None or p.device.type == "cpu" for p in parts):
            self._lists = [[] if p is None else p.reshape(-1).tolist() for p in parts]
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


def _hypot(values: list[float]) -> float:
    return math.hypot(*values) if values else 0.0


def _nonfinite_kind(value: float | None) -> str | None:
    if value is None or math.isfinite(value):
        return None
    return "nan" if math.isnan(value) else "inf"


# -- the monitor ------------------------------------------------------------------------


class Monitor:
    """Global hooks that record per-step figures of every model a process trains.

    ``model``/``optimizer`` (the Python API) restrict it to that model and optimizer.
    """

    def __init__(
        self,
        config: WatchConfig,
        sink: Any,
        *,
        model: nn.Module | None = None,
        optimizer: Any = None,
    ) -> None:
        self.config = config
        self.sink = sink
        self.model = model
        self.optimizer = optimizer
        self._pid = os.getpid()
        self._handles: list[Any] = []
        self._tracks: weakref.WeakKeyDictionary[Any, _Track] = weakref.WeakKeyDictionary()
        self._ignored: weakref.WeakSet[Any] = weakref.WeakSet()
        self._all_tracks: list[_Track] = []
        self._names: dict[int, tuple[_Track, int]] = {}  # id(module) -> (track, index)
        self._losses: list[torch.Tensor] = []
        self._depth = 0
        self._stepped = False
        self._backward_track: _Track | None = None
        self._mode_checked = False
        self._forward: Any = None
        self._started = False
        self._dead = False
        self._real_backward: Callable[..., Any] | None = None
        self._queue: list[tuple[_Track, _Step, _Host, _Host | None]] = []
        self._t0 = config.t0 if config.t0 is not None else time.time()
        self._clock0 = time.perf_counter() - (time.time() - self._t0)
        # --nan-origin: the watched calls of the current step, and backward events
        self._calls: dict[int, list[Any]] = {}  # call id -> [track, module, out_bad, in_bad]
        self._call_ids = 0
        self._checked: dict[tuple[int, int], Any] = {}  # (id, version) -> bad flag
        self._backward_events: list[tuple[int, str, Any]] = []  # (call, "in"/"out", bad)
        self.stopped: dict[str, Any] | None = None
        self._registry: _Registry | None = None

    # -- install / remove

    def install(self, process: bool = False) -> Monitor:
        """Add the global optimizer hooks and the backward wrapper (``process``: the
        monitor of a ``hookcli watch`` process, ended by ``atexit``)."""
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        self._handles.append(register_optimizer_step_pre_hook(self._pre))
        self._handles.append(register_optimizer_step_post_hook(self._post))
        real = torch.autograd.backward
        self._real_backward = real
        monitor = self

        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            return monitor._backward(real, tensors, *args, **kwargs)

        backward.__wrapped__ = real  # type: ignore[attr-defined]
        backward.__doc__ = real.__doc__
        torch.autograd.backward = backward
        self._backward_wrapper = backward
        _LIVE.add(self)
        if process:
            # Armed as torch is imported, before any model or optimizer exists: the
            # registry sees every one built, so no scan of the process's objects is
            # needed to find a model or to know whether an optimizer exists.
            self._registry = _Registry().install()
            atexit.register(self.finish)
        return self

    def uninstall(self) -> None:
        """Remove every hook and the wrapper (the Python API's ``__exit__``)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._forward is not None:
            self._forward.remove()
            self._forward = None
        if torch.autograd.backward is getattr(self, "_backward_wrapper", None):
            torch.autograd.backward = self._real_backward  # type: ignore[assignment]
        if self._registry is not None:
            self._registry.uninstall()
            self._registry = None
        self._dead = True

    def _forked(self) -> None:
        """A forked child (a data-loader worker) records nothing: the parent does."""
        self._dead = True
        self._queue = []

    def _off(self) -> bool:
        return self._dead or os.getpid() != self._pid or torch.compiler.is_compiling()

    def _broken(self, err: BaseException) -> None:
        """hookcli's own failure: say it once, stop watching, let the training go on."""
        if self._dead:
            return
        with contextlib.suppress(Exception):
            sys.stderr.write(
                f"hookcli watch: the monitor stopped in process {os.getpid()} "
                f"({type(err).__name__}: {err}); the training goes on unwatched\n"
            )
            self._write({"kind": "error", "message": f"{type(err).__name__}: {err}"})
        self.uninstall()

    def _write(self, record: dict[str, Any]) -> None:
        if not self._started:
            self._started = True
            rank, world, local = _rank()
            self.sink.write(
                {
                    "kind": "start",
                    "schema": STEPS_SCHEMA,
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "rank": rank,
                    "world_size": world,
                    "local_rank": local,
                    "argv": list(sys.argv),
                    "torch": torch.__version__.split("+")[0],
                    "every": self.config.every,
                    "nan_origin": self.config.nan_origin,
                    "time": round(time.time() - self._t0, 6),
                }
            )
        self.sink.write(record)

    def _now(self) -> float:
        return round(time.perf_counter() - self._clock0, 6)

    # -- backward: the loss, and steps without an optimizer

    def _backward(self, real: Callable[..., Any], tensors: Any, *args: Any, **kwargs: Any) -> Any:
        if self._off():
            return real(tensors, *args, **kwargs)
        outer = self._depth == 0
        if outer:
            loss = tensors[0] if isinstance(tensors, (tuple, list)) and tensors else tensors
            if (
                isinstance(loss, torch.Tensor)
                and loss.numel() == 1
                and loss.is_floating_point()
                and len(self._losses) < 10_000
            ):
                self._losses.append(loss.detach())
        self._depth += 1
        try:
            return real(tensors, *args, **kwargs)
        finally:
            self._depth -= 1
            if outer and not self._stepped:
                try:
                    self._after_backward()
                except Exception as err:
                    self._broken(err)

    def _after_backward(self) -> None:
        """With no optimizer in the process, a completed outermost backward is a step."""
        if not self._mode_checked:
            self._mode_checked = True
            if self.optimizer is not None or self._optimizers_exist():
                return
            track = self._backward_mode_track()
            if track is None:
                return
            self._backward_track = track
        track = self._backward_track
        if track is None:
            return
        self._begin(track, [])
        self._end(track)

    def _optimizers_exist(self) -> bool:
        """An optimizer in the process that will step the watched model (any model,
        where none is named): another one, over other tensors, makes no steps here."""
        if self._registry is not None:
            opts = list(self._registry.optimizers)
        else:
            opts = list(_objects(torch.optim.Optimizer))
        if self.model is None:
            return bool(opts)
        mine = {id(p) for p in self.model.parameters()}
        return any(
            id(p) in mine for opt in opts for group in opt.param_groups for p in group["params"]
        )

    def _backward_mode_track(self) -> _Track | None:
        if self.model is not None:
            roots = [self.model]
        else:
            tops = self._registry.tops() if self._registry is not None else None
            if tops is None:
                tops = _tops(_modules())
            roots = [m for m in tops if any(p.grad is not None for p in m.parameters())]
        params: list[torch.Tensor] = []
        seen: set[int] = set()
        for root in roots:
            for p in root.parameters():
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    params.append(p)
        if not params:
            return None
        return self._new_track(None, params, roots, mode="backward")

    # -- optimizer steps

    def _track_of(self, opt: Any) -> _Track | None:
        if opt in self._ignored:
            return None
        n = sum(len(g["params"]) for g in opt.param_groups)
        track = self._tracks.get(opt)
        if track is not None and track.n_params == n:
            return track
        params: list[torch.Tensor] = []
        seen: set[int] = set()
        for group in opt.param_groups:
            for p in group["params"]:
                if id(p) not in seen:
                    seen.add(id(p))
                    params.append(p)
        roots = [self.model] if self.model is not None else self._roots(params, seen)
        owned = {id(p) for r in roots for p in r.parameters()}
        if not owned & seen:  # an optimizer over bare tensors: not a model's training
            self._ignored.add(opt)
            return None
        track = self._new_track(opt, params, roots, mode="optimizer", n_params=n, old=track)
        self._tracks[opt] = track
        return track

    def _roots(self, params: list[torch.Tensor], seen: set[int]) -> list[nn.Module]:
        """The models owning ``params``: from the registry, else one scan of the objects."""
        if self._registry is not None:
            roots = self._registry.roots(params)
            if roots is not None:
                return roots
        return _roots(_modules(), seen)

    def _new_track(
        self,
        opt: Any,
        params: list[torch.Tensor],
        roots: list[nn.Module],
        mode: str,
        n_params: int = 0,
        old: _Track | None = None,
    ) -> _Track:
        index = old.index if old is not None else len(self._all_tracks)
        ids = {id(p): i for i, p in enumerate(params)}
        names = [f"<param {i}>" for i in range(len(params))]
        modules: list[_Module] = []
        refs: list[nn.Module] = []
        several = len(roots) > 1
        for root in roots:
            prefix = f"{type(root).__name__}." if several else ""
            for pname, p in root.named_parameters():
                i = ids.get(id(p))
                if i is not None and names[i].startswith("<param"):
                    names[i] = prefix + pname
            for mname, m in root.named_modules():
                own = [
                    ids[id(p)]
                    for _, p in m.named_parameters(recurse=False)
                    if p.requires_grad and id(p) in ids
                ]
                everything = {id(p): p for p in m.parameters()}
                modules.append(
                    _Module(
                        name=prefix + mname,
                        type=type(m).__name__,
                        params=own,
                        numel=sum(p.numel() for p in everything.values()),
                        own=sum(p.numel() for _, p in m.named_parameters(recurse=False)),
                        trainable=sum(p.numel() for p in everything.values() if p.requires_grad),
                        depth=0 if not mname else mname.count(".") + 1,
                    )
                )
                refs.append(m)
        label = "+".join(type(r).__name__ for r in roots)
        taken = {t.label for t in self._all_tracks if t is not old}
        if label in taken:
            label = f"{label}#{index}"
        track = _Track(
            index=index,
            label=label,
            mode=mode,
            optimizer=weakref.ref(opt) if opt is not None else None,
            root_class=label,
            params=params,
            param_names=names,
            modules=modules,
            n_params=n_params,
            never=set(range(len(params))),
        )
        if old is not None:
            track.steps = old.steps
            track.last_post = old.last_post
            self._all_tracks[index] = track
        else:
            self._all_tracks.append(track)
        for i, m in enumerate(refs):
            self._names.setdefault(id(m), (track, i))
        track.refs = refs
        self._write(
            {
                "kind": "model",
                "model": label,
                "opt": index,
                "mode": mode,
                "optimizer": type(opt).__name__ if opt is not None else None,
                "param_groups": len(opt.param_groups) if opt is not None else None,
                "params": len(params),
                "numel": sum(p.numel() for p in params),
                "modules": [
                    {
                        "name": m.name,
                        "type": m.type,
                        "depth": m.depth,
                        "params": m.numel,
                        "own_params": m.own,
                        "trainable_params": m.trainable,
                        "stepped": bool(m.params),
                    }
                    for m in modules
                ],
            }
        )
        self._sync_forward_hook()
        return track

    def _sync_forward_hook(self) -> None:
        """The global forward hook is there only while a next step logs activations (or
        under --nan-origin): other steps' module calls stay on PyTorch's fast path. Once
        torch.compile is in use it stays, so that compiled code is not re-traced each
        time it would come and go (under compilation the hook does nothing)."""
        wanted = self.config.nan_origin or any(t.next_logged for t in self._all_tracks)
        if wanted and self._forward is None and not self._dead:
            self._forward = nn.modules.module.register_module_forward_hook(self._forward_hook)
        elif not wanted and self._forward is not None and not _compiling_in_use():
            self._forward.remove()
            self._forward = None

    def _pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        if self._off() or (self.optimizer is not None and opt is not self.optimizer):
            return
        self._stepped = True
        stop = None
        try:
            self._drain()
            track = self._track_of(opt)
            if track is None:
                self._losses = []
                return
            stop = self._begin(track, [g["lr"] for g in opt.param_groups])
        except Exception as err:
            self._broken(err)
            return
        if stop is not None:
            self._stop(stop)

    def _post(self, opt: Any, args: Any, kwargs: Any) -> None:
        if self._off():
            return
        track = self._tracks.get(opt)
        if track is None or track.pending is None:
            return
        try:
            self._end(track)
        except Exception as err:
            self._broken(err)

    def _begin(self, track: _Track, lrs: list[Any]) -> dict[str, Any] | None:
        """The pre-step figures of ``track``'s next step; a stop record when one is due."""
        track.steps += 1
        k = track.steps
        log = logged(k, self.config.every)
        grads: list[torch.Tensor] = []
        pos: list[int] = []
        for i, p in enumerate(track.params):
            g = p.grad
            if g is not None:
                grads.append(g)
                pos.append(i)
        if track.never:
            track.never.difference_update(pos)
        with torch.no_grad():
            norms = _norm_vector(grads, track.plans, tuple(pos))
            weights = before = None
            if log:
                weights = _norm_vector(track.params, track.plans, "weights")
                if track.mode == "optimizer":
                    before = _copies(track.params, track.plans, track.kept)
                    if all(b.device.type == "cpu" for b in before[:1]):
                        # On the CPU a new buffer of the parameters' size costs its page
                        # faults again on every logged step: the copy is kept for the
                        # next one (CUDA's caching allocator reuses a freed one anyway).
                        track.kept = before
        losses, self._losses = self._losses, []
        step = _Step(
            step=k,
            logged=log,
            pos=pos,
            norms=norms,
            losses=losses,
            lrs=lrs,
            weights=weights,
            before=before,
            time=self._now(),
        )
        if track.act:
            step.act, step.act_order = track.act, track.act_order
            track.act, track.act_order = {}, []
        if self.config.nan_origin:
            step.origin = self._origin_of_step(track)
        track.pending = step
        host = self._host_pre(step)
        now = bool(self.config.stop_on) or self.config.nan_origin or host.ready()
        if now:
            return self._check(track, step, host.values())
        step._host = host  # type: ignore[attr-defined]
        return None

    def _host_pre(self, step: _Step) -> _Host:
        losses = [t.reshape(1) for t in step.losses]
        lrs = [torch.as_tensor(lr).reshape(1) for lr in step.lrs if isinstance(lr, torch.Tensor)]
        act = [step.act[i][0] for i in step.act_order]
        host = _Host([step.norms, step.weights, *losses, *lrs, *act])
        step._host = host  # type: ignore[attr-defined]
        return host

    def _check(
        self, track: _Track, step: _Step, values: list[list[float]]
    ) -> dict[str, Any] | None:
        """Non-finite values of this step: the event, and a stop record if one is due."""
        step._values = values  # type: ignore[attr-defined]
        norms = values[0]
        losses = [v[0] for v in values[2 : 2 + len(step.losses)]]
        loss = sum(losses) if losses else None
        total = _hypot(norms)
        if math.isfinite(total) and (loss is None or math.isfinite(loss)):
            return None  # the common case: one test, no scan
        stop = None
        for what in ("nan", "inf"):
            if what in track.seen:
                continue
            bad_loss = loss is not None and _nonfinite_kind(loss) == what
            bad_params = [step.pos[j] for j, v in enumerate(norms) if _nonfinite_kind(v) == what]
            if not bad_loss and not bad_params and _nonfinite_kind(total) != what:
                continue
            track.seen.add(what)
            event = self._event(track, step, what, bad_loss, bad_params, values)
            self._write(event)
            if what in self.config.stop_on and stop is None:
                stop = {
                    "kind": "stop",
                    "model": track.label,
                    "opt": track.index,
                    "step": step.step,
                    "what": what,
                }
        return stop

    def _event(
        self,
        track: _Track,
        step: _Step,
        what: str,
        bad_loss: bool,
        bad_params: list[int],
        values: list[list[float]],
    ) -> dict[str, Any]:
        """The first NaN (or Inf) of a track: step, phase, origin module and how sure."""
        bad = set(bad_params)
        modules = [m.name for m in track.modules if bad & set(m.params)]
        phase = "forward" if bad_loss else "backward"
        module: str | None = None
        exact = False
        how = "unknown"
        # a NaN may come from an Inf made first (inf - inf, 0 * inf): either kind of
        # non-finite output is the origin of a NaN; only an Inf is the origin of an Inf
        origin = step.origin if step.origin and what in ("nan", step.origin["what"]) else None
        act_origin = self._origin_from_stats(track, step, what, values)
        if origin is not None:
            phase, module, exact, how = origin["phase"], origin["module"], True, "nan-origin"
        elif act_origin is not None:
            phase, module, exact, how = "forward", act_origin, True, "activations"
        elif phase == "backward" and modules:
            # the first module in backward order (the last in forward order) whose
            # own gradients hold it: the origin or the nearest module before it
            order = track.forward_order or list(range(len(track.modules)))
            rank = {m: i for i, m in enumerate(order)}
            named = {m.name: i for i, m in enumerate(track.modules)}
            module = max(modules, key=lambda n: rank.get(named[n], -1))
            how = "parameter gradients"
        return {
            "kind": "nonfinite",
            "model": track.label,
            "opt": track.index,
            "step": step.step,
            "what": what,
            "phase": phase,
            "module": module,
            "exact": exact,
            "found_by": how,
            "loss": sum(v[0] for v in values[2 : 2 + len(step.losses)]) if step.losses else None,
            "modules": modules[:_MAX_NAMES],
            "params": [track.param_names[i] for i in bad_params[:_MAX_NAMES]],
            "time": step.time,
        }

    def _origin_from_stats(
        self, track: _Track, step: _Step, what: str, values: list[list[float]]
    ) -> str | None:
        """On a logged step: the first module (in the order calls returned) whose output
        held the value, from its min and max."""
        if not step.act_order:
            return None
        first = 2 + len(step.losses) + sum(1 for lr in step.lrs if isinstance(lr, torch.Tensor))
        for j, i in enumerate(step.act_order):
            vec = values[first + j]
            mn, mx = vec[2], vec[3]
            if what == "nan" and not all(math.isfinite(v) for v in vec[:4]):
                return track.modules[i].name
            if what == "inf" and "inf" in (_nonfinite_kind(mn), _nonfinite_kind(mx)):
                return track.modules[i].name
        return None

    def _end(self, track: _Track) -> None:
        """After ``step()``: the update ratios, the step time; the record goes out (on
        CUDA once its figures reached the host)."""
        step = track.pending
        assert step is not None
        track.pending = None
        now = time.perf_counter()
        step.step_time = None if track.last_post is None else round(now - track.last_post, 6)
        track.last_post = now
        post: _Host | None = None
        if step.before is not None:
            with torch.no_grad():
                diffs = _differences(track.params, step.before, track.plans)
                step.updates = _norm_vector(diffs, track.plans, "weights")
            step.before = None
            post = _Host([step.updates])
        track.next_logged = logged(track.steps + 1, self.config.every)
        self._sync_forward_hook()
        pre: _Host = step._host  # type: ignore[attr-defined]
        self._queue.append((track, step, pre, post))
        self._drain()

    def _drain(self, wait: bool = False) -> None:
        """Write the records whose figures reached the host (all of them with ``wait``)."""
        while self._queue:
            track, step, pre, post = self._queue[0]
            if not wait and not (pre.ready() and (post is None or post.ready())):
                return
            self._queue.pop(0)
            values = getattr(step, "_values", None)
            if values is None:
                values = pre.values()
                stop = self._check(track, step, values)
                if stop is not None:
                    self._write(stop)
            updates = post.values()[0] if post is not None else None
            self._write(self._record(track, step, values, updates))

    def _record(
        self, track: _Track, step: _Step, values: list[list[float]], updates: list[float] | None
    ) -> dict[str, Any]:
        norms, weights = values[0], values[1]
        n_loss = len(step.losses)
        losses = [v[0] for v in values[2 : 2 + n_loss]]
        tensor_lrs = iter(v[0] for v in values[2 + n_loss :])
        lrs = [next(tensor_lrs) if isinstance(lr, torch.Tensor) else _num(lr) for lr in step.lrs]
        record: dict[str, Any] = {
            "kind": "step",
            "model": track.label,
            "opt": track.index,
            "step": step.step,
            "time": step.time,
            "step_time": step.step_time,
            "loss": _sum(losses) if losses else None,
            "backwards": n_loss,
            "grad_norm": _hypot(norms) if step.pos else None,
            "lr": lrs,
        }
        if step.logged:
            grad_of = dict(zip(step.pos, norms, strict=True))
            first_act = 2 + n_loss + sum(1 for lr in step.lrs if isinstance(lr, torch.Tensor))
            act = {i: values[first_act + j] for j, i in enumerate(step.act_order)}
            counts = {i: step.act[i][1] for i in step.act_order}
            modules: dict[str, Any] = {}
            for i, m in enumerate(track.modules):
                entry: dict[str, Any] = {}
                if m.params:
                    got = [grad_of[p] for p in m.params if p in grad_of]
                    entry["grad_norm"] = _hypot(got) if got else None
                    w = _hypot([weights[p] for p in m.params]) if weights else None
                    entry["weight_norm"] = w
                    if updates is not None and w is not None:
                        u = _hypot([updates[p] for p in m.params])
                        entry["update_ratio"] = u / w if w > 0 else None
                    else:
                        entry["update_ratio"] = None
                if i in act:
                    total, norm, mn, mx, nonzero = act[i]
                    n = counts[i]
                    mean = total / n
                    var = norm * norm / n - mean * mean
                    entry["act"] = {
                        "mean": mean,
                        "std": math.sqrt(var) if var > 0 else (0.0 if var == var else var),
                        "absmax": math.nan if math.isnan(mn + mx) else max(abs(mn), abs(mx)),
                        "zero_frac": 1.0 - nonzero / n,
                    }
                if entry:
                    modules[m.name] = entry
            record["modules"] = modules
            if step.act_order:
                track.forward_order = list(step.act_order)
            record["unused"] = [track.param_names[i] for i in sorted(track.never)][:_MAX_NAMES]
        return record

    # -- the forward hook: activation statistics, --nan-origin

    def _forward_hook(self, module: nn.Module, args: Any, output: Any) -> None:
        if torch.compiler.is_compiling() or torch.jit.is_tracing():
            return
        found = self._names.get(id(module))
        if found is None or self._dead or not torch.is_grad_enabled():
            return
        track, index = found
        try:
            if track.next_logged and index not in track.act:
                t = _first_float(output)
                if t is not None and t.numel():
                    track.act[index] = (_stats(t), t.numel())
                    track.act_order.append(index)
            if self.config.nan_origin:
                self._watch_call(track, index, args, output)
        except Exception as err:
            self._broken(err)

    def _watch_call(self, track: _Track, index: int, args: Any, output: Any) -> None:
        from hookcli.structures import iter_tensors

        self._call_ids += 1
        call = self._call_ids
        out_bad = None
        for t in iter_tensors(output):
            if t.is_floating_point() and t.numel():
                flag = _nonfinite_flag(t)
                self._checked[(id(t), t._version)] = flag
                out_bad = flag if out_bad is None else _either(out_bad, flag)
                if t.requires_grad:
                    t.register_hook(_grad_hook(self._backward_events, call, "out"))
        in_bad = None
        for t in iter_tensors(args):
            if t.is_floating_point() and t.numel():
                flag = self._checked.get((id(t), t._version))
                if flag is None:
                    flag = _nonfinite_flag(t)
                in_bad = flag if in_bad is None else _either(in_bad, flag)
                if t.requires_grad:
                    t.register_hook(_grad_hook(self._backward_events, call, "in"))
        self._calls[call] = [track, index, out_bad, in_bad]

    def _origin_of_step(self, track: _Track) -> dict[str, Any] | None:
        """--nan-origin: the first module whose output (forward) or whose input's grad
        (backward) turned non-finite from finite values, this step."""
        calls = {c: v for c, v in self._calls.items() if v[0] is track}
        for c in calls:
            del self._calls[c]
        events = [e for e in self._backward_events if e[0] in calls]
        self._backward_events = [e for e in self._backward_events if e[0] in self._calls]
        self._checked = {}

        def kind(flag: Any) -> str | None:
            if flag is None:
                return None
            if isinstance(flag, torch.Tensor):
                flag = int(flag)
            return {0: None, 1: "nan", 2: "inf", 3: "nan"}[int(flag)]

        for entry in calls.values():
            out, inp = kind(entry[2]), kind(entry[3])
            if out is not None and inp is None:
                return {"what": out, "phase": "forward", "module": track.modules[entry[1]].name}
        out_seen: dict[int, str | None] = {}
        for call, which, flag in events:
            k = kind(flag)
            if which == "out":
                out_seen[call] = out_seen.get(call) or k
            elif k is not None and out_seen.get(call) is None:
                name = track.modules[calls[call][1]].name
                return {"what": k, "phase": "backward", "module": name}
        return None

    # -- stopping, the end

    def _stop(self, stop: dict[str, Any]) -> None:
        """--stop-on: the record out, then the ``hookcli watch`` parent ends the whole
        process group; without one (the API), ``StopTraining`` out of ``step()``."""
        import signal

        self.stopped = stop
        with contextlib.suppress(Exception):
            self._write(stop)
            self.sink.close()
        parent = self.config.parent
        if parent and self.sink.__class__ is FileSink:
            with contextlib.suppress(OSError):
                os.kill(parent, signal.SIGUSR1)
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:  # the parent's SIGTERM ends this
                    time.sleep(0.05)
        raise StopTraining(
            f"hookcli watch: stopped at step {stop['step']} of {stop['model']}: "
            f"the first {stop['what'].upper() if stop['what'] == 'nan' else 'Inf'} (--stop-on)"
        )

    def finish(self) -> None:
        """Write what is still queued and the end record; close the file."""
        if os.getpid() != self._pid or (self._dead and not self._queue):
            with contextlib.suppress(Exception):
                self.sink.close()
            return
        with contextlib.suppress(Exception):
            self._drain(wait=True)
            if self._started:
                self._write(
                    {
                        "kind": "end",
                        "steps": {t.label: t.steps for t in self._all_tracks},
                        "unused": {
                            t.label: [t.param_names[i] for i in sorted(t.never)][:_MAX_NAMES]
                            for t in self._all_tracks
                        },
                        "time": self._now(),
                    }
                )
        with contextlib.suppress(Exception):
            self.sink.close()


# -- helpers ----------------------------------------------------------------------------

_LIVE: weakref.WeakSet[Monitor] = weakref.WeakSet()


def _after_fork() -> None:
    for monitor in list(_LIVE):
        monitor._forked()


os.register_at_fork(after_in_child=_after_fork)


def _num(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _sum(values: list[float]) -> float:
    total = values[0]
    for v in values[1:]:
        total += v
    return total


class _Registry:
    """Who owns which parameter, and which module holds which, as models are built: the
    global parameter and module registration hooks (they fire in ``__setattr__``,
    ``register_parameter`` and ``add_module`` only, never per call), and the optimizers
    made (``Optimizer.__init__`` wrapped, calling the original unchanged)."""

    def __init__(self) -> None:
        self.owner: dict[int, tuple[weakref.ref[Any], weakref.ref[nn.Module]]] = {}
        self.parent: dict[int, tuple[weakref.ref[nn.Module], weakref.ref[nn.Module]]] = {}
        self.optimizers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._handles: list[Any] = []
        self._init: Any = None
        self._real_init: Any = None

    def install(self) -> _Registry:
        from torch.nn.modules import module as mod

        self._handles.append(mod.register_module_parameter_registration_hook(self._param))
        self._handles.append(mod.register_module_module_registration_hook(self._module))
        real = torch.optim.Optimizer.__init__
        optimizers = self.optimizers

        def __init__(opt: Any, *args: Any, **kwargs: Any) -> None:
            real(opt, *args, **kwargs)
            optimizers.add(opt)

        __init__.__wrapped__ = real  # type: ignore[attr-defined]
        __init__.__doc__ = real.__doc__
        torch.optim.Optimizer.__init__ = __init__  # type: ignore[method-assign,assignment]
        self._init, self._real_init = __init__, real
        return self

    def uninstall(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if torch.optim.Optimizer.__init__ is self._init:
            torch.optim.Optimizer.__init__ = self._real_init  # type: ignore[method-assign]

    def _param(self, module: nn.Module, name: str, param: Any) -> None:
        if param is not None:
            self.owner[id(param)] = (weakref.ref(param), weakref.ref(module))

    def _module(self, module: nn.Module, name: str, child: Any) -> None:
        if isinstance(child, nn.Module):
            self.parent[id(child)] = (weakref.ref(child), weakref.ref(module))

    def top(self, m: nn.Module) -> nn.Module:
        seen = {id(m)}
        while True:
            entry = self.parent.get(id(m))
            if entry is None or entry[0]() is not m:
                return m
            up = entry[1]()
            if up is None or id(up) in seen or m not in up._modules.values():
                return m
            seen.add(id(up))
            m = up

    def roots(self, params: list[torch.Tensor]) -> list[nn.Module] | None:
        """The outermost modules holding ``params``; None when one of them was not seen
        being registered (a model unpickled whole, built before the monitor)."""
        tops: dict[int, nn.Module] = {}
        memo: dict[int, nn.Module] = {}
        for p in params:
            entry = self.owner.get(id(p))
            owner = entry[1]() if entry is not None and entry[0]() is p else None
            if owner is None or not any(q is p for q in owner._parameters.values()):
                return None
            top = memo.get(id(owner))
            if top is None:
                top = memo[id(owner)] = self.top(owner)
            tops.setdefault(id(top), top)
        return list(tops.values())

    def tops(self) -> list[nn.Module] | None:
        """Every outermost module seen (None: none seen)."""
        found: dict[int, nn.Module] = {}
        for _, owner_ref in self.owner.values():
            owner = owner_ref()
            if owner is not None:
                top = self.top(owner)
                found.setdefault(id(top), top)
        return list(found.values()) or None


def _objects(kind: type) -> Iterator[Any]:
    """Every object of ``kind`` the garbage collector tracks (looked up by type, not
    ``isinstance``: a proxy's ``__class__`` would warn or import)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            if issubclass(type(obj), kind):
                yield obj


def _modules() -> list[nn.Module]:
    return list(_objects(nn.Module))


def _tops(modules: list[nn.Module]) -> list[nn.Module]:
    """The modules that are no other module's child."""
    children = {id(c) for m in modules for c in m._modules.values() if c is not None}
    return [m for m in modules if id(m) not in children]


def _roots(modules: list[nn.Module], stepped: set[int]) -> list[nn.Module]:
    """The models that own the stepped parameters: the outermost modules holding them
    (a DDP or ``torch.compile`` wrapper included: names are as ``named_modules()`` of
    what the training calls), the one holding most first, until every stepped
    parameter that a module holds is covered."""
    remaining = set(stepped)
    found: list[nn.Module] = []
    covers = []
    for m in _tops(modules):
        own = {id(p) for p in m.parameters()} & remaining
        if own:
            covers.append((len(own), m, own))
    covers.sort(key=lambda c: -c[0])
    for _, m, own in covers:
        if own & remaining:
            remaining -= own
            found.append(m)
    return found


def _compiling_in_use() -> bool:
    """Whether torch.compile has compiled anything in this process (torch.optim alone
    imports torch._dynamo, so that import says nothing)."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    if dynamo is None:
        return False
    try:
        return bool(dynamo.counters["frames"]["ok"]) or bool(dynamo.counters["frames"]["total"])
    except Exception:  # another torch's counters: assume it is, to be safe
        return True


def _first_float(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output if output.is_floating_point() else None
    from hookcli.structures import iter_tensors

    for t in iter_tensors(output):
        if t.is_floating_point():
            return t
    return None


def _stats(t: torch.Tensor) -> torch.Tensor:
    """[sum, L2 norm, min, max, non-zero count] of a module output, one vector, read
    from a detached tensor (no autograd node); the host makes the mean and the
    population std of them (``std_mean`` itself costs some 30 times more on the CPU)."""
    t = t.detach()
    if t.dtype in LOW_PRECISION or t.element_size() == 1:
        t = t.float()
    mn, mx = torch.aminmax(t)
    parts = [t.sum(), torch.linalg.vector_norm(t), mn, mx, torch.count_nonzero(t)]
    return torch.stack([v.to(mn.dtype) for v in parts])


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
