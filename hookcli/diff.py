"""Two hookcli JSON reports -> their differences. Pure functions; never imports torch.

Rows of ``layers`` (and of any other list of rows a command reports: ``params``,
``buffers``, ``events``...) are matched by ``name`` and ``call`` (``seq`` for
event lists, the position otherwise). Structure (types, shapes, parameter
counts, rows added or removed) is compared exactly; numbers in value columns
within ``|new - old| <= atol + rtol * |old|``, the rule of
``torch.testing.assert_close`` with the old report as the expected value.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from hookcli.errors import UsageError
from hookcli.fmt import fmt_bytes
from hookcli.report import SCHEMA, CheckResult, Report, Row

SCHEMA_PREFIX = "hookcli.report/"

# torch.testing.assert_close's defaults per dtype: (rtol, atol). Integers compare exactly.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1.3e-6, 1e-5),
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "float64": (1e-7, 1e-7),
}

# Keys whose change is a change of the model's structure, compared exactly.
STRUCTURE_KEYS = frozenset(
    {
        "type",
        "depth",
        "input_shapes",
        "output_shapes",
        "shapes",
        "shape",
        "params",
        "own_params",
        "trainable_params",
        "non_trainable_params",
        "numel",
        "dtype",
        "requires_grad",
        "persistent",
        "module",
        "shared_with",
        "class",
    }
)
# Keys that say how the run was set up rather than what it found.
_REPORT_KEYS = ("schema", "command", "model", "settings", "inputs", "checks", "error")

SETTING, STRUCTURE, VALUE = "setting", "structure", "value"


@dataclass(frozen=True)
class Difference:
    """One key of one row (or of the settings or totals) that differs."""

    kind: str  # setting | structure | value
    where: str  # settings | model | inputs | layers | totals | checks | report | a list name
    item: str  # the row ("layer1.0.conv1", "fc#1"); "" for a report-level key
    key: str  # the column, dotted for nested values ("before.mean"); "" for a whole row
    change: str  # added | removed | changed
    old: Any = None
    new: Any = None
    abs_diff: float | None = None
    rel_diff: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Every field, in order (the values as they are, not copied)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def label(self) -> str:
        """``layers fc2 grad_norm``: where, row and key, for one-line messages."""
        parts = [self.where, self.item, self.key]
        return " ".join(p for p in parts if p)


@dataclass
class KeyStats:
    """How the numbers of one value key compared (assert_close-style summary)."""

    compared: int = 0
    mismatched: int = 0
    max_abs: float = 0.0
    max_abs_at: str = ""
    max_rel: float = 0.0
    max_rel_at: str = ""


@dataclass(frozen=True)
class Tolerance:
    """rtol/atol for floats and for integers (integers: exact unless given)."""

    rtol: float
    atol: float
    int_rtol: float = 0.0
    int_atol: float = 0.0


@dataclass(frozen=True)
class DiffResult:
    """Everything ``diff`` found, with the tolerances it used."""

    command: str
    old_model: Mapping[str, Any]
    new_model: Mapping[str, Any]
    dtype: str
    tolerance: Tolerance
    only: tuple[str, ...]
    ignore: tuple[str, ...]
    differences: tuple[Difference, ...]
    uncompared_settings: tuple[Difference, ...] = ()  # settings differing in keys left out
    key_stats: Mapping[str, KeyStats] = field(default_factory=dict)

    @property
    def same(self) -> bool:
        return not self.differences

    def count(self, kind: str) -> int:
        return sum(1 for d in self.differences if d.kind == kind)


# -- reading ---------------------------------------------------------------------------


# A report larger than this is not read (``/dev/zero`` would fill the memory first).
MAX_REPORT_BYTES = 256 << 20


def _too_big(label: str) -> UsageError:
    return UsageError(
        f"{label} is larger than {fmt_bytes(MAX_REPORT_BYTES, binary=True)}: not a hookcli report "
        "(reports of the largest models are a few MiB)"
    )


def _read_bounded(path: Path, label: str) -> str:
    """A regular file's text, at most MAX_REPORT_BYTES; a folder, pipe or device is refused."""
    import os
    import stat

    st = os.stat(path)
    if stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{label}: is a folder; give a JSON report file")
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(
            f"{label}: not a regular file (a device, pipe or socket); give a JSON report "
            "file, or - for stdin"
        )
    if st.st_size > MAX_REPORT_BYTES:
        raise _too_big(label)
    with path.open("rb") as f:
        data = f.read(MAX_REPORT_BYTES + 1)
    if len(data) > MAX_REPORT_BYTES:
        raise _too_big(label)
    return data.decode("utf-8")


