"""The probes of compare's passes: record a side's calls, lend A's tensors to B in step
(``Handoff``), and feed B A's inputs and outputs (local mode)."""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from collections.abc import Callable, Container, Mapping
from typing import Any

import torch
from torch import nn

from hookcli.session import Frame, HookSession, Probe, disable_compile
from hookcli.structures import _rebuildable, iter_tensors, rebuild


def _by_position(grads: Any) -> list[torch.Tensor | None]:
    """A backward hook's grads copied by position (None where no grad reached)."""
    return [g.detach().clone() if isinstance(g, torch.Tensor) else None for g in grads]


class Recorder(Probe):
    """Keeps a copy of the output tensors (and, when asked, the inputs) of the calls
    ``keep`` names (None: every call), and the order the calls finished in."""

    def __init__(
        self,
        inputs: bool = False,
        keep: set[int] | None = None,
        input_refs: bool = False,
        outputs: bool = True,
        grad_outputs: bool = False,
    ) -> None:
        self.keep_grad_outputs = grad_outputs  # A's, for the local mode's backward
        self.grad_outputs: dict[int, list[torch.Tensor | None]] = {}
        self.grad_inputs_pos: dict[int, list[torch.Tensor | None]] = {}
        self.keep_outputs = outputs  # False: grad_inputs alone (B's, measured as it runs)
        self.keep_inputs = inputs or input_refs
        self.keep = keep
        # input_refs: the inputs themselves, no copy, with their version counters (the
        # run goes under no_grad, where tensors have them): read only while unchanged
        self.input_refs = input_refs
        self.needs_versions = input_refs
        self.inputs: dict[int, list[torch.Tensor]] = {}
        self.versions: dict[int, list[int]] = {}
        # copied outputs by tensor: a later call's input that is an earlier call's output,
        # unchanged since (same object, same version), shares its copy
        self._copied: dict[int, tuple[Any, int, torch.Tensor]] = {}
        if inputs and not input_refs:
            self.needs_versions = True
        self.outputs: dict[int, list[torch.Tensor]] = {}
        self.finished: list[int] = []
        self.backward_order: list[int] = []

    def on_forward_pre(self, frame: Frame, module: nn.Module, args: Any, kwargs: Any) -> None:
        if self.keep_inputs and (self.keep is None or frame.index in self.keep):
            if self.input_refs:
                refs = [t.detach() for obj in (args, kwargs) for t in iter_tensors(obj)]
                self.inputs[frame.index] = refs
                self.versions[frame.index] = [t._version for t in refs]
            else:
                self.inputs[frame.index] = [
                    self._copy(t) for obj in (args, kwargs) for t in iter_tensors(obj)
                ]

    def on_forward(
        self, frame: Frame, module: nn.Module, args: Any, kwargs: Any, output: Any
    ) -> None:
        self.finished.append(frame.index)
        if self.keep_outputs and (self.keep is None or frame.index in self.keep):
            self.outputs[frame.index] = [self._copy(t, True) for t in iter_tensors(output)]

    def _copy(self, t: torch.Tensor, remember: bool = False) -> torch.Tensor:
        """A copy of ``t``: the one already made where ``t`` is unchanged since."""
        if not self.needs_versions or t.is_inference():
            return t.detach().clone()
        seen = self._copied.get(id(t))
        if seen is not None and seen[0]() is t and seen[1] == t._version:
            return seen[2]
        copy = t.detach().clone()
        if remember:
            with contextlib.suppress(TypeError):  # a tensor subclass without weak references
                self._copied[id(t)] = (weakref.ref(t), t._version, copy)
        return copy

    def on_backward(
        self, frame: Frame, module: nn.Module, grad_input: Any, grad_output: Any
    ) -> None:
        self.backward_order.append(frame.index)
        if self.keep is None or frame.index in self.keep:
            if self.keep_grad_outputs:
                self.grad_outputs[frame.index] = _by_position(grad_output)
            # by position, None where no grad reached (a grad on one side only diverges)
            self.grad_inputs_pos[frame.index] = _by_position(grad_input)

    def unchanged_inputs(self, index: int) -> list[torch.Tensor] | None:
        """A call's inputs (kept by reference) if nothing changed them in place since."""
        refs = self.inputs.get(index)
        if refs is None:
            return None
        if self.input_refs and [t._version for t in refs] != self.versions.get(index):
            return None
        return refs


