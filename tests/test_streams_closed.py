"""A report to a stdout that is closed (``>&-``) or full (``> /dev/full``): one line on
stderr and exit 2, as ``-o`` gives, for every command that writes a report to stdout
(inspect in table and JSON, diff, watch). Real processes: ``stdout=DEVNULL`` is an
open descriptor, so the child closes its descriptor 1 itself before it runs hookcli."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SMALL = "tests.fixtures.round3:Small"
TRAIN = """
import torch
m = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad(); m(torch.randn(8, 4)).sum().backward(); opt.step()
"""


def _close_stdout() -> None:
    os.close(1)


def _run(args: list[str], how: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "hookcli", *args]
    if how == "closed":
        return subprocess.run(cmd, cwd=cwd, env=env, stderr=subprocess.PIPE, text=True,
                              timeout=300, preexec_fn=_close_stdout)  # fmt: skip
    with open("/dev/full", "w") as full:
        return subprocess.run(cmd, cwd=cwd, env=env, stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=300)  # fmt: skip


def _error_lines(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr
    return [ln for ln in stderr.splitlines() if ln.startswith("hookcli: error:")]


WHY = {
    "closed": "cannot write the report to stdout: stdout is closed",
    "full": "cannot write the report to stdout: No space left on device",
}


@pytest.fixture(scope="module")
def report_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("streams") / "a.json"
    r = subprocess.run(
        [sys.executable, "-m", "hookcli", "inspect", SMALL, "-f", "json", "-o", str(out)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return out


@pytest.mark.parametrize("how", ["closed", "full"])
@pytest.mark.parametrize(
    "args", [["inspect", SMALL, "-f", "json"], ["inspect", SMALL], ["diff", "A", "A"]]
)
def test_report_to_closed_or_full_stdout(
    how: str, args: list[str], report_json: Path, tmp_path: Path
) -> None:
    args = [str(report_json) if a == "A" else a for a in args]
    r = _run(args, how, tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.splitlines() == [f"hookcli: error: {WHY[how]}" + (
        " (write the report to a file with -o FILE)" if how == "closed" else "")]  # fmt: skip


@pytest.mark.parametrize("how", ["closed", "full"])
def test_watch_report_to_closed_or_full_stdout(how: str, tmp_path: Path) -> None:
    """watch runs the training, then cannot write its summary: one error line, exit 2."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    r = _run(["watch", "--", sys.executable, str(script)], how, tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = _error_lines(r.stderr)
    assert len(lines) == 1 and WHY[how] in lines[0], r.stderr


def test_closed_stdout_with_output_file_still_works(tmp_path: Path) -> None:
    """-o FILE needs no stdout: the report is written, exit 0, and no file the run
    opened landed on descriptor 1."""
    out = tmp_path / "r.json"
    r = _run(["inspect", SMALL, "-f", "json", "-o", str(out)], "closed", tmp_path)
    assert r.returncode == 0, r.stderr
    assert out.read_text().lstrip().startswith("{")
    assert _error_lines(r.stderr) == []


def test_output_to_full_file_is_the_same_exit() -> None:
    """The reference: ``-o /dev/full`` is exit 2 with one line."""
    r = _run(["inspect", SMALL, "-o", "/dev/full"], "closed", ROOT)
    assert r.returncode == 2, r.stderr
    assert len(_error_lines(r.stderr)) == 1
