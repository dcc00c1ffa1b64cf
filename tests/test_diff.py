"""``hookcli diff``: differences of two JSON reports, checked against torch's own comparison.

The numeric verdicts are compared with ``torch.isclose`` and the default
tolerances with ``torch.testing``'s table; structural changes are made by
editing a real report by hand, so the expected differences are known.
"""

from __future__ import annotations

import copy
import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from hookcli.diff import diff_reports
from tests.conftest import invoke, invoke_json


@pytest.fixture(scope="module")
def grads_report() -> dict[str, Any]:
    return invoke_json("grads", "sample_models:LeNet")


@pytest.fixture(scope="module")
def inspect_report() -> dict[str, Any]:
    return invoke_json("inspect", "sample_models:CustomLinearLayer")


def write(path: Path, report: dict[str, Any]) -> str:
    path.write_text(json.dumps(report), encoding="utf-8")
    return str(path)


def diff_json(
    tmp_path: Path, old: dict[str, Any], new: dict[str, Any], *opts: str
) -> tuple[int, dict[str, Any]]:
    a, b = write(tmp_path / "old.json", old), write(tmp_path / "new.json", new)
    result = invoke("diff", a, b, "--format", "json", *opts)
    assert result.exit_code in (0, 1), result.stderr
    return result.exit_code, json.loads(result.stdout)


def flagged(report: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(d["where"], d["item"], d["key"]) for d in report["differences"]}


def test_a_report_equals_itself(tmp_path: Path, grads_report: dict[str, Any]) -> None:
    a = write(tmp_path / "a.json", grads_report)
    result = invoke("diff", a, a)
    assert result.exit_code == 0, result.stderr
    assert "(no differences)" in result.stdout
    assert "PASS  same" in result.stdout


@pytest.mark.parametrize(
    ("dtype", "torch_dtype"),
    [
        ("float32", torch.float32),
        ("float16", torch.float16),
        ("bfloat16", torch.bfloat16),
        ("float64", torch.float64),
    ],
)
def test_default_tolerances_are_assert_close_s(
    tmp_path: Path, grads_report: dict[str, Any], dtype: str, torch_dtype: torch.dtype
) -> None:
    old = copy.deepcopy(grads_report)
    old["settings"]["dtype"] = dtype
    _, report = diff_json(tmp_path, old, old)
    try:  # private to torch: a torch that moves it skips this test, not the whole file
        from torch.testing._comparison import default_tolerances
    except ImportError:
        pytest.skip("torch.testing._comparison.default_tolerances (private) moved in this torch")
    rtol, atol = default_tolerances(torch_dtype)
    assert report["settings"]["rtol"] == rtol
    assert report["settings"]["atol"] == atol


# relative perturbations straddling float32's rtol 1.3e-6 + atol 1e-5 on values of ~0.1-4
FACTORS = [0.0, 1e-7, 1e-6, 2e-6, 3e-6, 1e-5, 1e-4, 1e-2, -3e-6, -1e-2]


@pytest.mark.parametrize("opts", [(), ("--rtol", "1e-5", "--atol", "0"), ("--atol", "1e-3")])
def test_numeric_verdicts_match_torch_isclose(
    tmp_path: Path, grads_report: dict[str, Any], opts: tuple[str, ...]
) -> None:
    old = grads_report
    new = copy.deepcopy(old)
    expected = set()
    rtol = float(opts[opts.index("--rtol") + 1]) if "--rtol" in opts else 1.3e-6
    atol = float(opts[opts.index("--atol") + 1]) if "--atol" in opts else 1e-5
    i = 0
    for row_old, row_new in zip(old["layers"], new["layers"], strict=True):
        for key in ("grad_norm", "weight_norm", "grad_output_norm"):
            if not isinstance(row_old[key], float):
                continue
            row_new[key] = row_old[key] * (1 + FACTORS[i % len(FACTORS)])
            i += 1
            a = torch.tensor(row_new[key], dtype=torch.float64)
            b = torch.tensor(row_old[key], dtype=torch.float64)
            if not torch.isclose(a, b, rtol=rtol, atol=atol):
                label = row_old["name"] or "(root)"
                expected.add(("layers", label, key))
    assert i > 10
    code, report = diff_json(tmp_path, old, new, *opts)
    assert flagged(report) == expected
    assert code == (1 if expected else 0)
    for d in report["differences"]:
        assert d["abs_diff"] == pytest.approx(abs(d["new"] - d["old"]), rel=1e-9)
        assert d["rel_diff"] == pytest.approx(abs(d["new"] - d["old"]) / abs(d["old"]), rel=1e-9)


