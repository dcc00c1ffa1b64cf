"""Hardening, round 3 (issue 19): forged passes, stdout, read-only files as root, the
network, module-level instances, API arguments, and the rough spots.

Subprocess tests run ``python -m hookcli`` under a memory limit (the model ends the
process, or threads outlive the command); the rest run in-process.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hookcli
from hookcli.errors import UsageError
from tests.conftest import hook_count, invoke
from tests.fixtures import round3
from tests.test_hardening_io import ROOT, _env, _limit_memory, one_error_line, run_cli

FIX = "tests.fixtures.round3"


def _one_line_error(stderr: str) -> str:
    """stderr holds exactly one line, hookcli's error."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("hookcli: error: "), stderr
    return lines[0]


# -- bug 1: os._exit in the model cannot forge a pass ----------------------------------------


def test_os_exit_in_forward_is_exit_4_naming_the_module() -> None:
    r = run_cli("grads", f"{FIX}:ExitsInForward", "--fail-on", "nan", "--format", "json")
    assert r.returncode == 4, (r.returncode, r.stderr)
    line = one_error_line(r.stderr)
    assert "boom" in line and "os._exit(0)" in line, line
    report = json.loads(r.stdout)  # the layers that ran are still reported
    assert [row["name"] for row in report["layers"]][:2] == ["", "fc"]


def test_os_exit_in_a_model_thread_is_exit_4() -> None:
    r = run_cli("inspect", f"{FIX}:ExitsInThread")
    assert r.returncode == 4, (r.returncode, r.stderr)
    line = one_error_line(r.stderr)
    assert "os._exit(0)" in line and "quitter" in line, line


@pytest.mark.parametrize("how", ["ctypes", "exec"])
def test_a_native_exit_cannot_forge_a_pass(how: str) -> None:
    """Native code that ends the process with status 0 (no Python runs, so the os._exit
    guard cannot see it): the guarding parent finds no exit status announced, exit 4."""
    args = ("grads", f"{FIX}:NativeExit", "-k", f"how={how!r}", "--fail-on", "nan")
    r = run_cli(*args)
    assert r.returncode == 4, (r.returncode, r.stderr)
    line = _one_line_error(r.stderr)
    assert "ended with status 0 before hookcli finished" in line, line
    # unguarded, the same run is the forged pass the parent exists for
    plain = subprocess.run(
        [sys.executable, "-m", "hookcli", *args],
        cwd=ROOT,
        env={**_env(), "HOOKCLI_EXIT_GUARD": "0"},
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limit_memory,
    )
    assert plain.returncode == 0 and plain.stdout == "", plain


def test_which_runs_are_guarded(monkeypatch: pytest.MonkeyPatch) -> None:
    from hookcli.exitguard import should_guard

    assert should_guard(["grads", "m", "--fail-on", "nan"])
    assert should_guard(["profile", "m"]) and should_guard(["params", "m"])
    for argv in (
        [],
        ["--help"],
        ["--version"],
        ["inspect", "--help"],
        ["diff", "a.json", "b.json"],
        ["models"],
        ["grads", "m", "--ddp"],
        ["cost", "m", "--fsdp"],
    ):
        assert not should_guard(argv), argv
    monkeypatch.setenv("HOOKCLI_EXIT_GUARD", "0")
    assert not should_guard(["grads", "m"])


def test_a_child_killed_by_a_signal_is_reported_as_that_signal() -> None:
    r = run_cli("inspect", f"{FIX}:NativeExit", "-k", "how='kill'")
    assert r.returncode == -9, (r.returncode, r.stderr)  # what the shell shows as 137


def test_exit_statuses_pass_through_the_guarding_parent(tmp_path: Path) -> None:
    """0, 1 (a failed check) and 2 (usage) reach the caller unchanged, with the report."""
    ok = run_cli("params", "sample_models:LeNet", "--format", "json")
    assert ok.returncode == 0 and json.loads(ok.stdout)["command"] == "params", ok.stderr
    failed = run_cli("grads", "sample_models:UnusedBranch", "--fail-on", "unused", "-f", "json")
    assert failed.returncode == 1, failed.stderr
    assert not json.loads(failed.stdout)["checks"][0]["passed"]
    usage = run_cli("inspect", "sample_models:LeNet", "--depth", "-3")
    assert usage.returncode == 2, usage.stderr


