"""``COMMAND --help`` groups options into panels; shell completion completes MODEL names."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from hookcli.commands import COMMANDS
from hookcli.helpfmt import PANEL_ORDER
from tests.conftest import invoke


def panels(help_text: str) -> dict[str, list[str]]:
    """Section title -> the long flags listed under it (from each option's own line)."""
    out: dict[str, list[str]] = {}
    current = None
    for line in help_text.splitlines():
        if re.match(r"^[A-Z][A-Za-z ]*:$", line):
            current = line[:-1]
            out[current] = []
        elif current and re.match(r"^  -", line):
            column = line.strip().split("  ")[0]
            out[current] += re.findall(r"--[a-z][a-z-]*", column)
    return out


@pytest.mark.parametrize("name", [n for n, _ in COMMANDS])
def test_every_option_of_every_command_sits_in_a_named_panel(name):
    result = invoke(name, "--help")
    assert result.exit_code == 0
    sections = panels(result.stdout)
    assert sections, f"no option panel found in `{name} --help`:\n{result.stdout}"
    assert "Options" not in sections or set(sections["Options"]) <= {"--help"}, sections.get(
        "Options"
    )
    known = [s for s in sections if s != "Arguments" and s != "Options"]
    assert known, sections  # every command has at least one named panel
    assert known == [p for p in PANEL_ORDER if p in known], known  # in the documented order


def test_inspect_panels_hold_the_expected_options():
    sections = panels(invoke("inspect", "--help").stdout)
    assert {"--kwargs", "--weights", "--trust-pickle", "--seed"} <= set(sections["Model"])
    assert {"--input", "--batch-size"} <= set(sections["Input"])
    assert {"--device", "--dtype", "--mode", "--hooks"} <= set(sections["Run"])
    assert {"--depth", "--format", "--output"} <= set(sections["Output"])
    assert "--fail-on" in panels(invoke("grads", "--help").stdout)["Checks"]


def complete(words: str, tmp_path) -> list[str]:
    env = {
        **os.environ,
        "_HOOKCLI_COMPLETE": "complete_bash",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split()) - 1),
        "XDG_CACHE_HOME": str(tmp_path),
        "HF_HUB_OFFLINE": "1",
    }
    code = "from hookcli.cli import main; main()"
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_completion_of_model_names(tmp_path):
    import torchvision

    expected = sorted(n for n in torchvision.models.list_models() if n.startswith("resnet1"))
    assert sorted(complete("hookcli inspect resnet1", tmp_path)) == expected
    assert any(f.name.startswith("models-torchvision-") for f in (tmp_path / "hookcli").iterdir())
    # from the cache the second time, same answer
    assert sorted(complete("hookcli grads resnet1", tmp_path)) == expected
    assert "hf:llama" in complete("hookcli inspect hf:llam", tmp_path)
    assert complete("hookcli inspect ./my_model.py", tmp_path) == []


def test_show_completion_prints_a_script():
    env = {**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "hookcli", "--show-completion", "bash"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "_hookcli_completion" in result.stdout and "complete" in result.stdout
