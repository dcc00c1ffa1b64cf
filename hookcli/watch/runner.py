"""``hookcli watch -- COMMAND``: run COMMAND with the monitor in each of its Python
processes, follow the steps files, then merge them into the report.

The parent never imports torch (unless ``--tensorboard`` asks for torch's
``SummaryWriter``). COMMAND runs in a process group of its own: SIGINT, SIGTERM and
SIGHUP that reach hookcli are passed on to the whole group (a second one of the same
kind: SIGKILL), and what the processes recorded until then is still merged and
written. ``--stop-on``: a monitor that meets its first NaN/Inf writes it, then asks
the parent (SIGUSR1) to end the whole group with SIGTERM.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from hookcli.errors import EXIT_USAGE, UsageError, first_line
from hookcli.fmt import number
from hookcli.watch.config import ARMED, ENV_CONFIG, ENV_OFF, ENV_PATH, WatchConfig, WatchGates
from hookcli.watch.merge import Process, read_lines, read_run, step_files

BOOTSTRAP = Path(__file__).resolve().parent / "bootstrap"
_RELAYED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_GRACE_S = 10.0  # after a stop's SIGTERM, SIGKILL for what is still running


@dataclass(frozen=True)
class WatchRun:
    """What ``hookcli watch`` was asked to do."""

    command: tuple[str, ...]
    every: int
    gates: WatchGates
    stop_on: tuple[str, ...] = ()
    nan_origin: bool = False
    out: Path | None = None
    plot: Path | None = None
    tensorboard: Path | None = None
    output: Path | None = None  # -o: checked with the others before COMMAND starts
    extra: dict[str, Any] = field(default_factory=dict)


def path_option(value: Path | str | None, option: str) -> Path | None:
    """A path option as typed; an empty one is refused (``Path('')`` would be ``.``)."""
    if value is None:
        return None
    if str(value).strip() == "":
        raise UsageError(f"{option} {value!r}: an empty path; give a path")
    return Path(value)


def _default_names(now: datetime) -> Iterator[Path]:
    """``hookcli-runs/<YYYYmmdd-HHMMSS>``, then ``-2``, ``-3``, ..."""
    stamp = now.strftime("%Y%m%d-%H%M%S")
    base = Path("hookcli-runs") / stamp
    yield base
    n = 1
    while True:
        n += 1
        yield base.with_name(f"{stamp}-{n}")


def default_out(now: datetime | None = None) -> Path:
    """The default ``--out``: the first of ``hookcli-runs/<YYYYmmdd-HHMMSS>/`` (``-2``,
    ``-3``, ...) that does not exist yet (``claim_default_out`` creates it)."""
    return next(p for p in _default_names(now or datetime.now()) if not p.exists())


def claim_default_out(now: datetime) -> Path:
    """Create the default ``--out`` folder, atomically: ``mkdir`` without ``exist_ok``,
    and on a name already taken (another ``hookcli watch`` started in the same second
    and created it first) the next one, so two runs never share a folder."""
    for path in _default_names(now):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise AssertionError("unreachable")  # the names never end


def check_run(run: WatchRun, out: Path | None = None) -> None:
    """Usage errors before anything starts (exit 2): the command, and every output path
    (``--out``, ``-o``, ``--plot``, ``--tensorboard``) with the rules of the model
    commands' outputs (``hookcli.atomic``)."""
    if not run.command:
        raise UsageError(
            "watch needs the command to run after --, e.g. hookcli watch -- python train.py"
        )
    program = run.command[0]
    if os.sep not in program and shutil.which(program) is None:
        raise UsageError(f"command not found: {program!r} (the COMMAND after --)")
    if os.sep in program and not os.access(program, os.X_OK):
        raise UsageError(f"{program!r} is not an executable file (the COMMAND after --)")
    check_outputs(run, out or run.out)
    if run.tensorboard is not None:
        import importlib.util

        if importlib.util.find_spec("tensorboard") is None:
            raise UsageError(
                "--tensorboard needs the tensorboard package: pip install 'hookcli[tensorboard]' "
                "(or pip install tensorboard)"
            )


