"""A parent process that guards the exit status, so a model cannot forge one.

``hookcli.entry.main`` (the console script, ``python -m hookcli``) calls ``guard``.
In-process, ``os._exit`` is guarded (``cli._ExitGuard``), which names the module that
called it. Native code is out of its reach: ``ctypes.CDLL(None)._exit(0)`` or
``os.execv("/bin/true", ...)`` in a model's ``forward`` ends the process with status 0
and no report, a forged pass. So the console command forks once, before torch is
imported (and before the CLI's own modules, so that the fork copies little): the child
runs hookcli (``hookcli.cli.main``) and tells the parent, through a pipe, the exit
status it decided. The parent waits for the child and leaves with that status; a child
that ended without a status the parent believes never finished its report, and the
parent says so and exits 4.

Which statuses the parent believes (``_verdict``): a pass (0) only on a line that
carries the token, 32 random hex digits the parent draws just before the fork. In the
child the token lives only inside the function ``guard`` returns (the *herald*), which
``entry.main`` hands to ``cli.main`` and which only the CLI's last step calls, once the
report is out; it is in no module attribute, no environment variable, no file and
no descriptor, and nothing is written with it before the end. A failure needs no token
(``announce``: a model that says "4" cannot turn anything into a pass). So writing "0"
to every inherited descriptor, calling ``announce(0)`` or hookcli's own exit
functions, and then ending the process from native code is still exit 4. The limit:
the model runs in the same process, so code that sets out to dig the token out of the
interpreter's memory (frames, closures, ``/proc/self/mem``) can still forge a pass;
hookcli is not a sandbox (docs/exit-codes.md).

The child also marks how far it got (``stage``): ``torch`` before it imports torch,
``model`` once torch is in and before any model code runs. A child that died with
neither (or with ``torch`` only: OpenBLAS under ``ulimit -v`` exits 1 from C) never
ran model code, and the parent says hookcli could not start instead of blaming the
model: exit 5 under a memory limit, else 4.

The parent relays SIGINT, SIGTERM and SIGHUP to the child (which restores the model
and removes temp files, then says 130, 143 or 129), and a child killed by a signal
kills the parent with the same signal, so the shell sees what it would have seen. A
signal the parent was started ignoring (``nohup``'s SIGHUP) stays ignored. The child
dies with the parent (``PR_SET_PDEATHSIG``, Linux).

Not guarded (``should_guard``): ``--help``/``--version``, commands that run no model
(``models``, ``diff``), runs under ``--ddp``/``--fsdp`` (torchrun tracks the ranks'
processes itself), platforms without ``fork``, and ``HOOKCLI_EXIT_GUARD=0``.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NoReturn

# the commands that run no model code in this process; every other command does (a new
# one is guarded). watch runs the training in child processes of its own, whose exit
# status it passes through.
_NO_MODEL = frozenset({"diff", "models", "watch"})
_RELAYED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
EXIT_RUN = 4  # hookcli.errors' values, not imported: the parent stays this module only
EXIT_RESOURCE = 5

_fd: int | None = None  # the child's end of the pipe, once guarded
_pid = 0  # the guarded child (a process the model forks says nothing)


def should_guard(argv: list[str]) -> bool:
    """Whether this command line runs model code that a guarding parent should protect."""
    if not hasattr(os, "fork") or os.environ.get("HOOKCLI_EXIT_GUARD", "") == "0":
        return False
    if any(a.startswith("_") and a.endswith("_COMPLETE") for a in os.environ):
        return False  # shell completion
    words = [a for a in argv if not a.startswith("-")]
    if not words or words[0] in _NO_MODEL:
        return False
    return not any(a in ("--help", "-h", "--version", "--ddp", "--fsdp") for a in argv)


def runs_model(command: str) -> bool:
    """Whether ``command`` runs model code (every command but ``models`` and ``diff``)."""
    return command not in _NO_MODEL


def _say(line: str) -> None:
    if _fd is not None and os.getpid() == _pid:
        with contextlib.suppress(OSError):  # a full or closed pipe: the parent fails closed
            os.write(_fd, line.encode())


def announce(code: int) -> None:
    """A failure hookcli decided, told to the parent (a no-op when unguarded).

    A pass cannot be said here: the parent ignores ``0`` from this function and names
    it as a forged status. Only the herald ``guard`` returned says a pass.
    """
    _say(f"status {code}\n")


def stage(name: str) -> None:
    """How far the child got: ``torch`` (importing it), ``model`` (model code may run)."""
    _say(f"stage {name}\n")


def guard() -> Callable[[int], None]:
    """Fork; return the herald in the child, which runs hookcli; the parent never returns."""
    global _fd, _pid
    token = os.urandom(16).hex()
    read_end, write_end = os.pipe()
    parent = os.getpid()
    for stream in (sys.stdout, sys.stderr):  # None where the descriptor is closed
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        os.set_blocking(write_end, False)  # a pipe the model filled cannot hang the end
        _fd, _pid = write_end, os.getpid()
        _die_with(parent)
        return _herald(token, write_end, _pid)
    os.close(write_end)
    _parent(pid, read_end, token)


def _herald(token: str, fd: int, pid: int) -> Callable[[int], None]:
    def herald(code: int) -> None:
        """The CLI's last word: the exit status it decided, with the token."""
        if os.getpid() == pid:
            with contextlib.suppress(OSError):
                os.write(fd, f"{token} {code}\n".encode())

    return herald


