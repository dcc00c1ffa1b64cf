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

from hookcli.options import DEFAULT_LOSS, Loss, LossKind, Mode
from hookcli.session import Frame, Probe
from hookcli.structures import shapes_of

if TYPE_CHECKING:
    from typing import Unpack

    from torch import nn

    from hookcli.commandargs import RunArgs
    from hookcli.pipeline import Prepared, RunOutcome
    from hookcli.report import Report
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


def _ms(ns: int | None) -> float | None:
    return None if ns is None else round(ns / 1e6, 4)


def event_matches(event: Event, pattern: str) -> bool:
    """``--filter``: a glob on the module name or class, or a module and its submodules."""
    from hookcli.globs import name_matches

    return name_matches(event.module, pattern, subtree=True, type_name=event.type)


def trace_report(
    prepared: Prepared,
    probe: TraceProbe,
    outcome: RunOutcome,
    *,
    depth: int | None = None,
    filter: str | None = None,
    limit: int | None = None,
    backward: bool = False,
    loss: Loss = DEFAULT_LOSS,
) -> Report:
    """The events kept by --depth, --filter and --limit; totals over every event."""
    from collections import Counter

    from hookcli.losses import loss_words
    from hookcli.render import fmt_float, fmt_shapes
    from hookcli.report import Column, Row, shapes_list

    events = probe.events
    kept = [
        e
        for e in events
        if (depth is None or e.depth <= depth) and (filter is None or event_matches(e, filter))
    ]
    if limit is not None:
        kept = kept[:limit]

    rows = []
    for e in kept:
        data = {
            "seq": e.seq,
            "event": e.event,
            "module": e.module,
            "type": e.type,
            "depth": e.depth,
            "call": e.call,
            "shapes": shapes_list(e.shapes),
            "elapsed_ms": _ms(e.elapsed_ns),
            "at_ms": _ms(e.at_ns),
            "duration_ms": _ms(e.duration_ns),
            "failed": e.failed,
        }
        display = {"name": e.module}
        if e.origin:
            display["mark"] = "<- raised here"
        elif e.failed:
            display["mark"] = "<- raised (propagating)"
        rows.append(Row.of(data, display))

    counts = Counter(e.event for e in events)
    outside = sorted({e.module for e in events if e.module.startswith("[")})
    total_ms = _ms(events[-1].at_ns) if events else 0.0
    totals = {
        "events": len(events),
        "shown": len(rows),
        **{name: counts.get(name, 0) for name in EVENTS},
        "outside_tree": outside,
        "elapsed_ms": total_ms,
    }
    if outcome.loss is not None:
        totals["loss"] = outcome.loss
    notes = []
    if filter is not None or limit is not None or depth is not None:
        picked = [
            f"--filter {filter}" if filter is not None else "",
            f"--depth {depth}" if depth is not None else "",
            f"--limit {limit}" if limit is not None else "",
        ]
        notes.append(
            f"showing {len(rows)} of {len(events)} events ({' '.join(p for p in picked if p)})"
        )
    per_kind = ", ".join(f"{name} {counts.get(name, 0)}" for name in EVENTS if counts.get(name))
    table_totals = [
        ("Events", f"{len(events)} ({per_kind or 'none'})"),
        ("Time", f"{fmt_float(total_ms)} ms from hooks attached to the last event"),
    ]
    if outside:
        table_totals.append(("Outside the model's tree", ", ".join(outside)))
    if outcome.loss is not None:
        words = "sum of outputs" if loss.kind is LossKind.SUM else loss_words(loss)
        table_totals.append((f"Loss ({words})", fmt_float(outcome.loss)))
    settings = {**prepared.settings, "backward": backward}
    if backward:
        settings["loss"] = loss.value
    return prepared.report(
        "trace",
        settings,
        totals=totals,
        lists={"events": tuple(rows)},
        primary="events",
        notes=tuple(notes),
        error=outcome.error.message if outcome.error else None,
        columns=(
            Column("seq", "Seq", str, "right"),
            Column("event", "Event"),
            Column("name", "Module"),
            Column("type", "Type"),
            Column("shapes", "Shapes", fmt_shapes),
            Column("elapsed_ms", "dt (ms)", fmt_float, "right"),
            Column("at_ms", "at (ms)", fmt_float, "right"),
            Column("duration_ms", "took (ms)", fmt_float, "right"),
        ),
        table_totals=tuple(table_totals),
    )


def cli_command(
    *,
    depth: int | None,
    backward: bool,
    loss: str | None,
    limit: int | None,
    filter: str | None,
    **common: Unpack[RunArgs],
) -> int:
    """The trace command's run (``hookcli trace``): build, run, emit the events."""
    import warnings

    from hookcli.commandargs import command_options
    from hookcli.losses import make_loss
    from hookcli.options import loss_arg
    from hookcli.pipeline import emit_outcome, prepare, run_session
    from hookcli.warnsummary import summarised_warnings

    the_loss = loss_arg(loss)
    mopts, ropts, out = command_options(common, Mode.EVAL, depth, global_hooks=True)

    with summarised_warnings(common["debug"]) as warned:
        prepared = prepare(mopts, ropts)
        probe = TraceProbe()
        with warnings.catch_warnings():
            # The first module's inputs never require grad: torch warns that its full
            # backward hook sees no grad_input. The trace shows that as empty shapes.
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            outcome = run_session(
                prepared,
                [probe],
                mode=ropts.mode,
                global_hooks=True,
                always_call=True,
                backward=backward,
                loss_fn=make_loss(the_loss, prepared.inputs),
            )
        warned.keep = outcome.error is None  # on failure the error is the one line to read
    report = trace_report(
        prepared,
        probe,
        outcome,
        depth=out.depth,
        filter=filter,
        limit=limit,
        backward=backward,
        loss=the_loss,
    )
    return emit_outcome(report, outcome.error, out)
