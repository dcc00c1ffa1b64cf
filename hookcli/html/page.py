"""Report -> one html page: the Jinja2 template filled from the report's own JSON.

Jinja2 is imported here only, when a page is rendered; matplotlib only by ``charts``.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import sys
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

from hookcli.fmt import fmt_bytes, fmt_norm_type, fmt_number, fmt_pct
from hookcli.report import Column, Report

# The report's lists whose rows are modules in call order (a parent before its children):
# their tree follows ``depth``; other lists with ``name`` and ``depth`` (profile's modules,
# sorted by time) are put in a tree by their dotted names.
CALL_ORDER_LISTS = ("layers",)
# Keys the tree column shows itself (the name, its call number, its depth).
TREE_KEYS = ("name", "call", "depth")
# Table columns that are not in the JSON (the table's own figures) -> the JSON key shown
# instead, and its header. The table's Params counts each tied tensor once and folds a cut
# subtree into its row; the JSON's ``params`` is each module's subtree.
JSON_COLUMNS = {
    "shown_params": ("params", "Params (subtree)"),
    "shown_trainable": ("trainable_params", "Trainable (subtree)"),
    "shown_buffers": ("buffers", "Buffers"),
    "key_cell": ("key", "Key"),
}


def script_json(text: str) -> str:
    """JSON text that cannot end the ``<script>`` element holding it, nor start a comment
    or entity there: ``<``, ``>``, ``&``, U+2028 and U+2029 as ``\\uXXXX`` escapes.

    Outside strings JSON has none of these characters, and inside a string the escape
    reads back as the same character, so ``JSON.parse`` gives the same value.
    """
    return (
        text.replace("&", "\\u0026")
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def _asset(name: str) -> str:
    return resources.files("hookcli.html").joinpath(name).read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def _environment() -> Any:
    """The Jinja2 environment: templates from the package, every value autoescaped."""
    try:
        import jinja2
    except ImportError:  # a dependency of hookcli; only a broken install lacks it
        from hookcli.errors import UsageError

        raise UsageError(
            "--format html needs jinja2: pip install jinja2 (a dependency of hookcli)"
        ) from None
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("hookcli.html", ""),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["value"] = fmt_value
    env.filters["nested"] = nested_html
    return env


def _csp_hash(script: str) -> str:
    digest = hashlib.sha256(script.encode("utf-8")).digest()
    return "sha256-" + base64.b64encode(digest).decode("ascii")


def versions() -> dict[str, str | None]:
    """hookcli's and torch's versions where the page is written (torch unimported stays so)."""
    # the package is loaded before any of its modules (an import of hookcli here would be a
    # circle through hookcli.render)
    hookcli_version = getattr(sys.modules.get("hookcli"), "__version__", None)
    torch_version: str | None = None
    torch = sys.modules.get("torch")
    if torch is not None:
        torch_version = str(getattr(torch, "__version__", "")) or None
    else:
        from importlib import metadata

        try:
            torch_version = metadata.version("torch")
        except metadata.PackageNotFoundError:
            torch_version = None
    return {"hookcli": hookcli_version, "torch": torch_version}


def fmt_value(value: Any, key: str = "") -> str:
    """A header or totals cell: numbers short, bytes also in KiB/MiB, lists joined."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        text = fmt_number(value)
        if key.endswith("bytes") and isinstance(value, int) and abs(value) >= 1024:
            text += f" ({fmt_bytes(value, binary=True)})"
        return text
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        v is None or isinstance(v, (str, int, float)) for v in value
    ):
        return ", ".join(fmt_value(v) for v in value) if value else "-"
    return json.dumps(value, separators=(", ", ": "), ensure_ascii=False)


