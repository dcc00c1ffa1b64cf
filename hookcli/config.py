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

``kwargs`` may be a table (``kwargs = {num_classes = 10}``, or a ``[tool.hookcli.kwargs]``
section): each entry is passed as ``-k KEY=VALUE`` with the TOML value's type kept. A
value checked only once the command runs (``--device``, ``--output``, ``--fail-on``) is
refused naming the file and the key too (``blamed``).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from hookcli.errors import UsageError, clip

# Typer ships its own copy of Click: its classes are reached by duck typing here.
Command = Any

TABLE = "hookcli"
# options whose value may be a TOML table (so [tool.hookcli.kwargs] is not a command)
TABLE_OPTIONS = ("kwargs",)
# ctx.meta key: {command: {param name: where its value came from}} for the values read
SOURCES = "hookcli.config.sources"


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
    except UnicodeDecodeError as err:  # tomllib decodes the whole file as UTF-8 first
        raise UsageError(
            f"cannot read {path}: not UTF-8 text (byte {err.object[err.start]:#04x} at "
            f"offset {err.start}); hookcli reads [tool.{TABLE}] from it "
            "(HOOKCLI_NO_CONFIG=1 skips the file)"
        ) from None
    except (OSError, ValueError) as err:  # TOMLDecodeError is a ValueError
        why = " ".join(str(err).split())
        raise UsageError(
            f"cannot read {path}: {why} (HOOKCLI_NO_CONFIG=1 skips the file)"
        ) from None
    tool = data.get("tool", {})
    if not isinstance(tool, dict):
        raise UsageError(f"{path}: tool must be a table ([tool.{TABLE}] is read from it)")
    table = tool.get(TABLE, {})
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


def _typed(param: Any, value: Any, where: str) -> None:
    """Click reads 1.5 and true as the int 1 (and true as the float 1.0); TOML tells
    them apart, so a float or a boolean for a number option is refused."""
    from typer._click.types import FloatParamType, IntParamType

    if isinstance(param.type, IntParamType) and isinstance(value, (float, bool)):
        raise UsageError(
            f"{where}: bad value {value!r}: a whole number is needed (a TOML integer, e.g. 3)"
        )
    if isinstance(param.type, FloatParamType) and isinstance(value, bool):
        raise UsageError(f"{where}: bad value {value!r}: a number is needed")


def kwargs_items(table: Mapping[str, Any], where: str) -> list[str]:
    """``kwargs = {num_classes = 10, act = "relu"}`` -> ``["num_classes=10", "act='relu'"]``:
    each value as the Python literal that ``-k`` reads back (``kwargs.parse_kwargs``),
    so a TOML string stays a string ("1" included) and a number a number. A table value
    (``config = {n_layer = 2}``) and a dotted key (``"config.n_layer" = 2``) build a config
    object as ``-k config.n_layer=2`` does. ``--kwargs-file`` is read the same way."""
    items = []
    for key, value in table.items():
        if not isinstance(key, str) or not all(p.isidentifier() for p in key.split(".")):
            raise UsageError(
                f"{where}: {key!r} is not a Python identifier (or a dotted path of them), so "
                "not a keyword argument's name"
            )
        text = repr(value)
        try:
            import ast

            same = ast.literal_eval(text) == value
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            same = False
        if not same:
            raise UsageError(
                f"{where}: {key} = {clip(str(value))}: not a value -k can pass (strings, numbers, "
                "booleans, null, arrays and tables of them are)"
            )
        items.append(f"{key}={text}")
    return items


def _raw_value(param: Any, value: Any, base: Path, where: str) -> Any:
    if param.name in TABLE_OPTIONS and isinstance(value, dict):
        return kwargs_items(value, where)
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
    _typed(param, value, where)
    if type(param.type).__name__ in ("Path", "TyperPath") and isinstance(value, str):
        return str(base / value)
    return value


def _is_section(key: str, value: Any) -> bool:
    """A ``[tool.hookcli.COMMAND]`` table, not a table-valued option (``kwargs``)."""
    return isinstance(value, dict) and key.replace("-", "_") not in TABLE_OPTIONS


def default_map(
    ctx: Any, table: Mapping[str, Any], path: Path, sources: dict[str, dict[str, str]] | None = None
) -> dict[str, Any]:
    """``[tool.hookcli]`` -> {command: {param: default}}; an unknown key is exit 2.
    ``sources`` gets, per command, where each value came from ("PATH: [tool.hookcli] KEY")."""
    group = ctx.command
    commands = {name: group.get_command(ctx, name) for name in group.list_commands(ctx)}
    shared = {k: v for k, v in table.items() if not _is_section(k, v)}
    per_command = {k: v for k, v in table.items() if _is_section(k, v)}
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
        origin: dict[str, str] = {}
        for key, value in shared.items():
            param = options.get(key.replace("-", "_"))
            if param is not None:
                where = f"{path}: [tool.{TABLE}] {key}"
                defaults[param.name] = _value(param, value, path.parent, where, ctx)
                origin[param.name] = where
        for key, value in per_command.get(name, {}).items():
            param = options.get(key.replace("-", "_"))
            if param is None:
                raise UsageError(
                    f"{path}: [tool.{TABLE}.{name}] {key}: not an option of {name}; options: "
                    + ", ".join(sorted(n.replace("_", "-") for n in options))
                )
            where = f"{path}: [tool.{TABLE}.{name}] {key}"
            defaults[param.name] = _value(param, value, path.parent, where, ctx)
            origin[param.name] = where
        if defaults:
            out[name] = defaults
        if sources is not None and origin:
            sources[name] = origin
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
        sources: dict[str, dict[str, str]] = {}
        ctx.default_map = {**(ctx.default_map or {}), **default_map(ctx, table, path, sources)}
        ctx.meta[SOURCES] = sources


_OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


@contextlib.contextmanager
def blamed(ctx: Any) -> Iterator[None]:
    """A usage error about an option whose value came from ``[tool.hookcli]`` (the first
    ``--option`` its message names) names the file and the key: "PATH: [tool.hookcli]
    device: --device cuda:7: ...". Values given on the command line are left alone."""
    try:
        yield
    except UsageError as err:
        where = _source_of(ctx, err.message)
        if where is not None:
            err.message = f"{where}: {err.message}"
            err.args = (err.message,)
        raise


def _source_of(ctx: Any, message: str) -> str | None:
    if ctx is None:
        return None
    found = _OPTION.search(message)
    sources = ctx.meta.get(SOURCES, {}).get(ctx.info_name, {})
    if found is None or not sources:
        return None
    from typer._click.core import ParameterSource

    for param in ctx.command.params:
        if found.group() in getattr(param, "opts", ()) and param.name in sources:
            if ctx.get_parameter_source(param.name) is ParameterSource.DEFAULT_MAP:
                return str(sources[param.name])
            return None
    return None