class Substitute(Probe):
    """The local mode: each aligned call of B runs its own code on A's values. A forward
    pre-hook returns A's recorded input for the call, and a forward hook returns A's
    recorded output in place of B's (both cast to the dtype and device of B's own), so
    every module starts from A's input and its parent goes on from A's output: what
    differs is what the module's own code adds. The inputs a call's code hands to its
    fed children (B's own, before they are replaced) are measured against A's there
    (``handed``: the enclosing call's key -> figures), since code between two children
    shows in nothing else. Runs after the session's hooks, which see B's own values. A
    call whose inputs (or outputs) differ from A's in number or shape keeps its own
    (``kept`` lists it).

    With ``grad_outputs`` (B's key -> A's grad_output for the call, by position) the pass
    runs with grad and each fed call's backward is measured as it returns: its top-level
    positional inputs that require grad in B are fed as leaves (A's values), and
    ``torch.autograd.grad`` of B's own output, from A's grad_output, gives its grad_input
    (against ``grad_inputs``: A's for the call, as the full backward hook gives them) and
    its own parameters' grads (summed over its calls in ``param_grads``); the call's graph
    is freed at once. A call inside which a fed child ran has none (``cut``): the child's
    backward is not the call's own, and the graph stops at the child's fed values."""

    def __init__(
        self,
        sources: Mapping[tuple[str, int], list[torch.Tensor]],
        outputs: Mapping[tuple[str, int], list[torch.Tensor]] | None = None,
        rtol: float | None = None,
        atol: float | None = None,
        names: set[str] | None = None,
        grad_outputs: Mapping[tuple[str, int], list[torch.Tensor | None]] | None = None,
        grad_inputs: Mapping[tuple[str, int], list[torch.Tensor | None]] | None = None,
        shared: Container[int] = (),
        copy: bool = False,
        writes: Container[str] | None = None,
    ) -> None:
        self.shared = shared  # ids of B's parameters two modules hold: no local grads
        # copy: ``sources`` and ``outputs`` lend A's own tensors (``Lent``): each is copied
        # here as it is fed, and given back
        self.copy = copy
        # what B was handed: id of the tensor B got -> (weak B's, its version, weak A's it
        # was copied from, A's version then); a tensor B passes on unchanged to another fed
        # call whose input is that same tensor of A's, unchanged too, is A's value already
        self._mirror: dict[int, tuple[Any, int, Any, int]] = {}
        # writes (with ``copy``): the modules of B seen changing an input in place (the
        # propagated pass's ``Measure``); a call of any other whose inputs are all A's
        # values already (``_known``) keeps them, uncopied, and must leave them unchanged
        # (checked as it returns, else ``Unfed``): the same values as a copy, read alike
        self.writes = writes
        self._passed: dict[tuple[str, int], list[tuple[torch.Tensor, int]]] = {}
        self.grad_outputs = grad_outputs
        self.ref_grad_inputs = {} if grad_inputs is None else grad_inputs
        self.grad_diffs: dict[tuple[str, int], Any] = {}  # B's key -> CallDiff of grad_input
        # B's module name -> {parameter's local name: the sum over its calls}
        self.param_grads: dict[str, dict[str, torch.Tensor]] = {}
        self.grad_calls: dict[str, int] = {}  # B's module name -> calls measured
        self.grad_missed: dict[str, int] = {}  # B's module name -> fed calls not measured
        self._leaves: dict[tuple[str, int], list[torch.Tensor]] = {}
        self._cut: set[tuple[str, int]] = set()
        self._fed_grad: set[tuple[str, int]] = set()
        self.names = names  # the modules to hook (None: those sources and outputs name)
        self.sources = sources  # (B name, B call) -> A's input tensors
        self.replace = {} if outputs is None else outputs  # (B name, B call) -> A's outputs
        self.rtol, self.atol = rtol, atol
        self.calls: dict[int, int] = {}
        self.kept: list[tuple[str, int]] = []
        self.fed: int = 0
        # the enclosing call's key -> [(the child's key, figures of what it was handed)]
        self.handed: dict[tuple[str, int], list[Any]] = {}
        self._stack: list[tuple[int, tuple[str, int]]] = []

    def attach(self, session: HookSession) -> None:
        names = self.names
        if names is None:
            names = {n for n, _ in self.sources} | {n for n, _ in self.replace}
        for module in session.model.modules():
            name = session.names.get(id(module))
            if name in names:
                pre, post = disable_compile(self._pre(name)), disable_compile(self._post(name))
                session.keep(module.register_forward_pre_hook(pre, with_kwargs=True))
                session.keep(module.register_forward_hook(post))

    def _pre(self, name: str) -> Any:
        def hook(module: nn.Module, args: Any, kwargs: Any) -> Any:
            call = self.calls.get(id(module), 0)
            self.calls[id(module)] = call + 1
            key = (name, call)
            outer = self._stack[-1][1] if self._stack else None
            self._stack.append((id(module), key))
            source = self.sources.get(key)
            if source is None:
                return None
            own = list(iter_tensors(args)) + list(iter_tensors(kwargs))
            if (
                self.copy
                and self.writes is not None
                and name not in self.writes
                and len(own) == len(source)
                and self._known(own, source)
            ):
                self._passed[key] = [(o, o._version) for o in own]
                _release(self.sources, key)
                self.fed += 1
                return None
            fed = self._fed(own, source)
            if fed is not None and outer is not None:
                self._hand(outer, key, source, own, fed)
            _release(self.sources, key)
            if fed is None:
                self.kept.append(key)
                return None
            feed = iter(fed)

            def leaf(v: Any) -> Any:
                return next(feed) if isinstance(v, torch.Tensor) else v

            new_args = rebuild(args, leaf, _rebuildable)
            new_kwargs = rebuild(kwargs, leaf, _rebuildable)
            if next(feed, None) is not None:  # a tensor inside an object rebuild keeps
                self.kept.append(key)
                return None
            self.fed += 1
            if self.grad_outputs is not None:
                self._cut.update(k for _, k in self._stack[:-1])  # enclosing calls
                new_args = self._as_leaves(key, new_args)
            return new_args, new_kwargs

        return hook

    def _fed(self, own: list[torch.Tensor], ref: list[torch.Tensor]) -> list[torch.Tensor] | None:
        """A's tensors ``ref`` as B gets them: cast like B's ``own`` (None: their number or
        shapes differ), copied where A's own are lent (``copy``), each remembered."""
        fed = _cast_like(own, ref)
        if fed is None:
            return None
        if self.copy:  # (a cast made a tensor of B's already)
            fed = [f.clone() if f is r else f for f, r in zip(fed, ref, strict=True)]
        for f, r in zip(fed, ref, strict=True):
            if not (f.is_inference() or r.is_inference()):
                with contextlib.suppress(TypeError):  # a subclass without weak references
                    self._mirror[id(f)] = (weakref.ref(f), f._version, weakref.ref(r), r._version)
        return fed

    def _known(self, own: list[torch.Tensor], ref: list[torch.Tensor]) -> bool:
        """Whether each of B's tensors ``own`` is one this probe handed B as the value of
        the very tensor of A's in ``ref`` at its place, neither changed since (version
        counters: the local pass runs under no_grad)."""
        for o, r in zip(own, ref, strict=True):
            m = self._mirror.get(id(o))
            if m is None or m[0]() is not o or m[2]() is not r:
                return False
            if o._version != m[1] or r._version != m[3]:
                return False
        return True

    def _as_leaves(self, key: tuple[str, int], new_args: Any) -> Any:
        """The fed top-level positional tensors that have a grad_input in A's backward
        (as the full backward hook gives it): leaves (kept for the call's backward), each
        handed on as a copy (an in-place op may change it)."""
        self._fed_grad.add(key)
        ref = self.ref_grad_inputs.get(key)
        if ref is None or not isinstance(new_args, tuple) or len(ref) != len(new_args):
            return new_args
        leaves: list[torch.Tensor] = []
        out = list(new_args)
        for pos, (fed, g) in enumerate(zip(new_args, ref, strict=True)):
            if g is None:
                continue
            if not isinstance(fed, torch.Tensor) or not fed.is_floating_point():
                return new_args  # (not measured: A's grad where B has no float tensor)
            leaf = fed.detach().requires_grad_(True)
            leaves.append(leaf)
            out[pos] = leaf.clone()
        self._leaves[key] = leaves
        return tuple(out)

    def _backward(self, name: str, key: tuple[str, int], module: nn.Module, output: Any) -> None:
        """The call's own backward from A's grad_output at A's input (``grad_diffs``,
        ``param_grads``); the call's graph freed."""
        from hookcli.compare.metrics import call_diff

        assert self.grad_outputs is not None
        leaves = self._leaves.pop(key, None)
        gout = self.grad_outputs.get(key)
        if leaves is None or gout is None or key in self._cut:
            self.grad_missed[name] = self.grad_missed.get(name, 0) + 1
            return
        own = list(iter_tensors(output))
        pairs = [
            (o, g.to(device=o.device, dtype=o.dtype))
            for o, g in zip(own, gout, strict=False)
            if g is not None and o.requires_grad and o.is_floating_point()
        ]
        params = [
            (n, p)
            for n, p in module.named_parameters(recurse=False)
            if p.requires_grad and id(p) not in self.shared
        ]
        if len(own) != len(gout) or not pairs:
            self.grad_missed[name] = self.grad_missed.get(name, 0) + 1
            return
        targets = [*leaves, *(p for _, p in params)]
        try:  # (nothing to take grads of, a tied parameter's module: none; older torch
            # refuses an empty list)
            grads = (
                torch.autograd.grad(
                    [o for o, _ in pairs],
                    targets,
                    grad_outputs=[g for _, g in pairs],
                    allow_unused=True,
                )
                if targets
                else ()
            )
        except RuntimeError:  # a graph autograd cannot go back through (a compiled call)
            self.grad_missed[name] = self.grad_missed.get(name, 0) + 1
            return
        del pairs, own
        gin = [  # an input B's backward did not reach: a zero grad
            torch.zeros_like(leaf) if g is None else g
            for leaf, g in zip(leaves, grads[: len(leaves)], strict=True)
        ]
        ref = [g for g in self.ref_grad_inputs.get(key) or () if g is not None]
        self.grad_diffs[key] = call_diff(ref, gin, self.rtol, self.atol)
        sums = self.param_grads.setdefault(name, {})
        for (pname, _), g in zip(params, grads[len(leaves) :], strict=True):
            if g is not None:
                sums[pname] = g if pname not in sums else sums[pname] + g
        self.grad_calls[name] = self.grad_calls.get(name, 0) + 1

    def _hand(
        self,
        outer: tuple[str, int],
        child: tuple[str, int],
        source: list[torch.Tensor],
        own: list[Any],
        fed: list[torch.Tensor],
    ) -> None:
        """B's own input to a fed call against A's: what the enclosing call's code made."""
        from hookcli.compare.metrics import call_diff

        if self._known(own, source) or all(  # A's value passed on untouched (cast to B's
            o is c or torch.equal(o, c)  # dtype, as fed): nothing made
            for o, c in zip(own, fed, strict=True)
        ):
            return
        self.handed.setdefault(outer, []).append(
            (child, call_diff(source, [o.detach() for o in own], self.rtol, self.atol))
        )

    def _post(self, name: str) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> Any:
            while self._stack and self._stack[-1][0] != id(module):
                # calls that raised and were caught inside forward
                if self._passed.pop(self._stack.pop()[1], None):
                    raise Unfed
            if not self._stack:
                return None
            _, key = self._stack.pop()
            passed = self._passed.pop(key, None)
            if passed and any(t._version != v for t, v in passed):
                raise Unfed  # it changed A's values it kept: a copy would have kept them
            if self.grad_outputs is not None and key in self._fed_grad:
                self._backward(name, key, module, output)
            ref = self.replace.get(key)
            fed = None if ref is None else self._fed(list(iter_tensors(output)), ref)
            if ref is not None:
                _release(self.replace, key)
            if fed is None:
                if passed and _shares(output, passed):
                    raise Unfed  # its own output (kept) is a view of the values it kept
                return None
            feed = iter(fed)
            try:
                new = rebuild(output, lambda v: next(feed) if isinstance(v, torch.Tensor) else v,
                              _rebuildable)  # fmt: skip
            except Exception:  # an output class that cannot be built again (a ModelOutput)
                new = None
            if new is None or next(feed, None) is not None:
                self.kept.append(key)
                if passed and _shares(output, passed):
                    raise Unfed
                return None
            if self.grad_outputs is not None:  # the enclosing calls' graphs stop here
                self._cut.update(k for _, k in self._stack)
            return new

        return hook


