"""The hostile sweep of issue 44 on ``-k`` and ``--kwargs-file``: each input used to grow
without bound, crash, echo itself or win silently; each is now exit 2 with one short line.

Every run is a subprocess ``python -m hookcli params ...`` under a data-size limit
(``resource.setrlimit(RLIMIT_DATA)``) and a timeout, so a regression fails the test instead
of eating the machine: a YAML "billion laughs" once grew to 11 GB.
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CM = "tests/fixtures/configmodels.py:GPT"
LIMIT = 2 * 1024**3  # bytes of heap a run may take (a build of this GPT takes far less)
SHORT = 400  # characters an error line may have


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_DATA, (LIMIT, LIMIT))


def hookcli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hookcli", "params", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOOKCLI_NO_CONFIG": "1"},
        preexec_fn=_limited,
    )


def refused(result: subprocess.CompletedProcess[str]) -> str:
    """The one short error line of an exit-2 run."""
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hookcli: error: "), result.stderr[-2000:]
    assert len(lines[0]) < SHORT, lines[0][:2000]
    return lines[0]


def billion_laughs(levels: int) -> str:
    """Nine "lol"s, then ``levels`` lists of nine aliases of the list before: 9**(levels+1)."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    names = "abcdefghijklmnop"
    for prev, name in itertools.pairwise(names[: levels + 1]):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("levels", [6, 8])
def test_yaml_aliases_that_expand_past_the_bound_are_refused(tmp_path: Path, levels: int) -> None:
    """levels 6 (the sweep's 381-byte file: 22 s, 5.8 MB in settings.kwargs) and 8 (its
    471-byte file: 11 GB of RSS)."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(billion_laughs(levels))
    assert len(bomb.read_bytes()) < 500
    line = refused(hookcli(CM, "--kwargs-file", str(bomb)))
    assert f"--kwargs-file {bomb}" in line and "aliases" in line


def params_of(**fields: object) -> int:
    from tests.fixtures import configmodels as cm

    return sum(p.numel() for p in cm.GPT(cm.GPTConfig(**fields)).parameters())  # type: ignore[arg-type]


def test_a_few_yaml_aliases_still_work(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("config:\n  n_embd: &w 8\n  block_size: *w\n  n_layer: 1\n")
    result = hookcli(CM, "--kwargs-file", str(cfg), "-f", "json")
    assert result.returncode == 0, result.stderr
    expected = params_of(n_embd=8, block_size=8, n_layer=1)
    assert json.loads(result.stdout)["totals"]["params"] == expected


def test_a_recursive_yaml_alias_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "cycle.yaml"
    cfg.write_text("config: &c\n  n_layer: 1\n  self: *c\n")
    assert "cycle" in refused(hookcli(CM, "--kwargs-file", str(cfg)))


def test_a_key_3000_levels_deep_is_refused() -> None:
    """It was a RecursionError (exit 70)."""
    line = refused(hookcli(CM, "-k", "config." + "node." * 3000 + "v=1"))
    assert "levels" in line


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_file_nested_3000_levels_deep_is_refused(tmp_path: Path, suffix: str) -> None:
    deep = tmp_path / f"deep{suffix}"
    deep.write_text('{"config": ' + "[" * 3000 + "]" * 3000 + "}")  # JSON is YAML too
    assert "levels" in refused(hookcli(CM, "--kwargs-file", str(deep)))


def test_an_integer_over_pythons_digit_limit_is_named_in_a_short_line() -> None:
    """It said "is not a Python literal" (it is one) on a 15 kB line."""
    line = refused(hookcli(CM, "-k", "config.n_layer=" + "7" * 5000))
    assert "not a Python literal" not in line
    assert "digits" in line and "config.n_layer" in line


def test_fields_on_a_plain_value_are_refused_naming_the_key() -> None:
    """``n_layer: int`` silently became a dict (then exit 3 inside the model)."""
    line = refused(hookcli(CM, "-k", "config.n_layer.x=1"))
    assert "config.n_layer" in line and "int" in line


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("dup.yaml", "config:\n  n_layer: 2\n  n_layer: 3\n"),
        ("dup.json", '{"config": {"n_layer": 2, "n_layer": 3}}'),
        ("top.yaml", "seed: 1\nseed: 2\n"),
    ],
)
def test_a_key_given_twice_in_a_file_is_refused(tmp_path: Path, name: str, text: str) -> None:
    """The later one won silently (TOML already refuses)."""
    path = tmp_path / name
    path.write_text(text)
    line = refused(hookcli(CM, "--kwargs-file", str(path)))
    assert "twice" in line and ("'n_layer'" in line or "'seed'" in line)


def test_yaml_merge_keys_may_be_overridden(tmp_path: Path) -> None:
    """``<<: *base`` then a key of the base again is an override, not a duplicate."""
    cfg = tmp_path / "merge.yaml"
    cfg.write_text("config:\n  <<: {n_layer: 1, n_embd: 8}\n  n_layer: 2\n")
    result = hookcli(CM, "--kwargs-file", str(cfg), "-f", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["totals"]["params"] == params_of(n_layer=2, n_embd=8)