def _flat(value: Any) -> bool:
    """A value ``fmt_value`` writes as text: a scalar, or a list of scalars."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return True
    return isinstance(value, list) and all(
        v is None or isinstance(v, (str, int, float)) for v in value
    )


def nested_html(value: Any, key: str = "", depth: int = 0) -> Any:
    """A header or totals cell as html: scalars and lists of scalars as ``fmt_value``
    writes them; a mapping as a small table of its keys; a list of mappings (watch's
    ``models``, one per model) as a table with a row each and a column per key; any
    other list as a list. Every text is escaped. Past four levels: the JSON text."""
    from markupsafe import Markup, escape

    if _flat(value) or depth > 4:
        text = fmt_value(value, key)
        exact = _exact(value)
        if exact is not None and exact != text:  # abbreviated: the exact figure on hover
            return Markup(f'<span title="{escape(exact)}">{escape(text)}</span>')
        return escape(text)
    if isinstance(value, Mapping):
        if not value:
            return escape("-")
        rows = "".join(
            f'<tr><th scope="row">{escape(str(k))}</th>'
            f"<td>{nested_html(v, str(k), depth + 1)}</td></tr>"
            for k, v in value.items()
        )
        return Markup(f'<table class="nested"><tbody>{rows}</tbody></table>')
    if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        keys = _row_keys(value)
        head = "".join(f'<th scope="col">{escape(str(k))}</th>' for k in keys)
        body = "".join(
            "<tr>"
            + "".join(
                f"<td>{nested_html(row.get(k), str(k), depth + 1) if k in row else '-'}"
                f"{_norm_of(row, k)}</td>"
                for k in keys
            )
            + "</tr>"
            for row in value
        )
        return Markup(
            f'<table class="nested"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
        )
    if isinstance(value, list):
        items = "".join(f"<li>{nested_html(v, key, depth + 1)}</li>" for v in value)
        return Markup(f'<ul class="nested">{items}</ul>')
    return escape(fmt_value(value, key))


def _norm_of(row: Mapping[str, Any], key: str) -> str:
    """Beside a watch model's grad norms where its ``grad_norm`` is of another norm
    than L2 (``norm_type``): which norm each cell is in, for the applied one is L2."""
    kind = row.get("norm_type")
    if kind is None or not key.startswith("grad_norm") or row.get(key) is None:
        return ""
    from markupsafe import escape

    if key.startswith("grad_norm_applied"):
        return " (L2)"
    return str(escape(f" ({fmt_norm_type(kind)}-norm)"))


def _exact(value: Any) -> str | None:
    """A number's exact text (the title of a cell that shows it abbreviated); None else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return str(value)


def _inputs_text(inputs: Sequence[Mapping[str, Any]]) -> list[str]:
    out = []
    for i in inputs:
        shape = i.get("shape")
        dims = "[" + ", ".join(str(d) for d in shape) + "]" if isinstance(shape, list) else ""
        out.append(f"{i.get('name', '')}{dims} {i.get('dtype') or ''}".strip())
    return out


def _row_keys(rows: Sequence[Any]) -> list[str]:
    keys: list[str] = []
    for r in rows:
        if isinstance(r, Mapping):
            for k in r:
                if k not in keys:
                    keys.append(k)
    return keys


def _lists(data: Mapping[str, Any]) -> list[str]:
    """``layers`` and every other top-level list of rows (objects), in report order."""
    fixed = ("schema", "command", "model", "settings", "inputs", "totals", "checks", "error")
    out = []
    for key, value in data.items():
        if key in fixed or not isinstance(value, list):
            continue
        if key == "layers" or all(isinstance(r, Mapping) for r in value):
            out.append(key)
    return out


def _tree_kind(name: str, rows: Sequence[Any]) -> str | None:
    """How the rows of a list nest: ``calls`` (depth, in call order), ``names`` (by their
    dotted names), or None (a flat list)."""
    keys = set(_row_keys(rows[:50]))
    if not {"name", "depth"} <= keys:
        return None
    return "calls" if name in CALL_ORDER_LISTS else "names"


