"""``hookcli watch``'s own process: nothing watched is never a pass, the run ends with
hookcli (SIGKILL included), every output path is checked before COMMAND starts, a writer
that fails mid-run loses nothing, thresholds that could never fail are refused, and each
line the run prints reaches stderr whole.

The oracles are the processes themselves (their pids, looked up in /proc; their
heartbeat files), the scripts' own printed lines, and files on disk, never hookcli's
report alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

TINY = REPO / "tests" / "watch_fixtures" / "tiny.py"
TIMEOUT = 240
LINUX_PROC = pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")


def watch(
    *args: str, env: dict[str, str] | None = None, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    """``python -m hookcli watch ARGS`` (ARGS hold ``--`` and COMMAND)."""
    base = dict(os.environ)
    base["PYTHONPATH"] = str(REPO)
    base.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "hookcli", "watch", *args],
        cwd=cwd,
        env=base,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def own_lines(stderr: str) -> list[str]:
    """hookcli's lines on stderr (the command's own are the rest)."""
    return [line for line in stderr.splitlines() if line.startswith("hookcli")]


# -- nothing watched is never a pass ---------------------------------------------------------

NEVER_TRAINS = "import torch\nm = torch.nn.Linear(2, 2)\nprint(float(m(torch.ones(1, 2)).sum()))\n"
NO_ARM = "no Python process armed the monitor"
NO_STEP = "armed the monitor (imported torch) but none recorded a step"


def _cases(tmp_path: Path) -> dict[str, tuple[list[str], dict[str, str], str]]:
    never = tmp_path / "never.py"
    never.write_text(NEVER_TRAINS)
    train = [str(TINY), "--steps", "2"]
    return {
        "python -I": ([sys.executable, "-I", *train], {}, NO_ARM),
        "HOOKCLI_WATCH=0": ([sys.executable, *train], {"HOOKCLI_WATCH": "0"}, NO_ARM),
        "launcher drops PYTHONPATH": (
            ["env", "-u", "PYTHONPATH", sys.executable, *train],
            {},
            NO_ARM,
        ),
        "sleep 1": (["sleep", "1"], {}, NO_ARM),
        "never trains": ([sys.executable, str(never)], {}, NO_STEP),
    }


CASES = ["python -I", "HOOKCLI_WATCH=0", "launcher drops PYTHONPATH", "sleep 1", "never trains"]


@pytest.mark.parametrize("case", CASES)
def test_a_run_that_recorded_no_step_fails_its_checks(case: str, tmp_path: Path) -> None:
    command, env, why = _cases(tmp_path)[case]
    out = tmp_path / "run"
    r = watch("--out", str(out), "--fail-on", "nan,unused", "-f", "json", "--", *command, env=env)
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    mine = own_lines(r.stderr)
    assert len(mine) == 1, r.stderr
    assert why in mine[0] and "nan, unused checked nothing" in mine[0], mine
    report = json.loads(r.stdout)
    assert [c["name"] for c in report["checks"]] == ["nan", "unused"]
    assert not any(c["passed"] for c in report["checks"])
    assert report["totals"]["processes_armed"] == (1 if why == NO_STEP else 0)
    assert not list(out.glob("steps*.jsonl"))
    assert not (out / ".armed").exists()  # the marker is hookcli's, removed at the end


@pytest.mark.parametrize("case", ["python -I", "never trains"])
def test_without_checks_it_says_so_and_exits_as_the_command(case: str, tmp_path: Path) -> None:
    command, env, why = _cases(tmp_path)[case]
    r = watch("--out", str(tmp_path / "run"), "--", *command, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    mine = own_lines(r.stderr)
    assert len(mine) == 1 and mine[0].startswith("hookcli watch: no step recorded:"), r.stderr
    assert why in mine[0]
    # the command's own failure still passes through, with checks too
    r = watch(
        "--out", str(tmp_path / "run2"), "--fail-on", "nan", "--", "sh", "-c", "exit 3", env=env
    )
    assert r.returncode == 3, r.stderr


def test_the_same_script_watched_records_its_steps(tmp_path: Path) -> None:
    """The control for the cases above: without -I, the launcher or HOOKCLI_WATCH=0, the
    script's steps are recorded and its checks pass."""
    out = tmp_path / "run"
    r = watch("--out", str(out), "--fail-on", "nan,unused", "--", sys.executable, str(TINY))
    assert r.returncode == 0, r.stderr[-2000:]
    assert not [line for line in own_lines(r.stderr) if "no step" in line]
    printed = [line for line in r.stderr.splitlines() if line.startswith("step ")]
    steps = (out / "steps.jsonl").read_text().count('"kind":"step"')
    assert steps == len(printed) == 4


