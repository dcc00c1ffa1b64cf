"""The Typer app: parses options, calls the command, maps HookcliError to exit codes.

Only this module turns errors into exit statuses (docs/reference.md "Exit status"). torch is
imported lazily by the commands, so ``hookcli --help`` and ``--version`` stay fast.
"""

import functools
import gc
import sys
import traceback
from collections.abc import Callable
from typing import Annotated, Any

import typer

from hookcli import __version__
from hookcli.errors import EXIT_INTERRUPTED, EXIT_RESOURCE, EXIT_RUN, HookcliError, first_line

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
    print(f"hookcli: error: {message}", file=sys.stderr, flush=True)
    return code


def execute(fn: Callable[[], int], debug: bool) -> int:
    """Run a command body and turn what it raises into an exit status and one line."""
    try:
        return fn()
    except HookcliError as err:
        if debug:
            traceback.print_exc()
        return _fail(err.message, err.exit_code)
    except KeyboardInterrupt:
        print("hookcli: interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except MemoryError as err:
        if debug:
            traceback.print_exc()
        return _fail(f"out of memory: {first_line(err)}", EXIT_RESOURCE)
    except Exception as err:  # a bug in hookcli or torch: still one line, never a traceback
        if debug:
            traceback.print_exc()
        hint = "" if debug else " (run with --debug for the traceback)"
        return _fail(f"internal error: {first_line(err)}{hint}", EXIT_RUN)


def command(name: str, fn: Callable[..., int], help_text: str | None = None) -> None:
    """Register a command body (which returns an exit status) under ``name``."""

    @functools.wraps(fn)
    def wrapper(**kwargs: Any) -> None:
        code = execute(lambda: fn(**kwargs), bool(kwargs.get("debug")))
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
    try:
        app(prog_name="hookcli")
    finally:
        gc.unfreeze()  # let interpreter shutdown finalize everything as usual


__all__ = ["app", "execute", "main"]