def read_stdin(stream: Any) -> str:
    """stdin's text, at most MAX_REPORT_BYTES (``< /dev/zero`` is refused, not read forever)."""
    raw = getattr(stream, "buffer", None)
    data = raw.read(MAX_REPORT_BYTES + 1) if raw is not None else stream.read(MAX_REPORT_BYTES + 1)
    if len(data) > MAX_REPORT_BYTES:
        raise _too_big("stdin")
    return data.decode("utf-8") if isinstance(data, bytes) else data


def load_report(source: str | Path, stdin_text: str | None = None) -> dict[str, Any]:
    """Read a report from a file, or from ``stdin_text`` when ``source`` is ``-``."""
    label = str(source)
    if label == "-":
        text = stdin_text if stdin_text is not None else ""
        label = "stdin"
    else:
        path = Path(source)
        try:
            text = _read_bounded(path, label)
        except FileNotFoundError:
            raise UsageError(f"{label}: no such file") from None
        except (OSError, UnicodeDecodeError) as err:
            raise UsageError(f"cannot read {label}: {err}") from err
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(
            f"{label} is not a hookcli JSON report: invalid JSON at line {err.lineno} "
            f"column {err.colno} ({err.msg}); write reports with --format json"
        ) from None
    except RecursionError:
        raise _malformed(label, f"lists and objects nest more than {MAX_NESTING} deep") from None
    except ValueError:  # the one ValueError json.loads lets through: int()'s digit limit
        raise _malformed(label, "a number in it has too many digits to read") from None
    return check_report(data, label)


def check_report(data: Any, label: str) -> dict[str, Any]:
    """A parsed JSON value that is a hookcli report, or UsageError saying why not.

    Beyond ``schema`` and ``command``, the keys the shipped schema (hookcli/schema) types
    at the top level must have those types (``layers`` a list of objects, ``totals`` an
    object...), and the values diff reads inside them too; nothing nests deeper than
    ``MAX_NESTING``. Keys may be missing (a report trimmed by hand still compares);
    jsonschema is not needed.
    """
    if not isinstance(data, dict) or "schema" not in data or "command" not in data:
        raise UsageError(
            f"{label} is not a hookcli report (no 'schema' and 'command' keys); "
            "write reports with --format json"
        )
    schema = data["schema"]
    if not isinstance(schema, str) or not schema.startswith(SCHEMA_PREFIX):
        raise UsageError(f"{label} is not a hookcli report: schema {_shown(schema)}")
    where = _too_deep(data)
    if where is not None:
        raise _malformed(label, f"lists and objects nest more than {MAX_NESTING} deep in {where}")
    for key, (kind, items) in _top_level_types().items():
        if key in data:
            _expect(data[key], kind, key, label)
            if kind == "array" and items == "object":
                for i, row in enumerate(data[key]):
                    _expect(row, "object", f"{key}[{i}]", label)
    settings = data.get("settings") or {}
    if "dtype" in settings and settings["dtype"] is not None:
        _expect(settings["dtype"], "string", "settings.dtype", label)
    for i, item in enumerate(data.get("inputs") or ()):
        if "shape" in item:
            _expect(item["shape"], "array", f"inputs[{i}].shape", label)
    for i, check in enumerate(data.get("checks") or ()):
        if "name" in check:
            _expect(check["name"], "string", f"checks[{i}].name", label)
    return data


# Levels of nested lists and objects a report may hold: hookcli writes fewer than 10
# (report, list, row, shapes, shape); the comparison recurses once per level.
MAX_NESTING = 100

_PY_TYPES: dict[str, type | tuple[type, ...]] = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "integer": int,
    "number": (int, float),
}
_JSON_NAMES = {dict: "an object", list: "a list", str: "a string", bool: "true or false"}


def _malformed(label: str, what: str) -> UsageError:
    return UsageError(f"{label} is not a well-formed hookcli report: {what}")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _json_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return "a number"
    return _JSON_NAMES.get(type(value), type(value).__name__)


