"""Issue 28, hostile sweep: ``[tool.hookcli]`` errors (B5, R17, R18) and ``hf:`` configs
that transformers refuses or that make no model worth running (B6, R11, R12, R13)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import invoke

ROOT = Path(__file__).resolve().parents[1]
USE_CONFIG = {"HOOKCLI_NO_CONFIG": ""}


def _error_line(stderr: str) -> str:
    """The one error line: no traceback, nothing else from hookcli."""
    assert "Traceback" not in stderr, stderr
    lines = [ln for ln in stderr.splitlines() if ln.startswith("hookcli: error:")]
    assert len(lines) == 1, stderr
    return lines[0]


def _project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str | bytes) -> Path:
    path = tmp_path / "pyproject.toml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    monkeypatch.chdir(tmp_path)
    return path


# -- B5: a pyproject.toml hookcli cannot read is a usage error for every command ------------

BROKEN = {
    "tool-not-a-table": b"tool = 5\n",
    "hookcli-not-a-table": b"[tool]\nhookcli = 5\n",
    "invalid-utf8": b'[tool.hookcli]\nseed = "\xff"\n',
    "invalid-utf8-elsewhere": b'[project]\nname = "\xfe\xff"\n',
    "bad-toml": b"[tool.hookcli\n",
}
COMMANDS = {
    "inspect": ["inspect", "sample_models:LeNet"],
    "diff": ["diff", "a.json", "b.json"],
    "models": ["models"],
}


@pytest.mark.parametrize("content", list(BROKEN))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_unreadable_pyproject_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str, command: str
) -> None:
    path = _project(tmp_path, monkeypatch, BROKEN[content])
    r = invoke(*COMMANDS[command], env=USE_CONFIG)
    assert r.exit_code == 2, (r.exit_code, r.stderr, r.exception)
    line = _error_line(r.stderr)
    assert str(path) in line, line


@pytest.mark.parametrize("command", ["inspect", "models"])
def test_an_unreadable_pyproject_is_exit_2_from_the_console_script(
    tmp_path: Path, command: str
) -> None:
    # the real entry point (forked and watched): not "something in the model ended it"
    (tmp_path / "pyproject.toml").write_bytes(b"tool = 5\n")
    env = {k: v for k, v in os.environ.items() if k != "HOOKCLI_NO_CONFIG"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "fixtures"), str(ROOT)])
    r = subprocess.run(
        [sys.executable, "-m", "hookcli", *COMMANDS[command]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, (r.returncode, r.stderr)
    line = _error_line(r.stderr)
    assert "pyproject.toml" in line and "tool" in line, line


# -- R17: values checked after the table is read still name the file and the key ----------


def test_a_device_from_the_table_names_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _project(tmp_path, monkeypatch, '[tool.hookcli]\ndevice = "nodevice:7"\n')
    r = invoke("inspect", "sample_models:LeNet", env=USE_CONFIG)
    assert r.exit_code == 2, r.stderr
    line = _error_line(r.stderr)
    assert f"{path}: [tool.hookcli] device:" in line and "nodevice:7" in line, line


def test_a_device_on_the_command_line_does_not_blame_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _project(tmp_path, monkeypatch, "[tool.hookcli]\nseed = 1\n")
    r = invoke("inspect", "sample_models:LeNet", "--device", "nodevice:7", env=USE_CONFIG)
    assert r.exit_code == 2, r.stderr
    line = _error_line(r.stderr)
    assert "pyproject.toml" not in line and "--device" in line, line


def test_a_read_only_output_from_the_table_names_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "ro.json"
    target.write_text("{}")
    target.chmod(0o444)
    path = _project(tmp_path, monkeypatch, '[tool.hookcli.inspect]\noutput = "ro.json"\n')
    r = invoke("inspect", "sample_models:LeNet", env=USE_CONFIG)
    assert r.exit_code == 2, r.stderr
    line = _error_line(r.stderr)
    assert f"{path}: [tool.hookcli.inspect] output:" in line and "read-only" in line, line
    assert target.read_text() == "{}"


def test_a_bad_fail_on_from_the_table_names_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _project(tmp_path, monkeypatch, '[tool.hookcli]\nfail-on = "bogus"\n')
    r = invoke("grads", "sample_models:LeNet", env=USE_CONFIG)
    assert r.exit_code == 2, r.stderr
    line = _error_line(r.stderr)
    assert f"{path}: [tool.hookcli] fail-on:" in line and "bogus" in line, line


@pytest.mark.parametrize(
    ("value", "shown"),
    [("2e70", "2e+70"), ("1.5", "1.5"), ("true", "True"), ("18446744073709551616", "2**64")],
)
def test_a_seed_from_the_table_is_a_whole_number_in_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str, shown: str
) -> None:
    path = _project(tmp_path, monkeypatch, f"[tool.hookcli]\nseed = {value}\n")
    r = invoke("inspect", "sample_models:LeNet", "-f", "json", env=USE_CONFIG)
    assert r.exit_code == 2, (r.stderr, r.stdout[-300:])  # 1.5 and true were seed 1
    line = _error_line(r.stderr)
    assert f"{path}: [tool.hookcli] seed:" in line, line
    if shown != "2**64":
        assert shown in line, line


def test_a_float_for_a_float_option_is_still_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the whole-number check is for int options only; an int for a float option is fine
    _project(tmp_path, monkeypatch, "[tool.hookcli.grads]\nmax-grad-norm = 1000\nseed = 4\n")
    r = invoke("grads", "sample_models:LeNet", "-f", "json", env=USE_CONFIG)
    assert r.exit_code == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["settings"]["seed"] == 4
    assert any(c["name"] == "max-grad-norm" for c in report["checks"])


# -- R18: kwargs as a table ---------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "[tool.hookcli]\nkwargs = {num_classes = 7}\n",
        "[tool.hookcli.kwargs]\nnum_classes = 7\n",
        "[tool.hookcli.inspect]\nkwargs = {num_classes = 7}\n",
        '[tool.hookcli.inspect]\nkwargs = ["num_classes=7"]\n',
    ],
)
def test_kwargs_may_be_a_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    _project(tmp_path, monkeypatch, text)
    r = invoke("inspect", "sample_models:LeNet", "--no-forward", "-f", "json", env=USE_CONFIG)
    assert r.exit_code == 0, r.stderr
    layers = {row["name"]: row for row in json.loads(r.stdout)["layers"]}
    assert layers["fc3"]["params"] == 84 * 7 + 7  # LeNet's last Linear for 7 classes


def test_kwargs_table_values_keep_their_types(tmp_path: Path) -> None:
    from hookcli.config import kwargs_items
    from hookcli.loading import parse_kwargs

    table = {"a": 1, "b": "text", "c": [1, 2.5], "d": True, "e": {"x": "1"}, "f": "1"}
    assert parse_kwargs(kwargs_items(table, "where")) == table


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[tool.hookcli]\nkwargs = {'not an identifier' = 1}\n", "not an identifier"),
        ("[tool.hookcli]\nkwargs = {a = nan}\n", "nan"),
        ("[tool.hookcli]\nkwargs = {a = 1979-05-27}\n", "1979-05-27"),
    ],
)
def test_a_bad_kwargs_table_names_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, needle: str
) -> None:
    path = _project(tmp_path, monkeypatch, text)
    r = invoke("inspect", "sample_models:LeNet", "--no-forward", env=USE_CONFIG)
    assert r.exit_code == 2, r.stderr
    line = _error_line(r.stderr)
    assert f"{path}: [tool.hookcli] kwargs" in line and needle in line, line
    assert "no such command" not in line


def test_another_table_that_is_no_command_is_still_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _project(tmp_path, monkeypatch, "[tool.hookcli.inspct]\ndepth = 1\n")
    r = invoke("inspect", "sample_models:LeNet", "--no-forward", env=USE_CONFIG)
    assert r.exit_code == 2, r.stderr
    assert "[tool.hookcli.inspct]: no such command" in _error_line(r.stderr)


# -- hf: configs transformers refuses (B6, R13), or that make nothing to run (R11, R12) -----

# A small llama on meta: nothing allocated, fast to build.
SMALL = ["-k", "intermediate_size=32", "-k", "vocab_size=64", "-k", "num_hidden_layers=1"]


def _transformers_reason(**kwargs: object) -> str:
    """transformers' own reason for refusing a LlamaConfig, as its last line says it."""
    from transformers import LlamaConfig

    with pytest.raises(Exception) as info:
        LlamaConfig(**kwargs)
    reason = str(info.value).strip().splitlines()[-1].strip()
    return reason.split(": ", 1)[1] if ": " in reason else reason


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (
            ["-k", "hidden_size=7", "-k", "num_attention_heads=4"],
            {"hidden_size": 7, "num_attention_heads": 4},
        ),
        (["-k", "hidden_size=abc"], {"hidden_size": "abc"}),
    ],
)
def test_a_config_transformers_refuses_is_a_load_error_with_its_reason(
    args: list[str], kwargs: dict[str, object]
) -> None:
    pytest.importorskip("transformers")
    r = invoke("inspect", "hf:llama", "--device", "meta", *SMALL, *args)
    assert r.exit_code == 3, r.stderr
    line = _error_line(r.stderr)
    assert "internal error" not in line and "hf:llama" in line, line
    assert _transformers_reason(**kwargs) in line, line