class Unfed(BaseException):
    """Raised in the local pass when a call that kept A's values uncopied (``Substitute``'s
    ``writes``) changed them or returned a view of them: the pass is run again copying
    every fed value (a BaseException: the model's code and B's session let it through)."""


def _shares(output: Any, passed: list[tuple[torch.Tensor, int]]) -> bool:
    """Whether a tensor of ``output`` shares memory with one of ``passed`` (or may: a
    tensor without a storage of its own, such as a sparse one)."""
    try:
        ptrs = {t.untyped_storage().data_ptr() for t, _ in passed}
        return any(t.untyped_storage().data_ptr() in ptrs for t in iter_tensors(output))
    except (RuntimeError, NotImplementedError):
        return True


def _cast_like(own: list[torch.Tensor], ref: list[torch.Tensor]) -> list[torch.Tensor] | None:
    """A's tensors cast to the dtype and device of B's own (None: their number or shapes
    differ)."""
    if len(own) != len(ref) or any(
        tuple(o.shape) != tuple(s.shape) for o, s in zip(own, ref, strict=True)
    ):
        return None
    return [
        s.to(device=o.device, dtype=o.dtype)
        if o.is_floating_point() and s.is_floating_point()
        else s.to(device=o.device)
        for o, s in zip(own, ref, strict=True)
    ]