def _die_with(parent: int) -> None:
    """The child ends when the parent does (SIGTERM, so it still cleans up)."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(143)


_FAILURE = re.compile(rb"(?:^|\W)status (-?\d+)$")
_STAGE = re.compile(rb"(?:^|\W)stage (torch|model)$")


@dataclass
class Verdict:
    """What the parent makes of what the child wrote into the pipe."""

    code: int | None = None  # the last status believed; None: no status
    stages: set[str] = field(default_factory=set)
    forged: bool = False  # something claimed a pass, or wrote what hookcli never writes


def _verdict(said: bytes, token: str) -> Verdict:
    """Read the pipe: ``TOKEN N`` (any status, the herald), ``status N`` (a failure,
    ``announce``), ``stage NAME``. A line may carry a prefix (bytes a model wrote without
    a newline): only its end is read. Anything else counts as forged."""
    verdict = Verdict()
    signed = re.compile(re.escape(token).encode() + rb" (-?\d+)$")
    for line in said.split(b"\n"):
        if not line:
            continue
        status = signed.search(line) or _FAILURE.search(line)
        if status is not None and (status.re is signed or int(status.group(1)) != 0):
            verdict.code = int(status.group(1))
        elif stage := _STAGE.search(line):
            verdict.stages.add(stage.group(1).decode())
        else:  # "status 0", a bare "0", another token: a pass hookcli did not say
            verdict.forged = True
    return verdict


def memory_limit() -> str | None:
    """The process's memory limit in words (``ulimit -v``/``-d``), or None when unlimited."""
    try:
        import resource
    except ImportError:  # not on this platform
        return None
    from hookcli.fmt import fmt_bytes

    for which, flag in ((resource.RLIMIT_AS, "-v"), (resource.RLIMIT_DATA, "-d")):
        soft = resource.getrlimit(which)[0]
        if soft != resource.RLIM_INFINITY:
            return f"a memory limit of {fmt_bytes(soft, binary=True)} (ulimit {flag} {soft >> 10})"
    return None


def not_started(why: str, memory_like: bool | None = None) -> tuple[str, int]:
    """The line and exit status when hookcli itself could not start (no model ran).

    ``memory_like``: whether the reason is running out of memory (``None``: no reason
    known, a native exit). Exit 5 when it is, or when unknown under a memory limit (the
    limit is then named as the likely cause); else 4.
    """
    limit = memory_limit()
    if limit is not None and memory_like is not False:
        why += f", under {limit}, the likely cause: raise the limit"
        return f"hookcli could not start: {why}", EXIT_RESOURCE
    return f"hookcli could not start: {why}", EXIT_RESOURCE if memory_like else EXIT_RUN


def _parent(pid: int, read_end: int, token: str) -> NoReturn:
    def relay(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for s in _RELAYED:
        if signal.getsignal(s) is not signal.SIG_IGN:  # nohup's SIGHUP stays ignored
            signal.signal(s, relay)
    _, status = os.waitpid(pid, 0)  # retried after a relayed signal (PEP 475)
    # What the child said is in the pipe by now; read without waiting for EOF (a
    # process the model forked may still hold the write end).
    os.set_blocking(read_end, False)
    said = b""
    with contextlib.suppress(BlockingIOError, OSError):
        while chunk := os.read(read_end, 4096):
            said += chunk
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        for s in _RELAYED:
            signal.signal(s, signal.SIG_DFL)
        with contextlib.suppress(Exception):  # SIGKILL and SIGSTOP keep theirs anyway
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # a signal that does not end a process
    status_code = os.waitstatus_to_exitcode(status)
    verdict = _verdict(said, token)
    if verdict.code is None:
        line, code = _no_status(status_code, verdict)
        with contextlib.suppress(OSError):  # a terminal that hung up
            os.write(2, f"hookcli: error: {line}\n".encode())
        os._exit(code)
    # hookcli decided; a later end with another status (a model's native exit in an
    # atexit handler) cannot turn a failure into a pass, but a crash after a pass counts
    decided = verdict.code
    os._exit(status_code if decided == 0 and status_code != 0 else decided)


def _no_status(status_code: int, verdict: Verdict) -> tuple[str, int]:
    """The parent's line and exit status for a child that ended without one."""
    ended = f"the process ended with status {status_code}"
    if "model" not in verdict.stages:  # no model code ran: hookcli's own start failed
        if "torch" in verdict.stages:
            return not_started(f"importing torch failed ({ended})")
        return not_started(f"{ended} before torch was loaded")
    forged = (
        "; an exit status written to hookcli's pipe that was not hookcli's own (it lacked "
        "the token) was ignored"
        if verdict.forged
        else ""
    )
    line = (
        f"{ended} before hookcli finished: something in the model ended it (native code, "
        f"an exec), so the run did not complete and nothing it reported can be trusted{forged}"
    )
    return line, EXIT_RUN
