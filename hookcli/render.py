"""Pure functions: report -> table / csv / markdown / json / html text. They never print.

tabulate is imported here only, when a table is rendered; the html page (``hookcli.html``)
only when one is asked for.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Any

from hookcli.errors import printable
from hookcli.fmt import fmt_bool as fmt_bool
from hookcli.fmt import fmt_bytes as fmt_bytes
from hookcli.fmt import fmt_count as fmt_count
from hookcli.fmt import fmt_float as fmt_float
from hookcli.fmt import fmt_int as fmt_int
from hookcli.fmt import fmt_pct as fmt_pct
from hookcli.fmt import fmt_shape as fmt_shape
from hookcli.fmt import fmt_shapes as fmt_shapes
from hookcli.fmt import fmt_text as fmt_text
from hookcli.options import Format
from hookcli.report import Column, Report, Row, jsonable, use_renderer


def name_cell(row: Row) -> str:
    """The Name cell: indented by depth; the root shows as (root)."""
    name = row.get("name") or "(root)"
    depth = int(row.get("depth") or 0)
    call = int(row.get("call") or 0)
    suffix = f" #{call}" if call else ""
    mark = row.display.get("mark", "")
    return f"{'  ' * depth}{name}{suffix}{(' ' + mark) if mark else ''}"


def render_table(
    report: Report, columns: Sequence[Column], totals: Sequence[tuple[str, str]] = ()
) -> str:
    """A human table: header lines, the rows, a totals block, the checks."""
    from tabulate import tabulate

    lines = [printable(header_line(report))]
    lines.extend(printable(n) for n in report.notes)
    lines.append("")
    rows = report.rows()
    if rows:
        # printable: a name holding a newline or ESC (add_module accepts them) stays one row
        body = [
            [
                printable(name_cell(r) if c.key == "name" else (c.fmt or fmt_text)(r.get(c.key)))
                for c in columns
            ]
            for r in rows
        ]
        lines.append(
            tabulate(
                body,
                headers=[c.header for c in columns],
                colalign=[c.align for c in columns],
                tablefmt="simple",
                disable_numparse=True,
                preserve_whitespace=True,  # the Layer column is indented by depth
            )
        )
    else:
        lines.append(f"(no {report.primary})")
    if totals:
        width = max(len(k) for k, _ in totals)
        lines.append("")
        lines.extend(f"{k + ':':<{width + 1}} {v}" for k, v in totals)
    if report.checks:
        lines.append("")
        lines.append("Checks:")
        for c in report.checks:
            status = "PASS" if c.passed else "FAIL"
            where = f" [{', '.join(c.layers)}]" if c.layers and not c.passed else ""
            lines.append(printable(f"  {status}  {c.name}: {c.detail}{where}"))
    if report.error:
        lines.append("")
        lines.append(printable(f"ERROR: {report.error}"))
    return "\n".join(lines) + "\n"


def header_line(report: Report) -> str:
    """'inspect resnet18 (ResNet) | inputs x[1, 3, 224, 224] float32 | eval | cpu'."""
    s = report.settings
    inputs = ", ".join(
        f"{i['name']}{fmt_shape(i['shape'])}"
        + (f" {i['dtype']}" if i.get("dtype") != "float32" else "")
        for i in report.inputs
    )
    title = f"hookcli {report.command}"
    if report.model.get("spec"):
        title += f" {report.model['spec']} ({report.model.get('class')})"
    parts = [title]
    if inputs:
        parts.append(f"inputs {inputs}")
    for key in ("mode", "device", "dtype", "amp"):
        if s.get(key):
            parts.append(f"{key} {s[key]}")
    if "seed" in s:
        parts.append(f"seed {s['seed']}")
    return " | ".join(parts)


def _cell(value: Any) -> Any:
    value = jsonable(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    if value is None:
        return ""
    return value


def _keys(rows: Sequence[Row]) -> list[str]:
    keys: list[str] = []
    for r in rows:
        for k in r.data:
            if k not in keys:
                keys.append(k)
    return keys


def render_csv(report: Report) -> str:
    """The primary rows as CSV with the JSON keys as header."""
    rows = report.rows()
    keys = _keys(rows)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(keys)
    for r in rows:
        writer.writerow([_cell(r.data.get(k)) for k in keys])
    return buf.getvalue()


def _md_escape(value: Any) -> str:
    return printable(str(value)).replace("|", "\\|")


def render_markdown(report: Report, notes: bool | None = None) -> str:
    """The primary rows as a GitHub Markdown table, with a heading line and the checks;
    ``notes`` (default: the report's ``markdown_notes``): the notes as a list under the
    heading."""
    rows = report.rows()
    keys = _keys(rows)
    lines = [f"**{_md_escape(header_line(report))}**", ""]
    if (report.markdown_notes if notes is None else notes) and report.notes:
        lines += [*(f"- {printable(n)}" for n in report.notes), ""]
    if keys:
        lines.append("| " + " | ".join(keys) + " |")
        lines.append("|" + "|".join("---" for _ in keys) + "|")
        for r in rows:
            lines.append("| " + " | ".join(_md_escape(_cell(r.data.get(k))) for k in keys) + " |")
    else:
        lines.append(f"_(no {report.primary})_")
    if report.checks:
        lines.append("")
        for c in report.checks:
            layers = f" ({', '.join(c.layers)})" if c.layers and not c.passed else ""
            status = "PASS" if c.passed else "FAIL"
            lines.append(f"- **{status}** `{c.name}`: {_md_escape(c.detail)}{layers}")
    return "\n".join(lines) + "\n"


def render(
    report: Report,
    fmt: Format,
    columns: Sequence[Column] = (),
    totals: Sequence[tuple[str, str]] = (),
) -> str:
    """Report -> text in the chosen format."""
    if fmt is Format.JSON:
        return report.to_json() + "\n"
    if fmt is Format.CSV:
        return render_csv(report)
    if fmt is Format.MARKDOWN:
        return render_markdown(report)
    if fmt is Format.HTML:
        from hookcli.html import render_html

        return render_html(report, columns=columns or report.columns)
    return render_table(report, columns, totals)


use_renderer(lambda report, fmt: render(report, Format(fmt), report.columns, report.table_totals))