def test_looser_dtype_tolerance_hides_small_changes(
    tmp_path: Path, grads_report: dict[str, Any]
) -> None:
    old = copy.deepcopy(grads_report)
    new = copy.deepcopy(grads_report)
    new["totals"]["grad_norm"] = old["totals"]["grad_norm"] * (1 + 1e-4)
    assert diff_json(tmp_path, old, new)[0] == 1  # float32: 1e-4 is beyond rtol 1.3e-6
    for r in (old, new):
        r["settings"]["dtype"] = "float16"
    code, report = diff_json(tmp_path, old, new)
    assert code == 0  # float16: within rtol 1e-3
    assert report["settings"]["rtol"] == 1e-3


def test_integers_compare_exactly_unless_a_tolerance_is_given(
    tmp_path: Path, inspect_report: dict[str, Any]
) -> None:
    new = copy.deepcopy(inspect_report)
    new["totals"]["param_bytes"] += 4  # far below rtol * value, still a change
    code, report = diff_json(tmp_path, inspect_report, new)
    assert code == 1
    assert flagged(report) == {("totals", "", "param_bytes")}
    code, _ = diff_json(tmp_path, inspect_report, new, "--rtol", "0.5")
    assert code == 0


def test_structural_changes(tmp_path: Path, inspect_report: dict[str, Any]) -> None:
    old = inspect_report
    new = copy.deepcopy(old)
    names = [r["name"] for r in old["layers"]]
    removed = new["layers"].pop(2)
    extra = dict(new["layers"][1], name="extra", call=0)
    new["layers"].append(extra)
    new["layers"][1]["type"] = "LazyLinear"
    new["layers"][1]["output_shapes"] = [[9, 9]]
    new["layers"][1]["params"] += 1
    new["totals"]["params"] += 1
    code, report = diff_json(tmp_path, old, new)
    assert code == 1
    diffs = {(d["item"], d["key"], d["change"]): d for d in report["differences"]}
    second = names[1] or "(root)"
    assert (removed["name"], "", "removed") in diffs
    assert ("extra", "", "added") in diffs
    for key in ("type", "output_shapes", "params"):
        d = diffs[(second, key, "changed")]
        assert d["kind"] == "structure"
        assert d["old"] == old["layers"][1][key]
        assert d["new"] == new["layers"][1][key]
    assert diffs[("", "params", "changed")]["where"] == "totals"
    assert report["totals"]["structure"] == len(report["differences"])


def test_layers_match_by_name_and_call(tmp_path: Path, inspect_report: dict[str, Any]) -> None:
    new = copy.deepcopy(inspect_report)
    new["layers"][1]["call"] = 1  # now a second call of that module, the first is gone
    _, report = diff_json(tmp_path, inspect_report, new)
    name = inspect_report["layers"][1]["name"]
    assert {(d["item"], d["change"]) for d in report["differences"]} == {
        (name, "removed"),
        (f"{name}#1", "added"),
    }


def test_settings_differences_come_first(tmp_path: Path) -> None:
    a = invoke_json("grads", "sample_models:LeNet")
    b = invoke_json("grads", "sample_models:LeNet", "--seed", "1", "--loss", "mean")
    pa, pb = write(tmp_path / "a.json", a), write(tmp_path / "b.json", b)
    result = invoke("diff", pa, pb)
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[1].startswith("The reports differ in their settings:")
    assert "seed 0 -> 1" in lines[1] and "loss sum -> mean" in lines[1]
    code, report = diff_json(tmp_path, a, b)
    kinds = [d["kind"] for d in report["differences"]]
    assert kinds[:2] == ["setting", "setting"]
    assert "setting" not in kinds[2:]
    # ignoring the settings: noted, not counted, values still compared
    code, report = diff_json(tmp_path, a, b, "--ignore", "seed,loss")
    assert code == 1
    assert not [d for d in report["differences"] if d["kind"] == "setting"]
    assert report["totals"]["values"] > 0


def test_only_and_ignore(tmp_path: Path, grads_report: dict[str, Any]) -> None:
    new = copy.deepcopy(grads_report)
    new["totals"]["loss"] += 1.0
    for r in new["layers"]:
        if isinstance(r["grad_norm"], float):
            r["grad_norm"] *= 2
        if isinstance(r["weight_norm"], float):
            r["weight_norm"] *= 2
    _, only = diff_json(tmp_path, grads_report, new, "--only", "loss")
    assert flagged(only) == {("totals", "", "loss")}
    _, report = diff_json(tmp_path, grads_report, new, "--ignore", "*_norm")
    assert flagged(report) == {("totals", "", "loss")}
    _, report = diff_json(tmp_path, grads_report, new, "--only", "weight_norm")
    assert {k for _, _, k in flagged(report)} == {"weight_norm"}
    result = invoke("diff", str(tmp_path / "old.json"), str(tmp_path / "new.json"), "--only", "los")
    assert result.exit_code == 2
    assert "--only los: no such key" in result.stderr


