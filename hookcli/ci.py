"""CI surfaces, after a report is written: ``--baseline``, annotations, JUnit XML, step summary.

``conclude`` is called once per command by ``pipeline.emit`` (and by ``diff``);
the formatting functions here return strings and never print, so they are
usable from Python too. No torch import.
"""

from __future__ import annotations

import os
import re
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hookcli.errors import EXIT_CHECK_FAILED, EXIT_OK
from hookcli.options import Annotate, CIOptions, OutputOptions

if TYPE_CHECKING:
    from hookcli.diff import Difference, DiffResult
    from hookcli.report import Report

# GitHub rejects a step summary over 1 MiB; what hookcli appends keeps the file under it.
SUMMARY_LIMIT = 1024 * 1024


# -- annotations ------------------------------------------------------------------------


def _escape_data(text: str) -> str:
    """A workflow command's message: %, CR and LF escaped (as @actions/core does)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    """A workflow command's property value: also ':' and ','."""
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def workflow_command(level: str, title: str, message: str) -> str:
    """``::error title=...::message``, escaped."""
    return f"::{level} title={_escape_property(title)}::{_escape_data(message)}"


def annotation_lines(report: Report, diff: DiffResult | None = None) -> list[str]:
    """One ``::error`` line per failed check, per difference and for a failed run."""
    from hookcli.diff import iter_messages

    lines = []
    if report.error:
        lines.append(
            workflow_command("error", f"hookcli {report.command}: run failed", report.error)
        )
    if report.command != "diff":  # a diff report's one check is the differences below
        for c in report.failed_checks:
            where = f" [{', '.join(c.layers)}]" if c.layers else ""
            title = f"hookcli {report.command}: check {c.name} failed"
            lines.append(workflow_command("error", title, f"{c.detail}{where}"))
    if diff is not None:
        lines.extend(workflow_command("error", t, m) for t, m in iter_messages(diff))
    return lines


def annotate_on(option: Annotate | None) -> bool:
    """--annotate github, or GITHUB_ACTIONS=true unless --annotate none."""
    if option is not None:
        return option is Annotate.GITHUB
    return os.environ.get("GITHUB_ACTIONS") == "true"


# -- JUnit XML ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One JUnit test case: passed, failed (a check or a difference) or errored (the run)."""

    name: str
    classname: str
    failure: str | None = None  # message; None: passed
    text: str = ""
    error: bool = False


@dataclass(frozen=True)
class Suite:
    """One JUnit test suite."""

    name: str
    cases: tuple[Case, ...]
    properties: tuple[tuple[str, str], ...] = field(default=())


_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _xml_text(text: str) -> str:
    """XML 1.0 cannot carry most control characters: drop them."""
    return _XML_BAD.sub("", text)


def report_suite(report: Report) -> Suite:
    """The run (an error when the model raised) and one case per check."""
    cls = f"hookcli.{report.command}"
    cases = [
        Case("run", cls, report.error, report.error or "", error=True)
        if report.error
        else Case("run", cls)
    ]
    for c in report.checks:
        if c.passed:
            cases.append(Case(f"check: {c.name}", cls))
        else:
            text = c.detail + ("\nlayers: " + ", ".join(c.layers) if c.layers else "")
            cases.append(Case(f"check: {c.name}", cls, c.detail, text))
    spec = report.model.get("spec")
    props = tuple((str(k), str(v)) for k, v in report.settings.items())
    return Suite(f"hookcli {report.command}" + (f" {spec}" if spec else ""), tuple(cases), props)


def diff_suite(result: DiffResult, name: str) -> Suite:
    """Cases 'diff: settings', 'diff: structure' and one 'diff: KEY' per value key compared."""
    from hookcli.diff import SETTING, STRUCTURE, VALUE, fmt_value

    cls = f"hookcli.diff.{result.command}"

    def case(title: str, diffs: Sequence[Difference]) -> Case:
        if not diffs:
            return Case(title, cls)
        lines = [f"{d.label}: {d.change} {fmt_value(d.old)} -> {fmt_value(d.new)}" for d in diffs]
        n = len(diffs)
        return Case(title, cls, f"{n} difference{'s' if n != 1 else ''}", "\n".join(lines))

    by_kind = {k: [d for d in result.differences if d.kind == k] for k in (SETTING, STRUCTURE)}
    cases = [case("diff: settings", by_kind[SETTING]), case("diff: structure", by_kind[STRUCTURE])]
    values = [d for d in result.differences if d.kind == VALUE]
    keys = list(dict.fromkeys([*result.key_stats, *(_top(d.key) for d in values)]))
    for key in keys:
        cases.append(case(f"diff: {key}", [d for d in values if _top(d.key) == key]))
    tol = result.tolerance
    props = (("rtol", f"{tol.rtol:g}"), ("atol", f"{tol.atol:g}"), ("dtype", result.dtype))
    return Suite(name, tuple(cases), props)


def _top(key: str) -> str:
    return key.split(".", 1)[0].split("[", 1)[0] or "(row)"


def junit_xml(suites: Iterable[Suite]) -> str:
    """JUnit XML (the testsuites/testsuite/testcase layout GitLab, Jenkins and GitHub read)."""
    suites = list(suites)
    root = ET.Element("testsuites", name="hookcli")
    totals = {"tests": 0, "failures": 0, "errors": 0}
    for s in suites:
        failures = sum(1 for c in s.cases if c.failure is not None and not c.error)
        errors = sum(1 for c in s.cases if c.error)
        el = ET.SubElement(
            root,
            "testsuite",
            name=_xml_text(s.name),
            tests=str(len(s.cases)),
            failures=str(failures),
            errors=str(errors),
            skipped="0",
        )
        totals["tests"] += len(s.cases)
        totals["failures"] += failures
        totals["errors"] += errors
        if s.properties:
            props = ET.SubElement(el, "properties")
            for k, v in s.properties:
                ET.SubElement(props, "property", name=_xml_text(k), value=_xml_text(v))
        for c in s.cases:
            tc = ET.SubElement(
                el, "testcase", classname=_xml_text(c.classname), name=_xml_text(c.name)
            )
            if c.failure is not None:
                tag = "error" if c.error else "failure"
                sub = ET.SubElement(tc, tag, message=_xml_text(c.failure), type=tag)
                sub.text = _xml_text(c.text)
    for key, count in totals.items():
        root.set(key, str(count))
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


