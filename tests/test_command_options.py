"""Each command's options are written once: ``cliopts.forwards`` makes the Typer signature
from the groups a command names and passes what Typer parsed, by name, to the capability."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import pytest
import typer
from typer.testing import CliRunner

from hookcli import cliopts as opts

COMMANDS_DIR = Path(__file__).resolve().parent.parent / "hookcli" / "commands"


def _app(target: Any, *params: Any) -> typer.Typer:
    app = typer.Typer()

    @opts.forwards(target, *params)
    def command() -> None:
        """A command."""

    app.command()(command)
    return app


def test_forwards_passes_what_typer_parsed_by_name() -> None:
    seen: list[dict[str, Any]] = []

    def target(**options: Any) -> int:
        seen.append(options)
        return 0

    steps = opts.Param("steps", Annotated[int, typer.Option("--steps")], 3)
    where = opts.Param("where", Annotated[str | None, typer.Option("--where")], convert=Path)
    app = _app(target, (opts.MODEL, *opts.RUN), steps, where)
    result = CliRunner().invoke(app, ["m", "--dtype", "float16", "--where", "out/x"])
    assert result.exit_code == 0, result.output
    assert seen == [
        {
            "model": "m",
            "device": "cpu",
            "dtype": "float16",
            "mode": None,
            "steps": 3,
            "where": Path("out/x"),  # converted
        }
    ]
    seen.clear()
    assert CliRunner().invoke(app, ["m", "--steps", "5"]).exit_code == 0
    assert seen[0]["steps"] == 5 and seen[0]["where"] is None  # None is not converted


def test_forwards_keeps_the_order_it_is_given_and_refuses_a_name_twice() -> None:
    import inspect

    @opts.forwards(print, opts.DEBUG, (opts.MODEL, opts.SEED))
    def command() -> None:
        """Help."""

    assert list(inspect.signature(command).parameters) == ["debug", "model", "seed"]
    assert command.__doc__ == "Help."
    with pytest.raises(ValueError, match="duplicate parameter name"):
        opts.forwards(print, opts.SEED, opts.SEED)(command)


def test_a_command_imports_its_capability_only_when_it_runs() -> None:
    """The targets named by the command modules are not imported by ``--help``'s path."""
    targets = sorted(
        node.value.split(":")[0]
        for path in COMMANDS_DIR.glob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant)
        and str(node.value).startswith("hookcli.")
        and str(node.value).endswith(":cli_command")
    )
    assert len(targets) >= 13, targets
    code = (
        "import sys, hookcli.cli; "
        f"print([m for m in {targets!r} if m in sys.modules], 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[] False"


@pytest.mark.parametrize("path", sorted(COMMANDS_DIR.glob("*.py")), ids=lambda p: p.name)
def test_no_command_module_passes_its_options_on_by_hand(path: Path) -> None:
    """``f(model=model, kwargs=kwargs, weights=weights, ...)`` writes the options a second
    time: ``forwards`` passes them."""
    by_hand = [
        f"{path.name}:{node.lineno}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and sum(isinstance(k.value, ast.Name) and k.value.id == k.arg for k in node.keywords) >= 3
    ]
    assert by_hand == []
