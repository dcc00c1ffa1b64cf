"""A parent process that watches the exit status, so a model cannot forge one.

``hookcli.entry.main`` (the console script, ``python -m hookcli``) calls ``watch``.
In-process, ``os._exit`` is guarded (``cli._ExitGuard``), which names the module that
called it. Native code is out
of its reach: ``ctypes.CDLL(None)._exit(0)`` or ``os.execv("/bin/true", ...)`` in a
model's ``forward`` ends the process with status 0 and no report, a forged pass. So the
console command forks once, before torch is imported (and before the CLI's own modules,
so that the fork copies little): the child runs hookcli (``hookcli.cli.main``), and
before it leaves it writes the exit status it decided into a pipe (``announce``). The
parent waits for the child and leaves with that status; a child that ended without
announcing one never finished its report, and the parent says so and exits 4.

The parent relays SIGINT, SIGTERM and SIGHUP to the child (which restores the model
and removes temp files, then announces 130 or 143), and a child killed by a signal
kills the parent with the same signal, so the shell sees what it would have seen.
The child dies with the parent (``PR_SET_PDEATHSIG``, Linux).

Not watched (``should_watch``): ``--help``/``--version``, commands that run no model
(``models``, ``diff``), runs under ``--ddp``/``--fsdp`` (torchrun tracks the ranks'
processes itself), platforms without ``fork``, and ``HOOKCLI_WATCH=0``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

# the commands that run no model code; every other command does (a new one is watched)
_NO_MODEL = frozenset({"diff", "models"})
_RELAYED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_fd: int | None = None  # the child's end of the pipe, once watched


def should_watch(argv: list[str]) -> bool:
    """Whether this command line runs model code that a watching parent should guard."""
    if not hasattr(os, "fork") or os.environ.get("HOOKCLI_WATCH", "") == "0":
        return False
    if any(a.startswith("_") and a.endswith("_COMPLETE") for a in os.environ):
        return False  # shell completion
    words = [a for a in argv if not a.startswith("-")]
    if not words or words[0] in _NO_MODEL:
        return False
    return not any(a in ("--help", "-h", "--version", "--ddp", "--fsdp") for a in argv)


def announce(code: int) -> None:
    """The child's last word: the exit status hookcli decided (a no-op when unwatched)."""
    if _fd is not None:
        with contextlib.suppress(OSError):
            os.write(_fd, f"{code}\n".encode())


def watch() -> None:
    """Fork; return in the child, which runs hookcli; the parent never returns."""
    global _fd
    read_end, write_end = os.pipe()
    parent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        _fd = write_end
        _die_with(parent)
        return
    os.close(write_end)
    _parent(pid, read_end)


def _die_with(parent: int) -> None:
    """The child ends when the parent does (SIGTERM, so it still cleans up)."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(143)


def _parent(pid: int, read_end: int) -> None:
    def relay(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for s in _RELAYED:
        signal.signal(s, relay)
    _, status = os.waitpid(pid, 0)  # retried after a relayed signal (PEP 475)
    # What the child announced is in the pipe by now; read without waiting for EOF (a
    # process the model forked may still hold the write end).
    os.set_blocking(read_end, False)
    said = b""
    with contextlib.suppress(BlockingIOError, OSError):
        while chunk := os.read(read_end, 4096):
            said += chunk
    codes = [int(w) for w in said.split() if w.lstrip(b"-").isdigit()]
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        for s in _RELAYED:
            signal.signal(s, signal.SIG_DFL)
        with contextlib.suppress(Exception):  # SIGKILL and SIGSTOP keep theirs anyway
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # a signal that does not end a process
    status_code = os.waitstatus_to_exitcode(status)
    if not codes:
        os.write(
            2,
            (
                f"hookcli: error: the process ended with status {status_code} before hookcli "
                "finished: something in the model ended it (native code, an exec), so the "
                "run did not complete and nothing it reported can be trusted\n"
            ).encode(),
        )
        os._exit(4)
    decided = codes[-1]
    # hookcli decided; a later end with another status (a model's native exit in an
    # atexit handler) cannot turn a failure into a pass, but a crash after a pass counts
    os._exit(status_code if decided == 0 and status_code != 0 else decided)
