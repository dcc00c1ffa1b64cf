"""Issue 28, the process slice of the hostile sweep: a forged pass (B1), SIGHUP while a
file is written (B2), a run that dies before the model loads (R19), in-process runs that
leave ``sys.path`` and the environment as found (R22), and functions whose annotation
says they return no model (R23).

Subprocess tests run ``python -m hookcli`` (the console command's guarding parent
included) under an address-space limit, with timeouts; the rest run in-process.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import invoke

ROOT = Path(__file__).resolve().parent.parent
FIX = "tests.fixtures.sweep_process"
HOSTILE = "tests/fixtures/hostile.py"
LIMIT = 6 << 30  # address space for a child: torch plus a small model
TIMEOUT = 120  # seconds, for any child


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")}
    env.update(
        PYTHONPATH=str(ROOT),
        OMP_NUM_THREADS="1",
        HOOKCLI_NO_CONFIG="1",
        HF_HUB_OFFLINE="1",
        COLUMNS="120",
    )
    env.update(extra)
    return env


def _preexec(limit: int | None = LIMIT, ignore_hup: bool = False) -> Callable[[], None]:
    def setup() -> None:
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        # as a terminal starts a command, whatever the suite inherited (`make test &` and
        # nohup ignore SIGINT/SIGHUP, and hookcli keeps an ignored signal ignored)
        for sig in (signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        if ignore_hup:  # what nohup does
            signal.signal(signal.SIGHUP, signal.SIG_IGN)

    return setup


def _run(*args: str, limit: int | None = LIMIT, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hookcli", *args],
        cwd=ROOT,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        preexec_fn=_preexec(limit),
    )


@contextmanager
def _spawned(*args: str, ignore_hup: bool = False, **env: str) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m hookcli ARGS``, killed (its process group) if the test fails midway."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "hookcli", *args],
        cwd=ROOT,
        env=_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_preexec(ignore_hup=ignore_hup),
        start_new_session=True,  # so the guarded child can be ended with it
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=TIMEOUT)


def _wait_for(predicate: Callable[[], bool], proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not predicate():
        assert proc.poll() is None, proc.communicate(timeout=TIMEOUT)
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def _one_line(stderr: str) -> str:
    """stderr holds exactly one non-empty line, hookcli's, never a traceback."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def _last_line(stderr: str) -> str:
    """hookcli's line, the last (the hostile fixtures print while imported), no traceback."""
    assert "Traceback" not in stderr, stderr
    return [ln for ln in stderr.splitlines() if ln.strip()][-1]


def _memory_limited(limit: int | None) -> bool:
    """Whether a child started with ``limit`` runs under any memory limit at all (this
    process's own limits are inherited)."""
    if limit is not None:
        return True
    return any(
        resource.getrlimit(r)[0] != resource.RLIM_INFINITY
        for r in (resource.RLIMIT_AS, resource.RLIMIT_DATA)
    )


# -- B1: a model cannot forge a pass to the guarding parent ---------------------------------


FORGED = "hookcli: error: the process ended with status 0 before hookcli finished"


@pytest.mark.parametrize("how", ["announce", "fds", "end"])
def test_a_forged_pass_is_not_believed(how: str) -> None:
    """The model says "0" to the parent (hookcli's announce, "0" on every inherited
    descriptor, hookcli's own exit function), then ends the process with status 0 from
    native code before any report: exit 4, the parent's line, and no report."""
    r = _run("grads", f"{FIX}:Forges", "-k", f"how={how!r}", "--fail-on", "nan")
    assert r.returncode == 4, (r.returncode, r.stderr)
    line = _one_line(r.stderr.replace("0\n", "\n") if how == "fds" else r.stderr)
    assert line.startswith(FORGED), line
    assert "not hookcli's own" in line, line  # the forged status is named as ignored
    assert r.stdout.replace("0\n", "") == ""  # no report (the "0"s the model wrote to fd 1)


def test_unguarded_the_same_forgery_is_a_pass() -> None:
    """What the parent is for: without it the forged run exits 0 with no report."""
    r = _run(
        "grads", f"{FIX}:Forges", "-k", "how='announce'", "--fail-on", "nan", HOOKCLI_EXIT_GUARD="0"
    )
    assert (r.returncode, r.stdout) == (0, ""), r