# -- the run ends with hookcli, whatever kills it ----------------------------------------------

SPAWNER = """\
import os, subprocess, sys, time
folder, level = sys.argv[1], int(sys.argv[2])
with open(os.path.join(folder, f"pid{level}"), "w") as f:
    f.write(str(os.getpid()))
if level < 2:  # a child, and a grandchild in a session of its own (as torchrun's workers)
    subprocess.Popen([sys.executable, __file__, folder, str(level + 1)],
                     start_new_session=level == 1)
while True:
    with open(os.path.join(folder, f"beat{level}"), "a") as f:
        f.write("x")
    time.sleep(0.02)
"""


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent's wait is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 :][:1] not in (b"Z", b"X")


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            out += [int(w) for w in (task / "children").read_text().split()]
    return out


@LINUX_PROC
@pytest.mark.parametrize("how", ["sigkill-hookcli", "sigkill-its-group"])
def test_sigkill_of_hookcli_ends_every_process_of_the_run(how: str, tmp_path: Path) -> None:
    script = tmp_path / "spawner.py"
    script.write_text(SPAWNER)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hookcli",
            "watch",
            "--out",
            str(tmp_path / "run"),
            "--",
            sys.executable,
            str(script),
            str(tmp_path),
            "0",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # hookcli leads a group of its own, as a CI job's does
    )
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (tmp_path / "beat2").exists():
            time.sleep(0.05)
        assert (tmp_path / "beat2").exists(), "the grandchild never started"
        pids = [int((tmp_path / f"pid{k}").read_text()) for k in range(3)]
        pids += [p for p in _children(proc.pid) if p not in pids]  # the watchdog too
        assert all(_alive(p) for p in pids)
        if how == "sigkill-hookcli":
            proc.kill()
        else:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.05)
        survivors = [p for p in pids if _alive(p)]
        assert survivors == [], survivors
        sizes = [(tmp_path / f"beat{k}").stat().st_size for k in range(3)]
        time.sleep(0.3)
        assert [(tmp_path / f"beat{k}").stat().st_size for k in range(3)] == sizes
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


@LINUX_PROC
def test_the_commands_status_and_signal_pass_through_the_watchdog(tmp_path: Path) -> None:
    r = watch("--out", str(tmp_path / "a"), "--", "sh", "-c", "exit 7")
    assert r.returncode == 7, r.stderr
    r = watch("--out", str(tmp_path / "b"), "--", "sh", "-c", "kill -TERM $$")
    assert r.returncode == 143, r.stderr
    assert "143 (SIGTERM)" in r.stdout  # the report's error
    # stdin is the command's, unchanged
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "hookcli",
            "watch",
            "--out",
            str(tmp_path / "c"),
            "--",
            "sh",
            "-c",
            'read x; test "$x" = hello',
        ],
        cwd=REPO,
        input="hello\n",
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert r.returncode == 0, r.stderr


# -- every output path before COMMAND starts -------------------------------------------------


