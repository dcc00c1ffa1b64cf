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
from typing import Annotated, Any, ClassVar, NoReturn

import typer
from typer.core import TyperGroup

from hookcli import __version__
from hookcli.errors import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_RESOURCE,
    EXIT_RUN,
    EXIT_TERMINATED,
    HookcliError,
    ModelExit,
    Terminated,
    UsageError,
    first_line,
    is_oom,
    oom_cause,
    printable,
)


def _one_line(err: Any, file: Any = None) -> None:
    """Click's usage error as hookcli's one line: no usage block, no 'Try ...' hint."""
    message = " ".join(str(err.format_message()).split()).rstrip(".")
    ctx = getattr(err, "ctx", None)
    hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    print(f"hookcli: error: {printable(message)}{hint}", file=sys.stderr, flush=True)


def _as_one_line(err: Exception) -> None:
    from typer._click.exceptions import NoArgsIsHelpError

    if not isinstance(err, NoArgsIsHelpError):  # that one is the help text itself
        err.show = functools.partial(_one_line, err)  # type: ignore[attr-defined]


class OneLineGroup(TyperGroup):
    """The group whose usage errors (``--seed x``, ``--nope``, a missing MODEL) come out as
    one line ``hookcli: error: ...`` with exit status 2, like every other hookcli error."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        from typer._click.exceptions import ClickException

        try:
            return super().make_context(*args, **kwargs)
        except ClickException as err:
            _as_one_line(err)
            raise

    def invoke(self, ctx: Any) -> Any:
        from typer._click.exceptions import ClickException

        try:
            return super().invoke(ctx)
        except ClickException as err:
            _as_one_line(err)
            raise


app = typer.Typer(
    name="hookcli",
    cls=OneLineGroup,
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


# -- a model that ends the process itself -------------------------------------------------

_REAL_EXIT = os._exit  # hookcli's own immediate exits go through this (by _end)


def _end(code: int, herald: Callable[[int], None] | None = None) -> NoReturn:
    """Leave now with ``code``, told first to the guarding parent (hookcli/exitguard.py).

    Without the herald (which only ``main`` holds) the parent hears a failure only: a
    model that calls this with 0 is not believed.
    """
    from hookcli.exitguard import announce

    if herald is not None:
        herald(code)
    else:
        announce(code)
    _REAL_EXIT(code)


class _ExitGuard:
    """``os._exit`` from model code while hookcli runs: an error, never the exit status.

    ``os._exit(0)`` in a model's ``forward`` would end the process at once with status
    0 and no report: a forged pass. While a command runs (and, in the CLI process,
    until it ends), ``os._exit`` and ``posix._exit`` raise ``ModelExit`` instead (a
    ``SystemExit``, so the session reports it as a failure in the module that called
    it, exit 4). A call from another thread ends that thread; it is recorded and the
    command ends with exit 4. A forked child process (a DataLoader worker) still exits
    for real.
    """

    depth: ClassVar[int] = 0
    pid: ClassVar[int] = 0
    calls: ClassVar[list[str]] = []  # what was called, and where, while guarded
    final: ClassVar[int] = 0  # the exit status of an ordinary interpreter exit

    @classmethod
    def last_word(cls) -> None:
        """The last atexit handler: a model's thread or handler that called ``os._exit``
        while the interpreter was shutting down still makes the exit status 4."""
        if cls.calls:
            code = cls.failure(cls.final)
            if code != cls.final:
                with contextlib.suppress(Exception):
                    sys.stderr.flush()
                _end(code)

    @classmethod
    def replacement(cls, status: int = 0) -> NoReturn:
        if os.getpid() != cls.pid:  # a forked child: its own process to end
            _REAL_EXIT(status)
        thread = threading.current_thread()
        where = "" if thread is threading.main_thread() else f" in thread {thread.name!r}"
        cls.calls.append(f"os._exit({status!r}){where}")
        if where:
            raise SystemExit(status)  # ends that thread quietly (threading ignores SystemExit)
        raise ModelExit(status, "os._exit")

    @classmethod
    def install(cls) -> None:
        import posix

        if cls.depth == 0:
            cls.pid = os.getpid()
            os._exit = cls.replacement
            posix._exit = cls.replacement
        cls.depth += 1

    @classmethod
    def uninstall(cls) -> None:
        import posix

        cls.depth -= 1
        if cls.depth == 0:
            os._exit = _REAL_EXIT
            posix._exit = _REAL_EXIT

    @classmethod
    def failure(cls, code: int) -> int:
        """The exit status once a command ended: 4 (and the line) when the model called
        ``os._exit`` and the command would otherwise pass or fail a check."""
        calls = list(cls.calls)
        cls.calls.clear()  # said once: by this line, or by the failure already reported
        if not calls or code not in (0, 1):
            return code
        what = calls[0]
        return _fail(
            f"the model called {what} to end the process; the run did not complete, "
            "so nothing it reported can be trusted",
            EXIT_RUN,
        )


@contextlib.contextmanager
def _exit_guarded() -> Iterator[None]:
    _ExitGuard.install()
    try:
        yield
    finally:
        _ExitGuard.uninstall()


# -- signals -------------------------------------------------------------------------------

EXIT_HANGUP = 128 + int(signal.SIGHUP)  # 129, as a shell reports a process SIGHUP ended

_SIGNAL_LINES = {
    signal.SIGINT: ("hookcli: interrupted", EXIT_INTERRUPTED),
    signal.SIGTERM: ("hookcli: terminated", EXIT_TERMINATED),
    signal.SIGHUP: ("hookcli: hung up", EXIT_HANGUP),
}
_SIGNAL_EXITS = frozenset(code for _, code in _SIGNAL_LINES.values())


class _Signals:
    """SIGINT/SIGTERM/SIGHUP while a command runs: raised where the program is
    (KeyboardInterrupt; Terminated for the other two), so the session restores the model
    and temp files go; elsewhere: the one line and the exit status at once (nothing to
    restore)."""

    running = 0  # command bodies under way
    received: int | None = None  # the first signal of this command

    @classmethod
    def handler(cls, signum: int, frame: Any) -> None:
        if cls.running <= 0:
            line, code = _SIGNAL_LINES[signal.Signals(signum)]
            print(line, file=sys.stderr, flush=True)
            _end(code)  # the report (if any) is written; stdout's leftovers are moot
        if cls.received is not None:
            return  # already unwinding: let the clean-up finish
        cls.received = signum
        if signum != signal.SIGINT:
            raise Terminated()
        raise KeyboardInterrupt()


def _install_signal_handlers() -> dict[int, Any]:
    """Ours for SIGINT, SIGTERM and SIGHUP; the previous handlers (none off the main
    thread). A SIGHUP the process was started ignoring (``nohup``) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {
        s: signal.signal(s, _Signals.handler)
        for s in _SIGNAL_LINES
        if s != signal.SIGHUP or signal.getsignal(s) is not signal.SIG_IGN
    }


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