def test_a_real_pass_still_passes_through_the_parent() -> None:
    r = _run("grads", f"{FIX}:Small", "--fail-on", "nan", "-f", "json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["command"] == "grads" and all(c["passed"] for c in report["checks"])


def test_the_parent_believes_only_statuses_with_its_token() -> None:
    from hookcli.exitguard import _verdict

    token = "ab" * 16
    assert _verdict(f"{token} 0\n".encode(), token).code == 0
    assert _verdict(f"junk{token} 0\n".encode(), token).code == 0  # a prefix cannot hide it
    for forged in (b"0\n", b"status 0\n", b"0", b"cd" * 16 + b" 0\n", b"0\n0\n0\n"):
        verdict = _verdict(forged, token)
        assert verdict.code is None and verdict.forged, forged
    # failures need no token (a failure cannot be forged into a pass); the last one counts
    assert _verdict(f"{token} 0\nstatus 4\n".encode(), token).code == 4
    assert _verdict(f"status 2\n{token} 0\n".encode(), token).code == 0
    assert _verdict(b"stage torch\nstage model\n", token).stages == {"torch", "model"}


# -- B2: SIGHUP is handled like SIGTERM ------------------------------------------------------


def _saving(folder: Path) -> Callable[[], bool]:
    def saving() -> bool:
        # the -o preflight's probe file comes and goes: only the save's own temp file counts
        for p in folder.iterdir():
            if p.suffix != ".tmp" or p.name.startswith(".hookcli-probe."):
                continue
            try:
                if p.stat().st_size > 0:
                    return True
            except FileNotFoundError:
                continue
        return False

    return saving


@pytest.mark.parametrize(
    ("guard", "to_group"),
    [("1", False), ("0", False), ("1", True)],
    ids=["guarded", "unguarded", "hangup-of-the-group"],
)
def test_sighup_during_a_save_leaves_no_temp_file(
    tmp_path: Path, guard: str, to_group: bool
) -> None:
    """SIGHUP to hookcli, or to its whole process group as a closing terminal sends it
    (the child then gets it twice: its own and the parent's relay): one line, exit 129."""
    target = tmp_path / "f.pt"
    args = ("features", f"{HOSTILE}:BigFeatures", "-k", "mib=32", "-l", "layers.*")
    with _spawned(*args, "--out", str(target), HOOKCLI_EXIT_GUARD=guard) as proc:
        _wait_for(_saving(tmp_path), proc)
        if to_group:
            os.killpg(proc.pid, signal.SIGHUP)
        else:
            proc.send_signal(signal.SIGHUP)
        _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 128 + signal.SIGHUP, err  # 129
    assert _last_line(err.decode()) == "hookcli: hung up"
    assert err.decode().count("hung up") == 1, err
    assert list(tmp_path.iterdir()) == []  # neither the temp file nor half a target


def test_sighup_under_nohup_is_ignored(tmp_path: Path) -> None:
    """An ignored SIGHUP (nohup) stays ignored: the run goes on and writes its file."""
    target = tmp_path / "f.pt"
    args = ("features", f"{HOSTILE}:BigFeatures", "-k", "mib=8", "-l", "layers.*")
    with _spawned(*args, "--out", str(target), ignore_hup=True) as proc:
        _wait_for(_saving(tmp_path), proc)
        proc.send_signal(signal.SIGHUP)
        _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err
    assert [p.name for p in tmp_path.iterdir()] == ["f.pt"]
    import torch

    saved = torch.load(target, weights_only=True)
    assert len(saved) == 4  # the four layers' features


# -- R19: a run that dies before the model is loaded ------------------------------------------


def _fake_torch(tmp_path: Path, body: str) -> str:
    """A PYTHONPATH whose ``torch`` runs ``body`` when imported."""
    package = tmp_path / "fake" / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(body)
    return f"{package.parent}{os.pathsep}{ROOT}"


@pytest.mark.parametrize("limit", [None, 4 << 30])
def test_a_native_exit_while_importing_torch_does_not_blame_the_model(
    tmp_path: Path, limit: int | None
) -> None:
    """What OpenBLAS does under ``ulimit -v 3000000``: exit(1) from C while torch loads."""
    path = _fake_torch(tmp_path, "import ctypes\nctypes.CDLL(None)._exit(1)\n")
    r = _run("inspect", f"{FIX}:Small", limit=limit, PYTHONPATH=path)
    limited = _memory_limited(limit)
    assert r.returncode == (5 if limited else 4), (r.returncode, r.stderr)
    line = _one_line(r.stderr)
    assert line.startswith("hookcli: error: hookcli could not start: importing torch failed"), line
    assert "model" not in line, line
    assert ("memory limit" in line) == limited, line


@pytest.mark.parametrize("guard", ["1", "0"])
@pytest.mark.parametrize(
    ("error", "code"),
    [("libtorch_cpu.so: failed to map segment from shared object", 5), ("no luck here", 4)],
)
def test_an_import_error_from_torch_is_not_an_internal_error(
    tmp_path: Path, guard: str, error: str, code: int
) -> None:
    path = _fake_torch(tmp_path, f"raise ImportError({error!r})\n")
    r = _run("inspect", f"{FIX}:Small", limit=None, PYTHONPATH=path, HOOKCLI_EXIT_GUARD=guard)
    assert r.returncode == code, (r.returncode, r.stderr)
    line = _one_line(r.stderr)
    assert line.startswith(
        f"hookcli: error: hookcli could not start: importing torch failed (ImportError: {error})"
    ), line
    assert "internal error" not in line and "model" not in line, line


# -- R22: an in-process run leaves sys.path and the environment as found --------------------


def test_an_in_process_run_leaves_sys_path_and_the_environment_as_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hookcli.cli import app

    (tmp_path / "r22_model.py").write_text(
        "import torch\n"
        "class M(torch.nn.Linear):\n"
        "    def __init__(self):\n"
        "        super().__init__(4, 4)\n"
        "        self.example_input_array = torch.zeros(1, 4)\n"
    )
    monkeypatch.chdir(tmp_path)
    here = {"", str(tmp_path), os.getcwd()}
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in here])
    monkeypatch.delitem(sys.modules, "r22_model", raising=False)
    monkeypatch.delenv("TRANSFORMERS_VERBOSITY", raising=False)
    monkeypatch.setenv("HOOKCLI_NO_CONFIG", "1")
    path, environ = list(sys.path), dict(os.environ)
    for argv in (
        ["inspect", "r22_model:M", "-f", "json", "-o", str(tmp_path / "a.json")],
        ["inspect", str(tmp_path / "r22_model.py:M"), "-f", "json", "-o", str(tmp_path / "b.json")],
        ["models", "--source", "hf", "--filter", "bert"],  # the hf: source's environment
    ):
        with pytest.raises(SystemExit) as done:
            app(argv)
        assert done.value.code in (0, None), argv
        assert sys.path == path, argv
        assert dict(os.environ) == environ, argv
    sys.modules.pop("r22_model", None)
    assert json.loads((tmp_path / "a.json").read_text())["command"] == "inspect"