class Measure(Probe):
    """B's side of a pass, measured as it runs: each call whose partner in A is known
    (``partner``: B's (name, call) -> A's call index) has its outputs compared with A's
    copies the moment it returns, and nothing of B's is kept; with ``keep_rest`` a call
    without a known partner keeps a copy of its outputs (measured once the alignment is
    known) and its inputs by reference (read later only if no in-place op changed them).
    With ``ref_inputs``, each call with a partner has its inputs tested against A's
    (``in_diverged``: did the call start from values that already differ), until the
    first output that diverged: the first divergence's walk up looks no later."""

    def __init__(
        self,
        partner: Mapping[tuple[str, int], Any],
        ref_outputs: Mapping[int, list[torch.Tensor]],
        rtol: float | None,
        atol: float | None,
        *,
        ref_inputs: Mapping[int, list[torch.Tensor]] | None = None,
        keep_rest: bool = False,
        track_writes: bool = False,
    ) -> None:
        self.partner = partner
        self.ref_outputs = ref_outputs
        # the modules a call of which changed one of its inputs in place (``Substitute``'s
        # ``writes``), seen by the version counters around each call
        self.writes: set[str] | None = set() if track_writes else None
        self._versions: dict[int, list[tuple[torch.Tensor, int]]] = {}
        self.ref_inputs = ref_inputs
        self.rtol, self.atol = rtol, atol
        self.keep_rest = keep_rest
        self.diffs: dict[int, tuple[Any, Any]] = {}  # B's call -> (A's call or key, CallDiff)
        self.outputs: dict[int, list[torch.Tensor]] = {}  # copies, calls with no partner
        self.in_diverged: dict[int, tuple[Any, bool]] = {}  # B's call -> (A's call, differs)
        self.input_refs: dict[int, tuple[list[torch.Tensor], list[int]]] = {}
        self.seen_divergence = False
        # a tensor measured already (a container's output that is its last child's, the
        # same objects, unchanged): (position, A's, B's) -> (weak A, A's version, weak B,
        # B's version, its figures). Version counters: B's pass runs under no_grad
        self._done: dict[tuple[int, int, int], tuple[Any, int, Any, int, Any]] = {}
        self.needs_versions = True

    def on_forward_pre(self, frame: Frame, module: nn.Module, args: Any, kwargs: Any) -> None:
        if self.writes is not None:
            self._versions[frame.index] = [
                (t, t._version)
                for obj in (args, kwargs)
                for t in iter_tensors(obj)
                if not t.is_inference()
            ]
        i = self.partner.get((frame.name, frame.call))
        if i is None and self.keep_rest:
            refs = [t.detach() for obj in (args, kwargs) for t in iter_tensors(obj)]
            if not any(t.is_inference() for t in refs):
                self.input_refs[frame.index] = (refs, [t._version for t in refs])
        if self.ref_inputs is None or self.seen_divergence or i is None:
            return
        ref = self.ref_inputs.get(i)
        if ref is not None:
            own = [t for obj in (args, kwargs) for t in iter_tensors(obj)]
            self.in_diverged[frame.index] = (i, diverged(ref, own, self.rtol, self.atol))
            _release(self.ref_inputs, i)

    def unchanged_inputs(self, index: int) -> list[torch.Tensor] | None:
        """A call's inputs kept by reference, if nothing changed them in place since."""
        kept = self.input_refs.get(index)
        if kept is None or [t._version for t in kept[0]] != kept[1]:
            return None
        return kept[0]

    def on_forward(
        self, frame: Frame, module: nn.Module, args: Any, kwargs: Any, output: Any
    ) -> None:
        from hookcli.compare.metrics import CallDiff, tensor_diff

        if self.writes is not None:
            held = self._versions.pop(frame.index, ())
            if any(t._version != v for t, v in held):
                self.writes.add(frame.name)
        i = self.partner.get((frame.name, frame.call))
        ref = None if i is None else self.ref_outputs.get(i)
        if i is None or ref is None:
            if self.keep_rest:
                self.outputs[frame.index] = [t.detach().clone() for t in iter_tensors(output)]
            return
        own = list(iter_tensors(output))
        tensors = []
        for pos in range(max(len(ref), len(own))):
            a = ref[pos] if pos < len(ref) else None
            b = own[pos] if pos < len(own) else None
            if a is None or b is None:
                tensors.append(tensor_diff(pos, a, b, self.rtol, self.atol))
                continue
            if a.is_inference() or b.is_inference():  # (no version counter: measured)
                tensors.append(tensor_diff(pos, a, b, self.rtol, self.atol))
                continue
            key = (pos, id(a), id(b))
            seen = self._done.get(key)
            if (
                seen is not None
                and seen[0]() is a
                and seen[1] == a._version
                and seen[2]() is b
                and seen[3] == b._version
            ):
                tensors.append(dataclasses.replace(seen[4], index=pos))
                continue
            d = tensor_diff(pos, a, b, self.rtol, self.atol)
            with contextlib.suppress(TypeError):  # a tensor subclass without weak references
                self._done[key] = (weakref.ref(a), a._version, weakref.ref(b), b._version, d)
            tensors.append(d)
        _release(self.ref_outputs, i)
        diff = CallDiff(tuple(tensors))
        self.diffs[frame.index] = (i, diff)
        if diff.diverged and not self.seen_divergence:
            self.seen_divergence = True
            stop = getattr(self.ref_inputs, "stop", None)
            if stop is not None:  # A's inputs are read up to the first divergence only
                stop()