@pytest.mark.parametrize(
    "options, words",
    [
        (["--out", "/proc/self/x"], "--out /proc/self/x: cannot create files in"),
        (["--out", ""], "--out '': an empty path"),
        (["--out", "{file}/sub"], "is not a folder"),
        (["--out", "{file}"], "is a file; give a folder"),
        (["--tensorboard", "/proc/self/tb"], "--tensorboard /proc/self/tb: cannot create"),
        (["--tensorboard", "{file}/tb"], "is not a folder"),
        (["--tensorboard", ""], "--tensorboard '': an empty path"),
        (["--plot", ""], "--plot '': an empty path"),
        (["--plot", "{file}/p.png"], "is not a folder"),
        (["--plot", "/proc/self/p.png"], "cannot create files in"),
        (["-o", "/proc/self/r.json"], "cannot create files in"),
        (["-o", "{file}/r.json"], "is not a folder"),
        (["-o", "{run}/report.json", "--out", "{run}"], "a file of the run under --out"),
        (["-o", "{run}/steps.jsonl", "--out", "{run}"], "a file of the run under --out"),
        (["--plot", "{run}/report.json", "--out", "{run}"], "PNG"),
        (["-o", "{run}", "--out", "{run}"], "name the same file"),
        (["-o", "{tmp}/a.png", "--plot", "{tmp}/a.png"], "name the same file"),
        (["--out", "{run}", "--tensorboard", "{run}"], "name the same file"),
        (["--out", "{readonly}"], "read-only"),
        (["-o", ""], "--output '': an empty path"),
        (["--tensorboard", "{run}/report.json", "--out", "{run}"], "a file of the run under"),
        (["--tensorboard", "{run}/steps.jsonl", "--out", "{run}"], "a file of the run under"),
        (["--tensorboard", "{run}/steps.rank1.jsonl", "--out", "{run}"], "a file of the run"),
        (["--tensorboard", "{run}/report.json/tb", "--out", "{run}"], "is under {run}/report"),
        (["-o", "{run}/steps.jsonl/r.json", "--out", "{run}"], "is under {run}/steps.jsonl"),
        (["-o", "{tmp}/r.json", "--tensorboard", "{tmp}/r.json/tb"], "is under --output"),
        (["--plot", "{tmp}/p.png", "--out", "{tmp}/p.png/run"], "is under --plot"),
    ],
    ids=[
        "out-proc",
        "out-empty",
        "out-under-a-file",
        "out-a-file",
        "tb-proc",
        "tb-under-a-file",
        "tb-empty",
        "plot-empty",
        "plot-under-a-file",
        "plot-proc",
        "output-proc",
        "output-under-a-file",
        "output-the-runs-report",
        "output-a-steps-file",
        "plot-the-runs-report",
        "output-is-out",
        "output-is-plot",
        "out-is-tensorboard",
        "out-read-only-report",
        "output-empty",
        "tb-the-runs-report",
        "tb-a-steps-file",
        "tb-a-rank-steps-file",
        "tb-under-the-runs-report",
        "output-under-a-steps-file",
        "tb-under-output",
        "out-under-plot",
    ],
)
def test_every_output_is_checked_before_the_command_starts(
    options: list[str], words: str, tmp_path: Path
) -> None:
    file = tmp_path / "a-file"
    file.write_text("x")
    readonly = tmp_path / "old-run"
    readonly.mkdir()
    (readonly / "report.json").write_text("{}")
    (readonly / "report.json").chmod(0o444)
    paths = {"file": file, "run": tmp_path / "run", "tmp": tmp_path, "readonly": readonly}
    args = [o.format(**paths) for o in options]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "default")]
    marker = tmp_path / "started"
    r = watch(*args, "--", "touch", str(marker), cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hookcli: error:"), r.stderr
    assert words.format(**paths) in lines[0], lines[0]
    assert not marker.exists()  # COMMAND never started
    assert not (tmp_path / "run").exists() and not (tmp_path / "default").exists()
    assert not (tmp_path / "p.png").exists() and not (tmp_path / "r.json").exists()
    assert (readonly / "report.json").read_text() == "{}"
    assert file.read_text() == "x"


@pytest.mark.parametrize("when", ["mid-run", "at-close"])
def test_a_tensorboard_writer_that_dies_loses_nothing(
    when: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The writer fails on the 13th step it is given (as one whose folder went away), or
    when it flushes its last events: the run goes on to its end, every step is in the
    report on disk and on stdout, stderr holds one line about it, and the exit status
    is 2 (an output that could not be written, as for --plot)."""
    pytest.importorskip("tensorboard")
    from hookcli.formats import Format
    from hookcli.watch import runner
    from hookcli.watch.command import cli_command

    calls = {"n": 0}
    real_add, real_close = runner._Boards.add, runner._Boards.close

    def add(self: runner._Boards, process: object, record: dict[str, object]) -> None:
        calls["n"] += 1
        if calls["n"] == 13 and when == "mid-run":
            raise OSError(5, "Input/output error")
        real_add(self, process, record)  # type: ignore[arg-type]

    def close(self: runner._Boards) -> None:
        real_close(self)
        if when == "at-close" and calls["n"] >= 30:
            calls["n"] = 0
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(runner._Boards, "add", add)
    monkeypatch.setattr(runner._Boards, "close", close)
    out = tmp_path / "run"
    code = cli_command(
        cmd=["--", sys.executable, str(TINY), "--steps", "30", "--sleep", "0.03"],
        every=10,
        nan_origin=False,
        fail_on="nan",
        stop_on=None,
        min_grad_norm=None,
        max_grad_norm=None,
        max_update_ratio=None,
        out=str(out),
        plot=None,
        tensorboard=str(tmp_path / "tb"),
        format=Format.JSON,
        output=None,
        debug=False,
    )
    captured = capfd.readouterr()
    assert code == 2, captured.err[-2000:]
    printed = [line for line in captured.err.splitlines() if line.startswith("step ")]
    assert len(printed) == 30
    saved = json.loads((out / "report.json").read_text())
    assert saved["totals"]["models"][0]["steps"] == 30
    assert json.loads(captured.out)["totals"]["models"][0]["steps"] == 30  # printed too
    mine = own_lines(captured.err)
    assert len(mine) == 1 and "--tensorboard" in mine[0] and "stopped writing" in mine[0]
    assert mine[0].endswith("the run and its report go on")
    assert ("No space left" in mine[0]) == (when == "at-close")


# -- thresholds that could never fail --------------------------------------------------------


@pytest.mark.parametrize("option", ["--min-grad-norm", "--max-grad-norm", "--max-update-ratio"])
@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
@pytest.mark.parametrize("spelling", ["separate", "equals"])
def test_a_threshold_that_could_never_fail_is_refused(
    option: str, value: str, spelling: str, tmp_path: Path
) -> None:
    marker = tmp_path / "started"
    args = [option, value] if spelling == "separate" else [f"{option}={value}"]
    r = watch("--out", str(tmp_path / "run"), *args, "--", "touch", str(marker))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hookcli: error:"), r.stderr
    assert option in lines[0] or "Invalid value" in lines[0] or "-1" in lines[0]
    assert not marker.exists()


# -- whole lines on stderr -------------------------------------------------------------------

TWO_WRITERS = """\
import subprocess, sys
if len(sys.argv) == 1:
    procs = [subprocess.Popen([sys.executable, __file__, str(r)]) for r in range(2)]
    sys.exit(max(p.wait() for p in procs))
r = sys.argv[1]
for i in range(6000):
    print(f"[rank{r}]", "line", i, "x" * (i % 37), "end", file=sys.stderr if i % 2 else sys.stdout)
"""


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "PYTHONUNBUFFERED"])
def test_two_ranks_lines_reach_stderr_whole(unbuffered: bool, tmp_path: Path) -> None:
    script = tmp_path / "two.py"
    script.write_text(TWO_WRITERS)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("PYTHONUNBUFFERED", None)
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "hookcli",
            "watch",
            "--out",
            str(tmp_path / "run"),
            "--",
            sys.executable,
            str(script),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    line = re.compile(r"\[rank([01])\] line (\d+) (x*) end")
    theirs = [s for s in r.stderr.splitlines() if not s.startswith("hookcli")]
    bad = [s for s in theirs if not ((m := line.fullmatch(s)) and len(m[3]) == int(m[2]) % 37)]
    assert bad == [], bad[:5]
    assert len(theirs) == 2 * 6000