def check_outputs(run: WatchRun, out: Path | None) -> None:
    """Every path the run writes, checked before COMMAND starts: a folder where files
    can be created (``--out``, ``--tensorboard``), files that can be written (``-o``,
    ``--plot``, the run's report.json: not read-only, not under a file, not in /proc),
    and no two options naming one file, nor ``-o``/``--plot`` naming a file of the run."""
    from hookcli.atomic import check_distinct, check_folder, check_target, is_stdout

    output = None if is_stdout(run.output) else run.output
    if out is not None:
        check_folder(out, "--out")
        if out.is_dir() and step_files(out):
            raise UsageError(
                f"--out {out}: already holds the steps files of a run; give a new folder"
            )
        check_target(out / "report.json", "--out")
    if run.tensorboard is not None:
        check_folder(run.tensorboard, "--tensorboard")
    if output is not None:
        check_target(output, "--output")
    if run.plot is not None:
        from hookcli.grads.plot import check_plot_path

        check_plot_path(run.plot)
    if out is not None:
        for option, path in (
            ("--output", output),
            ("--plot", run.plot),
            ("--tensorboard", run.tensorboard),
        ):
            of_run = _of_the_run(path, out) if path is not None else None
            if of_run is not None and of_run == path:
                raise UsageError(
                    f"{option} {path}: a file of the run under --out {out} (its report.json "
                    "or a steps file) would be overwritten; give another path"
                )
            if of_run is not None:
                raise UsageError(
                    f"{option} {path} is under {of_run}, a file of the run under --out {out}; "
                    "give another path"
                )
    check_distinct(
        (
            ("--output", output),
            ("--plot", run.plot),
            ("--out", out),
            ("--tensorboard", run.tensorboard),
        )
    )
    # no output at a path under another option's file (-o r.json --tensorboard r.json/tb)
    files = (("--output", output), ("--plot", run.plot))
    for option, path in (*files, ("--out", out), ("--tensorboard", run.tensorboard)):
        for file_option, file in files:
            if path is not None and file is not None and _under(path, file):
                raise UsageError(
                    f"{option} {path} is under {file_option} {file}, a file this run writes; "
                    "give another path"
                )


def _run_file(name: str) -> bool:
    """A name of the files a run writes in ``--out``: report.json, steps*.jsonl, .armed."""
    return name in ("report.json", ARMED) or (name.startswith("steps") and name.endswith(".jsonl"))


def _of_the_run(path: Path, out: Path) -> Path | None:
    """The file the run writes under ``out`` that ``path`` is, or lies under; None when
    neither."""
    from hookcli.atomic import same_file

    for candidate in (path, *path.parents):
        if _run_file(candidate.name) and same_file(candidate.parent, out):
            return candidate
    return None


def _under(path: Path, file: Path) -> bool:
    """Whether ``path`` lies below ``file`` (after resolving symlinks)."""
    return os.path.realpath(path).startswith(os.path.realpath(file).rstrip(os.sep) + os.sep)


def environment(config: WatchConfig, base: dict[str, str] | None = None) -> dict[str, str]:
    """COMMAND's environment: the bootstrap first on ``PYTHONPATH``, the options."""
    env = dict(os.environ if base is None else base)
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(BOOTSTRAP) + (os.pathsep + old if old else "")
    env[ENV_CONFIG] = config.to_env()
    env[ENV_PATH] = str(Path(__file__).resolve().parents[2])
    return env


class _Follower:
    """Reads the steps files while the run goes: new whole lines, per file."""

    def __init__(self, folder: Path, on_record: Callable[[Process, dict[str, Any]], None]):
        self.folder = folder
        self.on_record = on_record
        self.offsets: dict[Path, int] = {}
        self.processes: dict[Path, Process] = {}
        self.rest: dict[Path, str] = {}

    def poll(self) -> None:
        for path in step_files(self.folder):
            offset = self.offsets.get(path, 0)
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    f.seek(offset)
                    chunk = f.read()
                    self.offsets[path] = f.tell()
            except OSError:
                continue
            text = self.rest.pop(path, "") + chunk
            lines = text.split("\n")
            if lines and lines[-1]:
                self.rest[path] = lines.pop()
            process = self.processes.setdefault(path, Process(path))
            read_lines(lines, process, functools.partial(self.on_record, process))