# -- bug 2: stdout carries only the report ----------------------------------------------------


@pytest.mark.parametrize("fmt", ["json", "csv"])
@pytest.mark.parametrize("to_file", [False, True])
def test_a_model_thread_printing_after_the_report_stays_off_stdout(
    fmt: str, to_file: bool, tmp_path: Path
) -> None:
    out = tmp_path / f"report.{fmt}"
    args = ["inspect", f"{FIX}:ChattyThread", "--format", fmt]
    r = run_cli(*args, *(["-o", str(out)] if to_file else []))
    assert r.returncode == 0, r.stderr
    assert "CHATTER" in r.stderr  # the thread did print, after the report, to stderr
    text = out.read_text() if to_file else r.stdout
    if to_file:
        assert r.stdout == ""
    if fmt == "json":
        assert json.loads(text)["command"] == "inspect"
    else:
        rows = list(csv.reader(io.StringIO(text)))
        assert len({len(row) for row in rows}) == 1, rows
        assert len(rows) == 3  # header, root, fc


# -- bug 3 and rough 5: read-only files, as root too; the mode is kept ------------------------


@pytest.mark.parametrize(
    "option", [["-o"], ["--junit"], ["--update-baseline", "--baseline"]], ids=str
)
def test_a_read_only_target_is_refused_even_for_root(
    option: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "access", lambda *a, **k: True)  # what root is told
    target = tmp_path / "locked.json"
    target.write_text("keep me\n")
    target.chmod(0o444)
    r = invoke("params", f"{FIX}:Small", *option, str(target))
    assert r.exit_code == 2, (r.exit_code, r.stderr)
    assert "read-only" in _one_line_error(r.stderr)
    assert target.read_text() == "keep me\n"


def test_overwriting_keeps_the_file_mode(tmp_path: Path) -> None:
    target = tmp_path / "private.json"
    target.write_text("old\n")
    target.chmod(0o600)
    r = invoke("params", f"{FIX}:Small", "--format", "json", "-o", str(target))
    assert r.exit_code == 0, r.stderr
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert json.loads(target.read_text())["command"] == "params"


# -- bug 4: never the network, whatever HF_HUB_OFFLINE says ------------------------------------

_GUARDED = """
import os, socket, sys
def refuse(*a, **k):
    sys.stderr.write("NETWORK ATTEMPT\\n"); sys.stderr.flush()
    raise OSError("network refused by the test")
socket.socket.connect = refuse
socket.getaddrinfo = refuse
sys.argv = ["hookcli", *sys.argv[1:]]
from hookcli.cli import main
main()
"""


