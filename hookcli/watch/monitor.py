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
import math
import os
import socket
import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from hookcli.watch.config import STEPS_SCHEMA, WatchConfig, logged
from hookcli.watch.figures import (
    NanOrigin,
    _copies,
    _differences,
    _first_float,
    _Host,
    _hypot,
    _nonfinite_kind,
    _norm_vector,
    _Plan,
    _stats,
)
from hookcli.watch.registry import Registry, _compiling_in_use, _modules, _objects, _roots, _tops
from hookcli.watch.sinks import FileSink, MemorySink, _rank

__all__ = ["FileSink", "MemorySink", "Monitor", "StopTraining"]

_MAX_NAMES = 20  # names listed in one event


class StopTraining(RuntimeError):
    """Raised out of ``optimizer.step()`` by ``--stop-on`` / ``stop_on=`` when no
    ``hookcli watch`` parent ends the process for it."""


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
        self._origin = NanOrigin()
        self.stopped: dict[str, Any] | None = None
        self._registry: Registry | None = None

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
            self._registry = Registry().install()
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
            step.origin = self._origin.of_step(track)
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
                self._origin.watch_call(track, index, args, output)
        except Exception as err:
            self._broken(err)

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
