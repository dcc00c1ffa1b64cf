"""CI surfaces: --baseline/--update-baseline, GitHub annotations, the step summary, JUnit XML."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from hookcli.ci import SUMMARY_LIMIT, fit_summary, workflow_command
from tests.conftest import invoke

LENET = ("grads", "sample_models:LeNet")


# -- baseline ------------------------------------------------------------------------------


def test_update_then_compare_baseline(tmp_path: Path) -> None:
    base = tmp_path / "snap" / "grads.json"
    made = invoke(*LENET, "--baseline", str(base), "--update-baseline")
    assert made.exit_code == 0, made.stderr
    assert f"baseline written to {base}" in made.stderr
    printed = invoke(*LENET, "--format", "json")
    assert json.loads(base.read_text()) == json.loads(printed.stdout)

    same = invoke(*LENET, "--baseline", str(base))
    assert same.exit_code == 0, same.stderr
    assert "same within tolerance" in same.stderr
    assert same.stdout.startswith("hookcli grads")  # stdout still carries only the report

    changed = invoke(*LENET, "--baseline", str(base), "--seed", "1", "--format", "json")
    assert changed.exit_code == 1
    json.loads(changed.stdout)  # the report is complete and alone on stdout
    assert "baseline" in changed.stderr and "differs" in changed.stderr
    assert "seed 0 -> 1" in changed.stderr


def test_baseline_catches_a_structural_change(tmp_path: Path) -> None:
    base = tmp_path / "inspect.json"
    spec = ("inspect", "sample_models:CustomLinearLayer")
    assert invoke(*spec, "--baseline", str(base), "--update-baseline").exit_code == 0
    result = invoke(*spec, "-k", "hidden=16", "--baseline", str(base))
    assert result.exit_code == 1
    assert "output_shapes" in result.stderr
    assert "params" in result.stderr


def test_baseline_tolerance_options(tmp_path: Path) -> None:
    base = tmp_path / "b.json"
    assert invoke(*LENET, "--baseline", str(base), "--update-baseline").exit_code == 0
    report = json.loads(base.read_text())
    report["totals"]["grad_norm"] *= 1 + 1e-3
    base.write_text(json.dumps(report))
    assert invoke(*LENET, "--baseline", str(base)).exit_code == 1
    assert invoke(*LENET, "--baseline", str(base), "--rtol", "1e-2").exit_code == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--update-baseline",), "--update-baseline needs --baseline"),
        (("--baseline", "nope/missing.json"), "no such file; create it with --update-baseline"),
    ],
)
def test_baseline_usage_errors(args: tuple[str, ...], message: str) -> None:
    result = invoke(*LENET, *args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("option", ["--junit", "--baseline"])
def test_unwritable_ci_file_is_refused_before_the_run(tmp_path: Path, option: str) -> None:
    """A folder given as the file is exit 2 before the model is built, like --output."""
    extra = ("--update-baseline",) if option == "--baseline" else ()
    result = invoke(
        "grads", "tests/fixtures/broken.py:RaisesInMiddle", option, str(tmp_path), *extra
    )
    assert result.exit_code == 2  # the model would have failed with 4 had it run
    assert f"{option} {tmp_path}: is a folder" in result.stderr
    assert result.stdout == ""


def test_ci_files_are_written_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both files go through the one atomic writer (temp file, then rename)."""
    import hookcli.atomic as atomic

    written: list[str] = []
    original = atomic.atomic_write

    def recording(path: Path, write: Any, option: str = "") -> None:
        written.append(option)
        original(path, write, option)

    monkeypatch.setattr(atomic, "atomic_write", recording)
    base, junit = tmp_path / "b.json", tmp_path / "j.xml"
    base.write_text("old")
    made = invoke(*LENET, "--baseline", str(base), "--update-baseline", "--junit", str(junit))
    assert made.exit_code == 0, made.stderr
    assert sorted(written) == ["--baseline", "--junit"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json", "j.xml"]  # no temp file
    assert json.loads(base.read_text())["command"] == "grads"
    ET.parse(junit)


def test_baseline_of_another_command_is_exit_2(tmp_path: Path) -> None:
    base = tmp_path / "b.json"
    assert (
        invoke(
            "inspect", "sample_models:LeNet", "--baseline", str(base), "--update-baseline"
        ).exit_code
        == 0
    )
    result = invoke(*LENET, "--baseline", str(base))
    assert result.exit_code == 2
    assert "different commands" in result.stderr


def test_every_model_command_has_the_ci_options() -> None:
    for command in (
        "inspect",
        "grads",
        "stats",
        "buffers",
        "params",
        "registrations",
        "trace",
        "features",
    ):
        text = invoke(command, "--help").stdout
        for option in ("--baseline", "--update-baseline", "--annotate", "--junit", "--rtol"):
            assert option in text, (command, option)


def test_failed_run_neither_writes_nor_compares(tmp_path: Path) -> None:
    base = tmp_path / "b.json"
    result = invoke(
        "grads",
        "tests/fixtures/broken.py:RaisesInMiddle",
        "--baseline",
        str(base),
        "--update-baseline",
    )
    assert result.exit_code == 4
    assert not base.exists()
    assert "not written: the run failed" in result.stderr


# -- annotations ---------------------------------------------------------------------------


def test_workflow_command_escaping() -> None:
    line = workflow_command("error", "a: b, c%", "50% of\nlayers\r")
    assert line == "::error title=a%3A b%2C c%25::50%25 of%0Alayers%0D"


def annotation_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("::")]


