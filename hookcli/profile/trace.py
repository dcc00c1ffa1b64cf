"""``--trace-out FILE``: the timed passes as Chrome trace-event JSON.

The file is the JSON Object Format of the Trace Event Format, which Perfetto
(ui.perfetto.dev) and chrome://tracing open: complete events (``"ph": "X"``)
with ``ts`` and ``dur`` in microseconds, one per module call of every timed
pass, forward (``cat: "forward"``) and, with ``--backward``, backward
(``cat: "backward"``). Spans of one thread nest as the calls did; each thread
(the caller's, and the autograd engine's device threads on a GPU) is its own
track, named by a metadata event. A ``forward pass N`` / ``backward pass N``
span encloses each pass. Time 0 is the start of the first timed pass.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hookcli.profile.plan import Measured


def _us(ns: int, origin: int) -> float:
    return round((ns - origin) / 1e3, 3)


def trace_events(m: Measured, title: str) -> dict[str, Any]:
    """The trace as a JSON-ready dict."""
    hooks, tree = m.hooks, m.tree
    assert hooks is not None
    n = tree.n
    pid = os.getpid()
    origin = m.pass_starts[0] if m.pass_starts else 0
    events: list[dict[str, Any]] = []
    threads: dict[int, str] = {}

    def span(name: str, cat: str, start: int, end: int, tid: int, args: dict[str, Any]) -> None:
        events.append(
            {
                "name": name,
                "cat": cat,
                "ph": "X",
                "ts": _us(start, origin),
                "dur": round(max(end - start, 0) / 1e3, 3),
                "pid": pid,
                "tid": tid,
                "args": args,
            }
        )

    for p, start in enumerate(m.pass_starts):
        tid = hooks.fwd_tid[p]
        threads.setdefault(tid, "main thread (forward)")
        span(f"forward pass {p}", "pass", start, start + m.hooked_ns[p], tid, {"pass": p})
        base = p * n
        for i in range(n):
            args = {"module": tree.names[i], "type": tree.types[i], "pass": p}
            label = tree.names[i] or f"(root) {tree.types[i]}"
            span(label, "forward", hooks.starts[base + i], hooks.ends[base + i], tid, args)
    for p, start in enumerate(m.backward_starts):
        tid = hooks.fwd_tid[p]
        span(f"backward pass {p}", "pass", start, start + m.backward_ns[p], tid, {"pass": p})
        base = p * n
        for i in range(n):
            if not hooks.bwd_ok[base + i]:
                continue
            btid = hooks.bwd_tid[base + i]
            threads.setdefault(btid, "autograd thread (backward)")
            args = {"module": tree.names[i], "type": tree.types[i], "pass": p}
            label = tree.names[i] or f"(root) {tree.types[i]}"
            k = base + i
            span(label, "backward", hooks.bwd_starts[k], hooks.bwd_ends[k], btid, args)
    events.sort(key=lambda e: (e["tid"], e["ts"], -e["dur"]))
    meta: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": title}}
    ]
    for tid, name in threads.items():
        meta.append(
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}
        )
    return {
        "traceEvents": meta + events,
        "displayTimeUnit": "ms",
        "otherData": {"generator": "hookcli profile", "timer": m.clock.name},
    }


def write_trace(path: Path, m: Measured, title: str) -> Path:
    """Write the trace (atomically, folders created); exit 2 when it cannot be written."""
    from hookcli.atomic import atomic_write_text
    from hookcli.pipeline import progress

    text = json.dumps(trace_events(m, title), separators=(",", ":"))
    atomic_write_text(path, text + "\n", "--trace-out")
    progress(f"trace written to {path} (open it in ui.perfetto.dev or chrome://tracing)")
    return path
