"""``[tool.hookcli]`` in pyproject.toml: per-command defaults; the command line wins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import invoke

USE_CONFIG = {"HOOKCLI_NO_CONFIG": None}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder with a pyproject.toml; the tests run from a subfolder of it."""
    (tmp_path / "pyproject.toml").write_text(
        """
[project]
name = "demo"

[tool.hookcli]
seed = 3

[tool.hookcli.inspect]
format = "json"
depth = 1
input = "2x1x32x32"

[tool.hookcli.grads]
fail-on = ["unused", "nan"]
max-grad-norm = 1e6
baseline = "ci/grads.json"
"""
    )
    sub = tmp_path / "src" / "deep"
    sub.mkdir(parents=True)
    monkeypatch.chdir(sub)
    return tmp_path


def test_defaults_apply(project: Path) -> None:
    result = invoke("inspect", "sample_models:LeNet", env=USE_CONFIG)
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["settings"]["seed"] == 3  # from the shared table
    assert report["inputs"][0]["shape"] == [2, 1, 32, 32]
    assert max(r["depth"] for r in report["layers"]) == 1


def test_command_line_wins(project: Path) -> None:
    result = invoke(
        "inspect",
        "sample_models:LeNet",
        "-f",
        "csv",
        "--seed",
        "1",
        "-i",
        "1x1x32x32",
        env=USE_CONFIG,
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("name,type,depth")
    assert '"[[1,1,32,32]]"' in result.stdout


def test_lists_and_paths(project: Path) -> None:
    # baseline = "ci/grads.json" is relative to the pyproject.toml, not to the current folder
    made = invoke("grads", "sample_models:UnusedBranch", "--update-baseline", env=USE_CONFIG)
    assert made.exit_code == 1  # fail-on unused from the config
    assert (project / "ci" / "grads.json").is_file()
    report = json.loads((project / "ci" / "grads.json").read_text())
    assert [c["name"] for c in report["checks"]] == ["unused", "nan", "max-grad-norm"]


def test_ignored_when_disabled(project: Path) -> None:
    result = invoke("inspect", "sample_models:LeNet")  # the suite sets HOOKCLI_NO_CONFIG=1
    assert result.exit_code == 0
    assert result.stdout.startswith("hookcli inspect")


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        (
            "[tool.hookcli.inspect]\nfail-on = 'nan'\n",
            "[tool.hookcli.inspect] fail-on: not an option of inspect",
        ),
        ("[tool.hookcli.nope]\nseed = 1\n", "[tool.hookcli.nope]: no such command"),
        ("[tool.hookcli]\nwobble = 1\n", "[tool.hookcli] wobble: no command has this option"),
        ("[tool.hookcli\n", "cannot read"),
    ],
)
def test_bad_config_is_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, toml: str, message: str
) -> None:
    (tmp_path / "pyproject.toml").write_text(toml)
    monkeypatch.chdir(tmp_path)
    result = invoke("inspect", "sample_models:LeNet", env=USE_CONFIG)
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
