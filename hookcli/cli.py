"""The Typer app: parses options, calls the command, maps HookcliError to exit codes.

Only this module turns errors into exit statuses (docs/reference.md "Exit status"). torch is
imported lazily by the commands, so ``hookcli --help`` and ``--version`` stay fast.
"""

import contextlib
import functools
import gc
import io
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from hookcli import __version__
from hookcli.errors import (
    EXIT_INTERRUPTED,
    EXIT_RESOURCE,
    EXIT_RUN,
    EXIT_TERMINATED,
    HookcliError,
    Terminated,
    UsageError,
    first_line,
    is_oom,
    oom_cause,
    printable,
)

app = typer.Typer(
    name="hookcli",
    help="Inspect PyTorch models layer by layer with PyTorch's hooks: shapes, parameters, "
    "gradient flow, buffers, activations, hook order. Reports go to stdout; exit codes are "
    "stable for CI (0 ok, 1 check failed, 2 usage, 3 model not built, 4 model raised, "
    "5 resource limit).",
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"hookcli {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: Annotated[
        bool | None,
        typer.Option("--version", "-V", callback=_version, is_eager=True, help="Show the version."),
    ] = None,
) -> None:
    """hookcli: a command-line inspector for PyTorch models."""
    from hookcli.config import apply

    try:
        apply(ctx)  # [tool.hookcli] defaults; options on the command line win
    except HookcliError as err:
        raise typer.Exit(_fail(err.message, err.exit_code)) from None


def _fail(message: str, code: int) -> int:
    print(f"hookcli: error: {printable(message)}", file=sys.stderr, flush=True)
    return code


# -- signals -------------------------------------------------------------------------------

_SIGNAL_LINES = {
    signal.SIGINT: ("hookcli: interrupted", EXIT_INTERRUPTED),
    signal.SIGTERM: ("hookcli: terminated", EXIT_TERMINATED),
}


class _Signals:
    """SIGINT/SIGTERM while a command runs: raised where the program is (KeyboardInterrupt,
    Terminated), so the session restores the model and temp files go; elsewhere: the one
    line and the exit status at once (nothing to restore)."""

    running = 0  # command bodies under way
    received: int | None = None  # the first signal of this command

    @classmethod
    def handler(cls, signum: int, frame: Any) -> None:
        if cls.running <= 0:
            line, code = _SIGNAL_LINES[signal.Signals(signum)]
            print(line, file=sys.stderr, flush=True)
            os._exit(code)  # the report (if any) is written; stdout's leftovers are moot
        if cls.received is not None:
            return  # already unwinding: let the clean-up finish
        cls.received = signum
        if signum == signal.SIGTERM:
            raise Terminated()
        raise KeyboardInterrupt()


