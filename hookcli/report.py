"""Frozen report records and their JSON form (schema ``hookcli.report/1``, docs/reference.md)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

SCHEMA = "hookcli.report/1"

Formatter = Callable[[Any], str]


def _frozen(d: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(d or {}))


@dataclass(frozen=True)
class CheckResult:
    """One CI gate: ``name``, ``passed``, ``detail`` and the ``layers`` that failed it."""

    name: str
    passed: bool
    detail: str
    layers: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "passed": self.passed,
            "detail": self.detail,
            "layers": list(self.layers),
        }


@dataclass(frozen=True)
class Row:
    """One row: ``data`` is what JSON/CSV/Markdown carry, ``display`` is table-only."""

    data: Mapping[str, Any]
    display: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @staticmethod
    def of(data: Mapping[str, Any], display: Mapping[str, Any] | None = None) -> Row:
        return Row(_frozen(data), _frozen(display))

    @staticmethod
    def owning(data: dict[str, Any], display: dict[str, Any]) -> Row:
        """A row over dicts the caller made for it and no longer touches (no copy)."""
        return Row(MappingProxyType(data), MappingProxyType(display))

    def get(self, key: str, default: Any = None) -> Any:
        if key in self.display:
            return self.display[key]
        return self.data.get(key, default)

    def __getitem__(self, key: str) -> Any:
        """``row["grad_norm"]``: a JSON key of the row."""
        return self.data[key]

    def to_dict(self) -> dict[str, Any]:
        return dict(self.data)


@dataclass(frozen=True)
class Column:
    """A table column: the row key it shows, its header and how to format it.

    ``fmt`` None: the renderer's plain text (``hookcli.render.fmt_text``)."""

    key: str
    header: str
    fmt: Formatter | None = None
    align: str = "left"


# Records never import their renderer (hookcli.render imports them): render.py hands
# Report.render its entry point when it is imported, and importing hookcli imports it.
_renderer: list[Callable[[Report, str], str]] = []


def use_renderer(render: Callable[[Report, str], str]) -> None:
    """Called once by ``hookcli.render``: what ``Report.render`` turns a report into text with."""
    _renderer[:] = [render]


@dataclass(frozen=True)
class Report:
    """Everything one command found, built once, complete."""

    command: str
    model: Mapping[str, Any]
    settings: Mapping[str, Any]
    inputs: tuple[Mapping[str, Any], ...] = ()
    layers: tuple[Row, ...] = ()
    totals: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    checks: tuple[CheckResult, ...] = ()
    lists: Mapping[str, tuple[Row, ...]] = field(default_factory=lambda: MappingProxyType({}))
    primary: str = "layers"  # the list CSV/Markdown carry
    notes: tuple[str, ...] = ()  # extra header lines of the table
    error: str | None = None
    # How the table shows it: its columns and totals lines (not part of the JSON).
    columns: tuple[Column, ...] = field(default=(), compare=False, repr=False)
    table_totals: tuple[tuple[str, str], ...] = field(default=(), compare=False, repr=False)
    # Whether Markdown lists the notes under its heading, as the table prints them.
    markdown_notes: ClassVar[bool] = False

    @property
    def failed_checks(self) -> tuple[CheckResult, ...]:
        return tuple(c for c in self.checks if not c.passed)

    @property
    def passed(self) -> bool:
        """Every check passed and the model ran to the end."""
        return not self.failed_checks and self.error is None

    def render(self, format: str = "table") -> str:
        """The report as the CLI prints it: table, json, csv or markdown."""
        return _renderer[0](self, format)

    def rows(self, name: str | None = None) -> tuple[Row, ...]:
        """The rows of ``layers`` or of a command list."""
        key = name or self.primary
        return self.layers if key == "layers" else self.lists.get(key, ())

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "command": self.command,
            "model": dict(self.model),
            "settings": dict(self.settings),
            "inputs": [dict(i) for i in self.inputs],
            "layers": [dict(r.data) for r in self.layers],
            "totals": dict(self.totals),
            "checks": [c.to_dict() for c in self.checks],
        }
        for key, rows in self.lists.items():
            out[key] = [dict(r.data) for r in rows]
        if self.error is not None:
            out["error"] = self.error
        return out

    def to_json(self) -> str:
        """Indented JSON; arrays of numbers and shapes stay on one line."""
        return dumps(self.to_dict())


def _is_compact(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(not isinstance(v, (Mapping, list, tuple)) or _is_compact(v) for v in value)
    return not isinstance(value, Mapping)


_STR = json.JSONEncoder().encode  # one encoder: json.dumps builds a new one per call


def _leaf(value: Any) -> str:
    """One JSON scalar, or a one-line array of them; non-finite floats as strings."""
    if isinstance(value, str):
        return _STR(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return float.__repr__(value)
        return '"nan"' if math.isnan(value) else ('"inf"' if value > 0 else '"-inf"')
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_leaf(v) for v in value) + "]"
    return _STR(jsonable(value))


def dumps(value: Any, level: int = 0) -> str:
    """JSON text with 2-space indentation, keeping scalar arrays on one line.

    Tuples are arrays and non-finite floats strings ("nan", "inf"), as ``jsonable``
    makes them.
    """
    pad = "  " * (level + 1)
    end = "  " * level
    if isinstance(value, Mapping):
        if not value:
            return "{}"
        items = [f"{pad}{_STR(str(k))}: {dumps(v, level + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + end + "}"
    if isinstance(value, (list, tuple)) and value and not _is_compact(value):
        return "[\n" + ",\n".join(pad + dumps(v, level + 1) for v in value) + "\n" + end + "]"
    return _leaf(value)


def jsonable(value: Any) -> Any:
    """Plain JSON values: tuples to lists, non-finite floats to strings ("nan", "inf")."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def shapes_list(shapes: Sequence[Sequence[int]]) -> list[list[int]]:
    """Shapes as JSON lists."""
    return [list(s) for s in shapes]