def test_hf_offline_is_forced_whatever_the_environment_says(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    env = {**_env(), "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0"}
    r = subprocess.run(
        [sys.executable, "-c", _GUARDED, "inspect", "hf:someone/not-in-the-cache"],
        cwd=ROOT,
        env={**env, "HF_HOME": str(tmp_path / "hf")},
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limit_memory,
    )
    assert "NETWORK ATTEMPT" not in r.stderr, r.stderr
    assert r.returncode == 3, r.stderr
    assert "hookcli never downloads" in one_error_line(r.stderr)


def test_force_offline_sets_and_puts_back_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    from hookcli.loading import force_offline
    from hookcli.preserve import scope

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    with scope():
        force_offline()
        assert os.environ["HF_HUB_OFFLINE"] == "1"
        assert os.environ["TRANSFORMERS_OFFLINE"] == "1"
    assert os.environ["HF_HUB_OFFLINE"] == "0"
    assert "TRANSFORMERS_OFFLINE" not in os.environ


# -- bug 5: a module-level instance is left exactly as found ------------------------------------


def _instance_state() -> dict[str, object]:
    m = round3.INSTANCE
    return {
        "tensors": {k: (v.dtype, v.device, v.detach().clone()) for k, v in m.state_dict().items()},
        "ids": [id(p) for p in m.parameters()],
        "requires_grad": [p.requires_grad for p in m.parameters()],
        "training": [x.training for x in m.modules()],
        "hooks": hook_count(m),
    }


def _assert_instance_as(before: dict[str, object]) -> None:
    after = _instance_state()
    assert after["ids"] == before["ids"]
    assert after["requires_grad"] == before["requires_grad"]
    assert after["training"] == before["training"]
    assert after["hooks"] == before["hooks"]
    tb, ta = before["tensors"], after["tensors"]
    assert isinstance(tb, dict) and isinstance(ta, dict) and tb.keys() == ta.keys()
    for k, (dtype, device, value) in tb.items():
        assert ta[k][0] == dtype and ta[k][1] == device, k
        assert torch.equal(ta[k][2], value), k


@pytest.mark.parametrize(
    "args",
    [
        ["inspect", "--dtype", "float64"],
        ["inspect", "--device", "meta"],
        ["grads", "--mode", "train", "--dtype", "float64"],
        ["stats", "--device", "meta"],
        ["params", "--frozen", "fc.*", "--dtype", "bfloat16"],
    ],
    ids=" ".join,
)
def test_an_instance_is_left_as_found(args: list[str]) -> None:
    before = _instance_state()
    r = invoke(args[0], f"{FIX}:INSTANCE", *args[1:])
    assert r.exit_code in (0, 2), (r.exit_code, r.stderr)
    _assert_instance_as(before)


def test_an_instance_gets_its_values_back_after_weights(tmp_path: Path) -> None:
    other = round3.Small()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    path = tmp_path / "w.pt"
    torch.save(other.state_dict(), path)
    before = _instance_state()
    r = invoke("inspect", f"{FIX}:INSTANCE", "--weights", str(path), "--dtype", "float64")
    assert r.exit_code == 0, r.stderr
    _assert_instance_as(before)


# -- bug 6 and rough 15: API arguments are checked like options -------------------------------


@pytest.mark.parametrize(
    ("fn", "kwargs", "needle"),
    [
        (hookcli.inspect, {"seed": 2**70}, "seed"),
        (hookcli.grads, {"seed": "1"}, "seed"),
        (hookcli.inspect, {"depth": -1}, "depth"),
        (hookcli.stats, {"depth": "2"}, "depth"),
        (hookcli.grads, {"mode": "training"}, "train, eval"),
        (hookcli.grads, {"loss": "max"}, "sum, mean"),
        (hookcli.grads, {"max_grad_norm": "big"}, "max_grad_norm"),
        (hookcli.grads, {"fail_on": [1, 2]}, "fail_on"),
        (hookcli.stats, {"backward": "yes"}, "backward"),
        (hookcli.cost, {"optimizer": "lion"}, "adam, adamw, sgd, sgd-momentum, adafactor, none"),
        (hookcli.cost, {"memory_for": "both"}, "train, inference"),
        (hookcli.cost, {"max_memory": -5}, "max_memory"),
        (hookcli.inspect, {"forward_kwargs": [1]}, "forward_kwargs"),
        (hookcli.grads, {"plot": 5}, "plot must be a file path"),
        (hookcli.profile, {"seed": 2**70}, "seed"),
        (hookcli.profile, {"seed": "1"}, "seed"),
        (hookcli.profile, {"repeat": "3"}, "repeat must be a whole number"),
        (hookcli.profile, {"repeat": True}, "repeat must be a whole number"),
        (hookcli.profile, {"repeat": 0}, "repeat must be >= 1"),
        (hookcli.profile, {"warmup": 1.5}, "warmup must be a whole number"),
        (hookcli.profile, {"warmup": -1}, "warmup must be >= 0"),
        (hookcli.profile, {"sort": "speed"}, "self, inclusive, calls, flops"),
        (hookcli.profile, {"depth": "2"}, "depth"),
        (hookcli.profile, {"mode": "training"}, "train, eval"),
        (hookcli.profile, {"backward": 1}, "backward"),
        (hookcli.profile, {"sync": "yes"}, "sync"),
        (hookcli.profile, {"max_ms": 5}, "max_ms"),
        (hookcli.profile, {"max_ms": ["fc"]}, "GLOB:MS"),
        (hookcli.profile, {"trace_out": 5}, "trace_out"),
        (hookcli.profile, {"plot": 5}, "plot"),
        (hookcli.profile, {"forward_kwargs": [1]}, "forward_kwargs"),
    ],
)
def test_api_arguments_raise_usage_error(fn: object, kwargs: dict, needle: str) -> None:
    model = round3.Small()
    with pytest.raises(UsageError) as info:
        fn(model, torch.zeros(3, 4), **kwargs)  # type: ignore[operator]
    assert needle in str(info.value)


def test_api_diff_checks_its_arguments() -> None:
    with pytest.raises(UsageError, match="rtol"):
        hookcli.diff({}, {}, rtol="tight")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="old and new"):
        hookcli.diff(1, 2)  # type: ignore[arg-type]


