"""Exit codes a CI can trust under hostile models, signals and odd input (issue 10, I/O items).

Models that print, call sys.exit or run out of memory; options out of range; SIGINT and
SIGTERM; ``-o`` targets; odd module names. Subprocess tests run ``python -m hookcli``
under a memory limit, since they send real signals or exhaust real memory.
"""

from __future__ import annotations

import csv
import io
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import assert_no_hooks, assert_same_state, invoke, state_snapshot

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = "tests/fixtures/hostile.py"
LIMIT = 6 << 30  # address space for a child: torch plus a small model, never a big one


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))
    # as a terminal starts a command: a suite run in the background (`make test &`, nohup)
    # would otherwise hand its ignored SIGINT/SIGHUP down, and hookcli keeps an ignored
    # signal ignored (nohup's contract), so the signal tests would see no signal at all
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")}
    env.update(
        PYTHONPATH=str(ROOT),
        OMP_NUM_THREADS="1",
        HOOKCLI_NO_CONFIG="1",
        HF_HUB_OFFLINE="1",
        COLUMNS="120",
    )
    return env


def spawn(*args: str, cwd: Path = ROOT) -> subprocess.Popen[bytes]:
    """``python -m hookcli ARGS`` under a memory limit, stdout and stderr piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "hookcli", *args],
        cwd=cwd,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_limit_memory,
    )


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hookcli", *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limit_memory,
    )


def one_error_line(stderr: str) -> str:
    """The last stderr line, which must be hookcli's own; never a traceback."""
    assert "Traceback" not in stderr, stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert lines, "nothing on stderr"
    return lines[-1]


def wait_for(predicate: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


# -- 1. whatever the model prints goes to stderr -----------------------------------------


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_model_prints_stay_out_of_the_report(fmt: str) -> None:
    # a process of its own, as a user runs it: the file inside the tests package is
    # imported as tests.fixtures.hostile, which one process imports once
    result = run_cli("inspect", f"{HOSTILE}:Prints", "--format", fmt)
    assert result.returncode == 0, result.stderr
    for where in ("while imported", "while built", "in forward"):
        assert f"hostile: printed {where}" in result.stderr
    assert "written in forward" in result.stderr
    assert "hostile: " not in result.stdout
    # the report parses, and its figures are the model's (Linear(4, 3): 4*3 + 3)
    if fmt == "json":
        report = json.loads(result.stdout)
        assert report["totals"]["params"] == 4 * 3 + 3
    else:
        rows = list(csv.DictReader(io.StringIO(result.stdout)))
        assert [r["name"] for r in rows] == ["", "fc"]


def test_file_descriptor_writes_go_to_stderr_too() -> None:
    """C code and child processes write to fd 1 directly: that is stderr as well."""
    proc = run_cli("inspect", f"{HOSTILE}:Prints", "-f", "json")
    assert proc.returncode == 0, proc.stderr
    assert "hostile: fd 1 in forward" in proc.stderr
    assert json.loads(proc.stdout)["model"]["class"] == "Prints"


# -- 2. sys.exit in the model is a failure, never exit 0 ----------------------------------


@pytest.mark.parametrize(
    ("spec", "where"),
    [
        (f"{HOSTILE}:ExitsInInit", "constructor"),
        (f"{HOSTILE}:exits_in_factory", "factory"),
        ("tests/fixtures/exits_on_import.py:Net", "importing"),
        ("tests.fixtures.exits_on_import:Net", "importing"),
    ],
)
def test_sys_exit_while_building_is_exit_3(spec: str, where: str) -> None:
    result = invoke("inspect", spec, "-i", "2x4")
    assert result.exit_code == 3, (result.exit_code, result.stderr)
    line = one_error_line(result.stderr)
    assert "sys.exit(0)" in line and where in line


def test_sys_exit_in_forward_is_exit_4_naming_the_module() -> None:
    result = invoke("inspect", f"{HOSTILE}:ExitsInForward", "-f", "json")
    assert result.exit_code == 4, (result.exit_code, result.stderr)
    line = one_error_line(result.stderr)
    assert "body.1" in line and "sys.exit(0)" in line
    report = json.loads(result.stdout)  # the layers that ran are still reported
    assert [r["name"] for r in report["layers"] if r["output_shapes"]] == ["body.0"]


def test_sys_exit_in_backward_is_exit_4_naming_the_module() -> None:
    result = invoke("grads", f"{HOSTILE}:ExitsInBackward")
    assert result.exit_code == 4, (result.exit_code, result.stderr)
    line = one_error_line(result.stderr)
    assert "backward failed in gate" in line and "sys.exit(0)" in line


def test_sys_exit_in_forward_leaves_the_model_as_found() -> None:
    from hookcli.errors import RunError
    from hookcli.options import Mode
    from hookcli.session import HookSession
    from tests.fixtures.hostile import _Quits

    # Every kind of state the snapshot holds is changed before the exit: the session puts
    # the model in train mode and sets each grad to None; BatchNorm's running stats move
    # in the forward, before the module that exits. Each must be put back.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), _Quits()).eval()
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    before = state_snapshot(model)
    with (
        pytest.raises(RunError, match=r"sys\.exit"),
        HookSession(model, mode=Mode.TRAIN, backward=True) as s,
    ):
        s.forward((torch.randn(2, 4),))
    assert_no_hooks(model)
    assert_same_state(before, state_snapshot(model))  # flags, buffers, grads, in-place flags


# -- 3. out of memory anywhere is exit 5 ---------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["inspect", f"{HOSTILE}:OOMInInit"], "out of memory while building"),
        (["inspect", f"{HOSTILE}:OOMInForward"], "out of memory during forward"),
        (["grads", f"{HOSTILE}:OOMInBackward"], "out of memory during backward"),
    ],
)
def test_out_of_memory_is_exit_5(argv: list[str], fragment: str) -> None:
    result = invoke(*argv)
    assert result.exit_code == 5, (result.exit_code, result.stderr)
    line = one_error_line(result.stderr)
    assert fragment in line and "internal error" not in line


