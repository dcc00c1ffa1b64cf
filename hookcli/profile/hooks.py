"""The timing hooks: a forward-pre hook starts a call's clock, its forward hook stops it.

Every array is allocated before the first timed pass: stamps for every (pass, call)
slot, an explicit call stack, per-module backward cursors. Per call a hook reads the
clock once and writes one int64 slot; it builds no record object and grows no list
(Python still makes the clock's int, and torch its hook bookkeeping).

The call a forward-pre hook opens is the next one in the counting pass's order
(``CallTree``), checked against the module: a model whose calls differ from pass
to pass (data-dependent control flow) is reported, never mis-timed. Full backward
hooks find their call through per-module cursors: backward visits a module's calls
in reverse order, as ``HookSession`` assumes too.

Modules whose calls PyTorch's full backward hooks cannot time (their tensors are
keyword arguments, or sit inside tuples, dicts or dataclasses: diffusers' down blocks
called with ``hidden_states=...`` returning ``(h, (skip, skip))``; an embedding whose
input is integer) are timed with tensor hooks instead (``survey`` finds them in one
untimed forward): the backward starts when the gradients of all the call's output
tensors have arrived (as PyTorch's module backward pre-hook) and ends when the gradients
of all its input tensors are complete (or, for a module called once whose inputs need
none, of its own parameters). Where neither
can be had, ``why_not`` says why.

Three clocks (``clocks.py``): ``now()`` read in the hook (perf_counter_ns, or a
device synchronize then perf_counter_ns: ``--sync``), or CUDA events recorded in
the hook and read after the pass (the default on cuda).
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Callable
from typing import Any

from torch import nn

from hookcli.profile.figures import CallTree
from hookcli.structures import iter_tensors


def _zeros(n: int) -> array[int]:
    return array("q", bytes(8 * n))


def _is_tensor(x: Any) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


class Diverged(Exception):
    """The model's module calls differ from the counting pass."""