class _Status:
    """One live line on stderr (a terminal only): step, loss, grad norm, worst module."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.last = 0.0
        self.text = ""
        self.worst: dict[str, tuple[str, float]] = {}

    def update(self, process: Process, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        mods = record.get("modules") or {}
        grads = [
            (name, g) for name, e in mods.items() if (g := number(e.get("grad_norm"))) is not None
        ]
        model = str(record.get("model"))
        if grads:
            self.worst[model] = max(grads, key=lambda ng: ng[1])
        loss = number(record.get("loss"))
        grad = number(record.get("grad_norm"))
        parts = [f"hookcli watch: {model} step {record.get('step')}"]
        if process.rank is not None:
            parts[0] += f" (rank {process.rank})"
        if loss is not None:
            parts.append(f"loss {loss:.4g}")
        if grad is not None:
            parts.append(f"grad norm {grad:.4g}")
        if model in self.worst:
            name, g = self.worst[model]
            parts.append(f"largest: {name or '(root)'} {g:.3g}")
        self.text = " | ".join(parts)
        now = time.monotonic()
        if now - self.last >= 0.25:
            self.last = now
            self.draw()

    def draw(self) -> None:
        if self.enabled and self.text:
            width = shutil.get_terminal_size((100, 20)).columns
            with contextlib.suppress(Exception):
                sys.stderr.write("\r\x1b[K" + self.text[: max(10, width - 1)] + "\r")
                sys.stderr.flush()

    def clear(self) -> None:
        if self.enabled and self.text:
            with contextlib.suppress(Exception):
                sys.stderr.write("\r\x1b[K")
                sys.stderr.flush()


def _on_terminal() -> bool:
    try:
        return sys.stderr.isatty() and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError):
        return False


@dataclass
class Outcome:
    """How COMMAND ended."""

    returncode: int  # Popen's: negative for a signal
    signal_received: int | None  # a signal hookcli passed on
    stop_requested: bool
    seconds: float
    writer_failed: bool = False  # --tensorboard stopped writing during the run


def execute(run: WatchRun, out: Path) -> tuple[Outcome, list[Process]]:
    """Run COMMAND watched; the outcome and what every process recorded."""
    config = WatchConfig(
        every=run.every,
        nan_origin=run.nan_origin,
        stop_on=run.stop_on,
        out=str(out.resolve()),
        parent=os.getpid(),
        t0=time.time(),
    )
    out.mkdir(parents=True, exist_ok=True)
    env = environment(config)
    status = _Status(_on_terminal())
    writer = _Boards(run.tensorboard) if run.tensorboard is not None else None
    writer_failed = False

    def writer_failure(err: BaseException) -> None:
        nonlocal writer, writer_failed
        status.clear()
        print(
            f"hookcli watch: --tensorboard {run.tensorboard}: stopped writing "
            f"({type(err).__name__}: {first_line(err)}); the run and its report go on",
            file=sys.stderr,
            flush=True,
        )
        writer_failed = True
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()
            writer = None

    def on_record(process: Process, record: dict[str, Any]) -> None:
        status.update(process, record)
        if writer is not None:
            try:
                writer.add(process, record)
            except Exception as err:  # the run and its report go on without it
                writer_failure(err)

    follower = _Follower(out, on_record)
    state: dict[str, Any] = {"signal": None, "count": 0, "stop": False, "stop_at": 0.0}
    started = time.monotonic()
    try:
        stdout: Any = sys.stderr.fileno()  # whatever COMMAND prints stays off the report
    except (AttributeError, ValueError, OSError):
        stdout = None
    kwargs: dict[str, Any] = (
        {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
    )
    guarded = _reaper_works()
    argv = _guarded(run.command) if guarded else list(run.command)
    try:
        proc = subprocess.Popen(argv, env=env, stdout=stdout, **kwargs)
    except OSError as err:
        raise UsageError(f"cannot run {run.command[0]!r}: {err.strerror or err}") from None
    pgid = proc.pid
    _warm_imports()  # what the report needs, loaded while COMMAND starts

    def kill(sig: int) -> None:
        if sig == signal.SIGKILL and guarded and proc.returncode is None:
            # the watchdog kills every process below it, those that left the group too
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc.pid, _KILL_NOW)
                return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)

    def relay(signum: int, frame: Any) -> None:
        if state["signal"] == signum:
            kill(signal.SIGKILL)  # asked twice: now
            return
        state["signal"] = state["signal"] or signum
        kill(signum)

    def stop(signum: int, frame: Any) -> None:
        if not state["stop"]:
            state["stop"] = True
            state["stop_at"] = time.monotonic()
            kill(signal.SIGTERM)

    exited = _Exit(proc)
    previous = {}
    for s in (*_RELAYED, signal.SIGUSR1):
        with contextlib.suppress(ValueError, OSError):  # not the main thread
            previous[s] = signal.signal(s, stop if s == signal.SIGUSR1 else relay)
    try:
        while not exited.within(0.25):
            follower.poll()
            if state["stop"] and time.monotonic() - state["stop_at"] > _GRACE_S:
                kill(signal.SIGKILL)
        # the group's other processes (a rank's children) go with it
        if state["stop"] or state["signal"]:
            kill(signal.SIGKILL)
        follower.poll()
    finally:
        for s, handler in previous.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(s, handler)
        exited.close()
        status.clear()
        if writer is not None:
            try:  # the last events are flushed here
                writer.close()
            except Exception as err:
                writer_failure(err)
    outcome = Outcome(
        returncode=proc.returncode,
        signal_received=state["signal"],
        stop_requested=bool(state["stop"]),
        seconds=time.monotonic() - started,
        writer_failed=writer_failed,
    )
    return outcome, read_run(out)


class _Exit:
    """Waits for COMMAND to exit. ``Popen.wait(timeout)`` polls, sleeping up to 50 ms
    between looks, so a run's end would be seen up to 50 ms late; on Linux a pidfd
    (``os.pidfd_open``) is polled, which returns as the process exits. Elsewhere, or
    where the kernel has no pidfd, Popen's own wait."""

    def __init__(self, proc: subprocess.Popen[Any]) -> None:
        self.proc = proc
        self.fd: int | None = None
        self._poll: Any = None
        with contextlib.suppress(AttributeError, OSError):
            fd = os.pidfd_open(proc.pid)
            try:
                poller = select.poll()  # no FD_SETSIZE limit, unlike select.select
                poller.register(fd, select.POLLIN)
            except BaseException:
                os.close(fd)
                raise
            self.fd, self._poll = fd, poller

    def within(self, seconds: float) -> bool:
        """Whether COMMAND has exited, waiting at most ``seconds`` for it."""
        if self.fd is None:
            try:
                self.proc.wait(timeout=seconds)
            except subprocess.TimeoutExpired:
                return False
            return True
        self._poll.poll(seconds * 1000)  # resumed after a relayed signal (PEP 475)
        return self.proc.poll() is not None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