_REAL_OOM = [
    # 120 GB of float32: the allocator refuses under the limit
    (["inspect", "sample_models:LeNet", "-i", "1x3x100000x100000"], "drawing input"),
    (["inspect", "sample_models:LeNet", "-i", "1x1x32x32", "-b", "40000000"], "drawing input"),
    # a constructor that really allocates 64 GiB
    (["inspect", f"{HOSTILE}:HugeInit", "-i", "1x1"], "while building"),
]

# One child under the memory limit runs every case (one torch import, not three).
_RUN_EACH = """
import json, sys
from typer.testing import CliRunner
from hookcli.cli import app
for argv in json.loads(sys.argv[1]):
    result = CliRunner().invoke(app, argv)
    print(json.dumps([result.exit_code, result.stderr]))
"""


def test_real_allocation_failures_are_exit_5() -> None:
    cases = json.dumps([argv for argv, _ in _REAL_OOM])
    proc = subprocess.run(
        [sys.executable, "-c", _RUN_EACH, cases],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limit_memory,
    )
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(ln) for ln in proc.stdout.splitlines()]
    assert len(results) == len(_REAL_OOM)
    for (argv, fragment), (code, stderr) in zip(_REAL_OOM, results, strict=True):
        assert code == 5, (argv, code, stderr)
        line = one_error_line(stderr)
        assert line.startswith("hookcli: error: out of memory") and fragment in line, line


def test_is_oom_sees_the_cause_of_a_wrapped_error() -> None:
    from hookcli.errors import LoadError, is_oom

    try:
        try:
            raise torch.OutOfMemoryError("CUDA out of memory")
        except RuntimeError as err:
            raise LoadError("could not build x") from err
    except LoadError as wrapped:
        assert is_oom(wrapped)
    assert not is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