def _expect(value: Any, kind: str, where: str, label: str) -> None:
    """UsageError unless ``value`` has the JSON type ``kind`` (a bool is no number)."""
    ok = isinstance(value, _PY_TYPES[kind]) and not (
        isinstance(value, bool) and kind in ("integer", "number")
    )
    if not ok:
        wanted = {"object": "an object", "array": "a list"}.get(kind, f"a {kind}")
        raise _malformed(label, f"{where!r} is {_json_name(value)}, not {wanted}")


def _too_deep(data: Any) -> str | None:
    """Where lists and objects nest past MAX_NESTING (a top-level key); None if nowhere.

    Level by level, never recursively: the check must not fail as it guards."""
    if not isinstance(data, Mapping):
        return None if _depth(data) <= MAX_NESTING else "the report"
    for key, value in data.items():
        if _depth(value) >= MAX_NESTING:
            return repr(str(key))
    return None


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _depth(value: Any) -> int:
    """Levels of lists and objects in ``value``, counted to MAX_NESTING + 1 at most."""
    containers = (Mapping, list, tuple)
    scalars = _SCALARS  # the common case, tested first: isinstance on Mapping is slow
    level = [value] if isinstance(value, containers) else []
    depth = 0
    while level and depth <= MAX_NESTING:
        depth += 1
        below: list[Any] = []
        for v in level:
            items = v.values() if isinstance(v, Mapping) else v
            below.extend(x for x in items if type(x) not in scalars and isinstance(x, containers))
        level = below
    return depth


@functools.cache
def _top_level_types() -> dict[str, tuple[str, str | None]]:
    """Each top-level key the shipped schema types: (its JSON type, a list's item type)."""
    from hookcli.schema import load

    schema = load()
    defs = schema.get("$defs", {})

    def resolve(node: Any) -> dict[str, Any]:
        while isinstance(node, dict) and isinstance(node.get("$ref"), str):
            node = defs.get(node["$ref"].rsplit("/", 1)[-1])
        return node if isinstance(node, dict) else {}

    out: dict[str, tuple[str, str | None]] = {}
    for key, spec in schema.get("properties", {}).items():
        kind = resolve(spec).get("type")
        if isinstance(kind, str) and kind in _PY_TYPES:
            items = resolve(resolve(spec).get("items")).get("type") if kind == "array" else None
            out[key] = (kind, items if isinstance(items, str) else None)
    return out


def _compatible(old: Mapping[str, Any], new: Mapping[str, Any], labels: tuple[str, str]) -> None:
    if old["schema"] != new["schema"]:
        raise UsageError(
            f"the reports have different schema versions: {old['schema']} ({labels[0]}) and "
            f"{new['schema']} ({labels[1]}); regenerate the older one"
        )
    if old["command"] != new["command"]:
        raise UsageError(
            f"the reports come from different commands: {old['command']} ({labels[0]}) and "
            f"{new['command']} ({labels[1]}); diff compares reports of the same command"
        )


# -- comparing values -----------------------------------------------------------------