def _release(refs: Any, key: Any) -> None:
    """A's lent tensors given back (``Lent``); nothing for a plain mapping."""
    release = getattr(refs, "release", None)
    if release is not None:
        release(key)


def diverged(
    ref: list[torch.Tensor], own: list[torch.Tensor], rtol: float | None, atol: float | None
) -> bool:
    """Whether B's tensors differ from A's beyond the tolerance (equal ones: one pass)."""
    from hookcli.compare.metrics import tensor_diff

    n = max(len(ref), len(own))
    for pos in range(n):
        a = ref[pos] if pos < len(ref) else None
        b = own[pos] if pos < len(own) else None
        if (
            a is not None
            and b is not None
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.device == b.device
            and not a.is_meta
            and torch.equal(a, b.detach())
        ):
            continue
        if tensor_diff(pos, a, b, rtol, atol).diverged:
            return True
    return False


Key = tuple[str, tuple[str, int]]  # ("in" | "out", (A's module name, call))


class AFailed(BaseException):
    """Raised in B's run when A's run failed: B stops at once (a BaseException, so that
    B's session does not take it for an error of B's); the caller raises A's error."""


def _run_state() -> tuple[Any, ...]:
    """What one forward may set for the thread and the other must not see: grad mode,
    CPU autocast, the CPU random generator, the warning filters."""
    import warnings

    import torch

    return (
        torch.is_grad_enabled(),
        torch.is_autocast_enabled("cpu"),
        torch.get_autocast_dtype("cpu"),
        torch.get_rng_state(),
        warnings.filters,
        warnings.showwarning,
    )