# -- step summary ---------------------------------------------------------------------------


def summary_markdown(report: Report, diff: DiffResult | None = None, baseline: str = "") -> str:
    """The Markdown report, with the baseline diff after it."""
    from hookcli.render import render_markdown

    if report.command == "diff":
        return _diff_markdown(report, "**Diff**: ")
    parts = [render_markdown(report)]
    if diff is not None:
        from hookcli.diff import to_report

        diff_report = to_report(diff, baseline or "baseline", "this run")
        parts.append(_diff_markdown(diff_report, f"**Baseline `{baseline}`**: "))
    return "\n".join(parts)


def _diff_markdown(diff_report: Report, head: str) -> str:
    """The verdict, the summary lines, then the table of differences (when any)."""
    from hookcli.diff import render_markdown

    body = render_markdown(diff_report).split("\n", 2)[2]  # without its header line
    return head + diff_report.checks[0].detail + "\n\n" + body


def fit_summary(text: str, budget: int) -> str:
    """``text`` cut at a line end to ``budget`` bytes (UTF-8), with a note saying so."""
    data = text.encode("utf-8")
    if len(data) <= budget:
        return text
    note = (
        f"\n\n_(cut: this report is {len(data):,} bytes and a step summary holds 1 MiB; "
        "keep the full report with `--format json --output FILE`)_\n"
    )
    room = budget - len(note.encode("utf-8"))
    if room <= 0:
        return ""
    cut = data[:room]
    end = cut.rfind(b"\n")
    cut = cut[: end + 1] if end > 0 else cut
    return cut.decode("utf-8", errors="ignore") + note


def append_step_summary(text: str, path: Path) -> None:
    """Append to $GITHUB_STEP_SUMMARY, keeping the file under 1 MiB."""
    try:
        used = path.stat().st_size if path.exists() else 0
        chunk = fit_summary(text, SUMMARY_LIMIT - used)
        if not chunk:
            _note(f"step summary {path} is full (1 MiB): report not added")
            return
        with path.open("a", encoding="utf-8") as f:
            f.write(chunk if used == 0 else "\n" + chunk)
    except OSError as err:
        _note(f"cannot write the step summary {path}: {err.strerror or err}")


# -- the end of a command ----------------------------------------------------------------


def _note(message: str) -> None:
    print(f"hookcli: {message}", file=sys.stderr, flush=True)


def write_baseline(report: Report, path: Path) -> None:
    """Save the report as JSON: the snapshot later runs are compared with."""
    from hookcli.atomic import atomic_write_text

    atomic_write_text(path, report.to_json() + "\n", "--baseline")
    _note(f"baseline written to {path}")


def compare_baseline(report: Report, ci: CIOptions) -> DiffResult:
    """Diff the report against the saved baseline and print the differences on stderr."""
    from hookcli.diff import diff_reports, load_report, table_columns, to_report
    from hookcli.render import render_table

    assert ci.baseline is not None
    old = load_report(ci.baseline)
    label = str(ci.baseline)
    result = diff_reports(
        old, report.to_dict(), rtol=ci.rtol, atol=ci.atol, labels=(label, "this run")
    )
    if result.same:
        _note(f"baseline {label}: same within tolerance")
    else:
        diff_report = to_report(result, label, "this run")
        text = render_table(diff_report, table_columns(), ())
        sys.stderr.write(f"hookcli: baseline {label} differs:\n{text}")
        sys.stderr.flush()
    return result


def write_junit(path: Path, suites: Iterable[Suite]) -> None:
    """Write the JUnit XML atomically: a test reporter never reads half a file."""
    from hookcli.atomic import atomic_write_text

    atomic_write_text(path, junit_xml(suites), "--junit")


def conclude(report: Report, out: OutputOptions, diff: DiffResult | None = None) -> int:
    """After the report is written: baseline, annotations, JUnit, step summary; exit status.

    ``diff`` is given by the ``diff`` command (whose report is the diff itself);
    report commands get theirs from ``--baseline``.
    """
    ci = out.ci
    baseline = ""
    if ci.baseline is not None:
        baseline = str(ci.baseline)
        if report.error is not None:
            _note(f"baseline {baseline} not {'written' if ci.update_baseline else 'compared'}: "
                  "the run failed")  # fmt: skip
        elif ci.update_baseline:
            write_baseline(report, ci.baseline)
        else:
            diff = compare_baseline(report, ci)
    if annotate_on(ci.annotate):
        for line in annotation_lines(report, diff):
            print(line, file=sys.stderr)
        sys.stderr.flush()
    if ci.junit is not None:
        if report.command == "diff" and diff is not None:
            suites = [diff_suite(diff, f"hookcli diff {report.settings.get('command', '')}")]
        else:
            suites = [report_suite(report)]
            if diff is not None:
                suites.append(diff_suite(diff, f"hookcli {report.command} baseline {baseline}"))
        write_junit(ci.junit, suites)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        append_step_summary(summary_markdown(report, diff, baseline), Path(summary))
    failed = bool(report.failed_checks) or (diff is not None and not diff.same)
    return EXIT_CHECK_FAILED if failed else EXIT_OK