class TimingHooks:
    """Hooks on every module of a ``CallTree``, writing stamps for ``passes`` passes."""

    def __init__(
        self,
        modules: list[nn.Module],
        tree: CallTree,
        passes: int,
        *,
        backward: bool = False,
        now: Callable[[], int] | None = None,
        event: Callable[[], Any] | None = None,
        uncalled: list[nn.Module] | None = None,
    ) -> None:
        assert (now is None) != (event is None), "one clock: now() or events"
        self.modules = modules  # by slot
        # modules the counting pass never called: a call of one is a divergence
        self.uncalled = list(uncalled or ())
        self.tree = tree
        self.passes = passes
        self.backward = backward
        n = tree.n
        self.n = n
        self.starts, self.ends = _zeros(n * passes), _zeros(n * passes)
        self.fwd_tid = _zeros(passes)
        self.bwd_starts, self.bwd_ends = _zeros(n * passes), _zeros(n * passes)
        self.bwd_tid = _zeros(n * passes)
        self.bwd_ok = bytearray(n * passes)
        self._stack = _zeros(n + 1)
        self._top = 0
        self._next = 0
        self._base = 0
        self.diverged: str | None = None
        nslots = len(tree.slot_calls)
        self._bw_left = _zeros(nslots)
        self._bw_top = _zeros(nslots)
        self._bw_stacks = [_zeros(len(c)) for c in tree.slot_calls]
        self._now = now
        self._event = event
        # CUDA events: one start and one end event per call (and per backward call),
        # reused every pass and read after it
        self._ev: tuple[list[Any], ...] | None = None
        if event is not None:
            self._ev = tuple([event() for _ in range(n)] for _ in range(4 if backward else 2))
        self._handles: list[Any] = []
        self._full_flags = [m._is_full_backward_hook for m in modules]
        # backward by tensor hooks (``survey``): the slots, and why a slot has no time
        self.tensor_slots: set[int] = set()
        self._why: dict[int, str] = {}
        self._idle: set[int] = set()  # calls with no output needing a gradient: 0 ms backward
        self._idle_slots: set[int] = set()
        self._thandles: list[Any] = []  # tensor hooks of the pass under way

    # -- passes ------------------------------------------------------------------------
    def begin_pass(self, p: int) -> None:
        """Point the stamps at pass ``p`` (outside the timed region)."""
        self._base = p * self.n
        self._next = 0
        self._top = 0
        for slot, calls in enumerate(self.tree.slot_calls):
            self._bw_left[slot] = len(calls)
            self._bw_top[slot] = 0
        for slot in self.tensor_slots:  # a call's backward seen in this pass, or not
            for i in self.tree.slot_calls[slot]:
                self.bwd_starts[self._base + i] = 0
                self.bwd_ok[self._base + i] = 0
        for i in self._idle:  # nothing of it runs in backward: a span of 0
            k = self._base + i
            self.bwd_starts[k] = self.bwd_ends[k] = 1
            self.bwd_ok[k] = 1
        self.fwd_tid[p] = threading.get_native_id()

    def end_forward(self) -> None:
        """After a pass's forward: every call of the tree opened, in order, and closed."""
        if self.diverged is None and (self._next != self.n or self._top != 0):
            self.diverged = f"{self._next} module calls where the counting pass saw {self.n}"
        if self.diverged is not None:
            raise Diverged(self.diverged)

    def read_events(self, origin: Any, origin_ns: int, backward: bool) -> None:
        """Events: turn the recorded events of this pass into ns stamps (after a sync)."""
        assert self._ev is not None
        base, n = self._base, self.n
        lists = self._ev[2:] if backward else self._ev[:2]
        outs = (self.bwd_starts, self.bwd_ends) if backward else (self.starts, self.ends)
        for events, out in zip(lists, outs, strict=True):
            for i in range(n):
                if backward and (not self.bwd_ok[base + i] or i in self._idle):
                    continue
                out[base + i] = origin_ns + round(origin.elapsed_time(events[i]) * 1e6)

    def _diverge(self, i: int, slot: int) -> None:
        if self.diverged is None:
            got = self.tree.names[self.tree.slot_calls[slot][0]] or "(root)"
            want = self.tree.names[i] if i < self.n else "no further call"
            self.diverged = f"call {i} was {got} where the counting pass saw {want or '(root)'}"

    # -- which modules PyTorch's backward hooks can time --------------------------------------
    def survey(self, run: Callable[[], Any]) -> None:
        """One untimed forward (``run``) that finds, per module, whether PyTorch's full
        backward hooks can time its calls (a tensor needing a gradient among the
        positional inputs and at the top of the output); the others get tensor hooks."""
        seen_in: list[list[tuple[bool, bool]]] = [[] for _ in self.modules]
        seen_out: list[list[tuple[bool, bool]]] = [[] for _ in self.modules]
        handles = []

        def needs(x: Any) -> bool:
            return bool(getattr(x, "requires_grad", False))

        def top(value: Any) -> bool:
            items = value if isinstance(value, tuple) else (value,)
            return any(needs(v) for v in items if _is_tensor(v))

        def nested(value: Any) -> bool:
            return any(t.requires_grad for t in iter_tensors(value))

        for slot, m in enumerate(self.modules):

            def pre(module: nn.Module, args: Any, kwargs: Any, slot: int = slot) -> None:
                seen_in[slot].append((top(args), nested((args, kwargs))))

            def post(module: nn.Module, args: Any, output: Any, slot: int = slot) -> None:
                seen_out[slot].append((top(output), nested(output)))

            handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
            handles.append(m.register_forward_hook(post))
        try:
            run()
        finally:
            for h in handles:
                h.remove()
        for slot, m in enumerate(self.modules):
            ins, outs = seen_in[slot], seen_out[slot]
            if not ins or not outs:
                continue
            if all(a for a, _ in ins) and all(a for a, _ in outs):
                continue  # PyTorch's full backward hooks see it
            self.tensor_slots.add(slot)
            own = any(p.requires_grad for p in m.parameters())
            once = len(self.tree.slot_calls[slot]) == 1
            if not any(b for _, b in outs):
                # nothing of it runs in backward (a mask from token ids): 0 ms, not unknown
                self.tensor_slots.discard(slot)
                self._idle_slots.add(slot)
                self._idle.update(self.tree.slot_calls[slot])
            elif not all(b for _, b in ins) and not (own and once):
                self._why[slot] = (
                    "none of its input tensors needs a gradient and it has no parameters "
                    "of its own timed once, so its backward has no end to time"
                    if own is False or once
                    else "none of its input tensors needs a gradient, and its parameters "
                    "serve several calls, so no call's backward end can be told"
                )

    def why_not(self, slot: int) -> str:
        """Why a module has no backward time."""
        if slot in self._why:
            return self._why[slot]
        if slot in self.tensor_slots:
            return "its backward was not seen in every timed pass"
        return (
            "no input of it needs a gradient (PyTorch's module backward hook fires with "
            "none, so its span says nothing)"
        )

    # -- attaching -------------------------------------------------------------------------
    def attach(self) -> None:
        """Register the hooks (between timed regions; ``detach`` removes them)."""
        for slot, m in enumerate(self.modules):
            pre, post = self._forward_hooks(slot)
            self._handles.append(m.register_forward_pre_hook(pre))
            # prepend: the clock stops before any hook of the model's own runs
            self._handles.append(m.register_forward_hook(post, prepend=True))
            if self.backward and slot in self.tensor_slots:
                self._tensor_backward_hooks(slot, m)
            elif self.backward and slot not in self._idle_slots:
                bpre, bpost = self._backward_hooks(slot)
                self._handles.append(m.register_full_backward_pre_hook(bpre))
                self._handles.append(m.register_full_backward_hook(bpost))
        for m in self.uncalled:
            self._handles.append(m.register_forward_pre_hook(self._unexpected))

    def _tensor_backward_hooks(self, slot: int, m: nn.Module) -> None:
        """Backward of a module PyTorch's module hooks cannot time: hooks on the tensors
        of each call (nested inputs and outputs, keyword inputs) and, for a module called
        once, on its own parameters."""
        stack = self._stack
        bstarts, bends, tids, ok = self.bwd_starts, self.bwd_ends, self.bwd_tid, self.bwd_ok
        now, ev = self._now, self._ev
        native_id = threading.get_native_id
        st = self
        thandles = self._thandles

        def all_in(i: int) -> Callable[[Any], None]:
            # the last output gradient to arrive starts the span, as PyTorch's module
            # backward pre-hook fires once every output's gradient is there
            def hook(grad: Any) -> None:
                k = st._base + i
                if ev is not None:
                    ev[2][i].record()
                    bstarts[k] = 1  # a flag until the events are read
                else:
                    assert now is not None
                    bstarts[k] = now()
                tids[k] = native_id()

            return hook

        def last_out(i: int) -> Callable[[Any], None]:
            def hook(grad: Any) -> None:
                k = st._base + i
                if ev is not None:
                    ev[3][i].record()
                else:
                    assert now is not None
                    bends[k] = now()
                if bstarts[k]:
                    ok[k] = 1

            return hook

        def tpre(module: nn.Module, args: Any, kwargs: Any) -> None:
            if st._top <= 0:
                return
            i = stack[st._top - 1]
            for t in iter_tensors((args, kwargs)):
                if t.requires_grad:
                    thandles.append(t.register_hook(last_out(i)))

        def tpost(module: nn.Module, args: Any, output: Any) -> None:
            i = stack[st._top]  # the call the timing hook just closed
            for t in iter_tensors(output):
                if t.requires_grad:
                    thandles.append(t.register_hook(all_in(i)))

        self._handles.append(m.register_forward_pre_hook(tpre, with_kwargs=True))
        self._handles.append(m.register_forward_hook(tpost))
        calls = self.tree.slot_calls[slot]
        if len(calls) == 1:
            end = last_out(calls[0])
            for p in m.parameters():
                if p.requires_grad:
                    self._handles.append(p.register_hook(end))

    def _unexpected(self, module: nn.Module, args: Any) -> None:
        if self.diverged is None:
            self.diverged = f"{type(module).__name__} ran, which the counting pass never called"

    def detach(self) -> None:
        while self._handles:
            self._handles.pop().remove()
        while self._thandles:
            self._thandles.pop().remove()
        for m, flag in zip(self.modules, self._full_flags, strict=True):
            m._is_full_backward_hook = flag  # torch leaves it set after remove()

    def _forward_hooks(self, slot: int) -> tuple[Callable[..., None], Callable[..., None]]:
        n = self.n
        call_slot = self.tree.slots
        stack = self._stack
        starts, ends = self.starts, self.ends
        st = self
        if self._ev is not None:
            ev_start, ev_end = self._ev[0], self._ev[1]

            def pre_ev(module: nn.Module, args: Any) -> None:
                i = st._next
                st._next = i + 1
                if i >= n or call_slot[i] != slot:
                    st._diverge(i, slot)
                    return
                stack[st._top] = i
                st._top += 1
                ev_start[i].record()

            def post_ev(module: nn.Module, args: Any, output: Any) -> None:
                top = st._top - 1
                if top < 0 or call_slot[stack[top]] != slot:
                    st._diverge(st._next, slot)
                    return
                ev_end[stack[top]].record()
                st._top = top

            return pre_ev, post_ev
        now = self._now
        assert now is not None

        def pre(module: nn.Module, args: Any) -> None:
            i = st._next
            st._next = i + 1
            if i >= n or call_slot[i] != slot:
                st._diverge(i, slot)
                return
            stack[st._top] = i
            st._top += 1
            starts[st._base + i] = now()

        def post(module: nn.Module, args: Any, output: Any) -> None:
            t = now()
            top = st._top - 1
            if top < 0 or call_slot[stack[top]] != slot:
                st._diverge(st._next, slot)
                return
            ends[st._base + stack[top]] = t
            st._top = top

        return pre, post

    def _backward_hooks(self, slot: int) -> tuple[Callable[..., None], Callable[..., None]]:
        calls = self.tree.slot_calls[slot]
        left, tops, mine = self._bw_left, self._bw_top, self._bw_stacks[slot]
        bstarts, bends, tids, ok = self.bwd_starts, self.bwd_ends, self.bwd_tid, self.bwd_ok
        st = self
        native_id = threading.get_native_id
        now = self._now
        ev = self._ev

        def bpre(module: nn.Module, grad_output: Any) -> None:
            k = left[slot] - 1
            if k < 0:
                return
            left[slot] = k
            i = calls[k]
            mine[tops[slot]] = i
            tops[slot] += 1
            if ev is not None:
                ev[2][i].record()
            else:
                assert now is not None
                bstarts[st._base + i] = now()

        def bpost(module: nn.Module, grad_input: Any, grad_output: Any) -> None:
            t = now() if now is not None else 0
            top = tops[slot] - 1
            if top < 0:
                return
            tops[slot] = top
            i = mine[top]
            k = st._base + i
            if ev is not None:
                ev[3][i].record()
            else:
                bends[k] = t
            tids[k] = native_id()
            for g in grad_input:
                if g is not None:
                    ok[k] = 1
                    break

        return bpre, bpost


