"""The ``diff`` command's runner: two reports in, the differences written, the exit status.

Kept apart from hookcli/diff.py (pure comparisons, which ``ci`` and ``pipeline`` use) so
that no import circle runs through the writers. It never imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hookcli.ci import conclude
from hookcli.diff import (
    diff_reports,
    load_report,
    parse_keys,
    read_stdin,
    render_markdown,
    table_columns,
    to_report,
)
from hookcli.errors import UsageError
from hookcli.options import Format
from hookcli.pipeline import write_text
from hookcli.render import render


def run_diff(
    old: str,
    new: str,
    *,
    rtol: float | None,
    atol: float | None,
    only: str | None,
    ignore: str | None,
    out: Any,
    stdin: Any,
) -> int:
    """``hookcli diff``: load both reports (``-`` is ``stdin``), compare, write the
    differences as ``out`` says, and conclude (exit 1 when they differ)."""
    if old == "-" and new == "-":
        raise UsageError("OLD and NEW cannot both be - (stdin holds one report)")
    stdin_text = read_stdin(stdin) if "-" in (old, new) else None
    labels = (_source_label(old), _source_label(new))
    old_report, new_report = load_report(old, stdin_text), load_report(new, stdin_text)
    result = diff_reports(
        old_report,
        new_report,
        rtol=rtol,
        atol=atol,
        only=parse_keys(only),
        ignore=parse_keys(ignore),
        labels=labels,
    )
    report = to_report(result, *labels)
    if out.format is Format.MARKDOWN:
        text = render_markdown(report)  # with the summary lines, as the table has them
    elif out.format is Format.HTML:
        from hookcli.diff import aligned_rows
        from hookcli.html import render_html

        text = render_html(  # both reports embedded, side by side, rows matched as diff did
            report,
            columns=table_columns(),
            companions={"old": old_report, "new": new_report},
            extra={"diff": {"lists": aligned_rows(old_report, new_report)}},
        )
    else:
        text = render(report, out.format, table_columns(), ())
    write_text(text, out)
    return conclude(report, out, result)


def _source_label(source: str) -> str:
    return "stdin" if source == "-" else str(Path(source))