def _set_run_state(state: tuple[Any, ...]) -> None:
    import warnings

    import torch

    grad, cast, cast_dtype, rng, filters, show = state
    torch._C._set_grad_enabled(grad)
    torch.set_autocast_enabled("cpu", cast)
    torch.set_autocast_dtype("cpu", cast_dtype)
    torch.set_rng_state(rng)
    warnings.filters = filters
    warnings.showwarning = show
    mutated = getattr(warnings, "_filters_mutated", None)  # (the filters' cache)
    if mutated is not None:
        mutated()


class Handoff:
    """A's tensors handed to B's pass as A's run makes them: A runs in a greenlet of its
    own, in step with B, on B's thread (one thread: one pool of intra-op threads, no
    second core, nothing runs while the other side computes). B asks with ``get``: A's
    run resumes until it offers that list (lent, not copied, until B takes it with
    ``take``) or goes past it or ends. A list A offers that B is not waiting for but will
    ask for later (``wanted``) is copied and held until taken. When B's run ends, A's
    runs to its end (``b_finished``); when either fails, the other stops at once. Each
    side keeps its own grad mode, autocast, random generator and warning filters
    (``_run_state``) across the switches, as on a thread of its own."""

    def __init__(self, wanted: Container[Key]) -> None:
        self.wanted = wanted
        self.items: dict[Key, tuple[int, list[torch.Tensor]]] = {}
        self.passed: set[Key] = set()
        self.waiting: Key | None = None
        self.a_done = False
        self.b_done = False
        self.no_inputs = False  # B asks for no more inputs (it saw a divergence)
        self.copied = 0
        self._a: Any = None  # A's greenlet (``start``)
        self._b: Any = None  # the one that started it: B's
        self.a_error: BaseException | None = None  # A's run failed: B stops at once

    def start(self, run_a: Callable[[], None]) -> None:
        """(B's side, before its run) A's run, started at B's first ``get`` from the
        state the thread has now."""
        import greenlet

        first = _run_state()

        def run() -> None:
            _set_run_state(first)
            run_a()

        self._b = greenlet.getcurrent()
        self._a = greenlet.greenlet(run)

    def _switch(self, to: Any, *throw: Any) -> None:
        """To the other side; back here with this side's state as it was."""
        mine = _run_state()
        try:
            to.throw(*throw) if throw else to.switch()
        finally:
            _set_run_state(mine)

    def _here(self, side: Any) -> bool:
        """Whether this is ``side``'s greenlet (a module run on a thread of the model's
        own cannot switch: it is served as if the other side were elsewhere)."""
        import greenlet

        return greenlet.getcurrent() is side

    def _resume_a(self) -> None:
        if self._a is not None and not self._a.dead:
            self._switch(self._a)

    def offer(self, item: Key, index: int, tensors: list[torch.Tensor]) -> None:
        """(A's run) the list ``item``: lent to B if B waits for it, back when B asks
        for another; a copy if B will ask for it later."""
        self.passed.add(item)
        if item not in self.wanted or self.b_done or (item[0] == "in" and self.no_inputs):
            return
        self.items[item] = (index, tensors)
        if self.waiting == item and self._here(self._a):
            self._switch(self._b)  # back here when B waits for another list, or ended
        if item in self.items:  # B went on without it: a copy, held until taken
            self.items[item] = (index, [t.detach().clone() for t in tensors])
            self.copied += 1

    def a_finished(self, error: BaseException | None = None) -> None:
        self.a_done = True
        self.a_error = error

    def b_finished(self, failed: bool = False) -> None:
        """(B's side) B's run ended: A's runs to its end (it offers nothing more), or
        with ``failed``, stops where it is (or never starts)."""
        import greenlet

        self.b_done = True
        if self._a is None or self._a.dead:
            return
        if failed:
            self._switch(self._a, greenlet.GreenletExit)
        else:
            self._resume_a()

    def get(self, item: Key) -> tuple[int, list[torch.Tensor]] | None:
        """(B's run) A's list ``item``: None if A went past it without one."""
        if not self._here(self._b):
            return self.items.get(item)
        while item not in self.items and item not in self.passed and not self.a_done:
            self.waiting = item
            self._resume_a()
        self.waiting = None
        if self.a_error is not None:
            if isinstance(self.a_error, Exception):
                raise AFailed
            raise self.a_error  # Ctrl-C, an exit: as it came
        return self.items.get(item)

    def take(self, item: Key) -> None:
        self.items.pop(item, None)

    def left(self, kind: str) -> dict[int, list[torch.Tensor]]:
        """The lists of that kind B never took (copies by now), by A's call index."""
        return {i: ts for (k, _), (i, ts) in self.items.items() if k == kind}