REAPER = Path(__file__).resolve().parent / "reaper.py"
_KILL_NOW = signal.SIGUSR2  # hookcli.watch.reaper.KILL_NOW (not imported: a script)


def _reaper_works() -> bool:
    """Whether COMMAND runs under the watchdog (``hookcli.watch.reaper``): Linux, with
    /proc."""
    return sys.platform.startswith("linux") and os.path.isdir("/proc/self")


def _guarded(command: Sequence[str]) -> list[str]:
    """COMMAND started by the watchdog, which ends the whole run when hookcli dies."""
    return [sys.executable, "-I", "-S", str(REAPER), str(os.getpid()), "--", *command]


def _warm_imports() -> None:
    with contextlib.suppress(Exception):
        import tempfile  # noqa: F401  (hookcli.atomic's writes)

        import tabulate  # noqa: F401

        import hookcli.atomic
        import hookcli.options
        import hookcli.render
        import hookcli.watch.checks
        import hookcli.watch.summary  # noqa: F401


def exit_status(outcome: Outcome, checks_failed: bool) -> int:
    """COMMAND's own failure passes through; a stop or a failed check is 1; a signal
    hookcli passed on is 128 + its number (130, 143)."""
    if outcome.signal_received is not None:
        return 128 + int(outcome.signal_received)
    if outcome.stop_requested:
        return 1
    rc = outcome.returncode
    if rc < 0:
        return 128 - rc
    if rc > 0:
        return rc
    return 1 if checks_failed else 0