def test_annotations_on_under_github_actions() -> None:
    args = ("grads", "sample_models:UnusedBranch", "--fail-on", "unused,nan")
    result = invoke(*args, env={"GITHUB_ACTIONS": "true"})
    assert result.exit_code == 1
    lines = annotation_lines(result.stderr)
    assert len(lines) == 1  # one failed check (nan passed)
    assert lines[0].startswith("::error title=hookcli grads%3A check unused failed::")
    assert "spare" in lines[0]
    assert "::" not in result.stdout
    off = invoke(*args, "--annotate", "none", env={"GITHUB_ACTIONS": "true"})
    assert annotation_lines(off.stderr) == []
    plain = invoke(*args)
    assert annotation_lines(plain.stderr) == []
    forced = invoke(*args, "--annotate", "github")
    assert annotation_lines(forced.stderr) == lines


def test_annotations_for_each_difference(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(invoke(*LENET, "--format", "json").stdout)
    report = json.loads(a.read_text())
    report["totals"]["loss"] = 12.5
    report["layers"][1]["output_shapes"] = [[1, 2]]
    b.write_text(json.dumps(report))
    result = invoke("diff", str(a), str(b), "--annotate", "github")
    assert result.exit_code == 1
    lines = annotation_lines(result.stderr)
    assert len(lines) == 2
    (loss,) = [ln for ln in lines if "12.5" in ln]
    # a colon in the title is escaped (%3A), the message keeps its own
    title, message = loss.removeprefix("::error title=").split("::", 1)
    assert title == "hookcli diff%3A totals loss", loss
    assert message.startswith("totals loss: ") and "-> 12.5" in message, loss
    (shapes,) = [ln for ln in lines if "output_shapes" in ln]
    assert "[[1, 2]]" in shapes and "conv1" in shapes


def test_run_error_is_annotated() -> None:
    result = invoke("grads", "tests/fixtures/broken.py:RaisesInMiddle", "--annotate", "github")
    assert result.exit_code == 4
    lines = annotation_lines(result.stderr)
    assert lines and lines[0].startswith(
        "::error title=hookcli grads%3A run failed::forward failed"
    )


# -- step summary --------------------------------------------------------------------------


def test_step_summary_appends_markdown(tmp_path: Path) -> None:
    summary = tmp_path / "summary.md"
    summary.write_text("# earlier step\n")
    result = invoke(*LENET, "--fail-on", "unused", env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert result.exit_code == 0
    text = summary.read_text()
    assert text.startswith("# earlier step\n")
    assert "| name | type | depth | call |" in text
    assert "- **PASS** `unused`" in text


def test_step_summary_has_the_baseline_diff(tmp_path: Path) -> None:
    base, summary = tmp_path / "b.json", tmp_path / "s.md"
    assert invoke(*LENET, "--baseline", str(base), "--update-baseline").exit_code == 0
    result = invoke(
        *LENET, "--baseline", str(base), "--seed", "2", env={"GITHUB_STEP_SUMMARY": str(summary)}
    )
    assert result.exit_code == 1
    text = summary.read_text()
    assert f"**Baseline `{base}`**" in text
    assert "The reports differ in their settings: seed 0 -> 2" in text
    assert "| setting | settings |  | seed |" in text


def test_summary_is_cut_under_one_mib(tmp_path: Path) -> None:
    long = "".join(f"| row {i} | {'x' * 60} |\n" for i in range(40_000))  # ~2.9 MB
    cut = fit_summary(long, SUMMARY_LIMIT)
    assert len(cut.encode("utf-8")) <= SUMMARY_LIMIT
    assert "_(cut: this report is" in cut
    assert cut.split("\n\n_(cut")[0].endswith("|\n")  # cut at a line end
    summary = tmp_path / "s.md"
    summary.write_text("a" * (SUMMARY_LIMIT - 600) + "\n")
    result = invoke(*LENET, env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert result.exit_code == 0
    size = summary.stat().st_size
    assert SUMMARY_LIMIT - 600 < size <= SUMMARY_LIMIT
    assert "_(cut:" in summary.read_text()


# -- JUnit ---------------------------------------------------------------------------------


def cases(root: ET.Element) -> dict[str, ET.Element]:
    return {tc.attrib["name"]: tc for tc in root.iter("testcase")}


def check_counts(root: ET.Element) -> None:
    """The counters of every suite and of the root match the test cases they hold."""
    total = {"tests": 0, "failures": 0, "errors": 0}
    for suite in root.findall("testsuite"):
        tcs = suite.findall("testcase")
        failures = sum(1 for tc in tcs if tc.find("failure") is not None)
        errors = sum(1 for tc in tcs if tc.find("error") is not None)
        assert int(suite.attrib["tests"]) == len(tcs)
        assert int(suite.attrib["failures"]) == failures
        assert int(suite.attrib["errors"]) == errors
        total["tests"] += len(tcs)
        total["failures"] += failures
        total["errors"] += errors
    for k, v in total.items():
        assert int(root.attrib[k]) == v


def test_junit_checks(tmp_path: Path) -> None:
    path = tmp_path / "out" / "grads.xml"
    result = invoke(
        "grads", "sample_models:UnusedBranch", "--fail-on", "unused,nan", "--junit", str(path)
    )
    assert result.exit_code == 1
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    check_counts(root)
    suites = root.findall("testsuite")
    assert [s.attrib["name"] for s in suites] == ["hookcli grads sample_models:UnusedBranch"]
    tcs = cases(root)
    assert set(tcs) == {"run", "check: unused", "check: nan"}
    assert all(tc.attrib["classname"] == "hookcli.grads" for tc in tcs.values())
    failure = tcs["check: unused"].find("failure")
    assert failure is not None and "spare" in (failure.text or "")
    assert tcs["check: nan"].find("failure") is None
    assert tcs["run"].find("failure") is None and tcs["run"].find("error") is None
    props = {p.attrib["name"]: p.attrib["value"] for p in root.iter("property")}
    assert props["mode"] == "train" and props["seed"] == "0"


def test_junit_with_baseline_diff(tmp_path: Path) -> None:
    base, path = tmp_path / "b.json", tmp_path / "j.xml"
    assert invoke(*LENET, "--baseline", str(base), "--update-baseline").exit_code == 0
    result = invoke(*LENET, "--baseline", str(base), "--seed", "3", "--junit", str(path))
    assert result.exit_code == 1
    root = ET.parse(path).getroot()
    check_counts(root)
    suites = root.findall("testsuite")
    assert len(suites) == 2
    diff_cases = {tc.attrib["name"]: tc for tc in suites[1].iter("testcase")}
    assert diff_cases["diff: settings"].find("failure") is not None
    assert diff_cases["diff: structure"].find("failure") is None  # same model, same shapes
    assert diff_cases["diff: grad_norm"].find("failure") is not None
    assert "seed" in (diff_cases["diff: settings"].find("failure").text or "")  # type: ignore[union-attr]


def test_junit_run_error(tmp_path: Path) -> None:
    path = tmp_path / "j.xml"
    result = invoke("grads", "tests/fixtures/broken.py:RaisesInMiddle", "--junit", str(path))
    assert result.exit_code == 4
    root = ET.parse(path).getroot()
    check_counts(root)
    error = cases(root)["run"].find("error")
    assert error is not None and "block.1" in error.attrib["message"]


def test_junit_of_the_diff_command(tmp_path: Path) -> None:
    a, path = tmp_path / "a.json", tmp_path / "d.xml"
    a.write_text(invoke(*LENET, "--format", "json").stdout)
    result = invoke("diff", str(a), str(a), "--junit", str(path))
    assert result.exit_code == 0
    root = ET.parse(path).getroot()
    check_counts(root)
    assert root.attrib["failures"] == "0"
    names = set(cases(root))
    assert {"diff: settings", "diff: structure", "diff: grad_norm", "diff: loss"} <= names


def test_junit_text_is_escaped(tmp_path: Path) -> None:
    from hookcli.ci import Case, Suite, junit_xml

    text = junit_xml([Suite("s <&>", (Case('c "1"', "k", "bad <x> & \x01 y", "a]]>b"),))])
    root = ET.fromstring(text)
    tc = root.find("testsuite/testcase")
    assert tc is not None and tc.attrib["name"] == 'c "1"'
    failure: Any = tc.find("failure")
    assert failure.attrib["message"] == "bad <x> &  y"
    assert failure.text == "a]]>b"