class Offer(Probe):
    """A's side of a run in step (``Handoff``): each call's inputs and outputs offered;
    with ``keep_rest``, a copy of those of the calls B will not ask for (the alignment
    may pair them later)."""

    def __init__(self, handoff: Handoff, keep_rest: bool) -> None:
        self.handoff = handoff
        self.keep_rest = keep_rest
        self.needs_versions = True  # A's pass under no_grad, as B's (``Measure``)
        self.outputs: dict[int, list[torch.Tensor]] = {}
        self.inputs: dict[int, list[torch.Tensor]] = {}

    def on_forward_pre(self, frame: Frame, module: nn.Module, args: Any, kwargs: Any) -> None:
        item = ("in", (frame.name, frame.call))
        # (the tensors themselves where no graph hangs on them, as outputs below: the
        # local pass knows A's input that is A's earlier output by its identity)
        refs = [
            t.detach() if t.requires_grad else t
            for obj in (args, kwargs)
            for t in iter_tensors(obj)
        ]
        if self.keep_rest and item not in self.handoff.wanted:
            self.inputs[frame.index] = [t.clone() for t in refs]
        self.handoff.offer(item, frame.index, refs)

    def on_forward(
        self, frame: Frame, module: nn.Module, args: Any, kwargs: Any, output: Any
    ) -> None:
        item = ("out", (frame.name, frame.call))
        # (the tensors themselves where no graph hangs on them: B's ``Measure`` knows
        # an output measured already by its identity and version)
        refs = [t.detach() if t.requires_grad else t for t in iter_tensors(output)]
        if self.keep_rest and item not in self.handoff.wanted:
            self.outputs[frame.index] = [t.clone() for t in refs]
        self.handoff.offer(item, frame.index, refs)