# Commands that need tensor values: on meta they are refused before the model is built.
_NEEDS_VALUES = {
    "stats": "stats needs values: --device meta holds shapes only",
    "features": "features needs values: --device meta holds shapes only",
}


def preflight(options: dict[str, Any], command: str = "") -> dict[str, Any]:
    """Check the options every model command shares, before the model (and torch) load.

    Usage errors come back at once: ``--seed`` range, ``--input`` specs, ``--device``,
    ``--batch-size``, ``--output``, ``--junit`` and ``--baseline`` with ``--update-baseline``
    (a folder or an unwritable path), two file options naming one file. ``-o -`` is stdout.
    """
    from hookcli.atomic import check_distinct, check_not_inputs, check_target, is_stdout
    from hookcli.inputs.grammar import INT64_MAX, check_order, check_size, parse_device, parse_spec
    from hookcli.validate import check_seed

    if isinstance(options.get("seed"), int):
        check_seed(options["seed"])
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
        if command in _NEEDS_VALUES and device.strip().lower() == "meta":
            raise UsageError(_NEEDS_VALUES[command])
    fail_on = options.get("fail_on")
    texts = (
        [fail_on]
        if isinstance(fail_on, str)
        else list(fail_on or ())
        if isinstance(fail_on, (list, tuple))
        else []
    )
    if texts and not _names_in(texts):  # --fail-on '' (a default is None or [])
        raise UsageError(
            f"--fail-on {','.join(texts)!r} names no check; give the checks to fail on, "
            "or drop --fail-on"
        )
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
    if isinstance(baseline, Path):
        if options.get("update_baseline"):
            check_target(baseline, "--baseline")
        else:
            _check_baseline(baseline, command)
    # two outputs to one path: the second would replace the first
    check_distinct((flag, v) for flag, v in _file_options(options) if isinstance(v, Path))
    written = [
        (flag, v)
        for flag, v in _file_options(options)
        if isinstance(v, Path) and (flag != "--baseline" or options.get("update_baseline"))
    ]
    check_not_inputs(written, _read_files(options))
    return options


