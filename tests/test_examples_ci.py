"""examples/ci/: the shell script passes against its committed baselines and fails on a change."""

from __future__ import annotations

import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "ci"


def _limit_memory() -> None:
    """The script builds a small model: 4 GiB of address space is plenty."""
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def run_script(folder: Path, out: Path) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "HOOKCLI_NO_CONFIG", "UPDATE")
    }
    env["HOOKCLI"] = f"{shlex.quote(sys.executable)} -m hookcli"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(
        ["bash", str(folder / "check-model.sh"), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limit_memory,
    )


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_script_passes_and_keeps_the_reports(tmp_path: Path) -> None:
    out = tmp_path / "reports"
    result = run_script(EXAMPLE, out)
    assert result.returncode == 0, result.stderr
    assert "same within tolerance" in result.stderr
    inspect = json.loads((out / "inspect.json").read_text())
    assert inspect["command"] == "inspect" and inspect["inputs"][0]["shape"] == [8, 3, 32, 32]
    grads = json.loads((out / "grads.json").read_text())
    assert [c["name"] for c in grads["checks"]] == [
        "nan",
        "inf",
        "unused",
        "zero-grad",
        "max-grad-norm",
    ]
    assert all(c["passed"] for c in grads["checks"])
    for name in ("inspect.xml", "grads.xml"):
        root = ET.parse(out / name).getroot()
        assert root.tag == "testsuites" and root.attrib["failures"] == "0"
    assert "(no differences)" in (out / "grads-diff.md").read_text()


@pytest.mark.slow  # a second run of the script (~15 s)
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_script_fails_when_the_model_changes(tmp_path: Path) -> None:
    folder = tmp_path / "ci"
    shutil.copytree(EXAMPLE, folder)
    model = folder / "model.py"
    model.write_text(model.read_text().replace("width: int = 16", "width: int = 12"))
    out = tmp_path / "reports"
    result = run_script(folder, out)
    assert result.returncode == 1
    assert "baseline baseline/inspect.json differs" in result.stderr
    assert "output_shapes" in result.stderr
    root = ET.parse(out / "inspect.xml").getroot()
    failed = [tc.attrib["name"] for tc in root.iter("testcase") if tc.find("failure") is not None]
    assert failed[0] == "diff: structure"
    assert set(failed[1:]) <= {"diff: param_bytes", "diff: buffers", "diff: buffer_bytes"}
    assert (out / "grads.json").is_file()  # every step ran and kept its report


def test_workflow_runs_the_script() -> None:
    yaml = pytest.importorskip("yaml")
    workflow = yaml.safe_load((EXAMPLE / "github-workflow.yml").read_text())
    steps = workflow["jobs"]["hookcli"]["steps"]
    runs = " ".join(str(s.get("run", "")) for s in steps)
    assert "examples/ci/check-model.sh hookcli-reports" in runs
    uploads = [s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact")]
    assert uploads and uploads[0]["with"]["path"].startswith("hookcli-reports")
