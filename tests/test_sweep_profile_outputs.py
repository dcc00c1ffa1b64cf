"""Issue 28's sweep on output files and ``profile`` (B3, B7, R1-R7, R25).

Each test checks what happened on disk or whether the model was built at all (a factory
here counts its calls), not hookcli's own account of it: a refused file keeps its bytes
and mode, a refused option leaves the factory uncalled and no file behind.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import hookcli
from hookcli.errors import ResourceError, UsageError
from tests.conftest import invoke

BUILT: list[str] = []
SPEC = "tests.test_sweep_profile_outputs:tiny"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


def tiny() -> nn.Module:
    """The model factory the CLI calls: each call is recorded."""
    BUILT.append("tiny")
    return Tiny()


@pytest.fixture(autouse=True)
def _fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    BUILT.clear()
    monkeypatch.chdir(tmp_path)  # a stray file named "-" would land here


def _run(*args: str) -> Any:
    return invoke(args[0], SPEC, "-i", "2x4", *args[1:])


def _read_only(path: Path, data: bytes = b"keep me\n") -> Path:
    path.write_bytes(data)
    path.chmod(0o444)
    return path


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# -- B3: a read-only file is refused by every output option, as -o refuses it ----------------


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["profile", "--trace-out", "{}"], "--trace-out"),
        (["profile", "--plot", "{}"], "--plot"),
        (["grads", "--plot", "{}"], "--plot"),
        (["profile", "-o", "{}"], "--output"),  # the reference behaviour
    ],
)
def test_read_only_file_is_refused_before_the_build(
    tmp_path: Path, args: list[str], option: str
) -> None:
    target = _read_only(tmp_path / "ro.png")
    result = _run(*[a.format(target) if a == "{}" else a for a in args])
    assert result.exit_code == 2, result.stderr
    assert f"{option} {target}: the file is read-only" in result.stderr
    assert target.read_bytes() == b"keep me\n" and _mode(target) == 0o444
    assert BUILT == []


@pytest.mark.parametrize("key", ["trace_out", "plot"])
def test_api_refuses_a_read_only_file(tmp_path: Path, key: str) -> None:
    target = _read_only(tmp_path / "ro.png")
    with pytest.raises(UsageError, match="read-only"):
        hookcli.profile(Tiny(), torch.ones(2, 4), warmup=0, repeat=1, **{key: target})
    assert target.read_bytes() == b"keep me\n" and _mode(target) == 0o444


# -- R1, R2: refused before the model is built ------------------------------------------------


def test_profile_on_meta_is_refused_before_the_build() -> None:
    result = _run("profile", "--device", "meta")
    assert result.exit_code == 2 and "no time" in result.stderr
    assert BUILT == []


def test_no_forward_mult_adds_is_refused_before_the_build() -> None:
    result = invoke("inspect", SPEC, "--no-forward", "--columns", "kernel_size,mult_adds")
    assert result.exit_code == 2 and "--columns mult_adds" in result.stderr
    assert BUILT == []
    # the tree itself still works without mult_adds
    assert invoke("inspect", SPEC, "--no-forward", "--columns", "kernel_size").exit_code == 0
    assert BUILT == ["tiny"]


# -- R3: a place where no file can be made is refused before the run --------------------------

_UNWRITABLE = ["blocker/t.json"] + (["/proc/self/t.json"] if Path("/proc/self").is_dir() else [])


@pytest.mark.parametrize("where", _UNWRITABLE)
def test_unwritable_trace_is_refused_before_the_build(tmp_path: Path, where: str) -> None:
    (tmp_path / "blocker").write_text("a file, not a folder")
    result = _run("profile", "--repeat", "1", "--warmup", "0", "--trace-out", where)
    assert result.exit_code == 2 and "--trace-out" in result.stderr
    assert "Traceback" not in result.stderr
    assert BUILT == []


# -- R4: "-" is not a file name, and not stdout either (stdout has the report) ----------------


@pytest.mark.parametrize("option", ["--trace-out", "--junit", "--plot"])
def test_dash_is_refused_and_no_file_named_dash_appears(tmp_path: Path, option: str) -> None:
    result = _run("profile", "--repeat", "1", "--warmup", "0", option, "-")
    assert result.exit_code == 2 and f"{option} -: stdout carries the report" in result.stderr
    assert not (tmp_path / "-").exists()
    assert BUILT == []


def test_api_refuses_dash(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="stdout"):
        hookcli.profile(Tiny(), torch.ones(2, 4), warmup=0, repeat=1, trace_out="-")
    assert not (tmp_path / "-").exists()


def test_dash_output_is_still_stdout_beside_a_trace(tmp_path: Path) -> None:
    result = _run("profile", "--repeat", "1", "--warmup", "0", "-o", "-", "--trace-out", "t.json")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("hookcli profile")
    assert "traceEvents" in json.loads((tmp_path / "t.json").read_text())


# -- R5: two outputs to one path --------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["profile", "--trace-out", "r.json", "-o", "r.json"],
        ["profile", "--trace-out", "x.png", "--plot", "x.png"],
        ["profile", "--trace-out", "sub/../x.png", "--plot", "x.png"],
        ["profile", "--junit", "r.xml", "-o", "r.xml"],
        ["grads", "--plot", "x.png", "-o", "x.png"],
        ["inspect", "--junit", "r.xml", "-o", "r.xml"],
        ["inspect", "--baseline", "b.json", "--update-baseline", "-o", "b.json"],
        ["features", "-l", "a", "--out", "f.npz", "--png", "./f.npz"],
    ],
)
def test_two_outputs_to_one_path_are_refused(tmp_path: Path, args: list[str]) -> None:
    result = _run(*args)
    assert result.exit_code == 2, result.stderr
    assert "name the same file" in result.stderr
    assert BUILT == []
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_symlink_to_another_output_is_the_same_file(tmp_path: Path) -> None:
    (tmp_path / "real.json").write_text("{}")
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    result = _run("profile", "--trace-out", "link.json", "-o", "real.json")
    assert result.exit_code == 2 and "name the same file" in result.stderr
    assert (tmp_path / "real.json").read_text() == "{}"


def test_a_baseline_read_back_after_o_wrote_it_is_refused(tmp_path: Path) -> None:
    # -o writes before the baseline is compared: the run would compare with itself
    assert invoke("inspect", SPEC, "-i", "2x4", "-o", "b.json", "-f", "json").exit_code == 0
    before = (tmp_path / "b.json").read_bytes()
    result = _run("inspect", "-f", "json", "--baseline", "b.json", "-o", "b.json")
    assert result.exit_code == 2 and "name the same file" in result.stderr
    assert (tmp_path / "b.json").read_bytes() == before


def test_api_refuses_trace_and_plot_to_one_path(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="same file"):
        hookcli.profile(Tiny(), torch.ones(2, 4), repeat=1, trace_out="x.png", plot="x.png")
    assert not (tmp_path / "x.png").exists()


def test_distinct_outputs_are_all_written(tmp_path: Path) -> None:
    args = ["--repeat", "1", "--warmup", "0", "-f", "json", "-o", "r.json"]
    result = _run("profile", *args, "--trace-out", "t.json", "--plot", "p.png")
    assert result.exit_code == 0, result.stderr
    assert json.loads((tmp_path / "r.json").read_text())["command"] == "profile"
    assert "traceEvents" in json.loads((tmp_path / "t.json").read_text())
    assert (tmp_path / "p.png").read_bytes()[:8] == PNG_MAGIC


# -- R6: --plot names a PNG -------------------------------------------------------------------


@pytest.mark.parametrize("command", ["profile", "grads"])
@pytest.mark.parametrize("name", ["out.jpg", "out.svg", "out"])
def test_plot_with_another_suffix_is_refused(tmp_path: Path, command: str, name: str) -> None:
    result = _run(command, "--plot", name)
    assert result.exit_code == 2 and "ending in .png" in result.stderr
    assert not (tmp_path / name).exists()
    assert BUILT == []


def test_plot_suffix_is_case_blind(tmp_path: Path) -> None:
    hookcli.profile(Tiny(), torch.ones(2, 4), warmup=0, repeat=1, plot="OUT.PNG")
    assert (tmp_path / "OUT.PNG").read_bytes()[:8] == PNG_MAGIC


def test_plot_replaces_a_writable_file_keeping_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "p.png"
    target.write_bytes(b"old")
    target.chmod(0o640)
    hookcli.profile(Tiny(), torch.ones(2, 4), warmup=0, repeat=1, plot=target)
    assert target.read_bytes()[:8] == PNG_MAGIC and _mode(target) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["p.png"]  # no temp file left


# -- R7: --sync on the cpu says it changes nothing --------------------------------------------


def test_sync_on_cpu_is_noted() -> None:
    def run(*extra: str) -> str:
        result = _run("profile", "--repeat", "1", "--warmup", "0", *extra)
        assert result.exit_code == 0, result.stderr
        return str(result.stdout)

    noted = [line for line in run("--sync").splitlines() if line.startswith("--sync")]
    assert len(noted) == 1 and "changes nothing" in noted[0]
    assert "--sync" not in run()
    # JSON has no notes: its timer says what ran (not synchronize+perf_counter_ns)
    report = json.loads(run("--sync", "-f", "json"))
    assert report["settings"]["timer"] == "perf_counter_ns"


# -- B7, R25: --repeat and --warmup bounds ----------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--repeat", str(2**62)],
        ["--repeat", str(10**11)],
        ["--warmup", str(2**62)],
        ["--repeat", "1e11"],
    ],
)
def test_huge_pass_counts_are_usage_errors(args: list[str]) -> None:
    result = _run("profile", *args)
    assert result.exit_code == 2, result.stderr
    assert args[0] in result.stderr and "Traceback" not in result.stderr
    assert "internal error" not in result.stderr and "out of memory" not in result.stderr
    assert BUILT == []


@pytest.mark.parametrize(("key", "value"), [("repeat", 2**63), ("warmup", 2**63)])
def test_api_huge_pass_counts_are_usage_errors(key: str, value: int) -> None:
    with pytest.raises(UsageError, match=f"--{key} {value} is out of range"):
        hookcli.profile(Tiny(), torch.ones(2, 4), **{key: value})


def test_the_bound_itself_is_accepted_by_the_plan() -> None:
    from hookcli.profile.runner import MAX_PASSES, plan_profile

    assert plan_profile(repeat=MAX_PASSES, warmup=MAX_PASSES).repeat == MAX_PASSES
    with pytest.raises(UsageError):
        plan_profile(repeat=MAX_PASSES + 1)


def test_stamps_out_of_memory_name_repeat(monkeypatch: pytest.MonkeyPatch) -> None:
    from hookcli.profile import hooks

    def no_memory(*args: Any, **kwargs: Any) -> None:
        raise MemoryError

    monkeypatch.setattr(hooks.TimingHooks, "__init__", no_memory)
    with pytest.raises(ResourceError, match=r"--repeat 7 passes of 3 module calls"):
        hookcli.profile(Tiny(), torch.ones(2, 4), warmup=0, repeat=7)


# -- found beside B3: a device, a pipe or a symlink as the output -----------------------------


def test_a_pipe_is_written_into_not_replaced(tmp_path: Path) -> None:
    # as -o /dev/null: a rename over it would make the node a regular file (as root, for
    # /dev/null itself, for everything on the machine)
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    result = _run("profile", "--repeat", "1", "--warmup", "0", "--trace-out", str(fifo))
    reader.join(timeout=60)
    assert result.exit_code == 0, result.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert "traceEvents" in json.loads(got[0])


@pytest.mark.parametrize("option", ["-o", "--trace-out"])
def test_a_symlink_is_written_through(tmp_path: Path, option: str) -> None:
    (tmp_path / "real.json").write_text("old")
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    args = ["--repeat", "1", "--warmup", "0", "-f", "json", option, "link.json"]
    result = _run("profile", *args)
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "link.json").is_symlink()
    assert (tmp_path / "real.json").read_text() != "old"
    json.loads((tmp_path / "real.json").read_text())
