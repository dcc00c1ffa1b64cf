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


def _zeros(n: int) -> array[int]:
    return array("q", bytes(8 * n))


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

    # -- passes ------------------------------------------------------------------------
    def begin_pass(self, p: int) -> None:
        """Point the stamps at pass ``p`` (outside the timed region)."""
        self._base = p * self.n
        self._next = 0
        self._top = 0
        for slot, calls in enumerate(self.tree.slot_calls):
            self._bw_left[slot] = len(calls)
            self._bw_top[slot] = 0
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
                if backward and not self.bwd_ok[base + i]:
                    continue
                out[base + i] = origin_ns + round(origin.elapsed_time(events[i]) * 1e6)

    def _diverge(self, i: int, slot: int) -> None:
        if self.diverged is None:
            got = self.tree.names[self.tree.slot_calls[slot][0]] or "(root)"
            want = self.tree.names[i] if i < self.n else "no further call"
            self.diverged = f"call {i} was {got} where the counting pass saw {want or '(root)'}"

    # -- attaching -------------------------------------------------------------------------
    def attach(self) -> None:
        """Register the hooks (between timed regions; ``detach`` removes them)."""
        for slot, m in enumerate(self.modules):
            pre, post = self._forward_hooks(slot)
            self._handles.append(m.register_forward_pre_hook(pre))
            # prepend: the clock stops before any hook of the model's own runs
            self._handles.append(m.register_forward_hook(post, prepend=True))
            if self.backward:
                bpre, bpost = self._backward_hooks(slot)
                self._handles.append(m.register_full_backward_pre_hook(bpre))
                self._handles.append(m.register_full_backward_hook(bpost))
        for m in self.uncalled:
            self._handles.append(m.register_forward_pre_hook(self._unexpected))

    def _unexpected(self, module: nn.Module, args: Any) -> None:
        if self.diverged is None:
            self.diverged = f"{type(module).__name__} ran, which the counting pass never called"

    def detach(self) -> None:
        while self._handles:
            self._handles.pop().remove()
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