# -- rough 1 and 2: usage errors are one line -------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["inspect", "resnet18", "--seed", "banana"], "--seed"),
        (["inspect", "resnet18", "--nope"], "--nope"),
        (["inspect"], "MODEL"),
        (["inspect", "resnet18", "--format", "xml"], "--format"),
        (["nosuchcommand"], "nosuchcommand"),
    ],
)
def test_click_usage_errors_are_one_line(args: list[str], needle: str) -> None:
    r = invoke(*args)
    assert r.exit_code == 2
    assert needle in _one_line_error(r.stderr)


def test_a_bad_pyproject_value_names_the_file_and_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.hookcli]\nseed = "banana"\n')
    monkeypatch.chdir(tmp_path)
    r = invoke("inspect", "resnet18", env={"HOOKCLI_NO_CONFIG": ""})
    assert r.exit_code == 2
    line = _one_line_error(r.stderr)
    assert "pyproject.toml" in line and "seed" in line and "banana" in line, line


# -- rough 3: warnings are one note everywhere ---------------------------------------------


@pytest.mark.parametrize(
    ("command", "model"),
    [
        ("inspect", "Warns"),
        ("cost", "Warns"),
        ("buffers", "Warns"),
        ("inspect", "WarnsWhenBuilt"),
        ("params", "WarnsWhenBuilt"),  # no forward: the model must warn while built
    ],
)
def test_model_warnings_are_summarised(command: str, model: str) -> None:
    r = invoke(command, f"{FIX}:{model}")
    assert r.exit_code == 0, r.stderr
    assert (
        "warnings.warn" not in r.stderr
        and "Warning: round3" not in r.stderr.split("hookcli: note")[0]
    ), r.stderr
    notes = [ln for ln in r.stderr.splitlines() if ln.startswith("hookcli: note: warned")]
    assert len(notes) == 1, r.stderr
    assert "UserWarning: round3" in notes[0] and "1 other warning" in notes[0], notes[0]


# -- rough 4: stdlib functions are not factories ----------------------------------------------