def _install_signal_handlers() -> dict[int, Any]:
    """Ours for SIGINT and SIGTERM; the previous handlers (none off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.signal(s, _Signals.handler) for s in _SIGNAL_LINES}


@contextlib.contextmanager
def _signals_guarded() -> Iterator[None]:
    previous = _install_signal_handlers()
    _Signals.running += 1
    _Signals.received = None
    try:
        yield
    finally:
        _Signals.running -= 1
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _interrupted(err: BaseException | None = None) -> int:
    from hookcli.atomic import remove_pending

    remove_pending()
    signum = _Signals.received
    if signum is None:
        signum = signal.SIGTERM if isinstance(err, Terminated) else signal.SIGINT
    line, code = _SIGNAL_LINES[signal.Signals(signum)]
    print(line, file=sys.stderr, flush=True)
    return code


# -- options checked before torch is imported --------------------------------------------

SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.manual_seed takes


def preflight(options: dict[str, Any]) -> dict[str, Any]:
    """Check the options every model command shares, before the model (and torch) load.

    Usage errors come back at once: ``--seed`` range, ``--input`` specs, ``--device``,
    ``--batch-size``, ``--output``, ``--junit`` and ``--baseline`` with ``--update-baseline``
    (a folder or an unwritable path). ``-o -`` is stdout.
    """
    from hookcli.atomic import check_target, is_stdout
    from hookcli.inputs import INT64_MAX, check_order, check_size, parse_device, parse_spec

    seed = options.get("seed")
    if isinstance(seed, int) and not SEED_MIN <= seed <= SEED_MAX:
        raise UsageError(
            f"--seed {seed} is out of range: a seed is a whole number from 0 to "
            f"{SEED_MAX} (2**64 - 1; negatives down to -2**63 are accepted as torch does)"
        )
    batch = options.get("batch_size")
    if isinstance(batch, int) and batch > INT64_MAX:
        raise UsageError(f"--batch-size {batch} is out of range (at most 2**63 - 1)")
    specs = [parse_spec(text) for text in options.get("input") or ()]
    check_order(specs)
    for spec in specs:
        if isinstance(batch, int):
            check_size((batch, *spec.dims[1:]), spec.dtype, f"{spec.text} -b {batch}")
    device = options.get("device")
    if isinstance(device, str):
        parse_device(device)
    output = options.get("output")
    if isinstance(output, Path):
        if is_stdout(output):
            options = {**options, "output": None}
        else:
            check_target(output, "--output")
    junit = options.get("junit")
    if isinstance(junit, Path):
        check_target(junit, "--junit")
    baseline = options.get("baseline")
    if isinstance(baseline, Path) and options.get("update_baseline"):
        check_target(baseline, "--baseline")
    return options


# -- what the model writes ----------------------------------------------------------------


def _route_fd1_to_stderr() -> None:
    """File descriptor 1 becomes stderr, for C code and child processes the model starts;
    ``sys.stdout`` keeps the original stdout, which only the report is written to."""
    stream = sys.stdout
    try:
        fd = stream.fileno()
        stream.flush()
        report_fd = os.dup(fd)
        os.dup2(sys.stderr.fileno(), fd)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return  # no real stdout (embedded, closed): nothing to route
    sys.stdout = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(report_fd, "w")),
        encoding=getattr(stream, "encoding", None) or "utf-8",
        errors=getattr(stream, "errors", None) or "strict",
        line_buffering=bool(getattr(stream, "line_buffering", False)),
    )


def execute(fn: Callable[[], int], debug: bool) -> int:
    """Run a command body and turn what it raises into an exit status and one line.

    While it runs, SIGINT/SIGTERM unwind it (130/143) and whatever the model prints
    goes to stderr: stdout carries only the report.
    """
    from hookcli.pipeline import model_output_to_stderr

    with _signals_guarded(), model_output_to_stderr():
        try:
            return _outcome(fn, debug)
        except KeyboardInterrupt as err:  # the signal came while an error line was printed
            return _interrupted(err)


def _outcome(fn: Callable[[], int], debug: bool) -> int:
    try:
        return fn()
    except HookcliError as err:
        if debug:
            traceback.print_exc()
        return _fail(err.message, err.exit_code)
    except KeyboardInterrupt as err:
        return _interrupted(err)
    except SystemExit as err:  # model code the loaders and the session did not wrap
        if debug:
            traceback.print_exc()
        return _fail(f"the model called sys.exit({err.code!r}) while running", EXIT_RUN)
    except Exception as err:  # a bug in hookcli or torch: still one line, never a traceback
        if _Signals.received is not None:
            return _interrupted()  # a signal broke a library call (torch.save) midway
        if debug:
            traceback.print_exc()
        if is_oom(err):
            return _fail(f"out of memory: {first_line(oom_cause(err))}", EXIT_RESOURCE)
        hint = "" if debug else " (run with --debug for the traceback)"
        return _fail(f"internal error: {first_line(err)}{hint}", EXIT_RUN)


def command(name: str, fn: Callable[..., int], help_text: str | None = None) -> None:
    """Register a command body (which returns an exit status) under ``name``."""

    @functools.wraps(fn)
    def wrapper(**kwargs: Any) -> None:
        code = execute(lambda: fn(**preflight(kwargs)), bool(kwargs.get("debug")))
        if code:
            raise typer.Exit(code)

    from hookcli.helpfmt import PanelCommand

    app.command(name, help=help_text or fn.__doc__, cls=PanelCommand)(wrapper)


def _register() -> None:
    from hookcli.commands import COMMANDS

    for name, fn in COMMANDS:
        command(name, fn)


_register()


def main() -> None:
    """Console-script entry point."""
    # Importing torch and torchvision leaves millions of objects that every gen-2
    # collection would rescan. Collection waits until the model is built; then
    # that heap is frozen out of later collections (pipeline.build_model).
    gc.disable()
    _install_signal_handlers()  # a signal outside a command: the one line, at once
    _route_fd1_to_stderr()
    try:
        app(prog_name="hookcli")
        code: object = 0
    except SystemExit as done:
        if done.code in (EXIT_INTERRUPTED, EXIT_TERMINATED):
            # Interrupted: the line is printed and the model restored. Leave without
            # flushing the rest of the report into a pipe nobody may read any more.
            sys.stderr.flush()
            os._exit(int(done.code))
        code = done.code
    finally:
        gc.unfreeze()  # an ordinary shutdown finalizes everything as usual
    _leave(code)


def _leave(code: object) -> None:
    """End the process; once torch is loaded, without the interpreter's finalization.

    Finalizing a process that imported torch takes about 0.6 s and raises its peak RSS
    by about 120 MB (torch's own teardown), after the report is out and every file
    written. So hookcli runs the ``atexit`` handlers (torch's, the model's), flushes
    its streams and leaves with ``os._exit``. An ordinary exit is kept when nothing
    of torch was loaded (``--help``), when another non-daemon thread is still running
    (the interpreter would wait for it), while a process group is initialized, and
    when ``HOOKCLI_FULL_EXIT=1`` is set.
    """
    if not isinstance(code, int) or not _fast_exit_ok():
        raise SystemExit(code)
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):  # a reader that left: nothing more to say
            if stream is not None:
                stream.flush()
    os._exit(code)


def _fast_exit_ok() -> bool:
    if "torch" not in sys.modules or os.environ.get("HOOKCLI_FULL_EXIT", "") not in ("", "0"):
        return False
    main_thread = threading.main_thread()
    if any(t is not main_thread and not t.daemon and t.is_alive() for t in threading.enumerate()):
        return False
    dist = sys.modules.get("torch.distributed")
    return not (dist is not None and dist.is_available() and dist.is_initialized())


__all__ = ["app", "execute", "main", "preflight"]