def test_nan_equals_nan_and_inf_strings(tmp_path: Path, grads_report: dict[str, Any]) -> None:
    old = copy.deepcopy(grads_report)
    old["totals"]["loss"] = "nan"
    old["totals"]["grad_norm"] = "inf"
    new = copy.deepcopy(old)
    assert diff_json(tmp_path, old, new)[0] == 0
    new["totals"]["loss"] = 1.0
    code, report = diff_json(tmp_path, old, new)
    assert code == 1 and flagged(report) == {("totals", "", "loss")}


def test_check_that_turns_to_fail(tmp_path: Path) -> None:
    a = invoke("grads", "sample_models:UnusedBranch", "--format", "json")
    b = invoke("grads", "sample_models:UnusedBranch", "--fail-on", "unused", "--format", "json")
    assert a.exit_code == 0 and b.exit_code == 1
    code, report = diff_json(tmp_path, json.loads(a.stdout), json.loads(b.stdout))
    assert code == 1
    assert ("checks", "unused", "") in flagged(report)


def test_table_csv_markdown_show_only_differing_rows(
    tmp_path: Path, grads_report: dict[str, Any]
) -> None:
    new = copy.deepcopy(grads_report)
    target = next(r for r in new["layers"] if isinstance(r["grad_norm"], float))
    old_value = target["grad_norm"]
    target["grad_norm"] = old_value * 1.5
    a, b = write(tmp_path / "a.json", grads_report), write(tmp_path / "b.json", new)
    table = invoke("diff", a, b)
    assert table.exit_code == 1
    rows = [ln for ln in table.stdout.splitlines() if ln.startswith("layers")]
    assert len(rows) == 1
    cells = rows[0].split()
    assert cells[:3] == ["layers", target["name"], "grad_norm"]
    assert float(cells[3]) == old_value and float(cells[4]) == pytest.approx(old_value * 1.5)
    assert float(cells[5]) == pytest.approx(0.5, rel=1e-3)
    got = list(csv.DictReader(io.StringIO(invoke("diff", a, b, "-f", "csv").stdout)))
    assert [(r["where"], r["item"], r["key"]) for r in got] == [
        ("layers", target["name"], "grad_norm")
    ]
    md = invoke("diff", a, b, "-f", "markdown").stdout
    assert "| kind | where | item | key |" in md
    assert sum(1 for ln in md.splitlines() if ln.startswith("| value |")) == 1


def test_stdin(tmp_path: Path, grads_report: dict[str, Any]) -> None:
    a = write(tmp_path / "a.json", grads_report)
    result = invoke("diff", a, "-", input=json.dumps(grads_report))
    assert result.exit_code == 0, result.stderr
    result = invoke("diff", "-", a, "-f", "json", input=json.dumps(grads_report))
    assert json.loads(result.stdout)["settings"]["old"] == "stdin"


def test_unusable_inputs_exit_2(
    tmp_path: Path, grads_report: dict[str, Any], inspect_report: dict[str, Any]
) -> None:
    good = write(tmp_path / "good.json", grads_report)
    (tmp_path / "bad.json").write_text("{not json", encoding="utf-8")
    (tmp_path / "other.json").write_text('{"a": 1}', encoding="utf-8")
    newer = dict(grads_report, schema="hookcli.report/2")
    cases = {
        "bad.json is not a hookcli JSON report": [str(tmp_path / "bad.json"), good],
        "other.json is not a hookcli report": [good, str(tmp_path / "other.json")],
        "different commands: grads": [good, write(tmp_path / "i.json", inspect_report)],
        "different schema versions": [good, write(tmp_path / "n.json", newer)],
        "no such file": [good, str(tmp_path / "missing.json")],
        "cannot both be -": ["-", "-"],
    }
    for message, args in cases.items():
        result = invoke("diff", *args)
        assert result.exit_code == 2, (message, result.stdout)
        assert message in result.stderr
        assert "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        assert result.stdout == ""


def test_diff_module_is_pure() -> None:
    import subprocess
    import sys

    code = (
        "import sys, json; from hookcli.diff import diff_reports; "
        "r={'schema':'hookcli.report/1','command':'x','layers':[]}; "
        "assert diff_reports(r, r).same; assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_python_function_takes_dicts(grads_report: dict[str, Any]) -> None:
    new = copy.deepcopy(grads_report)
    new["totals"]["grad_norm"] *= 1.01
    result = diff_reports(grads_report, new)
    assert not result.same
    assert [(d.where, d.key) for d in result.differences] == [("totals", "grad_norm")]
    assert result.key_stats["grad_norm"].mismatched == 1