def _as_number(value: Any) -> float | int | None:
    """A JSON number, or one of the strings report.jsonable writes for non-finite floats."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if value in ("nan", "inf", "-inf"):
        return float(value)
    return None


def tolerance_for(dtypes: Iterable[Any], rtol: float | None, atol: float | None) -> Tolerance:
    """The per-dtype defaults (the looser of two dtypes), overridden by rtol/atol if given."""
    known = [TOLERANCES[d] for d in dtypes if isinstance(d, str) and d in TOLERANCES]
    base = (max(t[0] for t in known), max(t[1] for t in known)) if known else TOLERANCES["float32"]
    return Tolerance(
        rtol=base[0] if rtol is None else rtol,
        atol=base[1] if atol is None else atol,
        int_rtol=0.0 if rtol is None else rtol,
        int_atol=0.0 if atol is None else atol,
    )


def compare_numbers(
    old: float | int, new: float | int, tol: Tolerance
) -> tuple[bool, float, float]:
    """(within tolerance, |new - old|, |new - old| / |old|); NaN equals NaN."""
    a, b = float(old), float(new)
    if math.isnan(a) or math.isnan(b):
        same = math.isnan(a) and math.isnan(b)
        return same, (0.0 if same else math.nan), (0.0 if same else math.nan)
    if math.isinf(a) or math.isinf(b):
        same = a == b
        return same, (0.0 if same else math.inf), (0.0 if same else math.inf)
    diff = abs(b - a)
    rel = diff / abs(a) if a != 0 else (0.0 if diff == 0 else math.inf)
    exact = isinstance(old, int) and isinstance(new, int)
    rtol, atol = (tol.int_rtol, tol.int_atol) if exact else (tol.rtol, tol.atol)
    return diff <= atol + rtol * abs(a), diff, rel


class _Selector:
    """--only / --ignore: fnmatch patterns over a key's top-level name or its dotted path."""

    def __init__(self, only: Sequence[str], ignore: Sequence[str]) -> None:
        self.only = tuple(only)
        self.ignore = tuple(ignore)
        self.used: set[str] = set()

    @staticmethod
    def _match(pattern: str, path: str) -> bool:
        top = path.split(".", 1)[0].split("[", 1)[0]
        return (
            fnmatch.fnmatchcase(top, pattern)
            or fnmatch.fnmatchcase(path, pattern)
            or path.startswith(pattern + ".")
        )

    def wants(self, path: str) -> bool:
        for p in self.only:
            if self._match(p, path):
                self.used.add(p)
        if self.only and not any(self._match(p, path) for p in self.only):
            return False
        return not any(self._match(p, path) for p in self.ignore)


