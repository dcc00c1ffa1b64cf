"""The trace probe: one event per hook firing, in firing order, with the time between them.

Used with ``HookSession(global_hooks=True, always_call=True)``: the global
``register_module_*`` hooks fire for every module called during the run, also
modules created inside ``forward`` (named ``[ClassName]`` by the session), and
the forward hook fires even when the module raises.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hookcli.session import Frame, Probe
from hookcli.structures import shapes_of

if TYPE_CHECKING:
    from torch import nn

    from hookcli.session import HookSession

FORWARD_PRE = "forward_pre"
FORWARD = "forward"
BACKWARD_PRE = "backward_pre"
BACKWARD = "backward"
EVENTS = (FORWARD_PRE, FORWARD, BACKWARD_PRE, BACKWARD)


@dataclass(frozen=True)
class Event:
    """One hook firing.

    ``shapes`` are the input shapes (forward_pre), output shapes (forward),
    grad_output shapes (backward_pre) or grad_input shapes (backward);
    ``elapsed_ns`` is the time since the previous event (the first: since the
    hooks were attached), ``at_ns`` the time since the hooks were attached, and
    ``duration_ns`` (forward and backward events) the time since the matching
    forward_pre / backward_pre of the same call. ``failed`` marks a forward
    event of a module that raised.
    """

    seq: int
    event: str
    module: str
    type: str
    depth: int
    call: int
    shapes: tuple[tuple[int, ...], ...]
    elapsed_ns: int
    at_ns: int
    duration_ns: int | None = None
    failed: bool = False
    origin: bool = False  # the first module that raised (the failure's origin)


class TraceProbe(Probe):
    """Records every forward-pre, forward, backward-pre and backward firing."""

    def __init__(self) -> None:
        # (event, frame fields, shapes, perf_counter_ns, failed); frozen into Events at the end
        self._raw: list[tuple[str, Frame, tuple[tuple[int, ...], ...], int, bool]] = []
        self._start = 0
        self.events: tuple[Event, ...] = ()

    def attach(self, session: HookSession) -> None:
        self._start = time.perf_counter_ns()

    def _add(self, event: str, frame: Frame, shapes: Any, failed: bool = False) -> None:
        self._raw.append((event, frame, shapes, time.perf_counter_ns(), failed))

    def on_forward_pre(self, frame: Frame, module: nn.Module, args: Any, kwargs: Any) -> None:
        self._add(FORWARD_PRE, frame, frame.input_shapes)

    def on_forward(
        self, frame: Frame, module: nn.Module, args: Any, kwargs: Any, output: Any
    ) -> None:
        self._add(FORWARD, frame, frame.output_shapes, failed=frame.failed)

    def on_backward_pre(self, frame: Frame, module: nn.Module, grad_output: Any) -> None:
        self._add(BACKWARD_PRE, frame, shapes_of(grad_output))

    def on_backward(
        self, frame: Frame, module: nn.Module, grad_input: Any, grad_output: Any
    ) -> None:
        self._add(BACKWARD, frame, shapes_of(grad_input))

    def finish(self, session: HookSession) -> None:
        origin = session.failure
        events = []
        previous = self._start
        opened: dict[tuple[int, str], int] = {}
        for seq, (event, frame, shapes, stamp, failed) in enumerate(self._raw):
            duration = None
            if event in (FORWARD_PRE, BACKWARD_PRE):
                opened[(id(frame), event)] = stamp
            else:
                begin = opened.pop((id(frame), f"{event}_pre"), None)
                duration = None if begin is None else stamp - begin
            events.append(
                Event(
                    seq=seq,
                    event=event,
                    module=frame.name,
                    type=frame.type,
                    depth=frame.depth,
                    call=frame.call,
                    shapes=tuple(shapes),
                    elapsed_ns=max(stamp - previous, 0),
                    at_ns=max(stamp - self._start, 0),
                    duration_ns=duration,
                    failed=failed,
                    origin=failed and frame is origin,
                )
            )
            previous = stamp
        self.events = tuple(events)
        self._raw.clear()