def test_a_config_json_transformers_refuses_says_why(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"model_type": "llama", "hidden_size": "big", "num_hidden_layers": 1})
    )
    r = invoke("inspect", f"hf:{folder}", "--device", "meta")
    assert r.exit_code == 3, r.stderr
    line = _error_line(r.stderr)
    assert "config.json" in line, line
    assert not line.rstrip().endswith(":"), line
    assert _transformers_reason(hidden_size="big") in line, line


def test_vocab_size_0_says_the_config_makes_no_input() -> None:
    pytest.importorskip("transformers")
    r = invoke("inspect", "hf:llama", "--device", "meta", *SMALL, "-k", "vocab_size=0")
    assert r.exit_code == 3, r.stderr
    line = _error_line(r.stderr)
    assert "vocab_size=0" in line and "no input known" not in line, line


@pytest.mark.parametrize("key", ["num_hidden_layers", "hidden_size", "num_attention_heads"])
def test_a_negative_size_is_refused(key: str) -> None:
    pytest.importorskip("transformers")
    r = invoke("inspect", "hf:llama", "--device", "meta", *SMALL, "-k", f"{key}=-1")
    assert r.exit_code == 3, (r.stderr, r.stdout[-300:])
    line = _error_line(r.stderr)
    assert f"{key}=-1" in line, line


def test_a_negative_size_in_config_json_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"model_type": "llama", "num_hidden_layers": -2, "vocab_size": 64})
    )
    r = invoke("inspect", f"hf:{folder}", "--device", "meta")
    assert r.exit_code == 3, (r.stderr, r.stdout[-300:])
    assert "num_hidden_layers=-2" in _error_line(r.stderr)


def test_zero_layers_still_builds() -> None:
    # 0 is a size (an embedding alone); only negative ones are refused
    pytest.importorskip("transformers")
    r = invoke(
        "inspect", "hf:llama", "--device", "meta", *SMALL, "-k", "num_hidden_layers=0", "-f", "json"
    )
    assert r.exit_code == 0, r.stderr
    names = [row["name"] for row in json.loads(r.stdout)["layers"]]
    assert not any(n.startswith("layers.") for n in names), names
