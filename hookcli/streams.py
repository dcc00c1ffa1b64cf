"""Where output goes while a command runs: the report to the real stdout, everything
else (progress, what the model prints) to stderr. No torch import, and nothing from
hookcli above ``errors``: every layer may write through these."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TextIO

__all__ = ["model_output_to_stderr", "progress", "report_stream"]


def progress(message: str) -> None:
    """A diagnostic line on stderr (reports go to stdout)."""
    print(message, file=sys.stderr, flush=True)


_REPORT_STREAMS: list[TextIO] = []


@contextlib.contextmanager
def model_output_to_stderr() -> Iterator[None]:
    """While a command runs, ``sys.stdout`` is stderr: whatever the model prints while it
    is imported, built or run stays out of the report. The report goes to the stdout
    saved here (``report_stream``)."""
    saved = sys.stdout
    _REPORT_STREAMS.append(saved)
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        sys.stdout = saved
        _REPORT_STREAMS.pop()


def report_stream() -> TextIO:
    """Where the report goes when there is no ``--output``: the real stdout."""
    return _REPORT_STREAMS[-1] if _REPORT_STREAMS else sys.stdout
