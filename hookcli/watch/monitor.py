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
measures it) and, on logged steps, each module's. A step that clips has the same
vector taken at its first clipping call too (``clipping.py``): ``grad_norm`` is the
norm before clipping, ``grad_norm_applied`` the one ``step()`` applies. A closure step
takes its figures when its closure first returns (``closure.py``). An iteration that
ran a backward and then ``zero_grad`` with no step between (``zerograd.py``), or whose
step a GradScaler skipped (``scaler.py``), is a ``skipped`` record of its own. Several optimizers
over one model are one track: a step begins at the first of them and ends when each
has stepped. Logged steps add the weight norms
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
from typing import Any

import torch
from torch import nn

from hookcli.watch.clipping import ClipWatch
from hookcli.watch.closure import closure_of, with_closure
from hookcli.watch.config import STEPS_SCHEMA, WatchConfig, logged
from hookcli.watch.figures import (
    NanOrigin,
    _act_parts,
    _copies_normed,
    _first_float,
    _Host,
    _hypot,
    _norm_vector,
    _stats,
    _updates_normed,
)
from hookcli.watch.frames import hide
from hookcli.watch.merge import nonfinite_kind
from hookcli.watch.records import (
    LOSSES,
    MAX_NAMES,
    _num,
    _sum,
    nonfinite_event,
    step_record,
)
from hookcli.watch.registry import Registry, _compiling_in_use, _modules, _objects, _roots, _tops
from hookcli.watch.scaler import ScalerWatch
from hookcli.watch.sinks import FileSink, MemorySink, _rank
from hookcli.watch.track import (
    _count,
    _grads,
    _is_dtensor,
    _Module,
    _params_of,
    _Step,
    _Track,
    _weights,
)
from hookcli.watch.zerograd import ZeroGradWatch

__all__ = ["FileSink", "MemorySink", "Monitor", "StopTraining"]

# torch.compile(module) warns whenever a global module hook exists: the monitor's own
_COMPILE_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks"


class StopTraining(RuntimeError):
    """Raised out of ``optimizer.step()`` by ``--stop-on`` / ``stop_on=`` when no
    ``hookcli watch`` parent ends the process for it."""