class _Differ:
    """Walks two reports and collects Differences (one instance per diff)."""

    def __init__(self, tol: Tolerance, select: _Selector) -> None:
        self.tol = tol
        self.select = select
        self.out: list[Difference] = []
        self.uncompared: list[Difference] = []
        self.stats: dict[str, KeyStats] = {}

    def add(self, d: Difference) -> None:
        self.out.append(d)

    def value(self, where: str, item: str, key: str, old: Any, new: Any, kind: str) -> None:
        """Compare one value (recursing into dicts and equal-length number lists)."""
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            for k in _union(old, new):
                sub = f"{key}.{k}"
                if not self.select.wants(sub):
                    continue
                if k not in old or k not in new:
                    change = "added" if k not in old else "removed"
                    self.add(Difference(kind, where, item, sub, change, old.get(k), new.get(k)))
                else:
                    self.value(where, item, sub, old[k], new[k], kind)
            return
        a, b = _as_number(old), _as_number(new)
        if a is not None and b is not None and kind != STRUCTURE:
            same, diff, rel = compare_numbers(a, b, self.tol)
            top = key.split(".", 1)[0].split("[", 1)[0]
            stats = self.stats.setdefault(top, KeyStats())
            stats.compared += 1
            at = (item or where) + ("" if key == top else f" {key}")
            if diff > stats.max_abs or (math.isnan(diff) and not math.isnan(stats.max_abs)):
                stats.max_abs, stats.max_abs_at = diff, at
            if rel > stats.max_rel or (math.isnan(rel) and not math.isnan(stats.max_rel)):
                stats.max_rel, stats.max_rel_at = rel, at
            if not same:
                stats.mismatched += 1
                self.add(Difference(kind, where, item, key, "changed", old, new, diff, rel))
            return
        if (
            kind != STRUCTURE
            and isinstance(old, list)
            and isinstance(new, list)
            and len(old) == len(new)
            and old
            and all(_as_number(v) is not None for v in (*old, *new))
        ):
            for i, (x, y) in enumerate(zip(old, new, strict=True)):
                self.value(where, item, f"{key}[{i}]", x, y, kind)
            return
        if old != new:
            self.add(Difference(kind, where, item, key, "changed", old, new))

    def mapping(
        self, where: str, item: str, old: Mapping[str, Any], new: Mapping[str, Any]
    ) -> None:
        """Compare the keys of two dicts (a row, the totals)."""
        for k in _union(old, new):
            if not self.select.wants(k):
                continue
            kind = STRUCTURE if k in STRUCTURE_KEYS else VALUE
            if k not in old or k not in new:
                change = "added" if k not in old else "removed"
                self.add(Difference(kind, where, item, k, change, old.get(k), new.get(k)))
            else:
                self.value(where, item, k, old[k], new[k], kind)

    def rows(self, where: str, old: Sequence[Any], new: Sequence[Any]) -> None:
        """Match rows by identity; added/removed rows, order changes, then each column."""
        old_rows, new_rows = _keyed(old), _keyed(new)
        for key, row in new_rows.items():
            if key not in old_rows:
                self.add(Difference(STRUCTURE, where, key, "", "added", None, _row_type(row)))
        for key, row in old_rows.items():
            if key not in new_rows:
                self.add(Difference(STRUCTURE, where, key, "", "removed", _row_type(row), None))
        common_old = [k for k in old_rows if k in new_rows]
        common_new = [k for k in new_rows if k in old_rows]
        if common_old != common_new:
            i = next(
                i for i, (x, y) in enumerate(zip(common_old, common_new, strict=True)) if x != y
            )
            self.add(
                Difference(
                    STRUCTURE,
                    where,
                    f"position {i}",
                    "(order)",
                    "changed",
                    common_old[i],
                    common_new[i],
                )
            )
        for key in common_old:
            a, b = old_rows[key], new_rows[key]
            if isinstance(a, Mapping) and isinstance(b, Mapping):
                self.mapping(where, key, a, b)
            else:
                self.value(where, key, "", a, b, VALUE)

    def settings(self, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        """Settings, model and inputs: said first; left-out keys are noted, not counted."""
        pairs: list[tuple[str, str, Any, Any, str]] = []
        for k in _union(old.get("settings") or {}, new.get("settings") or {}):
            a, b = (old.get("settings") or {}).get(k), (new.get("settings") or {}).get(k)
            if k == "weights" and _same_weights(a, b):
                if a != b:  # one checkpoint at another path: noted, not a difference
                    self.uncompared.append(
                        Difference(SETTING, "settings", "", k, "changed", _path(a), _path(b))
                    )
                continue
            if k in ("kwargs", "weights") and isinstance(a, Mapping) and isinstance(b, Mapping):
                for key, fa, fb in _flat_pairs(a, b, k):
                    pairs.append(("settings", key, fa, fb, SETTING))
                continue
            pairs.append(("settings", k, a, b, SETTING))
        om, nm = old.get("model") or {}, new.get("model") or {}
        pairs.append(("model", "spec", om.get("spec"), nm.get("spec"), SETTING))
        pairs.append(("model", "class", om.get("class"), nm.get("class"), STRUCTURE))
        pairs.append(
            ("inputs", "inputs", _inputs_text(old.get("inputs")), _inputs_text(new.get("inputs")),
             SETTING)
        )  # fmt: skip
        for where, key, a, b, kind in pairs:
            if a == b:
                continue
            d = Difference(kind, where, "", key, "changed", a, b)
            if self.select.wants(key):
                self.add(d)
            else:
                self.uncompared.append(d)

    def checks(self, old: Sequence[Any], new: Sequence[Any]) -> None:
        """Checks matched by name: a check that passed and now fails (or the reverse)."""
        if not self.select.wants("checks"):
            return
        a = {c.get("name"): c for c in old if isinstance(c, Mapping)}
        b = {c.get("name"): c for c in new if isinstance(c, Mapping)}
        for name in _union(a, b):
            if name not in a or name not in b:
                change = "added" if name not in a else "removed"
                ca, cb = a.get(name), b.get(name)
                self.add(
                    Difference(
                        STRUCTURE,
                        "checks",
                        str(name),
                        "",
                        change,
                        None if ca is None else _passed(ca),
                        None if cb is None else _passed(cb),
                    )
                )
                continue
            for k in ("passed", "layers"):
                if a[name].get(k) != b[name].get(k):
                    self.add(
                        Difference(
                            VALUE, "checks", str(name), k, "changed", a[name].get(k), b[name].get(k)
                        )
                    )


def _same_weights(a: Any, b: Any) -> bool:
    """Two ``settings.weights`` of one checkpoint (its sha256) used the same way."""
    if not isinstance(a, Mapping) or not isinstance(b, Mapping):
        return False
    sha = a.get("sha256")
    return sha is not None and sha == b.get("sha256") and a.get("config") == b.get("config")


def _path(weights: Any) -> Any:
    return weights.get("path") if isinstance(weights, Mapping) else weights


def _flat_pairs(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str) -> list[tuple]:
    """``settings.kwargs`` and ``settings.weights`` compared key by key, dotted
    (``kwargs.config.n_layer``), so the line names what changed."""
    out: list[tuple[str, Any, Any]] = []
    for k in _union(a, b):
        va, vb = a.get(k), b.get(k)
        key = f"{prefix}.{k}"
        if isinstance(va, Mapping) and isinstance(vb, Mapping):
            out += _flat_pairs(va, vb, key)
        else:
            out.append((key, va, vb))
    return out


def _passed(check: Mapping[str, Any]) -> str:
    return "pass" if check.get("passed") else "fail"


def _union(a: Iterable[Any], b: Iterable[Any]) -> list[Any]:
    return list(dict.fromkeys([*a, *b]))


def _inputs_text(inputs: Any) -> str | None:
    if not isinstance(inputs, list):
        return None
    parts = []
    for i in inputs:
        if isinstance(i, Mapping):
            shape = ", ".join(str(d) for d in i.get("shape") or [])
            parts.append(f"{i.get('name')}[{shape}] {i.get('dtype')}")
    return "; ".join(parts)


def row_label(row: Any, index: int) -> str:
    """``layer1.0.conv1``, ``(root)``, ``fc#1`` for a second call, ``seq 12``, ``[3]``."""
    if isinstance(row, Mapping):
        if isinstance(row.get("name"), str):
            name = row["name"] or "(root)"
            call = row.get("call")
            return f"{name}#{call}" if isinstance(call, int) and call else name
        if "seq" in row:
            return f"seq {row['seq']}"
    return f"[{index}]"


def _keyed(rows: Sequence[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i, row in enumerate(rows):
        label = row_label(row, i)
        key, n = label, 1
        while key in out:  # two rows with one name: keep both, by occurrence
            key, n = f"{label} ({n})", n + 1
        out[key] = row
    return out


def aligned_rows(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, list[list[Any]]]:
    """Per list of rows: ``[label, old index or None, new index or None]`` in the new
    report's order, a removed row after the row it followed; matched as ``diff`` matches
    them (the html page's side-by-side view)."""
    out: dict[str, list[list[Any]]] = {}
    for name in _union(_list_keys(old), _list_keys(new)):
        old_rows = old.get(name) or []
        new_rows = new.get(name) or []
        old_at = {k: i for i, k in enumerate(_keyed(old_rows))}
        new_keys = list(_keyed(new_rows))
        in_new = set(new_keys)
        removed_after: dict[str | None, list[list[Any]]] = {}
        previous: str | None = None
        for k, i in old_at.items():
            if k in in_new:
                previous = k
            else:
                removed_after.setdefault(previous, []).append([k, i, None])
        pairs = list(removed_after.get(None, []))
        for i, k in enumerate(new_keys):
            pairs.append([k, old_at.get(k), i])
            pairs.extend(removed_after.get(k, []))
        out[name] = pairs
    return out


def _row_type(row: Any) -> Any:
    return row.get("type", "row") if isinstance(row, Mapping) else "row"


def _list_keys(report: Mapping[str, Any]) -> list[str]:
    """``layers`` and every other top-level list of rows a command reports."""
    keys = []
    for k, v in report.items():
        if k in _REPORT_KEYS or not isinstance(v, list):
            continue
        keys.append(k)
    return keys


def _all_keys(report: Mapping[str, Any]) -> set[str]:
    """Every key --only could name in this report."""
    keys = {"spec", "class", "inputs", "checks", "error"}
    keys |= set(report.get("settings") or {})
    keys |= set(report.get("totals") or {})
    for k in _list_keys(report):
        for row in report[k]:
            if isinstance(row, Mapping):
                keys |= set(row)
    return keys


def parse_keys(text: str | Sequence[str] | None) -> tuple[str, ...]:
    """``grad_norm,loss`` (or a list of them) -> ('grad_norm', 'loss')."""
    if text is None:
        return ()
    parts = text.split(",") if isinstance(text, str) else [p for t in text for p in t.split(",")]
    return tuple(dict.fromkeys(p.strip() for p in parts if p.strip()))


def diff_reports(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    *,
    rtol: float | None = None,
    atol: float | None = None,
    only: Sequence[str] = (),
    ignore: Sequence[str] = (),
    labels: tuple[str, str] = ("OLD", "NEW"),
) -> DiffResult:
    """Compare two report dicts (``Report.to_dict()`` or parsed JSON): old is expected."""
    old = check_report(_plain(old, labels[0]), labels[0])
    new = check_report(_plain(new, labels[1]), labels[1])
    _compatible(old, new, labels)
    for name, value in (("--rtol", rtol), ("--atol", atol)):
        if value is not None and (not math.isfinite(value) or value < 0):
            raise UsageError(f"{name} must be a finite number >= 0, got {value}")
    only, ignore = parse_keys(only), parse_keys(ignore)
    if only:
        known = _all_keys(old) | _all_keys(new)
        unknown = [p for p in only if not any(_Selector._match(p, k) for k in known)]
        if unknown:
            raise UsageError(
                f"--only {','.join(unknown)}: no such key in the reports; keys: "
                + ", ".join(sorted(known))
            )
    dtypes = {(old.get("settings") or {}).get("dtype"), (new.get("settings") or {}).get("dtype")}
    tol = tolerance_for(dtypes, rtol, atol)
    differ = _Differ(tol, _Selector(only, ignore))
    differ.settings(old, new)
    for k in _union(_list_keys(old), _list_keys(new)):
        differ.rows(k, old.get(k) or [], new.get(k) or [])
    differ.mapping("totals", "", old.get("totals") or {}, new.get("totals") or {})
    differ.checks(old.get("checks") or [], new.get("checks") or [])
    if differ.select.wants("error") and old.get("error") != new.get("error"):
        differ.add(
            Difference(VALUE, "report", "", "error", "changed", old.get("error"), new.get("error"))
        )
    diffs = sorted(differ.out, key=lambda d: d.kind != SETTING)  # settings first, stable
    dtype_text = "/".join(sorted(d for d in dtypes if isinstance(d, str))) or "float32"
    return DiffResult(
        command=str(new["command"]),
        old_model=dict(old.get("model") or {}),
        new_model=dict(new.get("model") or {}),
        dtype=dtype_text,
        tolerance=tol,
        only=only,
        ignore=ignore,
        differences=tuple(diffs),
        uncompared_settings=tuple(differ.uncompared),
        key_stats=differ.stats,
    )


def _plain(report: Mapping[str, Any] | Report, label: str) -> Any:
    """A Report object or a dict -> plain JSON values, as a saved report would read back."""
    from hookcli.report import jsonable

    data: Mapping[str, Any]
    if isinstance(report, Report):
        data = report.to_dict()
    else:
        data = report
        where = _too_deep(data)  # before jsonable and json, which recurse
        if where is not None:
            raise _malformed(
                label, f"lists and objects nest more than {MAX_NESTING} deep in {where}"
            )
    try:
        return json.loads(json.dumps(jsonable(data)))
    except (TypeError, ValueError) as err:  # a set, a tensor, a circular reference...
        raise _malformed(label, f"it holds a value JSON cannot: {err}") from None


# -- the diff as a report -------------------------------------------------------------


def fmt_value(value: Any) -> str:
    """A cell of the Old/New columns: exact floats (shortest repr), compact lists."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(", ", ": "))
    return str(value)


def fmt_rel(value: Any) -> str:
    if value is None:
        return ""
    v = float(value)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf"
    return f"{v:.2e}" if v else "0"


def _summary_lines(result: DiffResult) -> list[str]:
    """Settings first, then an assert_close-style line per value key with mismatches."""
    lines: list[str] = []
    settings = [d for d in result.differences if d.kind == SETTING]
    if settings or result.uncompared_settings:
        parts = [f"{d.key} {fmt_value(d.old)} -> {fmt_value(d.new)}" for d in settings]
        parts += [
            f"{d.key} {fmt_value(d.old)} -> {fmt_value(d.new)} (not compared)"
            for d in result.uncompared_settings
        ]
        lines.append("The reports differ in their settings: " + "; ".join(parts))
    tol = result.tolerance
    lines.append(
        f"Tolerance: rtol {tol.rtol:g}, atol {tol.atol:g} for floats ({result.dtype}); "
        + (
            "integers exact"
            if tol.int_rtol == tol.int_atol == 0
            else f"rtol {tol.int_rtol:g}, atol {tol.int_atol:g} for integers"
        )
    )
    for key, s in result.key_stats.items():
        if not s.mismatched:
            continue
        pct = 100.0 * s.mismatched / s.compared
        lines.append(
            f"{key}: {s.mismatched} of {s.compared} values differ ({pct:.1f}%); greatest "
            f"absolute difference {fmt_rel(s.max_abs)} at {s.max_abs_at}, greatest relative "
            f"difference {fmt_rel(s.max_rel)} at {s.max_rel_at}"
        )
    return lines


def detail(result: DiffResult) -> str:
    """One line: 'same within tolerance' or how many differences of each kind."""
    if result.same:
        return "the reports are the same within tolerance"
    parts = []
    for kind, one, many in (
        (SETTING, "setting", "settings"),
        (STRUCTURE, "structural", "structural"),
        (VALUE, "value", "values"),
    ):
        n = result.count(kind)
        if n:
            parts.append(f"{n} {one if n == 1 else many}")
    n = len(result.differences)
    return f"{n} difference{'s' if n != 1 else ''} ({', '.join(parts)})"


def to_report(result: DiffResult, old_label: str, new_label: str) -> Report:
    """The diff as a Report (command ``diff``): one row per difference, and a ``same`` check."""
    rows = tuple(Row.of(d.to_dict(), {"key_cell": _key_cell(d)}) for d in result.differences)
    items = tuple(dict.fromkeys(d.item or d.where for d in result.differences))
    check = CheckResult("same", result.same, detail(result), () if result.same else items)
    tol = result.tolerance
    settings: dict[str, Any] = {
        "command": result.command,
        "old": old_label,
        "new": new_label,
        "dtype": result.dtype,
        "rtol": tol.rtol,
        "atol": tol.atol,
        "int_rtol": tol.int_rtol,
        "int_atol": tol.int_atol,
        "only": list(result.only),
        "ignore": list(result.ignore),
    }
    totals = {
        "differences": len(result.differences),
        "settings": result.count(SETTING),
        "structure": result.count(STRUCTURE),
        "values": result.count(VALUE),
        "compared_values": sum(s.compared for s in result.key_stats.values()),
    }
    return Report(
        command="diff",
        model=dict(result.new_model),
        settings=settings,
        totals=totals,
        checks=(check,),
        lists={"differences": rows},
        primary="differences",
        notes=tuple(_summary_lines(result)),
    )


def _key_cell(d: Difference) -> str:
    """The Key cell: the key, with '(added)'/'(removed)' where it is not a plain change."""
    if d.change == "changed":
        return d.key
    return f"{d.key} ({d.change})" if d.key else f"({d.change})"


def table_columns() -> list[Any]:
    """The diff table: only the differing rows, old and new side by side."""
    from hookcli.report import Column

    return [
        Column("where", "Where"),
        Column("item", "Item", lambda v: v or "-"),
        Column("key_cell", "Key"),
        Column("old", "Old", fmt_value, "right"),
        Column("new", "New", fmt_value, "right"),
        Column("rel_diff", "Rel diff", fmt_rel, "right"),
    ]


def render_markdown(report: Report) -> str:
    """The diff report as Markdown: the header, the summary lines, the differences."""
    from hookcli.render import render_markdown as plain

    return plain(report, notes=True)


def iter_messages(result: DiffResult) -> Iterator[tuple[str, str]]:
    """(title, message) per difference, for CI annotations."""
    for d in result.differences:
        title = f"hookcli diff: {d.label}"
        if d.change == "added":
            msg = f"{d.where} {d.item or d.key}: added in the new report"
        elif d.change == "removed":
            msg = f"{d.where} {d.item or d.key}: missing from the new report"
        else:
            msg = f"{d.label}: {fmt_value(d.old)} -> {fmt_value(d.new)}"
            if d.rel_diff is not None:
                tol = result.tolerance
                msg += (
                    f" (abs diff {fmt_rel(d.abs_diff)}, rel diff {fmt_rel(d.rel_diff)}; "
                    f"allowed rtol {tol.rtol:g}, atol {tol.atol:g})"
                )
        yield title, msg


__all__ = [
    "SCHEMA",
    "TOLERANCES",
    "DiffResult",
    "Difference",
    "check_report",
    "diff_reports",
    "load_report",
    "to_report",
]
