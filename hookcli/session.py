"""``HookSession``: attach the probes' hooks, run the model, always put it back.

One set of hooks per kind is attached (per module, or through the global
``register_module_*`` family with ``global_hooks=True``) and dispatched to the
probes, so that the session alone owns every handle. On exit, also after an
exception or Ctrl-C, it removes every handle, restores each module's training
flag, every buffer (values and identity), every plain tensor attribute (a KV cache,
also before each forward after the first), every parameter's ``.grad`` and any
``inplace`` flag it switched off for backward hooks.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn.modules import module as module_mod
from torch.utils.hooks import RemovableHandle

from hookcli.amp import autocast
from hookcli.errors import (
    ResourceError,
    RunError,
    first_line,
    is_oom,
    oom_cause,
)
from hookcli.metavalues import MetaValues
from hookcli.modelinfo import depth_of
from hookcli.options import HookKind, Mode
from hookcli.preserve import TensorAttributes
from hookcli.structures import iter_tensors, shapes_of


class Frame:
    """One module call while the run is under way (internal, filled as hooks fire)."""

    __slots__ = (
        "call",
        "depth",
        "done",
        "failed",
        "index",
        "input_shapes",
        "module_id",
        "name",
        "output_shapes",
        "type",
    )

    def __init__(self, index: int, module: nn.Module, name: str, depth: int, call: int) -> None:
        self.index = index
        self.module_id = id(module)
        self.name = name
        self.type = type(module).__name__
        self.depth = depth
        self.call = call
        self.input_shapes: tuple[tuple[int, ...], ...] = ()
        self.output_shapes: tuple[tuple[int, ...], ...] = ()
        self.done = False
        self.failed = False


class CallRecord(NamedTuple):
    """One finished (or failed) module call, as the report sees it (a named tuple: one
    is made per call on every run, and a frozen dataclass's init costs several times more)."""

    index: int  # type: ignore[assignment]  # the field shadows tuple.index, by design
    name: str
    type: str
    depth: int
    call: int
    module_id: int
    input_shapes: tuple[tuple[int, ...], ...]
    output_shapes: tuple[tuple[int, ...], ...]
    done: bool
    failed: bool


class Probe:
    """The hooks of one kind plus the columns they fill. Override what you need.

    ``kinds`` says which per-module hook kinds the probe needs; the session
    attaches the union. A probe never prints and never keeps a tensor it does
    not need past the hook that saw it.
    """

    kinds: frozenset[HookKind] = frozenset()
    # True: a forward without grad runs under ``no_grad`` instead of ``inference_mode``,
    # so tensors keep the version counter that tells the probe of in-place changes.
    needs_versions: bool = False

    def attach(self, session: HookSession) -> None:
        """Extra hooks (tensor hooks): register them through ``session.keep``."""

    def on_forward_pre(self, frame: Frame, module: nn.Module, args: Any, kwargs: Any) -> None:
        """A module call begins."""

    def on_forward(
        self, frame: Frame, module: nn.Module, args: Any, kwargs: Any, output: Any
    ) -> None:
        """A module call returned (or raised, when ``always_call`` is on)."""

    def on_backward_pre(self, frame: Frame, module: nn.Module, grad_output: Any) -> None:
        """Gradients w.r.t. a module call's outputs are ready."""

    def on_backward(
        self, frame: Frame, module: nn.Module, grad_input: Any, grad_output: Any
    ) -> None:
        """Gradients w.r.t. a module call's inputs are ready."""

    def finish(self, session: HookSession) -> None:
        """The run is over (hooks still attached): gather device-side results once."""

    def columns(self, record: CallRecord) -> dict[str, Any]:
        """Extra columns of one row."""
        return {}

    def container_columns(self, module: nn.Module) -> dict[str, Any]:
        """Extra columns of a module never called whose descendants ran (its subtree)."""
        return {}

    def totals(self) -> dict[str, Any]:
        """Extra totals."""
        return {}


def _reason(err: BaseException) -> str:
    """The first line of what the model raised; SystemExit says the model called sys.exit."""
    if isinstance(err, SystemExit):
        return f"the model called {getattr(err, 'via', 'sys.exit')}({err.code!r})"
    return first_line(err)


def _raised_where(err: BaseException, phase: str, frame: Frame | None) -> str:
    """`` (raised at model.py:42 in forward)`` for the model's own code; an InternalError
    when hookcli's code raised (never blamed on the model)."""
    from hookcli.failure import deliberate, internal_error, raised_at

    if deliberate(err):
        return ""  # what hookcli raises on purpose names its own cause

    at = raised_at(err)
    if at is None:
        return ""
    if at.hookcli:
        module = None if frame is None else f"{frame.name or '(root)'} ({frame.type})"
        raise internal_error(err, at, phase, module) from err
    return at.suffix()


def _carried_state(err: BaseException, model: nn.Module) -> str:
    """What names tensors the model keeps from call to call (a KV cache in attributes)
    when backward reached into an earlier call's graph; '' otherwise."""
    from hookcli.failure import carried_state_reason

    return carried_state_reason(err, model)


def _fmt_shapes(shapes: Sequence[Sequence[int]]) -> str:
    if not shapes:
        return "no tensors"
    return ", ".join("[" + ", ".join(str(d) for d in s) + "]" for s in shapes)


def _aliasing_hook_forward(ctx: Any, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """BackwardHookFunction.forward, returning aliases instead of views (see HookSession)."""
    outs = tuple(a.detach() for a in args)
    frozen = [o for a, o in zip(args, outs, strict=True) if not a.requires_grad]
    ctx.mark_non_differentiable(*frozen)
    if any(a.is_quantized for a in args):
        # autograd fills a missing grad with zeros_like, which a quantized tensor has no
        # kernel for: its slot (and any other without a grad) stays None instead
        ctx.set_materialize_grads(False)
    return outs


_eager_hooks = False  # (``hooks_outside_compile``)


@contextlib.contextmanager
def hooks_outside_compile(on: bool = True) -> Any:
    """While on, the hooks of every session attached (and those ``disable_compile``
    wraps) are hidden from torch.compile: where a compiled forward calls a module, its
    graph breaks and the hook runs eagerly, on real tensors, instead of being traced into
    the graph (``compare --vs compile``: the figures are taken in plain PyTorch)."""
    global _eager_hooks
    before, _eager_hooks = _eager_hooks, on or _eager_hooks
    try:
        yield
    finally:
        _eager_hooks = before


def disable_compile(hook: Any) -> Any:
    """``hook`` as it is, or hidden from torch.compile while ``hooks_outside_compile``."""
    return torch.compiler.disable(hook) if _eager_hooks else hook


_WALKS = ("parameters", "named_parameters", "_named_members", "named_modules", "modules")


def _parameters(model: nn.Module, modules: Sequence[nn.Module]) -> list[nn.Parameter]:
    """``model.parameters()``, each once, from the modules already listed (the same
    order); ``model.parameters()`` itself where the model's class walks its own way."""
    if any(getattr(type(model), n) is not getattr(nn.Module, n) for n in _WALKS):
        return list({id(p): p for p in model.parameters()}.values())
    seen: set[int] = set()
    out: list[nn.Parameter] = []
    for m in modules:
        for p in m._parameters.values():
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


def _copy_back(originals: list[torch.Tensor], copies: list[torch.Tensor]) -> None:
    """``original.copy_(copy)`` for each pair: one ``_foreach_copy_``, which copies as
    ``copy_`` does (another dtype or device, a broadcast), else one by one where it
    refuses them (a sparse or quantized tensor, a torch without it). Copying a pair
    again is harmless, so a refusal part way through only costs time."""
    if not originals:
        return
    foreach = getattr(torch, "_foreach_copy_", None)
    if foreach is not None:
        try:
            foreach(originals, copies)
            return
        except (RuntimeError, TypeError, NotImplementedError):
            pass
    for o, c in zip(originals, copies, strict=True):
        o.copy_(c)


def _on_meta(model: nn.Module, args: Any, kwargs: Any) -> bool:
    for t in iter_tensors((args, kwargs)):
        return bool(t.is_meta)
    return any(p.is_meta for p in model.parameters())


class HookSession:
    """Context manager: attach hooks, run forward (and backward), restore the model."""

    def __init__(
        self,
        model: nn.Module,
        probes: Sequence[Probe] = (),
        *,
        mode: Mode = Mode.EVAL,
        global_hooks: bool = False,
        backward: bool = False,
        always_call: bool = False,
        only: Collection[nn.Module] | None = None,
        call: Callable[..., Any] | None = None,
        grad: bool = False,
    ) -> None:
        self.model = model
        # what forward calls: a wrapper around model (DistributedDataParallel), else model
        self.call = model if call is None else call
        # per-module hooks on these modules alone (features); None: every module
        self.only = None if only is None else {id(m) for m in only}
        self.probes = list(probes)
        self.mode = mode
        self.global_hooks = global_hooks
        self.always_call = always_call
        kinds: set[HookKind] = set()
        for p in self.probes:
            kinds |= p.kinds
        self.kinds = frozenset(kinds)
        self.backward_needed = backward or any(k.is_backward for k in self.kinds)
        # forward records autograd's graph (cost's saved tensors) even with no backward
        self.grad = grad or self.backward_needed
        # one walk of the tree: every module once, under its first name (module_names)
        named = list(model.named_modules())
        self._modules = [m for _, m in named]
        self.names = {id(m): name for name, m in named}
        self.frames: list[Frame] = []
        self.failure: Frame | None = None
        self.backward_failure: Frame | None = None
        self.backward_done = False  # a ``backward`` call returned (every grad arrived)
        self.passes = 0  # forwards run: each after the first starts from the state as found
        self._stack: list[Frame] = []
        self._calls: dict[int, int] = {}
        self._bw_pending: dict[int, list[Frame]] = {}
        self._bw_open: dict[int, list[Frame]] = {}
        self._bw_order: list[Frame] = []
        # stand-ins used on meta, by kind (hookcli.metavalues.ASSUMPTIONS)
        self.meta_assumed: Counter[str] = Counter()
        self.scripted: set[int] = set()  # TorchScript submodules: run without hooks
        self._handles: list[RemovableHandle] = []
        self._restore: list[Callable[[], None]] = []
        self._fwd_pre = [
            p for p in self.probes if type(p).on_forward_pre is not Probe.on_forward_pre
        ]
        self._fwd = [p for p in self.probes if type(p).on_forward is not Probe.on_forward]
        self._bw_pre = [
            p for p in self.probes if type(p).on_backward_pre is not Probe.on_backward_pre
        ]
        self._bw = [p for p in self.probes if type(p).on_backward is not Probe.on_backward]

    # -- state -----------------------------------------------------------------
    def keep(self, handle: RemovableHandle) -> RemovableHandle:
        """Own a handle: it is removed when the session ends, whatever happens."""
        self._handles.append(handle)
        return handle

    def on_exit(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` when the session ends (restorers run last-in first-out)."""
        self._restore.append(fn)

    def _save_state(self) -> None:
        model = self.model
        modules = self._modules
        training = [(m, m.training) for m in modules]

        def restore_training() -> None:
            for m, flag in training:
                if m.training is not flag:  # per module: train() would also reset the children
                    m.training = flag

        self.on_exit(restore_training)

        saved_buffers: list[tuple[nn.Module, str, torch.Tensor, torch.Tensor]] = []
        with torch.no_grad():
            for m in modules:
                for name, buf in m._buffers.items():
                    if buf is not None:  # (under no_grad: a copy outside any graph)
                        saved_buffers.append((m, name, buf, buf.clone()))
        # keys(): a TorchScript module's buffer dict cannot be iterated directly; modules
        # with no buffer (most) need no set: any buffer they hold after was added
        buffer_names = {id(m): set(m._buffers.keys()) for m in modules if m._buffers}

        def restore_buffers() -> None:
            with torch.no_grad():
                for m, name, original, _ in saved_buffers:
                    m._buffers[name] = original
                _copy_back(
                    [original for _, _, original, _ in saved_buffers],
                    [copy for _, _, _, copy in saved_buffers],
                )
                for m in modules:
                    if m._buffers:  # (one without buffers has none to drop)
                        for extra in set(m._buffers.keys()) - buffer_names.get(id(m), set()):
                            del m._buffers[extra]

        self.on_exit(restore_buffers)
        # plain tensor attributes (a KV cache that forward writes): as found on each pass
        self._attributes = TensorAttributes(modules)
        self.on_exit(self._attributes.reset)

        params = _parameters(model, modules)
        grads = [(p, p.grad) for p in params]

        def restore_grads() -> None:
            for p, g in grads:
                if p.grad is not g:  # (reading is cheap, torch's setter checks each one)
                    p.grad = g

        self.on_exit(restore_grads)
        if self.backward_needed:
            for p in params:
                p.grad = None  # accumulate from zero, so the figures are this run's alone
            if not self._alias_hooked_tensors():
                self._disable_inplace()

    def reset_attributes(self) -> None:
        """The model's plain tensor attributes as found (``preserve.TensorAttributes``):
        call before a pass the session does not run itself (profile's timed passes)."""
        self._attributes.reset()

    def _disable_inplace(self) -> None:
        # Full backward hooks wrap module outputs in a view; an in-place op on it
        # (ReLU(inplace=True) after a hooked module) would make autograd raise.
        switched = []
        for m in self.model.modules():
            if isinstance(getattr(m, "inplace", None), bool) and m.inplace:
                setattr(m, "inplace", False)  # noqa: B010
                switched.append(m)

        def restore() -> None:
            for m in switched:
                setattr(m, "inplace", True)  # noqa: B010

        self.on_exit(restore)

    def _alias_hooked_tensors(self) -> bool:
        # torch's BackwardHookFunction (behind full backward hooks) returns its
        # inputs as-is, which autograd turns into views; an in-place op on a hooked
        # module's output (torchvision ResNet's `out += identity`, MobileNet's
        # `result += input`, ReLU(inplace=True)) then raises. Detached aliases share
        # storage and version counter and give the same gradients, so such models run
        # as written while hooked. False when this torch has no such class to patch
        # (then the in-place flags are switched off instead).
        from torch.nn.modules import _functions

        fn_cls = getattr(_functions, "BackwardHookFunction", None)
        original = None if fn_cls is None else fn_cls.__dict__.get("forward")
        if fn_cls is None or not isinstance(original, staticmethod):
            return False
        fn_cls.forward = staticmethod(_aliasing_hook_forward)

        def restore() -> None:
            fn_cls.forward = original

        self.on_exit(restore)
        return True

    def __enter__(self) -> HookSession:
        self._check_scripted()
        if self.backward_needed:
            from hookcli.failure import refuse_grad_off_root

            refuse_grad_off_root(self.model)  # before any work: no grad can come out
        try:
            self._save_state()
            self._set_mode()
            self._attach()
            for p in self.probes:
                p.attach(self)
        except BaseException:
            self._close()
            raise
        return self

    def _set_mode(self) -> None:
        """``model.train(mode)``; skipped where it would change nothing: every module
        already in that mode, none with a ``train`` of its own."""
        want = self.mode is Mode.TRAIN
        plain = nn.Module.train
        for m in self._modules:
            if m.training is not want or type(m).train is not plain:
                self.model.train(want)
                return

    def __exit__(self, *exc: object) -> None:
        self._close()

    def _close(self) -> None:
        errors: list[BaseException] = []
        while self._handles:
            self._handles.pop().remove()
        while self._restore:
            try:
                self._restore.pop()()
            except Exception as err:  # keep restoring the rest
                errors.append(err)
        if errors:
            raise errors[0]

    def _check_scripted(self) -> None:
        """TorchScript modules take no Python hooks: refuse a scripted root, skip submodules."""
        from hookcli.scripted import check_scripted

        script = torch.jit.ScriptModule
        if not any(isinstance(m, script) for m in self._modules):
            self.scripted = set()  # check_scripted's answer, without its walk
            return
        self.scripted = check_scripted(
            self.model, self.global_hooks, self.backward_needed, self.only
        )

    # -- hooks -------------------------------------------------------------------
    def _frame_for(self, module: nn.Module) -> Frame:
        mid = id(module)
        name = self.names.get(mid)
        call = self._calls.get(mid, 0)
        self._calls[mid] = call + 1
        if name is None:
            name, depth = f"[{type(module).__name__}]", len(self._stack)
        else:
            depth = depth_of(name)
        frame = Frame(len(self.frames), module, name, depth, call)
        self.frames.append(frame)
        return frame

    def _pre_hook(self, module: nn.Module, args: Any, kwargs: Any = None) -> None:
        frame = self._frame_for(module)
        frame.input_shapes = shapes_of(args, kwargs)
        self._stack.append(frame)
        for p in self._fwd_pre:
            p.on_forward_pre(frame, module, args, kwargs)

    def _pop(self, module: nn.Module) -> Frame | None:
        mid = id(module)
        for i in range(len(self._stack) - 1, -1, -1):
            if self._stack[i].module_id == mid:
                frame = self._stack[i]
                del self._stack[i:]  # frames above it raised and were caught inside forward
                return frame
        return None

    def _fwd_hook(self, module: nn.Module, args: Any, *rest: Any) -> None:
        kwargs, output = rest if len(rest) == 2 else (None, rest[0])
        raising = self.always_call and sys.exc_info()[1] is not None
        frame = self._pop(module)
        if frame is None:
            return
        if raising:
            frame.failed = True
            if self.failure is None:
                self.failure = frame
        else:
            frame.output_shapes = shapes_of(output)
            frame.done = True
            if self.backward_needed and torch.is_grad_enabled():
                self._bw_pending.setdefault(frame.module_id, []).append(frame)
        for p in self._fwd:
            p.on_forward(frame, module, args, kwargs, output)

    def _bw_pre_hook(self, module: nn.Module, grad_output: Any) -> None:
        pending = self._bw_pending.get(id(module))
        if not pending:
            return
        frame = pending.pop()  # backward visits a module's calls in reverse order
        self._bw_open.setdefault(id(module), []).append(frame)
        self._bw_order.append(frame)
        for p in self._bw_pre:
            p.on_backward_pre(frame, module, grad_output)

    def _bw_hook(self, module: nn.Module, grad_input: Any, grad_output: Any) -> None:
        opened = self._bw_open.get(id(module))
        if not opened:
            return
        frame = opened.pop()
        for p in self._bw:
            p.on_backward(frame, module, grad_input, grad_output)

    def _attach(self) -> None:
        keep = self.keep
        if _eager_hooks:  # run as they are where torch.compile meets them, never traced
            for name in ("_pre_hook", "_fwd_hook", "_bw_pre_hook", "_bw_hook"):
                setattr(self, name, torch.compiler.disable(getattr(self, name)))
        if self.global_hooks:
            keep(module_mod.register_module_forward_pre_hook(self._pre_hook))
            fwd = keep(
                module_mod.register_module_forward_hook(
                    self._fwd_hook, with_kwargs=True, always_call=self.always_call
                )
            )

            # torch's handle forgets this dict on remove(); leave no trace of the hook
            def forget_with_kwargs() -> None:
                module_mod._global_forward_hooks_with_kwargs.pop(fwd.id, None)

            self.on_exit(forget_with_kwargs)
            if self.backward_needed:
                keep(module_mod.register_module_full_backward_pre_hook(self._bw_pre_hook))
                keep(module_mod.register_module_full_backward_hook(self._bw_hook))
            return
        # register_*_hook raises on a ScriptModule (check_scripted said so): skip them
        walk = (  # the walk __init__ made, unless the class walks its own way
            self._modules
            if type(self.model).modules is nn.Module.modules
            else list(self.model.modules())
        )
        modules = [
            m
            for m in walk
            if (self.only is None or id(m) in self.only) and id(m) not in self.scripted
        ]
        self._attach_forward(modules)
        if self.backward_needed:
            for m in modules:
                keep(m.register_full_backward_pre_hook(self._bw_pre_hook))
                keep(m.register_full_backward_hook(self._bw_hook))

    def _attach_forward(self, modules: list[nn.Module]) -> None:
        """Per-module forward-pre and forward hooks (with kwargs) on every module.

        What ``register_forward_pre_hook``/``register_forward_hook`` do, without a
        handle object per module: the entries go straight into each module's hook
        dicts under one reserved handle id and are taken out on exit. On a model of
        10,000 modules this saves ~20,000 handles (most of the attach time). A torch
        without these dicts gets the public calls instead.
        """
        names: tuple[str, ...] = (
            "_forward_pre_hooks",
            "_forward_pre_hooks_with_kwargs",
            "_forward_hooks",
            "_forward_hooks_with_kwargs",
            "_forward_hooks_always_called",
        )
        if not all(isinstance(getattr(m, n, None), dict) for m in modules[:1] for n in names):
            for m in modules:
                self.keep(m.register_forward_pre_hook(self._pre_hook, with_kwargs=True))
                self.keep(
                    m.register_forward_hook(
                        self._fwd_hook, with_kwargs=True, always_call=self.always_call
                    )
                )
            return
        hid = RemovableHandle.next_id  # reserved: no other handle gets this id
        RemovableHandle.next_id += 1
        attached: list[nn.Module] = []

        always = self.always_call

        def detach() -> None:
            for m in attached:
                m._forward_pre_hooks.pop(hid, None)
                m._forward_pre_hooks_with_kwargs.pop(hid, None)
                m._forward_hooks.pop(hid, None)
                m._forward_hooks_with_kwargs.pop(hid, None)
                if always:
                    m._forward_hooks_always_called.pop(hid, None)

        self.on_exit(detach)
        for m in modules:
            m._forward_pre_hooks[hid] = self._pre_hook
            m._forward_pre_hooks_with_kwargs[hid] = True
            m._forward_hooks[hid] = self._fwd_hook
            m._forward_hooks_with_kwargs[hid] = True
            if self.always_call:
                m._forward_hooks_always_called[hid] = True
            attached.append(m)

    # -- running -------------------------------------------------------------------
    def _grad_context(self) -> contextlib.AbstractContextManager[Any]:
        if self.grad:
            return torch.enable_grad()
        if any(p.needs_versions for p in self.probes):
            return torch.no_grad()
        return torch.inference_mode()

    def forward(self, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None) -> Any:
        """Run the model once; a failure raises RunError naming the module."""
        meta = MetaValues() if _on_meta(self.model, args, kwargs) else None
        if self.passes:
            self.reset_attributes()
        self.passes += 1
        try:
            with self._grad_context(), meta or contextlib.nullcontext(), autocast():
                return self.call(*args, **(kwargs or {}))
        except KeyboardInterrupt:
            raise
        except (Exception, SystemExit) as err:  # sys.exit in a model is a failure, not exit 0
            if is_oom(err):
                oom_at = self.failure or (self._stack[-1] if self._stack else None)
                at = ""
                if oom_at is not None:
                    oom_at.failed = True
                    self.failure = oom_at
                    at = (
                        f" in {oom_at.name or '(root)'} ({oom_at.type}) with input shapes "
                        f"{_fmt_shapes(oom_at.input_shapes)}"
                    )
                raise ResourceError(
                    f"out of memory during forward{at}: {first_line(oom_cause(err))}"
                ) from err
            reason = _reason(err)  # the model's exception first, then hookcli's reading
            where = self.failure or (self._stack[-1] if self._stack else None)
            reason += _raised_where(err, "forward", where)
            reading = meta.reading(err) if meta is not None else None
            if reading is not None:
                reason = f"{reason} (on meta: {reading}; run with --device cpu)"
            if where is not None:
                where.failed = True
                self.failure = where
                label = where.name or "(root)"
                msg = (
                    f"forward failed in {label} ({where.type}) with input shapes "
                    f"{_fmt_shapes(where.input_shapes)}: {reason}"
                )
                raise RunError(msg, module=where.name) from err
            raise RunError(f"forward failed: {reason}") from err
        finally:
            if meta is not None:
                self.meta_assumed.update(meta.assumed)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward from a scalar loss; a failure raises RunError naming the module."""
        try:
            with warnings.catch_warnings():
                # torch warns when a hooked module's inputs need no grad (the first layer)
                warnings.filterwarnings("ignore", message="Full backward hook is firing")
                loss.backward()
            self.backward_done = True
        except KeyboardInterrupt:
            raise
        except (Exception, SystemExit) as err:
            open_frames = [f for stack in self._bw_open.values() for f in stack]
            where = max(open_frames, key=lambda f: self._bw_order.index(f), default=None)
            if is_oom(err):
                at = f" in {where.name or '(root)'} ({where.type})" if where is not None else ""
                raise ResourceError(
                    f"out of memory during backward{at}: {first_line(oom_cause(err))}"
                ) from err
            state = _carried_state(err, self.model)
            reason = state or _reason(err) + _raised_where(err, "backward", where)
            if where is not None:
                self.backward_failure = where
                label = where.name or "(root)"
                msg = f"backward failed in {label} ({where.type}): {reason}"
                raise RunError(msg, module=where.name) from err
            raise RunError(f"backward failed: {reason}") from err

    def finish(self) -> None:
        """Let every probe gather its results (call before leaving the ``with``)."""
        for p in self.probes:
            p.finish(self)

    @property
    def records(self) -> tuple[CallRecord, ...]:
        """Every call, in the order calls began."""
        return tuple(
            CallRecord(
                index=f.index,
                name=f.name,
                type=f.type,
                depth=f.depth,
                call=f.call,
                module_id=f.module_id,
                input_shapes=f.input_shapes,
                output_shapes=f.output_shapes,
                done=f.done,
                failed=f.failed,
            )
            for f in self.frames
        )