# -- the figures of one model/optimizer --------------------------------------------------


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
        # the output last measured by the forward hook, weakly (the output may be freed
        # before the step): the same tensor, unchanged (its version), returned again by
        # a container is not read twice
        self._last_out: tuple[weakref.ref[torch.Tensor], int, tuple[torch.Tensor, ...]] | None = (
            None
        )
        self._t0 = config.t0 if config.t0 is not None else time.time()
        self._clock0 = time.perf_counter() - (time.time() - self._t0)
        # --nan-origin: the watched calls of the current step, and backward events
        self._origin = NanOrigin()
        self._pre_count = 0  # optimizer pre-hooks seen (GradScaler's skips)
        self._mute: _Track | None = None  # a closure step's later closure calls
        self._clips = ClipWatch(self._before_clip, self._after_clip)
        self._scaler = ScalerWatch(lambda: self._pre_count, self._skipped)
        self._since_step = False  # a backward ran since the last step (or discard)
        self._zeros = ZeroGradWatch(lambda: self._since_step, self._zeroing)
        self._warning_filter: Any = None
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
            try:
                return monitor._backward(real, tensors, *args, **kwargs)
            except BaseException as err:
                hide(err)
                raise

        backward.__wrapped__ = real  # type: ignore[attr-defined]
        backward.__doc__ = real.__doc__
        torch.autograd.backward = backward
        self._backward_wrapper = backward
        self._clips.install()
        self._scaler.install()
        self._zeros.install()
        import warnings

        warnings.filterwarnings("ignore", message=_COMPILE_WARNING, category=UserWarning)
        self._warning_filter = warnings.filters[0]
        _LIVE.add(self)
        if process:
            from hookcli.watch.frames import install_excepthook

            install_excepthook()
            # Armed as torch is imported, before any model or optimizer exists: the
            # registry sees every one built, so no scan of the process's objects is
            # needed to find a model or to know whether an optimizer exists.
            self._registry = Registry().install()
            atexit.register(self.finish)
        return self

    def uninstall(self) -> None:
        """Remove every hook and the wrapper (the Python API's ``__exit__``), and let go
        of the parameters' copy kept between logged steps (``_begin``)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for track in self._all_tracks:
            track.kept = None
        if self._forward is not None:
            self._forward.remove()
            self._forward = None
        if torch.autograd.backward is getattr(self, "_backward_wrapper", None):
            torch.autograd.backward = self._real_backward  # type: ignore[assignment]
        self._clips.uninstall()
        self._scaler.uninstall()
        self._zeros.uninstall()
        if self._warning_filter is not None:
            import warnings

            with contextlib.suppress(ValueError):
                warnings.filters.remove(self._warning_filter)  # type: ignore[attr-defined]
                warnings._filters_mutated()  # type: ignore[attr-defined]
            self._warning_filter = None
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
            try:
                self._before_backward(tensors)
            except Exception as err:
                self._broken(err)
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

    def _before_backward(self, tensors: Any) -> None:
        """An outermost backward begins: its loss (the one the script computed, under a
        GradScaler unscaled); the end of a step that several optimizers took; and under
        --stop-on a non-finite loss is recorded now, before the backward (under DDP its
        all-reduce hands the value to the other ranks, whose stop may end this one)."""
        self._clips.late()
        if self._since_step and self._mute is None:
            self._gone()  # gradients set to None by hand since the last backward?
        for track in self._all_tracks:
            track.preclip = track.preclip_total = None
            if track.pending is not None and track.posted:
                self._end(track)  # the optimizers of a model have all stepped
        if self._mute is not None:
            return  # a closure step's later call (LBFGS): the first call's figures count
        self._since_step = True
        loss = tensors[0] if isinstance(tensors, (tuple, list)) and tensors else tensors
        if (
            isinstance(loss, torch.Tensor)
            and loss.numel() == 1
            and loss.is_floating_point()
            and len(self._losses) < 10_000
        ):
            loss = self._scaler.unscaled(loss).detach()
            self._losses.append(loss)
            if self.config.stop_on:
                self._early_nonfinite(loss)

    def _early_nonfinite(self, loss: torch.Tensor) -> None:
        tracks = [t for t in self._all_tracks if t.mode == "optimizer"]
        if len(tracks) != 1 or math.isfinite(float(loss)):
            return
        track = tracks[0]
        what = nonfinite_kind(float(loss))
        if what is None or what in track.seen:
            return
        step = _Step(step=track.steps + 1, logged=False, pos=[], norms=None, losses=[loss], lrs=[])
        step.time = self._now()  # when the backward of the non-finite loss began
        step.act, step.act_order = dict(track.act), list(track.act_order)
        if self.config.nan_origin:
            step.origin = self._origin.of_step(track)
        acts = _act_parts(step.act, step.act_order)
        host = _Host([None, None, None, None, loss.reshape(1), *acts])
        track.seen.add(what)
        self._write(nonfinite_event(track, step, what, True, [], host.values()))
        track.early = what
        if what in self.config.stop_on:
            track.stop_due = self._stop_record(track, step.step, what)

    def _stop_record(self, track: _Track, step: int, what: str) -> dict[str, Any]:
        return {
            "kind": "stop",
            "model": track.label,
            "opt": track.index,
            "step": step,
            "what": what,
        }

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

    def _optimizers(self) -> list[Any]:
        if self.optimizer is not None:
            return [self.optimizer]
        if self._registry is not None:
            return list(self._registry.optimizers)
        return list(_objects(torch.optim.Optimizer))

    def _optimizers_exist(self) -> bool:
        """An optimizer in the process that will step the watched model (any model,
        where none is named): another one, over other tensors, makes no steps here."""
        opts = self._optimizers()
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
        return self._new_track([], params, roots, mode="backward")

    # -- optimizer steps

    def _track_of(self, opt: Any) -> _Track | None:
        """The model ``opt`` steps. Every optimizer over one model (SGD on one part, Adam
        on another) is that one model: its parameters are the union of theirs."""
        if opt in self._ignored:
            return None
        track = self._tracks.get(opt)
        if track is not None and track.members.get(id(opt)) == _count(opt):
            return track
        params, seen = _params_of([opt])
        roots = [self.model] if self.model is not None else self._roots(params, seen)
        owned = {id(p) for r in roots for p in r.parameters()}
        if not owned & seen:  # an optimizer over bare tensors: not a model's training
            self._ignored.add(opt)
            return None
        root_ids = tuple(id(r) for r in roots)
        if track is None:
            track = next(
                (t for t in self._all_tracks if t.mode == "optimizer" and t.root_ids == root_ids),
                None,
            )
        members = [opt]
        if self.optimizer is None:
            for other in self._optimizers():
                if other is not opt and other not in self._ignored:
                    theirs = {id(p) for g in other.param_groups for p in g["params"]}
                    if theirs and theirs <= owned:
                        members.append(other)
        params, seen = _params_of(members)
        track = self._new_track(members, params, roots, mode="optimizer", old=track)
        for member in members:
            self._tracks[member] = track
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
        opts: list[Any],
        params: list[torch.Tensor],
        roots: list[nn.Module],
        mode: str,
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
            optimizer=weakref.ref(opts[0]) if opts else None,
            root_class=label,
            params=params,
            param_names=names,
            modules=modules,
            n_params=sum(_count(o) for o in opts),
            never=set(range(len(params))),
            members={id(o): _count(o) for o in opts},
            root_ids=tuple(id(r) for r in roots),
            ids=set(ids),
            sharded=any(_is_dtensor(p) for p in params),
        )
        if old is not None:
            track.steps = old.steps
            track.last_post = old.last_post
            track.seen = old.seen
            self._all_tracks[index] = track
            if self._backward_track is old:
                self._backward_track = track
        else:
            self._all_tracks.append(track)
        if old is not None:
            self._names = {k: v for k, v in self._names.items() if v[0] is not old}
            if self._mute is old:
                self._mute = track
        for i, m in enumerate(refs):
            self._names.setdefault(id(m), (track, i))
        track.refs = refs
        self._write(
            {
                "kind": "model",
                "model": label,
                "opt": index,
                "mode": mode,
                "optimizer": "+".join(type(o).__name__ for o in opts) if opts else None,
                "param_groups": sum(len(o.param_groups) for o in opts) if opts else None,
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

    def _pre(self, opt: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        if self._off() or (self.optimizer is not None and opt is not self.optimizer):
            return None
        self._stepped = True
        self._pre_count += 1
        stop = None
        try:
            self._drain()
            track = self._track_of(opt)
            if track is None:
                self._losses = []
                return None
            lrs = [g["lr"] for g in opt.param_groups]
            if track.pending is not None:
                if id(opt) not in track.joined:
                    # another optimizer of the same model, in the same iteration: the
                    # step's figures (every parameter of the model) are taken already
                    track.joined.add(id(opt))
                    track.pending.lrs.extend(_num(lr) for lr in lrs)
                    return None
                self._end(track)  # the model's optimizers stepped again: a new step
            track.joined, track.posted = {id(opt)}, set()
            closure = closure_of(opt, args, kwargs)
            if closure is not None:
                # forward and backward run inside step(): the step's figures are taken
                # when its closure returns (its first call), before the update
                track.closing = lrs
                return self._with_closure(track, closure, args, kwargs)
            stop = self._begin(track, lrs)
        except Exception as err:
            self._broken(err)
            return None
        if stop is not None:
            self._stop(stop)
        return None

    def _with_closure(
        self, track: _Track, closure: Callable[..., Any], args: Any, kwargs: Any
    ) -> tuple[Any, Any]:
        """The closure wrapped: its first return ends the step's forward and backward
        (LBFGS calls it again after its inner updates: those calls' losses and
        activations are not the step's)."""
        return with_closure(args, kwargs, closure, lambda: self._closure_done(track))

    def _closure_done(self, track: _Track) -> None:
        if track.closing is None or self._off():
            return
        lrs, track.closing = track.closing, None
        try:
            stop = self._begin(track, lrs)
            self._mute = track
        except Exception as err:
            self._broken(err)
            return
        if stop is not None:
            self._stop(stop)

    def _post(self, opt: Any, args: Any, kwargs: Any) -> None:
        if self._off():
            return
        track = self._tracks.get(opt)
        if track is None:
            return
        try:
            if self._mute is track:
                self._mute = None
            if track.closing is not None:  # a closure step whose closure never ran
                lrs, track.closing = track.closing, None
                self._begin(track, lrs)
            if track.pending is None:
                return
            track.posted.add(id(opt))
            if len(track.members) <= 1 or len(track.posted) >= len(track.members):
                self._end(track)
            # else: ended when another of its optimizers steps, a backward begins, or
            # the process ends
        except Exception as err:
            self._broken(err)

    def _before_clip(self, params: list[torch.Tensor]) -> list[_Track] | None:
        """A clipping call: the grad norms of every model whose parameters it clips, as
        they are before it (the first clipping call of a step counts); the tracks whose
        figures it took (for ``_after_clip``)."""
        if self._off() or self._mute is not None:
            return None
        try:
            ids = {id(p) for p in params}
            tracks = [
                t for t in self._all_tracks if t.mode == "optimizer" and not ids.isdisjoint(t.ids)
            ]
            if not tracks and self._all_tracks == []:  # before the first step
                for opt in self._optimizers():
                    if any(id(p) in ids for g in opt.param_groups for p in g["params"]):
                        track = self._track_of(opt)
                        if track is not None and track not in tracks:
                            tracks.append(track)
            taken = []
            for track in tracks:
                if track.preclip is None:
                    grads, pos = _grads(track)
                    with torch.no_grad():
                        track.preclip = (pos, _norm_vector(grads, track.plans, tuple(pos)))
                    taken.append((track, ids, params))
            return taken  # type: ignore[return-value]
        except Exception as err:
            self._broken(err)
            return None

    def _after_clip(self, taken: Any, total: torch.Tensor, norm_type: float | None) -> None:
        """What a norm-clipping call returned (the total norm before clipping, of its
        ``norm_type``; under FSDP the whole model's where each rank holds a shard) is
        the step's ``grad_norm`` where the call clipped every parameter of the model
        that has a gradient and no other one that has."""
        if not taken or self._off() or norm_type is None:
            return
        try:
            for track, ids, params in taken:
                if track.preclip is None or track.preclip_total is not None:
                    continue
                if ids == track.ids or (  # the common case: one set comparison
                    all(id(track.params[i]) in ids for i in track.preclip[0])
                    and not any(p.grad is not None for p in params if id(p) not in track.ids)
                ):
                    track.preclip_total = total.detach().reshape(1).to(torch.float64)
                    track.preclip_type = norm_type
        except Exception as err:
            self._broken(err)

    def _skipped(self, opt: Any) -> None:
        """GradScaler skipped ``opt.step()`` (Inf or NaN in the scaled gradients): the
        iteration is recorded as skipped, its loss never added into the next step."""
        if self._off() or (self.optimizer is not None and opt is not self.optimizer):
            return
        try:
            self._drain()
            track = self._track_of(opt)
            if track is None:
                self._losses, self._since_step = [], False
                return
            self._discard(track, "GradScaler")
        except Exception as err:
            self._broken(err)

    def _zeroing(self, obj: Any) -> None:
        """``obj.zero_grad()`` (an optimizer or a module) while a backward has run since
        the last step, before it clears the gradients: where it clears every gradient
        of a model and no other watched model holds one, the script discarded the
        iteration (a guard's ``zero_grad(); continue``)."""
        if self._off():
            return
        try:
            if isinstance(obj, torch.optim.Optimizer):
                if self.optimizer is not None and obj is not self.optimizer:
                    return
                cleared = {id(p) for g in obj.param_groups for p in g["params"]}
                owners = [obj]
            else:
                cleared = {id(p) for p in obj.parameters()}
                owners = [o for o in self._optimizers() if self.optimizer in (None, o)]
            tracks = []
            for opt in owners:
                if self._all_tracks and opt not in self._tracks:
                    continue
                if any(id(p) in cleared for g in opt.param_groups for p in g["params"]):
                    track = self._track_of(opt)
                    if track is not None and track.mode == "optimizer" and track not in tracks:
                        tracks.append(track)
            held = [t for t in self._all_tracks if t.mode == "optimizer" and _holds(t)]
            if len(tracks) == 1 and held == tracks and not self._untracked_hold(cleared):
                track = tracks[0]
                if all(id(p) in cleared for p in track.params if p.grad is not None):
                    self._drain()
                    self._discard(track, "zero_grad")
        except Exception as err:
            self._broken(err)

    def _untracked_hold(self, cleared: set[int]) -> bool:
        """Whether an optimizer that has not stepped yet (no track: a GAN's generator
        before its first ``step()``) holds a gradient that ``zero_grad`` leaves: the
        backward since the last step was (also) another model's, not a discard."""
        return any(
            p.grad is not None and id(p) not in cleared
            for opt in self._optimizers()
            if opt not in self._tracks and opt not in self._ignored
            for g in opt.param_groups
            for p in g["params"]
        )

    def _gone(self) -> None:
        """A backward begins and one has run since the last step: where a clipping call
        saw the one model's gradients since and they are all None now, the script set
        them so (``p.grad = None``) and discarded that iteration."""
        try:
            tracks = [t for t in self._all_tracks if t.mode == "optimizer"]
            seen = len(tracks) == 1 and tracks[0].preclip is not None
            if seen and tracks[0].preclip[0] and not _holds(tracks[0]):  # type: ignore[index]
                self._drain()
                self._discard(tracks[0], "zero_grad", late=True)
        except Exception as err:
            self._broken(err)

    def _discard(self, track: _Track, by: str, late: bool = False) -> None:
        """An iteration that ran its backward and no step (``by``: the GradScaler
        skipped the step, or the script cleared the gradients): a ``skipped`` record of
        its own (its loss, its grad norm before clipping), not a step, and nothing of it
        carried into the next step. ``late``: seen at the next backward, after the
        gradients went (the norm is known only where a clipping call took it) and after
        the next forward (whose activation statistics stay)."""
        losses, self._losses = self._losses, []
        self._since_step = False
        pre, track.preclip = track.preclip, None
        total, track.preclip_total = track.preclip_total, None
        if pre is None and not late:
            grads, pos = _grads(track)
            with torch.no_grad():
                pre = (pos, _norm_vector(grads, track.plans, tuple(pos)))
        if not late:
            track.act, track.act_order = {}, []
            if self.config.nan_origin:
                self._origin.of_step(track)
        if track.early is not None:  # a non-finite loss written before its backward
            track.seen.discard(track.early)
            track.early = track.stop_due = None
        values = _Host([pre[1] if pre else None, total, *(t.reshape(1) for t in losses)]).values()
        record: dict[str, Any] = {
            "kind": "skipped",
            "by": by,
            "model": track.label,
            "opt": track.index,
            "after": track.steps,
            "time": self._now(),
            "loss": _sum([v[0] for v in values[2:]]) if losses else None,
            "backwards": len(losses),
            "grad_norm": values[1][0] if values[1] else None,
        }
        if not values[1] and pre and pre[0]:
            record["grad_norm"] = _hypot(values[0])
        if values[1] and track.preclip_type != 2.0:
            record["norm_type"] = track.preclip_type
        self._write(record)

    def _begin(self, track: _Track, lrs: list[Any]) -> dict[str, Any] | None:
        """The pre-step figures of ``track``'s next step; a stop record when one is due."""
        track.steps += 1
        k = track.steps
        log = logged(k, self.config.every)
        self._last_out = None
        grads, pos = _grads(track)
        if track.never:
            track.never.difference_update(pos)
        with torch.no_grad():
            norms = _norm_vector(grads, track.plans, tuple(pos))
            weights = before = None
            if log:
                params = _weights(track)
                if track.mode == "optimizer":
                    weights, before = _copies_normed(params, track.plans, track.kept)
                    if before[:1] and before[0].is_cpu:
                        # On the CPU a new buffer of the parameters' size costs its page
                        # faults again on every logged step: the copy is kept for the
                        # next one until the watch ends (``uninstall``); CUDA's caching
                        # allocator reuses a freed one anyway.
                        track.kept = before
                else:
                    weights = _norm_vector(params, track.plans, "weights")
        losses, self._losses = self._losses, []
        self._since_step = False
        track.early = None
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
        if track.preclip is not None:
            step.pre_pos, step.pre_norms = track.preclip
            step.pre_total, step.pre_type = track.preclip_total, track.preclip_type
            track.preclip = track.preclip_total = None
        track.pending = step
        host = self._host_pre(step)
        now = bool(self.config.stop_on) or self.config.nan_origin or host.ready()
        if now:
            return self._check(track, step, host.values())
        step._host = host  # type: ignore[attr-defined]
        return None

    def _host_pre(self, step: _Step) -> _Host:
        lrs = [torch.as_tensor(lr).reshape(1) for lr in step.lrs if isinstance(lr, torch.Tensor)]
        act = _act_parts(step.act, step.act_order)
        host = _Host(
            [step.norms, step.weights, step.pre_norms, step.pre_total, *step.losses, *lrs, *act]
        )
        step._host = host  # type: ignore[attr-defined]
        return host

    def _check(
        self, track: _Track, step: _Step, values: list[list[float]]
    ) -> dict[str, Any] | None:
        """Non-finite values of this step: the event, and a stop record if one is due."""
        step._values = values  # type: ignore[attr-defined]
        due, track.stop_due = track.stop_due, None
        # the gradients before clipping: a NaN in one makes clip_grad_norm_ spread it
        norms = values[2] if step.pre_pos is not None else values[0]
        where = step.pre_pos if step.pre_pos is not None else step.pos
        losses = [v[0] for v in values[LOSSES : LOSSES + len(step.losses)]]
        loss = sum(losses) if losses else None
        total = _hypot(norms)
        if math.isfinite(total) and (loss is None or math.isfinite(loss)):
            return due  # the common case: one test, no scan
        stop = None
        for what in ("nan", "inf"):
            if what in track.seen:
                continue
            bad_loss = loss is not None and nonfinite_kind(loss) == what
            bad_params = [where[j] for j, v in enumerate(norms) if nonfinite_kind(v) == what]
            if not bad_loss and not bad_params and nonfinite_kind(total) != what:
                continue
            track.seen.add(what)
            event = nonfinite_event(track, step, what, bad_loss, bad_params, values)
            self._write(event)
            if what in self.config.stop_on and stop is None:
                stop = self._stop_record(track, step.step, what)
        return stop or due

    def _end(self, track: _Track) -> None:
        """After ``step()``: the update ratios, the step time; the record goes out (on
        CUDA once its figures reached the host)."""
        step = track.pending
        assert step is not None
        track.pending = None
        if len(track.members) > 1:  # which of the model's optimizers took the step
            step.by = [i for i, k in enumerate(track.members) if k in track.joined]
        now = time.perf_counter()
        step.step_time = None if track.last_post is None else round(now - track.last_post, 6)
        track.last_post = now
        post: _Host | None = None
        if step.before is not None:
            with torch.no_grad():
                step.updates = _updates_normed(_weights(track), step.before, track.plans)
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
            self._write(step_record(track, step, values, updates))

    # -- the forward hook: activation statistics, --nan-origin

    def _forward_hook(self, module: nn.Module, args: Any, output: Any) -> None:
        if torch.compiler.is_compiling() or torch.jit.is_tracing():
            return
        found = self._names.get(id(module))
        if found is None or self._dead or not torch.is_grad_enabled():
            return
        track, index = found
        if track is self._mute:
            return
        try:
            if track.next_logged and index not in track.act:
                t = _first_float(output)
                if t is not None and t.numel():
                    # (an inference tensor has no version counter: never taken as known)
                    inference = t.is_inference()
                    last = None if inference else self._last_out
                    if last is not None and last[0]() is t and last[1] == t._version:
                        stats = last[2]  # a container's output is its last child's
                    else:
                        stats = _stats(t)
                        self._last_out = None
                        if not inference:
                            with contextlib.suppress(TypeError):  # no weak references
                                self._last_out = (weakref.ref(t), t._version, stats)
                    track.act[index] = (stats, t.numel())
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
            for track in self._all_tracks:
                if track.pending is not None and track.posted:
                    self._end(track)  # a model's step that not all its optimizers took
            self._drain(wait=True)
            if self._started:
                self._write(
                    {
                        "kind": "end",
                        "steps": {t.label: t.steps for t in self._all_tracks},
                        "unused": {
                            t.label: [t.param_names[i] for i in sorted(t.never)][:MAX_NAMES]
                            for t in self._all_tracks
                        },
                        "time": self._now(),
                        "step_calls": self._pre_count,
                        "backward_since_step": self._since_step,
                    }
                )
        with contextlib.suppress(Exception):
            self.sink.close()


# -- helpers ----------------------------------------------------------------------------

_LIVE: weakref.WeakSet[Monitor] = weakref.WeakSet()


def _holds(track: _Track) -> bool:
    """Whether any of ``track``'s parameters has a gradient."""
    return any(p.grad is not None for p in track.params)


def _after_fork() -> None:
    for monitor in list(_LIVE):
        monitor._forked()


os.register_at_fork(after_in_child=_after_fork)