class Lent(Mapping[Any, list[torch.Tensor]]):
    """A ``Handoff``'s lists of one kind seen as a mapping for B's probes: ``get(key)``
    waits for A's list (B's key mapped to A's by ``names``, or A's key itself): A's own,
    lent until ``release``, which a probe calls when done with it (a copy B may keep and
    change is the probe's to make: ``Substitute``'s ``copy``; ``keep_lent``: release
    does nothing: another probe takes it later)."""

    def __init__(
        self,
        handoff: Handoff,
        kind: str,
        names: Mapping[tuple[str, int], tuple[str, int]] | None = None,
        keep_lent: bool = False,
    ) -> None:
        self.handoff, self.kind, self.names = handoff, kind, names
        self.keep_lent = keep_lent

    def _item(self, key: Any) -> Key | None:
        akey = key if self.names is None else self.names.get(key)
        return None if akey is None else (self.kind, akey)

    def get(self, key: Any, default: Any = None) -> Any:
        item = self._item(key)
        got = None if item is None else self.handoff.get(item)
        return default if got is None else got[1]

    def stop(self) -> None:
        """B asks for no more lists of this kind: A offers none and drops those offered."""
        h = self.handoff
        h.no_inputs = True
        for item in [k for k in h.items if k[0] == self.kind]:
            del h.items[item]

    def release(self, key: Any) -> None:
        item = self._item(key)
        if item is not None and not self.keep_lent:
            self.handoff.take(item)

    def __getitem__(self, key: Any) -> list[torch.Tensor]:
        got = self.get(key)
        if got is None:
            raise KeyError(key)
        return got

    def __iter__(self) -> Any:
        return iter(())

    def __len__(self) -> int:
        return 0