# -- 4. values out of range: exit 2 with the grammar, before torch is imported --------------

OUT_OF_RANGE = [
    (["--seed", str(2**64)], "--seed"),
    (["--seed", str(-(2**63) - 1)], "--seed"),
    (["-i", f"int64:1x2:0..{2**63}"], "grammar"),
    (["-i", f"int64:1x2:{-(2**63) - 1}..0"], "grammar"),
    (["-i", f"int32:1x2:0..{2**31 + 1}"], "grammar"),
    (["-i", "99999999999x99999999999x9999"], "grammar"),
    (["-i", "1x1x32x32", "-b", str(2**62)], "grammar"),
    (["-i", "1x1x32x32", "-b", str(2**64)], "--batch-size"),
    (["--device", "CPU"], "cpu, cuda, cuda:N, mps, meta"),
    (["--device", "tpu"], "cpu, cuda, cuda:N, mps, meta"),
    (["--device", "cpu:5"], "cpu, cuda, cuda:N, mps, meta"),
    (["-i", "k=1x2", "-i", "1x2"], "positional"),
]


@pytest.mark.parametrize(
    ("extra", "fragment"), OUT_OF_RANGE, ids=[" ".join(e) for e, _ in OUT_OF_RANGE]
)
def test_out_of_range_is_exit_2(extra: list[str], fragment: str) -> None:
    result = invoke("inspect", "sample_models:LeNet", *extra)
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    line = one_error_line(result.stderr)
    assert fragment in line and "internal error" not in line


_NO_TORCH = """
import json, sys
from typer.testing import CliRunner
from hookcli.cli import app
codes = [CliRunner().invoke(app, argv).exit_code for argv in json.loads(sys.argv[1])]
print(json.dumps([codes, "torch" in sys.modules]))
"""


def test_usage_errors_come_before_torch_is_imported() -> None:
    cases = [["inspect", "sample_models:LeNet", *extra] for extra, _ in OUT_OF_RANGE]
    cases.append(["inspect", "sample_models:LeNet", "-o", str(ROOT)])  # a folder
    proc = subprocess.run(
        [sys.executable, "-c", _NO_TORCH, json.dumps(cases)],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limit_memory,
    )
    assert proc.returncode == 0, proc.stderr
    codes, torch_imported = json.loads(proc.stdout)
    assert codes == [2] * len(cases)
    assert not torch_imported


def test_the_widest_ranges_are_accepted_and_drawn_as_torch_does() -> None:
    from hookcli.inputs.grammar import build_inputs

    lo, hi = -(2**63), 2**63 - 1
    got = build_inputs(
        torch.nn.Identity(), [f"int64:64:{lo}..{hi}", f"int32:8:{-(2**31)}..{2**31}"]
    )
    g = torch.Generator().manual_seed(0)
    assert torch.equal(got.args[0], torch.randint(lo, hi, (64,), generator=g))
    expected = torch.randint(-(2**31), 2**31, (8,), generator=g).to(torch.int32)
    assert torch.equal(got.args[1], expected)