def test_stdlib_functions_are_not_run(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    before = {"shutil": dict(vars(shutil)), "os.popen": os.popen}
    r = invoke("inspect", "shutil:rmtree", "-k", f"path='{victim}'")
    assert r.exit_code == 3
    assert "standard library" in _one_line_error(r.stderr)
    assert victim.is_dir()
    r = invoke("inspect", "os:popen", "-k", f"cmd='touch {tmp_path / 'ran'}'")
    assert r.exit_code == 3
    assert not (tmp_path / "ran").exists()
    # the modules themselves are untouched: no attribute of shutil added, removed or
    # replaced (rmtree is still the function it was), and os.popen is still os.popen
    assert dict(vars(shutil)) == before["shutil"]
    assert os.popen is before["os.popen"]


# -- rough 6: quantized models are counted ---------------------------------------------------


def test_quantized_conv_and_linear_macs() -> None:
    model = round3.quantized()
    report = hookcli.cost(model)
    rows = {r["name"]: r for r in report.to_dict()["layers"]}
    # conv: output 1x8x8x8 elements, each (3 in-channels x 3x3 kernel) multiply-adds
    conv_macs = (1 * 8 * 8 * 8) * (3 * 3 * 3)
    # linear: 10 outputs, each 512 in-features multiply-adds
    fc_macs = 10 * (8 * 8 * 8)
    assert rows["conv"]["macs"] == conv_macs
    assert rows["fc"]["macs"] == fc_macs
    assert report.totals["macs"] == conv_macs + fc_macs
    assert report.totals["flops"] == 2 * (conv_macs + fc_macs)


# -- rough 7: out of memory names the module --------------------------------------------------


def test_out_of_memory_in_forward_names_the_module() -> None:
    r = invoke("inspect", f"{FIX}:OutOfMemory")
    assert r.exit_code == 5
    line = _one_line_error(r.stderr)
    assert "out of memory" in line and "hungry" in line and "_Hungry" in line, line


# -- rough 8-13: options checked early, files that are not files -------------------------------


def test_ablate_fail_on_glob_matching_nothing_names_fail_on() -> None:
    r = invoke("ablate", f"{FIX}:Small", "--layer", "fc", "--fail-on", "fc9:rel_l2<1")
    assert r.exit_code == 2
    line = _one_line_error(r.stderr)
    assert "--fail-on" in line and "fc9" in line and "--layer" not in line, line


def test_baseline_folder_says_folder(tmp_path: Path) -> None:
    r = invoke("params", f"{FIX}:Small", "--baseline", str(tmp_path))
    assert r.exit_code == 2
    assert "is a folder" in _one_line_error(r.stderr)


def test_baseline_of_another_command_is_refused_before_the_run(tmp_path: Path) -> None:
    base = tmp_path / "params.json"
    assert invoke("params", f"{FIX}:Small", "--format", "json", "-o", str(base)).exit_code == 0
    round3.BUILT.clear()
    r = invoke("inspect", f"{FIX}:counted", "--baseline", str(base))
    assert r.exit_code == 2
    assert "'params'" in _one_line_error(r.stderr)
    assert round3.BUILT == []  # refused before the model was built


@pytest.mark.parametrize("command", ["stats", "features"])
def test_meta_refused_before_building(command: str) -> None:
    round3.BUILT.clear()
    extra = ["--layer", "fc"] if command == "features" else []
    r = invoke(command, f"{FIX}:counted", "--device", "meta", *extra)
    assert r.exit_code == 2
    assert "meta" in _one_line_error(r.stderr)
    assert round3.BUILT == []


def test_diff_refuses_devices_and_bounds_the_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = tmp_path / "a.json"
    assert invoke("params", f"{FIX}:Small", "--format", "json", "-o", str(good)).exit_code == 0
    dev = run_cli("diff", "/dev/zero", str(good))  # a child: reading it all would fill memory
    assert dev.returncode == 2, dev.stderr
    assert "not a regular file" in one_error_line(dev.stderr)
    monkeypatch.setattr(sys.modules["hookcli.diff"], "MAX_REPORT_BYTES", 64)
    r = invoke("diff", str(good), str(good))
    assert r.exit_code == 2
    assert "larger than" in _one_line_error(r.stderr)
    r = invoke("diff", "-", str(good), input="x" * 100)
    assert r.exit_code == 2
    assert "stdin is larger" in _one_line_error(r.stderr)


def test_weights_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "weights.pt"
    os.mkfifo(fifo)
    try:
        r = subprocess.run(
            [sys.executable, "-m", "hookcli", "params", f"{FIX}:Small", "--weights", str(fifo)],
            cwd=ROOT,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=_limit_memory,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("--weights on a FIFO blocked")
    assert r.returncode == 3, r.stderr
    assert "not a regular file" in one_error_line(r.stderr)


# -- rough 14: models --filter hints ------------------------------------------------------------


def test_models_filter_with_no_match_suggests() -> None:
    r = invoke("models", "--filter", "resnt18", "--source", "torchvision")
    assert r.exit_code == 0
    assert "'*resnt18*'" in r.stderr and "resnet18" in r.stderr, r.stderr
    r = invoke("models", "--filter", "lenet", "--source", "torchvision")
    assert "'*lenet*'" in r.stderr and "mobilenet" in r.stderr, r.stderr


# -- rough 16: in-process runs put the global RNGs back ----------------------------------------


def test_in_process_runs_restore_the_rngs() -> None:
    torch.manual_seed(99)
    random.seed(7)
    torch_state, py_state = torch.get_rng_state(), random.getstate()
    r = invoke("inspect", f"{FIX}:Small", "--seed", "5")
    assert r.exit_code == 0, r.stderr
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert random.getstate() == py_state