class _Boards:
    """``--tensorboard DIR``: the per-step scalars as TensorBoard event files (torch's
    ``SummaryWriter``), written while the run goes; one folder per rank under torchrun."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.writers: dict[Path, Any] = {}

    def _writer(self, process: Process) -> Any:
        writer = self.writers.get(process.path)
        if writer is None:
            from torch.utils.tensorboard import SummaryWriter

            world = process.start.get("world_size")
            if process.rank is not None and (world or 0) > 1:
                logdir = self.folder / f"rank{process.rank}"
            elif process.rank is None and process.path.name.startswith("steps.pid"):
                logdir = self.folder / f"pid{process.start.get('pid')}"
            else:
                logdir = self.folder
            writer = SummaryWriter(log_dir=str(logdir), flush_secs=5)
            self.writers[process.path] = writer
        return writer

    def add(self, process: Process, record: dict[str, Any]) -> None:
        w = self._writer(process)
        model = record.get("model")
        step = int(record.get("step") or 0)

        def scalar(tag: str, value: Any) -> None:
            v = number(value)
            if v is not None:
                w.add_scalar(f"{model}/{tag}", v, step)

        scalar("loss", record.get("loss"))
        scalar("grad_norm", record.get("grad_norm"))
        scalar("step_time", record.get("step_time"))
        for i, lr in enumerate(record.get("lr") or []):
            scalar(f"lr/{i}", lr)
        for name, entry in (record.get("modules") or {}).items():
            label = name or "(root)"
            for key in ("grad_norm", "weight_norm", "update_ratio"):
                scalar(f"{key}/{label}", entry.get(key))
            for key, value in (entry.get("act") or {}).items():
                scalar(f"act_{key}/{label}", value)

    def close(self) -> None:
        """Close every writer (each flushes its events); the first failure is raised
        once all were tried."""
        failed: Exception | None = None
        for w in self.writers.values():
            try:
                w.close()
            except Exception as err:
                failed = failed or err
        self.writers.clear()
        if failed is not None:
            raise failed


def settings_of(run: WatchRun, out: Path) -> dict[str, Any]:
    return {
        "every": run.every,
        "nan_origin": run.nan_origin,
        "fail_on": list(run.gates.checks),
        "thresholds": run.gates.thresholds(),
        "stop_on": list(run.stop_on),
        "command": list(run.command),
        "out": str(out),
    }


def watch_command(run: WatchRun) -> tuple[Any, int, Outcome]:
    """Run, merge, check: the report, the exit status and how COMMAND ended."""
    now = datetime.now()
    out = run.out or default_out(now)
    check_run(run, out)
    if run.out is None:  # created now, atomically: a run started in the same second
        claimed = claim_default_out(now)  # may have taken the name since
        if claimed != out:
            try:
                check_outputs(run, claimed)
            except BaseException:
                claimed.rmdir()
                raise
        out = claimed
    outcome, processes = execute(run, out)
    # what only the end needs is imported once COMMAND runs (``_warm_imports``)
    from hookcli.watch.checks import asked_checks, gate_results, recorded_a_step
    from hookcli.watch.summary import build_report

    armed = _armed(out)
    checks = gate_results(
        run.gates, run.stop_on, processes, lambda: _why_unwatched(armed, processes)
    )
    if not recorded_a_step(processes):
        unwatched = _why_unwatched(armed, processes)
        asked = asked_checks(run.gates, run.stop_on)
        if asked:  # a check that saw nothing is no pass
            print(
                f"hookcli watch: FAIL: no step recorded, so {', '.join(asked)} checked "
                f"nothing: {unwatched}",
                file=sys.stderr,
                flush=True,
            )
        else:
            print(f"hookcli watch: no step recorded: {unwatched}", file=sys.stderr, flush=True)
    extra = {
        "processes_armed": len(armed),
        "returncode": outcome.returncode,
        "seconds": round(outcome.seconds, 3),
        "files": {
            "out": str(out),
            "steps": [p.path.name for p in processes],
            "report": "report.json",
        },
    }
    error = None
    if outcome.signal_received is not None:
        name = signal.Signals(outcome.signal_received).name
        error = f"interrupted by {name}: the report holds what was recorded until then"
    elif outcome.returncode != 0 and not outcome.stop_requested:
        error = f"the command ended with status {_status_text(outcome.returncode)}"
    report = build_report(
        processes,
        checks,
        settings_of(run, out),
        shlex.join(run.command),
        extra_totals=extra,
        error=error,
    )
    from hookcli.atomic import atomic_write_text

    atomic_write_text(out / "report.json", report.to_json() + "\n", "--out")
    code = exit_status(outcome, any(not c.passed for c in checks))
    if outcome.writer_failed:  # said on stderr when it failed; the report is written
        code = code or EXIT_USAGE
    if run.plot is not None:
        from hookcli.errors import HookcliError
        from hookcli.watch.plot import plot_run

        try:
            plot_run(processes, run.plot, shlex.join(run.command))
        except HookcliError as err:  # the report is written: say so, and what failed
            print(f"hookcli watch: --plot not written: {err.message}", file=sys.stderr, flush=True)
            code = code or err.exit_code
    return report, code, outcome


def _armed(out: Path) -> set[int]:
    """The pids of the processes that armed the monitor (``hookcli.watch.boot``); the
    file that says so is removed."""
    path = out / ARMED
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return set()
    with contextlib.suppress(OSError):
        path.unlink()
    return {int(w) for w in text.split() if w.isdigit()}


def _why_unwatched(armed: set[int], processes: Sequence[Process] = ()) -> str:
    """Why a run recorded no step, in a clause: what did happen, from the processes'
    end records (none: the process never trained, or was killed)."""
    if armed:
        n = len(armed)
        ends = [p.end for p in processes if p.end]
        calls = sum(int(e.get("step_calls") or 0) for e in ends)
        dropped = sum(len(p.discarded) for p in processes)
        did = [
            f"{calls} optimizer.step() call{'s' if calls > 1 else ''} began and none completed "
            "over module parameters"
            if calls
            else "no optimizer.step() over module parameters"
        ]
        if dropped:
            did.append(f"{dropped} iteration{'s' if dropped > 1 else ''} discarded")
        if any(e.get("backward_since_step") for e in ends):
            did.insert(0, "a backward ran")
        elif not dropped:
            did.append("no backward")
        return (
            f"{n} Python process{'es' if n > 1 else ''} armed the monitor (imported torch) but "
            f"none recorded a step ({', '.join(did)})"
        )
    if os.environ.get(ENV_OFF) == "0":
        return f"no Python process armed the monitor ({ENV_OFF}=0 is set)"
    return (
        "no Python process armed the monitor (none imported torch with hookcli's bootstrap "
        "on PYTHONPATH: python -I or -S, HOOKCLI_WATCH=0, a launcher that drops PYTHONPATH, "
        "or a command that runs no Python)"
    )


def _status_text(rc: int) -> str:
    if rc < 0:
        with contextlib.suppress(ValueError):
            return f"{128 - rc} ({signal.Signals(-rc).name})"
    return str(rc)


def command_line(argv: Sequence[str]) -> tuple[str, ...]:
    """COMMAND as given (a leading ``--`` dropped)."""
    args = list(argv)
    if args and args[0] == "--":
        args = args[1:]
    return tuple(args)