# -- R23: a function whose annotation says it returns no model is never called -------------


def test_a_function_annotated_to_return_none_is_not_called(tmp_path: Path) -> None:
    target = tmp_path / "written"
    r = invoke("inspect", f"{FIX}:writes_a_file", "-k", f"path={str(target)!r}")
    assert r.exit_code == 3, r.stderr
    line = _one_line(r.stderr)
    assert "writes_a_file" in line and "returns None" in line and "not a model factory" in line
    assert not target.exists()
    r = invoke("inspect", f"{FIX}:counts")
    assert r.exit_code == 3 and "returns dict[str, int]" in r.stderr, r.stderr


def test_torch_save_as_a_model(tmp_path: Path) -> None:
    """The sweep's case: refused before the call where torch.save's annotation says None
    (exit 3 either way; the file is written only when the annotation cannot tell)."""
    import torch

    says_none = typing.get_type_hints(torch.save).get("return") is type(None)
    target = tmp_path / "saved.pt"
    r = invoke("inspect", "torch:save", "-k", "obj=1", "-k", f"f={str(target)!r}")
    assert r.exit_code == 3, r.stderr
    assert target.exists() is not says_none


@pytest.mark.parametrize(
    "factory",
    [
        "build_annotated",
        "build_by_name",
        "build_maybe",
        "build_unannotated",
        "build_unresolvable",
        "build_any",
        "build_typevar",
    ],
)
def test_real_factories_still_build(factory: str) -> None:
    r = invoke("params", f"{FIX}:{factory}", "-f", "json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["totals"]["params"] == 4 * 3 + 3
