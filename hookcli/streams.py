"""Where output goes while a command runs: the report to the real stdout, everything
else (progress, what the model prints) to stderr. No torch import, and nothing from
hookcli above ``errors``: every layer may write through these."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO

from hookcli.errors import UsageError

__all__ = ["adopt_closed_stdout", "model_output_to_stderr", "progress", "report_stream"]

CLOSED = "stdout is closed (write the report to a file with -o FILE)"


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
    """Where the report goes when there is no ``--output``: the real stdout.

    A write or flush that fails (a full disk, ``> /dev/full``; a closed stdout, ``>&-``)
    raises ``UsageError`` ("cannot write the report to stdout: ..."), exit 2 as for
    ``-o``; a reader that left (``| head``) is still ``BrokenPipeError``."""
    stream = _REPORT_STREAMS[-1] if _REPORT_STREAMS else sys.stdout
    return _Report(stream)  # type: ignore[return-value]


def adopt_closed_stdout() -> None:
    """At start: a closed file descriptor 1 (``>&-``) gets stderr (or /dev/null) in its
    place, so that no file hookcli or the model opens lands on it and C code's prints go
    where the model's prints go. ``sys.stdout`` is None (Python sets it so), and writing
    the report there is ``report_stream``'s one-line error."""
    try:
        os.fstat(1)
        return
    except OSError:
        pass
    with contextlib.suppress(OSError):
        try:
            os.dup2(2, 1)
        except OSError:
            fd = os.open(os.devnull, os.O_WRONLY)
            if fd != 1:
                os.dup2(fd, 1)
                os.close(fd)
        os.set_inheritable(1, True)


class _Report:
    """The report's stream: the real stdout, with failures said as one usage error."""

    def __init__(self, stream: TextIO | None) -> None:
        self._stream = stream

    def _failed(self, err: OSError | None) -> UsageError:
        if err is None:
            return UsageError(f"cannot write the report to stdout: {CLOSED}")
        return UsageError(f"cannot write the report to stdout: {err.strerror or err}")

    def write(self, text: str) -> int:
        if self._stream is None:
            raise self._failed(None)
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as err:
            raise self._failed(err) from err

    def flush(self) -> None:
        if self._stream is None:
            raise self._failed(None)
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as err:
            raise self._failed(err) from err

    def __getattr__(self, name: str) -> Any:
        if self._stream is None:
            raise self._failed(None)
        return getattr(self._stream, name)
