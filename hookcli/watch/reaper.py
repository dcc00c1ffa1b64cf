"""The watchdog between ``hookcli watch`` and COMMAND (Linux): COMMAND ends with hookcli.

``python -I -S reaper.py PARENT_PID -- COMMAND [ARGS...]``, started by
``hookcli.watch.runner`` as the leader of a new process group; it runs standard-library
code only, no hookcli and no site (so neither the bootstrap nor a ``sitecustomize``).
It

- asks the kernel to send it ``SIGUSR2`` when ``hookcli watch`` dies, however it dies
  (``PR_SET_PDEATHSIG``: ``kill -9``, the OOM killer, a CI timeout's SIGKILL of the
  job's group);
- becomes a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): a process that COMMAND
  starts and that outlives its own parent is re-parented here, not to init, so every
  process of the run stays below this one, even those that left the process group
  (torchrun starts its workers with ``start_new_session``);
- forks and execs COMMAND in its own process group, waits for it, and exits as it
  exited (the same status, or killed by the same signal);
- on ``SIGUSR2`` (hookcli died, or hookcli asks for the run to end now) sends SIGKILL to
  every process below it, again until none is left (a process may fork while it is
  killed), then exits as COMMAND did;
- on SIGINT, SIGTERM or SIGHUP (hookcli passes them on to the whole group, this one
  included) does nothing itself: COMMAND got the same signal. Once COMMAND has exited
  after one, what it left running below is killed, as the group was before.
"""

import contextlib
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
KILL_NOW = signal.SIGUSR2


class _State:
    command = 0  # COMMAND's pid
    status: "int | None" = None  # its wait status, once reaped
    ending = False  # a relayed signal or a kill request came
    killing = False


_state = _State()


def _prctl(option: int, value: int) -> bool:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(option, value, 0, 0, 0) == 0


def descendants(root: int) -> "list[int]":
    """The live processes below ``root`` (from /proc; zombies left out)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        fields = data[data.rindex(b")") + 2 :].split()
        if fields[0] in (b"Z", b"X"):
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), ()):
            out.append(pid)
            todo.append(pid)
    return out


def _reap() -> None:
    """Collect every exited child (re-parented ones too); keep COMMAND's status."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid == _state.command:
            _state.status = status


def kill_tree() -> None:
    """SIGKILL every process below this one until none is left."""
    if _state.killing:
        return
    _state.killing = True
    me = os.getpid()
    for _ in range(1000):
        pids = descendants(me)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        _reap()
    _reap()
    _state.killing = False


def _on_kill_now(signum: int, frame: object) -> None:
    _state.ending = True
    kill_tree()


def _on_relayed(signum: int, frame: object) -> None:
    _state.ending = True


def _exit_as(status: int) -> None:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        with contextlib.suppress(ImportError, ValueError, OSError):
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core of this process
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, signal.SIG_DFL)  # (SIGKILL and SIGSTOP have no handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # a signal that does not end a process (SIGCHLD...)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def main(argv: "list[str]") -> None:
    parent = int(argv[1])
    command = argv[3:]
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    signal.signal(KILL_NOW, _on_kill_now)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_relayed)
    _prctl(PR_SET_PDEATHSIG, int(KILL_NOW))
    if os.getppid() != parent:  # hookcli died before the line above took effect
        os._exit(137)
    pid = os.fork()
    if pid == 0:
        try:
            for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # as subprocess restores them
                signal.signal(sig, signal.SIG_DFL)
            for sig in (KILL_NOW, signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            os.execvp(command[0], command)
        except OSError as err:
            os.write(2, f"hookcli watch: cannot run {command[0]!r}: {err.strerror}\n".encode())
        os._exit(127)
    _state.command = pid
    while _state.status is None:
        try:
            got, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if got == pid:
            _state.status = status
    if _state.ending:  # what COMMAND left running after a relayed signal goes too
        kill_tree()
    else:
        _reap()
    _exit_as(_state.status if _state.status is not None else 137 << 8)


if __name__ == "__main__":
    main(sys.argv)
