"""A traceback without the monitor's frames.

An exception raised in the training (in a backward, a closure, a clipping call) passes
through the monitor's wrappers on its way up. ``strip`` unlinks those frames from the
traceback (and from the exceptions it chains), so what the user reads is the traceback
of the unwatched run: ``hookcli watch`` does it in ``sys.excepthook`` of the watched
process, ``hookcli.watch(...)`` when an exception leaves its block. Each wrapper also
re-raises what the call it wraps raised with ``hide`` (``except BaseException as err:
hide(err); raise``), so a script that catches it and prints it itself
(``traceback.print_exc()``) reads no frame of the monitor either: on Python 3.11 and
later a bare ``raise`` keeps the traceback as set; on 3.10 the wrapper's own frame
stays.
"""

from __future__ import annotations

import contextlib
import sys
from types import TracebackType
from typing import Any

_OURS = ("hookcli.watch.",)


def _ours(tb: TracebackType) -> bool:
    name = tb.tb_frame.f_globals.get("__name__", "")
    return isinstance(name, str) and name.startswith(_OURS)


def strip_tb(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` without the entries of hookcli's watch modules."""
    while tb is not None and _ours(tb):
        tb = tb.tb_next
    head = tb
    while tb is not None:
        nxt = tb.tb_next
        while nxt is not None and _ours(nxt):
            nxt = nxt.tb_next
        tb.tb_next = nxt
        tb = nxt
    return head


def hide(err: BaseException) -> None:
    """In a wrapper's ``except``, before its bare ``raise``: ``err``'s traceback without
    the watch's frames (the wrapper's own included)."""
    with contextlib.suppress(Exception):
        err.__traceback__ = strip_tb(err.__traceback__)


def strip(err: BaseException | None) -> None:
    """Strip ``err``'s traceback and those of the exceptions it chains, in place."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        err.__traceback__ = strip_tb(err.__traceback__)
        if err.__context__ is not None and id(err.__context__) not in seen:
            strip(err.__context__)
        err = err.__cause__


def install_excepthook() -> None:
    """``sys.excepthook`` strips before it prints (the previous hook does the printing)."""
    previous = sys.excepthook

    def excepthook(kind: Any, value: Any, tb: Any) -> Any:
        try:
            strip(value)
            tb = value.__traceback__ if value is not None else tb
        except Exception:  # never lose the user's traceback over this
            pass
        return previous(kind, value, tb)

    excepthook.__hookcli_strip__ = True  # type: ignore[attr-defined]
    if not getattr(previous, "__hookcli_strip__", False):
        sys.excepthook = excepthook
