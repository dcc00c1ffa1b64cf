"""Per-command option defaults from a ``[tool.hookcli]`` table in pyproject.toml.

    [tool.hookcli]                 # every command that has the option
    seed = 0
    [tool.hookcli.grads]           # one command; wins over the table above
    input = ["8x3x32x32"]
    fail-on = "nan,inf,unused"
    baseline = "ci/grads.json"     # paths are relative to the pyproject.toml

The nearest pyproject.toml from the current folder upwards is read (as ruff and
black do). Its values become Click's ``default_map``, so an option given on the
command line always wins. ``HOOKCLI_NO_CONFIG=1`` skips the file.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hookcli.errors import UsageError

# Typer ships its own copy of Click: its classes are reached by duck typing here.
Command = Any

TABLE = "hookcli"


def find_pyproject(start: Path) -> Path | None:
    """The nearest pyproject.toml in ``start`` or a parent folder."""
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def read_table(path: Path) -> dict[str, Any]:
    """``[tool.hookcli]`` of a pyproject.toml ({} when it has none)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            return {}
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise UsageError(f"cannot read {path}: {err}") from err
    table = data.get("tool", {}).get(TABLE, {})
    if not isinstance(table, dict):
        raise UsageError(f"{path}: [tool.{TABLE}] must be a table")
    return table


def _options(command: Command) -> dict[str, Any]:
    """The options (not the arguments) of a Click command, by parameter name."""
    return {p.name: p for p in command.params if p.param_type_name == "option" and p.name}


def _checked(param: Any, value: Any, where: str, ctx: Any) -> Any:
    """The value as Click would take it from the command line; a bad one is exit 2 naming
    the pyproject.toml and the key (not only the option it fills)."""
    from typer._click.exceptions import BadParameter
    from typer._click.exceptions import UsageError as ClickUsageError

    try:
        param.type_cast_value(ctx, value)
    except (BadParameter, ClickUsageError) as err:
        why = " ".join(str(err.format_message()).split()).rstrip(".")
        raise UsageError(f"{where}: bad value {value!r}: {why}") from None
    except (TypeError, ValueError) as err:
        raise UsageError(f"{where}: bad value {value!r}: {err}") from None
    return value


def _value(param: Any, value: Any, base: Path, where: str, ctx: Any = None) -> Any:
    """A TOML value as Click's default: lists for repeatable options, paths made absolute."""
    return _checked(param, _raw_value(param, value, base, where), where, ctx)


def _raw_value(param: Any, value: Any, base: Path, where: str) -> Any:
    if param.multiple:
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(v, (str, int, float)) for v in items):
            raise UsageError(f"{where}: expected a string or a list of strings")
        return [str(v) for v in items]
    if isinstance(value, list):  # fail-on = ["nan", "unused"] -> "nan,unused"
        if not all(isinstance(v, str) for v in value):
            raise UsageError(f"{where}: expected a string or a list of strings")
        value = ",".join(value)
    if isinstance(value, (dict, list)):
        raise UsageError(f"{where}: expected a single value")
    if type(param.type).__name__ in ("Path", "TyperPath") and isinstance(value, str):
        return str(base / value)
    return value


def default_map(ctx: Any, table: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """``[tool.hookcli]`` -> {command: {param: default}}; an unknown key is exit 2."""
    group = ctx.command
    commands = {name: group.get_command(ctx, name) for name in group.list_commands(ctx)}
    shared = {k: v for k, v in table.items() if not isinstance(v, dict)}
    per_command = {k: v for k, v in table.items() if isinstance(v, dict)}
    for name in per_command:
        if name not in commands:
            raise UsageError(
                f"{path}: [tool.{TABLE}.{name}]: no such command; commands: " + ", ".join(commands)
            )
    known_anywhere = {n for c in commands.values() if c for n in _options(c)}
    for key in shared:
        if key.replace("-", "_") not in known_anywhere:
            raise UsageError(f"{path}: [tool.{TABLE}] {key}: no command has this option")
    out: dict[str, Any] = {}
    for name, command in commands.items():
        if command is None:
            continue
        options = _options(command)
        defaults: dict[str, Any] = {}
        for key, value in shared.items():
            param = options.get(key.replace("-", "_"))
            if param is not None:
                where = f"{path}: [tool.{TABLE}] {key}"
                defaults[param.name] = _value(param, value, path.parent, where, ctx)
        for key, value in per_command.get(name, {}).items():
            param = options.get(key.replace("-", "_"))
            if param is None:
                raise UsageError(
                    f"{path}: [tool.{TABLE}.{name}] {key}: not an option of {name}; options: "
                    + ", ".join(sorted(n.replace("_", "-") for n in options))
                )
            where = f"{path}: [tool.{TABLE}.{name}] {key}"
            defaults[param.name] = _value(param, value, path.parent, where, ctx)
        if defaults:
            out[name] = defaults
    return out


def apply(ctx: Any) -> None:
    """Set the group context's default_map from the nearest pyproject.toml."""
    if os.environ.get("HOOKCLI_NO_CONFIG") or not hasattr(ctx.command, "list_commands"):
        return
    path = find_pyproject(Path.cwd())
    if path is None:
        return
    table = read_table(path)
    if table:
        ctx.default_map = {**(ctx.default_map or {}), **default_map(ctx, table, path)}