def _primary(report: Report, data: Mapping[str, Any], lists: Sequence[str]) -> str:
    if report.primary in lists and (data.get(report.primary) or report.primary != "layers"):
        return report.primary
    for name in lists:
        if data.get(name):
            return name
    return report.primary if report.primary in lists else (lists[0] if lists else "layers")


def page_config(
    report: Report, data: Mapping[str, Any], columns: Sequence[Column] = ()
) -> dict[str, Any]:
    """What the page script needs besides the report: which list is the table, its
    columns (the table's, where the JSON has them), how each list nests, the origin."""
    lists = _lists(data)
    primary = _primary(report, data, lists)
    keys = _row_keys(data.get(primary) or [])
    trees = {name: _tree_kind(name, data.get(name) or []) for name in lists}
    hidden = TREE_KEYS if trees.get(primary) else ()  # the tree column shows them
    shown: list[list[str]] = []
    percent: list[str] = []  # keys the table shows as a percentage of a fraction
    for c in columns:
        key, header = JSON_COLUMNS.get(c.key, (c.key, c.header))
        if key in keys and key not in hidden and [key, header] not in shown:
            shown.append([key, header])
            if c.fmt is fmt_pct:
                percent.append(key)
    return {
        "primary": primary,
        "lists": {name: {"tree": tree} for name, tree in trees.items()},
        "columns": shown,
        "percent": percent,
        "notes": list(report.notes),
        "origin": nonfinite_origin(data),
        "versions": versions(),
    }


def nonfinite_origin(data: Mapping[str, Any]) -> str | None:
    """The row label (``log``, ``fc#1``, ``(root)``) of the first NaN/Inf, where the report
    names one: stats' ``totals.nonfinite_origin``, watch's ``totals.first_nonfinite``."""
    totals = data.get("totals") or {}
    origin = totals.get("nonfinite_origin")
    if isinstance(origin, str) and origin:
        return origin
    first = totals.get("first_nonfinite")
    if isinstance(first, Mapping) and isinstance(first.get("module"), str):
        return first["module"] or "(root)"
    return None


def render_html(
    report: Report,
    *,
    columns: Sequence[Column] = (),
    companions: Mapping[str, Mapping[str, Any]] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """The page of ``report``: its JSON embedded, the header, checks, totals, the tree table
    (``columns``: the table's columns, shown first) and the command's charts.

    ``companions``: other reports the page embeds beside it (``diff``: ``old`` and ``new``);
    ``extra``: more for the page script (``diff``: how their rows line up).
    """
    from hookcli.html.charts import sections

    text = report.to_json()
    data = json.loads(text)  # what the page parses: the header is filled from the same
    config = page_config(report, data, columns)
    if extra:
        config.update(extra)
    embedded = {"hookcli-report": script_json(text)}
    for name, other in (companions or {}).items():
        embedded[f"hookcli-{name}"] = script_json(json.dumps(other, separators=(",", ":")))
    embedded["hookcli-page"] = script_json(json.dumps(config, separators=(",", ":")))
    script = _asset("tree.js")
    settings = dict(data.get("settings") or {})
    assumptions = settings.pop("meta_assumptions", None) or []
    totals = data.get("totals") or {}
    return (
        _environment()
        .get_template("page.html.j2")
        .render(
            data=data,
            command=str(data.get("command", "")),
            model={"spec": None, "class": None, **(data.get("model") or {})},
            inputs=_inputs_text(data.get("inputs") or []),
            settings=settings,
            assumptions=assumptions if isinstance(assumptions, list) else [assumptions],
            totals=totals,
            checks=data.get("checks") or [],
            error=data.get("error"),
            notes=list(report.notes),
            versions=config["versions"],
            origin=config["origin"],
            charts=sections(data, companions or {}),
            embedded=embedded,
            css=_asset("page.css"),
            script=script,
            script_hash=_csp_hash(script),
        )
    )