def _names_in(texts: list[Any]) -> list[str]:
    return [p for t in texts for p in str(t).split(",") if p.strip()]


def _spec_file(spec: Any) -> Path | None:
    """The file a ``FILE.py:attr`` / ``FILE`` spec names, where it is an existing file."""
    if not isinstance(spec, str) or not spec.strip():
        return None
    text = spec.strip()
    for cut in (text, text.rpartition(":")[0], text.partition(":")[0]):
        if cut and Path(cut).is_file():
            return Path(cut)
    return None


def _read_files(options: dict[str, Any]) -> list[tuple[str, Path]]:
    """The files the run reads (MODEL's file, weights, inputs, kwargs, a loss function's
    file, compare's B side): no output may name one of them."""
    found: list[tuple[str, Any]] = [
        ("MODEL", _spec_file(options.get("model"))),
        ("MODEL B", _spec_file(options.get("model_b"))),
        ("--inputs-from", _spec_file(options.get("inputs_from"))),
    ]
    loss = options.get("loss")
    if isinstance(loss, str) and loss.strip().startswith("fn:"):
        found.append(("--loss", _spec_file(loss.strip()[3:])))
    for name in (
        "weights", "a_weights", "b_weights", "input_file", "kwargs_file", "a_kwargs_file",
        "b_kwargs_file", "map_file",
    ):  # fmt: skip
        found.append(("--" + name.replace("_", "-"), options.get(name)))
    for text in options.get("vs") or ():
        key, _, value = str(text).partition("=")
        if key.strip() == "weights" and value.strip():
            found.append(("--vs weights=", Path(value.strip())))
    return [(flag, Path(v)) for flag, v in found if isinstance(v, (str, Path)) and str(v)]


def _file_options(options: dict[str, Any]) -> list[tuple[str, Any]]:
    """The options naming a file hookcli writes (and ``--baseline``, read after ``-o`` is
    written): ``-o``, ``--junit``, ``--baseline``, ``--plot``, ``--trace-out``, ``--out``,
    ``--png``."""
    names = ("output", "junit", "baseline", "plot", "trace_out", "out", "png")
    return [("--" + name.replace("_", "-"), options.get(name)) for name in names]