def test_the_largest_seed_is_accepted() -> None:
    result = invoke("inspect", "sample_models:LeNet", "--seed", str(2**64 - 1), "-f", "json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["settings"]["seed"] == 2**64 - 1


# -- 5. -i that forward cannot take: exit 2 with forward's signature ----------------------


@pytest.mark.parametrize(
    ("spec", "inputs", "fragment"),
    [
        ("sample_models:LeNet", ["1x1x32x32", "1x1x32x32"], "LeNet.forward(x)"),
        ("sample_models:LeNet", ["y=1x1x32x32"], "LeNet.forward(x)"),
        (f"{HOSTILE}:TwoInputs", ["2x4", "2x4", "2x4"], "TwoInputs.forward(x, y=None)"),
        (f"{HOSTILE}:TwoInputs", ["2x4", "x=2x4"], "TwoInputs.forward(x, y=None)"),
        (f"{HOSTILE}:PositionalOnly", ["x=2x4"], "PositionalOnly.forward(x, /)"),
    ],
)
def test_inputs_forward_does_not_take_are_exit_2(
    spec: str, inputs: list[str], fragment: str
) -> None:
    argv = ["inspect", spec]
    for text in inputs:
        argv += ["-i", text]
    result = invoke(*argv)
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    assert fragment in one_error_line(result.stderr)


def test_forward_with_varargs_takes_any_inputs() -> None:
    result = invoke(
        "inspect", f"{HOSTILE}:Varargs", "-i", "2x4", "-i", "2x4", "-i", "z=2x4", "-f", "json"
    )
    assert result.exit_code == 0, result.stderr
    assert [i["name"] for i in json.loads(result.stdout)["inputs"]] == ["input0", "input1", "z"]


def test_keyword_input_forward_accepts_runs() -> None:
    result = invoke("inspect", f"{HOSTILE}:TwoInputs", "-i", "2x4", "-i", "y=2x4", "-f", "json")
    assert result.exit_code == 0, result.stderr


# -- 6. SIGTERM like SIGINT; signals during a save or while the report prints -------------


# SIGINT worked before SIGTERM did; its subprocess variants run with the slow tests.
SIGNALS = [
    (signal.SIGTERM, 143, "terminated"),
    pytest.param(signal.SIGINT, 130, "interrupted", marks=pytest.mark.slow),
]


def test_sigterm_during_forward_restores_the_model_in_process() -> None:
    from tests.fixtures.hostile import SELF_TERMINATES as model

    model.train()
    before = state_snapshot(model)
    # Before hookcli handled SIGTERM this guard turned it into Ctrl-C (exit 130), so the
    # test fails there instead of killing the test run.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        result = invoke("grads", "tests.fixtures.hostile:SELF_TERMINATES")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result.exit_code == 143, (result.exit_code, result.stderr)
    assert one_error_line(result.stderr) == "hookcli: terminated"
    assert_no_hooks(model)
    after = state_snapshot(model)
    assert before["training"] == after["training"]
    for key, (ident, value) in before["buffers"].items():
        assert after["buffers"][key][0] == ident and torch.equal(after["buffers"][key][1], value)
    assert all(g is None for g in after["grads"].values())


@pytest.mark.parametrize(("sig", "code", "line"), SIGNALS)
def test_signal_during_forward(tmp_path: Path, sig: int, code: int, line: str) -> None:
    marker = tmp_path / "running"
    proc = spawn("inspect", f"{HOSTILE}:Slow", "-k", f"marker='{marker}'")
    wait_for(marker.exists)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert one_error_line(err.decode()) == f"hookcli: {line}"
    assert out == b""


@pytest.mark.parametrize(
    ("sig", "code", "line"),
    [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")],
)
def test_signal_during_a_save_leaves_no_temp_file(
    tmp_path: Path, sig: int, code: int, line: str
) -> None:
    target = tmp_path / "features.pt"
    proc = spawn(
        "features", f"{HOSTILE}:BigFeatures", "-k", "mib=32", "-l", "layers.*", "--out", str(target)
    )

    def saving() -> bool:
        # the -o preflight's probe file comes and goes: a file may vanish between the
        # listing and the stat, and only the save's own temp file (with bytes) counts
        for p in tmp_path.iterdir():
            if p.suffix != ".tmp" or p.name.startswith(".hookcli-probe."):
                continue
            try:
                if p.stat().st_size > 0:
                    return True
            except FileNotFoundError:
                continue
        return False

    wait_for(saving)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert one_error_line(err.decode()) == f"hookcli: {line}"
    assert list(tmp_path.iterdir()) == []  # neither the temp file nor half a target


@pytest.mark.parametrize(("sig", "code", "line"), SIGNALS)
def test_signal_while_the_report_prints(sig: int, code: int, line: str) -> None:
    proc = spawn("inspect", f"{HOSTILE}:Deep", "-f", "json")
    assert proc.stdout is not None
    try:
        first = proc.stdout.read(100)  # the report has begun; the pipe fills behind it
        # Nothing more is read until hookcli has ended: the rest of the report (several
        # hundred kB) cannot get past the full pipe, so however late the guarding parent
        # relays the signal, it lands while the report prints. (Draining stdout right
        # after the signal let a relay slowed by a busy machine arrive after the whole
        # report was out.) A hookcli that went on writing would block here for good.
        proc.send_signal(sig)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("hookcli went on writing the report after the signal")
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == code, err
    assert one_error_line(err.decode()) == f"hookcli: {line}"
    # 3000 rows make several hundred kB: the report stopped where the signal found it
    assert first.startswith(b"{") and len(first + out) < 700_000


def test_a_reader_that_stops_early_is_not_an_error() -> None:
    """``hookcli ... | head``: the report's reader leaves; hookcli exits quietly."""
    proc = spawn("inspect", f"{HOSTILE}:Deep", "-f", "json")
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(300).startswith(b"{")
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err
    assert "error" not in err and "Traceback" not in err


def test_interrupted_atomic_write_keeps_the_old_file_and_no_temp(tmp_path: Path) -> None:
    from hookcli.atomic import atomic_write

    target = tmp_path / "report.txt"
    target.write_text("old")

    def interrupted(f: Any) -> None:
        f.write(b"half a rep")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, interrupted)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.txt"]


# -- 7. -o FILE: checked before the run, written atomically, - is stdout -------------------


def test_output_folder_is_exit_2_before_the_model_is_built(tmp_path: Path) -> None:
    result = invoke("inspect", f"{HOSTILE}:Prints", "-o", str(tmp_path))
    assert result.exit_code == 2, result.stderr
    assert "folder" in one_error_line(result.stderr)
    assert "printed while built" not in result.stderr + result.stdout  # never built


def test_output_under_a_file_is_exit_2_before_the_run(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = invoke("inspect", f"{HOSTILE}:Prints", "-o", str(blocker / "report.txt"))
    assert result.exit_code == 2, result.stderr
    assert "not a folder" in one_error_line(result.stderr)
    assert "printed while built" not in result.stderr + result.stdout  # never built


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_output_where_no_file_can_be_created_is_exit_2() -> None:
    # /proc refuses new files even to root, which os.access alone would let through
    result = invoke("inspect", f"{HOSTILE}:Prints", "-o", "/proc/hookcli-test/report.txt")
    assert result.exit_code == 2, result.stderr
    assert "cannot create files" in one_error_line(result.stderr)
    assert "printed while built" not in result.stderr + result.stdout  # never built


def test_features_out_target_is_checked_before_the_run(tmp_path: Path) -> None:
    (tmp_path / "d.pt").mkdir()
    result = invoke("features", f"{HOSTILE}:Prints", "-l", "fc", "--out", str(tmp_path / "d.pt"))
    assert result.exit_code == 2, result.stderr
    assert "printed while built" not in result.stderr + result.stdout  # never built


def test_output_dash_is_stdout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke("inspect", str(ROOT / HOSTILE) + ":Prints", "-o", "-", "-f", "json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["totals"]["params"] == 15
    assert list(tmp_path.iterdir()) == []


def test_output_is_written_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "report.json"
    target.write_text("previous report")

    def interrupted(fd: int) -> None:  # Ctrl-C after the data went out, before the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    result = invoke("inspect", "sample_models:LeNet", "-o", str(target), "-f", "json")
    assert result.exit_code == 130, result.stderr
    assert target.read_text() == "previous report"
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]
    monkeypatch.undo()
    result = invoke("inspect", "sample_models:LeNet", "-o", str(target), "-f", "json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(target.read_text())["command"] == "inspect"
    assert oct(target.stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# -- 11. --device errors list hookcli's devices ---------------------------------------------


@pytest.mark.parametrize("device", ["CPU", "tpu", "cpu:5", "cuda:x", "meta:0", "Cuda:0", ""])
def test_device_errors_list_hookclis_devices(device: str) -> None:
    result = invoke("inspect", "sample_models:LeNet", "--device", device)
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    line = one_error_line(result.stderr)
    assert "hookcli's devices: cpu, cuda, cuda:N, mps, meta" in line
    assert "xla" not in line  # not torch's own list of device types


def test_missing_cuda_device_lists_the_devices_here() -> None:
    # one past the last GPU here: never on this machine, however many it has
    missing = f"cuda:{torch.cuda.device_count()}"
    result = invoke("inspect", "sample_models:LeNet", "--device", missing)
    assert result.exit_code == 2
    line = one_error_line(result.stderr)
    assert "hookcli's devices: cpu, cuda, cuda:N, mps, meta" in line
    assert "on this machine: cpu" in line


# -- 12. only nn.Module classes and Python functions are called -----------------------------


@pytest.mark.parametrize("spec", ["os:system", "os.system", "builtins:exec", "builtins:print"])
def test_builtins_are_not_model_factories(spec: str, tmp_path: Path) -> None:
    flag = tmp_path / "ran"
    result = invoke("inspect", spec, "-k", f"command='touch {flag}'")
    assert result.exit_code == 3, (result.exit_code, result.stderr)
    assert "not a model factory" in one_error_line(result.stderr)
    assert not flag.exists()


def test_a_class_that_is_not_a_module_is_not_called() -> None:
    result = invoke("inspect", "pathlib:Path", "-i", "1x1")
    assert result.exit_code == 3
    assert "not a model factory" in one_error_line(result.stderr)


@pytest.mark.parametrize(
    "spec",
    [
        "sample_models:LeNet",
        "tests.fixtures.hostile:Factories.static",
        "tests.fixtures.hostile:Factories.clsmethod",
        "tests.fixtures.hostile:PARTIAL",
        "tests.fixtures.hostile:_linear",
    ],
)
def test_python_factories_are_still_called(spec: str) -> None:
    extra = ["-k", "width=4"] if spec.endswith(("_linear", "PARTIAL")) else []
    extra += ["-k", "out=2"] if spec.endswith("_linear") else []
    inputs = ["-i", "1x1x32x32"] if "LeNet" in spec else ["-i", "3x4"]
    result = invoke("inspect", spec, *extra, *inputs, "-f", "json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    # the same factory called by hand, with the same keyword arguments: the oracle
    import functools
    import importlib

    module_name, attr = spec.split(":")
    target: object = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    kwargs = {"width": 4} if spec.endswith(("_linear", "PARTIAL")) else {}
    kwargs |= {"out": 2} if spec.endswith("_linear") else {}
    assert callable(target) or isinstance(target, functools.partial)
    model = target(**kwargs)
    assert report["totals"]["params"] == sum(p.numel() for p in model.parameters())


# -- 16. odd module names do not break the table ---------------------------------------------


def test_control_characters_in_names_do_not_break_the_table() -> None:
    from tests.fixtures.hostile import OddNames

    result = invoke("inspect", f"{HOSTILE}:OddNames")
    assert result.exit_code == 0, result.stderr
    assert "\x1b" not in result.stdout and "\t" not in result.stdout
    lines = result.stdout.splitlines()
    rule = next(i for i, ln in enumerate(lines) if ln.startswith("---"))
    body = lines[rule + 1 : lines.index("", rule)]
    assert len(body) == len(list(OddNames().modules()))  # one line per module call
    assert any("line\\nbreak" in ln for ln in body)
    assert any("esc\\x1b[2Jclear" in ln for ln in body)


def test_control_characters_in_markdown_and_error_lines() -> None:
    result = invoke("inspect", f"{HOSTILE}:OddNames", "-f", "markdown")
    assert result.exit_code == 0
    rows = [ln for ln in result.stdout.splitlines() if ln.startswith("| ")]
    assert len(rows) == 1 + 4  # header + one row per module
    assert "\x1b" not in result.stdout
    result = invoke("inspect", f"{HOSTILE}:OddNameRaises")
    assert result.exit_code == 4
    ours = [ln for ln in result.stderr.splitlines() if not ln.startswith("hostile: ")]
    assert len(ours) == 1 and "forward failed in bad\\nname (Linear)" in ours[0], ours


def test_control_characters_in_the_per_parameter_table() -> None:
    result = invoke("grads", f"{HOSTILE}:OddNames", "--per-param")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    start = lines.index("Parameters:") + 3  # title, header, rule
    body = lines[start : lines.index("", start)]
    # one line per parameter: 2 Linear layers with a weight and a bias each
    assert len(body) == 4, body
    assert body[0].startswith("line\\nbreak.weight")


def test_json_keeps_the_exact_names() -> None:
    result = invoke("inspect", f"{HOSTILE}:OddNames", "-f", "json")
    names = [r["name"] for r in json.loads(result.stdout)["layers"]]
    assert names == ["", "line\nbreak", "tab\there", "esc\x1b[2Jclear"]


# -- 21. one atomic writer for -o and features --out ----------------------------------------


def test_output_and_features_out_share_one_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hookcli.atomic as atomic

    written: list[str] = []
    original = atomic.atomic_write

    def recording(path: Path, write: Any, option: str = "") -> None:
        written.append(path.name)
        original(path, write, option)

    import hookcli.features.runner as features

    assert features.atomic_write is atomic.atomic_write  # no second writer of its own
    monkeypatch.setattr(atomic, "atomic_write", recording)
    monkeypatch.setattr(features, "atomic_write", recording)
    result = invoke(
        "features",
        "sample_models:LeNet",
        "-l",
        "conv1",
        "-i",
        "1x1x32x32",
        "--out",
        str(tmp_path / "f.pt"),
        "-o",
        str(tmp_path / "report.txt"),
    )
    assert result.exit_code == 0, result.stderr
    assert sorted(written) == ["f.pt", "report.txt"]
    saved = torch.load(tmp_path / "f.pt", weights_only=True)
    torch.manual_seed(0)
    from sample_models import LeNet

    model = LeNet().eval()
    x = torch.randn((1, 1, 32, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(saved["conv1"], model.conv1(x))


# -- the process's end ------------------------------------------------------------------


@pytest.mark.parametrize("full_exit", ["", "1"])
def test_exit_runs_atexit_handlers_and_flushes_the_report(tmp_path: Path, full_exit: str) -> None:
    """hookcli leaves without the interpreter's finalization (docs/performance.md), yet
    the model's atexit handlers run and the whole report reaches the pipe."""
    marker = tmp_path / "m"
    args = ("inspect", f"{HOSTILE}:LeavesWork", "-k", f"marker='{marker}'", "-f", "json")
    proc = subprocess.run(
        [sys.executable, "-m", "hookcli", *args],
        cwd=ROOT,
        env={**_env(), "HOOKCLI_FULL_EXIT": full_exit},
        capture_output=True,
        timeout=120,
        preexec_fn=_limit_memory,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)  # complete: the last byte was flushed
    assert report["totals"]["params"] == 4 * 4 + 4
    assert (tmp_path / "m.atexit").read_text() == "ran"


def test_exit_waits_for_the_model_threads(tmp_path: Path) -> None:
    """A non-daemon thread the model started is waited for, as Python would."""
    marker = tmp_path / "m"
    result = run_cli(
        "inspect", f"{HOSTILE}:LeavesWork", "-k", f"marker='{marker}'", "-k", "thread_seconds=1.0"
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "m.thread").read_text() == "ran"
    assert (tmp_path / "m.atexit").read_text() == "ran"


def test_exit_code_of_a_failed_check_survives_the_fast_exit() -> None:
    result = run_cli("grads", "sample_models:UnusedBranch", "--fail-on", "unused")
    assert result.returncode == 1, result.stderr
    assert "unused" in result.stdout