class MemoryHooks:
    """Peak memory above each call's start: the max-allocated delta, nested calls folded.

    ``allocated``/``peak``/``reset_peak`` are ``torch.cuda.memory_allocated``,
    ``max_memory_allocated`` and ``reset_peak_memory_stats`` on a GPU (injected, so
    a test can drive them). Each hook folds the peak so far into every open call and
    resets it, so a child's reset never hides its parent's peak.
    """

    def __init__(
        self,
        modules: list[nn.Module],
        tree: CallTree,
        allocated: Callable[[], int],
        peak: Callable[[], int],
        reset_peak: Callable[[], None],
    ) -> None:
        self.modules = modules
        self.tree = tree
        self.allocated, self.peak, self.reset_peak = allocated, peak, reset_peak
        n = tree.n
        self.start = _zeros(n)
        self.high = _zeros(n)
        self.delta = _zeros(n)
        self._stack = _zeros(n + 1)
        self._top = 0
        self._next = 0
        self._handles: list[Any] = []

    def _fold(self) -> None:
        p = self.peak()
        for j in range(self._top):
            i = self._stack[j]
            if p > self.high[i]:
                self.high[i] = p
        self.reset_peak()

    def attach(self) -> None:
        for m in self.modules:
            self._handles.append(m.register_forward_pre_hook(self._pre))
            self._handles.append(m.register_forward_hook(self._post, prepend=True))

    def detach(self) -> None:
        while self._handles:
            self._handles.pop().remove()

    def _pre(self, module: nn.Module, args: Any) -> None:
        i = self._next
        self._next += 1
        if i >= self.tree.n:
            return
        self._fold()
        self.start[i] = self.high[i] = self.allocated()
        self._stack[self._top] = i
        self._top += 1

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._top == 0:
            return
        self._fold()
        self._top -= 1
        i = self._stack[self._top]
        self.delta[i] = self.high[i] - self.start[i]

    def per_module(self) -> list[int]:
        """Per module (slot): the largest delta over its calls."""
        return [max(self.delta[i] for i in calls) for calls in self.tree.slot_calls]