def _check_baseline(path: Path, command: str) -> None:
    """The baseline to compare with, read before the run: a folder, a file that is not a
    report, or a report of another command is exit 2 at once, not after the whole run."""
    from hookcli.diff import load_report

    if path.is_dir():
        raise UsageError(f"--baseline {path}: is a folder; give the baseline's JSON file")
    if not path.exists():
        return  # ci_options says how to create it
    data = load_report(path)
    if command and data.get("command") != command:
        raise UsageError(
            f"--baseline {path} and this run come from different commands: it is a report "
            f"of {data.get('command')!r}, not of {command!r}; write this command's baseline "
            "with --update-baseline"
        )


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

    While it runs, SIGINT/SIGTERM/SIGHUP unwind it (130/143/129) and whatever the model
    prints goes to stderr: stdout carries only the report. In-process (``app([...])``)
    ``sys.path`` and the environment variables hookcli sets come back as they were.
    """
    from hookcli.pipeline import model_output_to_stderr
    from hookcli.preserve import scope

    try:
        with _host_kept(), _signals_guarded(), model_output_to_stderr(), _exit_guarded():
            try:
                with scope():  # a MODEL instance and the global RNGs put back at the end
                    code = _outcome(fn, debug)
                return _ExitGuard.failure(code)
            except KeyboardInterrupt as err:  # the signal came while an error line was printed
                return _interrupted(err)
    finally:
        if _CLI_PROCESS:
            # The report is out: whatever the model's threads print from now on goes to
            # stderr too, never after the report on stdout.
            sys.stdout = sys.stderr


_CLI_PROCESS = False  # set by main(): this process is hookcli itself, not a host program
# what the MODEL sources set in os.environ (hookcli/sources/hf.py); put back in-process
_HOOKCLI_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_VERBOSITY")


@contextlib.contextmanager
def _host_kept() -> Iterator[None]:
    """In a host program (``app([...])``, not the ``hookcli`` process): ``sys.path``
    (a MODEL's folder, the current one) and ``_HOOKCLI_ENV`` put back at the end."""
    if _CLI_PROCESS:  # the model's threads and atexit handlers may still import from it
        yield
        return
    path = list(sys.path)
    env = {key: os.environ.get(key) for key in _HOOKCLI_ENV}
    try:
        yield
    finally:
        sys.path[:] = path
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _started() -> None:
    """torch imported before the command body (so model code runs after it), its failure
    said as hookcli's own: "hookcli could not start", never the model's fault. The
    guarding parent is told both steps (hookcli/exitguard.py ``stage``)."""
    from hookcli import exitguard
    from hookcli.errors import ResourceError, RunError

    if "torch" not in sys.modules:
        exitguard.stage("torch")
        try:
            import torch  # noqa: F401
        except (Exception, SystemExit) as err:  # ImportError, OSError, MemoryError ...
            why = first_line(err)
            memory = is_oom(err) or any(
                m in why.lower() for m in ("failed to map segment", "cannot allocate memory")
            )
            line, code = exitguard.not_started(f"importing torch failed ({why})", memory)
            raise (ResourceError if code == EXIT_RESOURCE else RunError)(line) from err
    exitguard.stage("model")


def _outcome(fn: Callable[[], int], debug: bool) -> int:
    from hookcli.warnsummary import summarised_warnings

    try:
        with summarised_warnings(debug):  # a failure drops them: its line is what to read
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
        via = getattr(err, "via", "sys.exit")
        return _fail(f"the model called {via}({err.code!r}) while running", EXIT_RUN)
    except Exception as err:  # a bug in hookcli or torch: still one line, never a traceback
        if _Signals.received is not None:
            return _interrupted()  # a signal broke a library call (torch.save) midway
        if debug:
            traceback.print_exc()
        if is_oom(err):
            return _fail(f"out of memory: {first_line(oom_cause(err))}", EXIT_RESOURCE)
        from hookcli.failure import raised_at

        at = raised_at(err)
        hint = "" if debug else " (run with --debug for the traceback)"
        if at is not None and not at.hookcli:  # the model's code, where hookcli did not wrap it
            return _fail(f"the model raised: {first_line(err)}{at.suffix()}", EXIT_RUN)
        where = at.suffix() if at is not None else ""
        return _fail(
            f"internal error in hookcli (not the model's fault): {first_line(err)}{where}{hint}",
            EXIT_INTERNAL,
        )


def command(name: str, fn: Callable[..., int], help_text: str | None = None) -> None:
    """Register a command body (which returns an exit status) under ``name``."""

    @functools.wraps(fn)
    def wrapper(**kwargs: Any) -> None:
        from typer._click.globals import get_current_context

        from hookcli.config import blamed
        from hookcli.exitguard import runs_model

        ctx = get_current_context(silent=True)

        def body() -> int:
            from hookcli import gradmode
            from hookcli.amp import requested

            with blamed(ctx):  # an option's value from [tool.hookcli]: the error names it
                options = preflight(kwargs, name)
                options, amp = _amp_option(options)
                enable_grad = bool(options.pop("enable_grad", False))
                options, build = _pop_build_options(options)
            if runs_model(name):
                _started()  # torch in, before any model code
            from hookcli.loading import requested as build_requested

            with (
                blamed(ctx),
                requested(amp),
                gradmode.requested(enable_grad),
                build_requested(**build),
            ):
                return fn(**_kwargs_file(options))

        code = execute(body, bool(kwargs.get("debug")))
        if code:
            raise typer.Exit(code)

    _add_kwargs_file(wrapper)
    _add_amp(wrapper, name)
    _add_build_options(wrapper)
    from hookcli.helpfmt import PanelCommand

    settings = getattr(fn, "context_settings", None)  # watch: COMMAND keeps its own flags
    app.command(name, help=help_text or fn.__doc__, cls=PanelCommand, context_settings=settings)(
        wrapper
    )


def _add_options(wrapper: Any, after: str, *added: tuple[str, Any]) -> None:
    """Give ``wrapper`` the parameters ``added`` (name, Typer option type; default None), in
    that order, right after its parameter ``after``."""
    import inspect

    sig = inspect.signature(wrapper)
    params = []
    for p in sig.parameters.values():
        params.append(p)
        if p.name == after:
            kind = p.KEYWORD_ONLY if p.kind is p.KEYWORD_ONLY else p.kind
            params += [inspect.Parameter(n, kind, default=None, annotation=a) for n, a in added]
    wrapper.__signature__ = sig.replace(parameters=params)
    wrapper.__annotations__ = {**getattr(wrapper, "__annotations__", {}), **dict(added)}


def _add_kwargs_file(wrapper: Any) -> None:
    """Every command with ``-k`` also takes ``--kwargs-file FILE``: its items come before
    the ``-k`` ones (so the command line wins), each naming the file in messages."""
    import inspect

    from hookcli.cliopts import ConfigClassOpt, KwargsFileOpt

    sig = inspect.signature(wrapper)
    if "kwargs" in sig.parameters and "kwargs_file" not in sig.parameters:
        added = ("kwargs_file", KwargsFileOpt), ("config_class", ConfigClassOpt)
        _add_options(wrapper, "kwargs", *added)


# The commands that run the model's forward take --amp (params and registrations build
# it only).
_AMP_COMMANDS = frozenset(
    ("inspect", "grads", "buffers", "trace", "stats", "features", "cost", "profile", "ablate")
)


def _add_amp(wrapper: Any, name: str) -> None:
    """``--amp bf16|fp16`` after ``--dtype`` on every command that runs the model, and
    ``--enable-grad`` after it; the CLI holds them for the command
    (``hookcli.amp.requested``, ``hookcli.gradmode.requested``), the run applies them."""
    import inspect

    from hookcli.cliopts import AmpOpt, EnableGradOpt

    sig = inspect.signature(wrapper)
    if name in _AMP_COMMANDS and "dtype" in sig.parameters and "amp" not in sig.parameters:
        _add_options(wrapper, "dtype", ("amp", AmpOpt), ("enable_grad", EnableGradOpt))


_BUILD_OPTIONS = ("model_parallel", "part")  # held by hookcli.loading.requested


def _add_build_options(wrapper: Any) -> None:
    """``--model-parallel N`` and ``--part NAME`` after ``--weights`` on every command
    that builds a MODEL; ``hookcli.loading.requested`` holds them for its build."""
    import inspect

    from hookcli.cliopts import ModelParallelOpt, PartOpt

    sig = inspect.signature(wrapper)
    if "weights" in sig.parameters and "part" not in sig.parameters:
        _add_options(wrapper, "weights", ("model_parallel", ModelParallelOpt), ("part", PartOpt))


def _pop_build_options(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The options less ``--model-parallel`` and ``--part``, and those two."""
    build = {k: options[k] for k in _BUILD_OPTIONS if k in options}
    return {k: v for k, v in options.items() if k not in _BUILD_OPTIONS}, build


def _amp_option(options: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The options less ``amp``, and ``--amp`` checked (exit 2 before anything loads)."""
    if "amp" not in options:
        return options, None
    from hookcli.amp import CHOICES

    options = dict(options)
    amp = options.pop("amp")
    if amp is not None and amp not in CHOICES:
        raise UsageError(f"--amp must be one of {', '.join(CHOICES)}, got {amp!r}")
    return options, amp


def _kwargs_file(options: dict[str, Any]) -> dict[str, Any]:
    """``--kwargs-file FILE`` read into the ``-k`` items (a bad file: exit 2 naming it);
    ``--config-class`` after them (``hookcli.kwargs.config_class_items``)."""
    if "kwargs_file" not in options:
        return options
    from hookcli.kwargs import config_class_items, with_file

    options = dict(options)
    path = options.pop("kwargs_file")
    classes = config_class_items(options.pop("config_class", None))
    options["kwargs"] = with_file(options.get("kwargs"), path)
    if classes:
        options["kwargs"] = [*(options["kwargs"] or []), *classes]
    return options


def _register() -> None:
    from hookcli.commands import COMMANDS

    for name, fn in COMMANDS:
        command(name, fn)


_register()


def main(herald: Callable[[int], None] | None = None) -> None:
    """Run the command line in this process (``hookcli.entry.main``, the console script,
    forks first where hookcli/exitguard.py says so and calls this in the child, with the
    herald: the one function that can tell the guarding parent a pass)."""
    # Importing torch and torchvision leaves millions of objects that every gen-2
    # collection would rescan. Collection waits until the model is built; then
    # that heap is frozen out of later collections (pipeline.build_model).
    global _CLI_PROCESS
    gc.disable()
    _CLI_PROCESS = True
    _install_signal_handlers()  # a signal outside a command: the one line, at once
    _route_fd1_to_stderr()
    _ExitGuard.install()  # until the process ends: atexit handlers of the model included
    import atexit

    atexit.register(_ExitGuard.last_word)  # registered first, so it runs last
    try:
        app(prog_name="hookcli")
        code: object = 0
    except SystemExit as done:
        if done.code in _SIGNAL_EXITS:
            # Interrupted: the line is printed and the model restored. Leave without
            # flushing the rest of the report into a pipe nobody may read any more.
            sys.stderr.flush()
            _end(int(done.code))
        code = done.code
    finally:
        gc.unfreeze()  # an ordinary shutdown finalizes everything as usual
    _leave(code, herald)


def _leave(code: object, herald: Callable[[int], None] | None = None) -> None:
    """End the process; once torch is loaded, without the interpreter's finalization.

    Finalizing a process that imported torch takes about 0.6 s and raises its peak RSS
    by about 120 MB (torch's own teardown), after the report is out and every file
    written. So hookcli runs the ``atexit`` handlers (torch's, the model's), flushes
    its streams and leaves with ``os._exit``. An ordinary exit is kept when nothing
    of torch was loaded (``--help``), when another non-daemon thread is still running
    (the interpreter would wait for it), while a process group is initialized, and
    when ``HOOKCLI_FULL_EXIT=1`` is set.
    """
    from hookcli.exitguard import announce

    if not isinstance(code, int) or not _fast_exit_ok():
        if isinstance(code, int):
            code = _ExitGuard.failure(code)
            _ExitGuard.final = code
        (herald or announce)(0 if code is None else code if isinstance(code, int) else 1)
        raise SystemExit(code)
    import atexit

    code = _ExitGuard.failure(code)
    _ExitGuard.final = code
    atexit._run_exitfuncs()
    code = _ExitGuard.failure(code)  # an atexit handler of the model that called os._exit
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):  # a reader that left: nothing more to say
            if stream is not None:
                stream.flush()
    _end(code, herald)


def _fast_exit_ok() -> bool:
    if "torch" not in sys.modules or os.environ.get("HOOKCLI_FULL_EXIT", "") not in ("", "0"):
        return False
    main_thread = threading.main_thread()
    if any(t is not main_thread and not t.daemon and t.is_alive() for t in threading.enumerate()):
        return False
    dist = sys.modules.get("torch.distributed")
    return not (dist is not None and dist.is_available() and dist.is_initialized())


__all__ = ["app", "execute", "main", "preflight"]
