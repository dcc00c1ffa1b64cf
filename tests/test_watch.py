"""``hookcli watch -- COMMAND``: real training scripts run unchanged under the monitor.

Checked against plain PyTorch computed independently by the scripts themselves
(``tests/watch_scripts/*.py --ref``, reading only): per-step total and per-module grad
norms, weight norms and update ratios (rel 1e-5), learning rates, the loss bit for bit;
the losses and the final weights of a watched run equal the unwatched run's bit for
bit; the first NaN's step, phase and module; exit statuses; signals; torchrun with a
NaN on rank 1 alone. Every steps-file line validates against
``hookcli/schema/steps.schema.json`` and every report against the report schema.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch

import hookcli.schema
from tests.conftest import REPO

SCRIPTS = REPO / "tests" / "watch_scripts"
TINY = REPO / "tests" / "watch_fixtures" / "tiny.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")
TIMEOUT = 240
REL = 1e-5

# The scripts train on the CPU, and on CUDA where there is a GPU (``--device cuda``):
# there the monitor's figures reach the host without a sync, read at the next step, and
# --nan-origin / --stop-on read them at the step itself.
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]

STEPS_VALIDATOR = jsonschema.Draft202012Validator(hookcli.schema.load_steps())
REPORT_VALIDATOR = jsonschema.Draft202012Validator(hookcli.schema.load())


def hookcli_watch(
    out: Path, *options: str, command: list[str], timeout: float = TIMEOUT
) -> subprocess.CompletedProcess[str]:
    """``python -m hookcli watch --out OUT OPTIONS -- COMMAND`` from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "hookcli", "watch", "--out", str(out), *options, "--", *command],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def python(script: Path, *args: str) -> list[str]:
    return [sys.executable, str(script), *args]


class plain:  # a class used as a function: it starts the run at once
    """The unwatched run, started at once (it runs beside the watched one); ``str()``
    waits for it and is its stdout."""

    def __init__(self, script: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            python(script, *args),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def __str__(self) -> str:
        stdout, stderr = self.proc.communicate(timeout=TIMEOUT)
        assert self.proc.returncode == 0, stderr[-2000:]
        return stdout


def trained(text: str | plain) -> list[str]:
    """The lines that say how a script trained: per-step losses (with their hex) and
    the final weights' digest; the other lines (hookcli's, warnings) dropped."""
    keep = ("step ", "rank ", "weights sha256", "sha256 ")
    return [line for line in str(text).splitlines() if line.startswith(keep)]


def records(path: Path) -> list[dict[str, Any]]:
    """Every line of a steps file, each checked against the steps schema."""
    out = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        errors = [e.message for e in STEPS_VALIDATOR.iter_errors(record)]
        assert errors == [], (record, errors)
        out.append(record)
    return out


def report_of(out: Path) -> dict[str, Any]:
    report = json.loads((out / "report.json").read_text())
    assert [e.message for e in REPORT_VALIDATOR.iter_errors(report)] == []
    assert report["command"] == "watch"
    return report


def value(x: Any) -> float | None:
    if x is None:
        return None
    return float(x)  # "nan"/"inf" strings too


def close(a: Any, b: Any) -> bool:
    a, b = value(a), value(b)
    if a is None or b is None:
        return a is None and b is None
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=REL, abs_tol=1e-12)


def compare(ref_steps: list[dict[str, Any]], steps: list[dict[str, Any]]) -> int:
    """Every reference step against the watched record of that step: the number of
    per-module figures compared."""
    by_step = {s["step"]: s for s in steps}
    assert sorted(by_step) == [s["step"] for s in ref_steps]
    compared = 0
    for ref in ref_steps:
        got = by_step[ref["step"]]
        assert float(got["loss"]).hex() == ref["loss_hex"], (ref["step"], got["loss"])
        assert close(got["grad_norm"], ref["grad_norm"]), (ref["step"], got, ref)
        assert close(got["grad_norm_applied"], ref["grad_norm_applied"]), (ref["step"], got)
        if "clip_norm" in ref:  # the script's own clip_grad_norm_ return: the pre-clip norm
            assert close(got["grad_norm"], ref["clip_norm"]), (ref["step"], got, ref)
        assert [value(x) for x in got["lr"]] == ref["lr"]
        modules = got["modules"]
        for name, figures in ref["modules"].items():
            for key in ("grad_norm", "grad_norm_applied", "weight_norm", "update_ratio"):
                if key in figures:
                    assert close(modules[name][key], figures[key]), (ref["step"], name, key)
                    compared += 1
        stepped = {n for n, m in modules.items() if "grad_norm" in m}
        assert stepped == set(ref["modules"]), stepped ^ set(ref["modules"])
    return compared


# -- real scripts against their plain-PyTorch reference -----------------------------------


_GPT = ("--steps", "5")
_CNN = ("--steps", "4", "--eval-every", "2")


@pytest.mark.parametrize(
    ("name", "args", "device"),
    [
        pytest.param("gpt_char", _GPT, "cpu", id="gpt_char"),
        pytest.param("cnn_bn", _CNN, "cpu", id="cnn_bn"),
        pytest.param("accumulate", ("--steps", "3", "--accum", "3"), "cpu", id="accumulate"),
        pytest.param("gpt_char", _GPT, "cuda", id="gpt_char-cuda", marks=CUDA),
        pytest.param("cnn_bn", _CNN, "cuda", id="cnn_bn-cuda", marks=CUDA),
    ],
)
def test_figures_equal_plain_pytorch_and_training_is_unchanged(
    name: str, args: tuple[str, ...], device: str, tmp_path: Path
) -> None:
    script = SCRIPTS / f"{name}.py"
    if device != "cpu":
        args = (*args, "--device", device)
    ref = tmp_path / "ref.json"
    out = tmp_path / "run"
    unwatched = plain(script, *args, "--seed", "1")
    r = hookcli_watch(
        out, "--every", "1", command=python(script, *args, "--seed", "1", "--ref", str(ref))
    )
    assert r.returncode == 0, r.stderr[-3000:]
    # the script's own lines went to stderr; stdout is the report alone
    assert trained(r.stderr) == trained(unwatched)
    assert r.stdout.startswith("hookcli watch ")
    lines = records(out / "steps.jsonl")
    steps = [x for x in lines if x["kind"] == "step"]
    assert compare(json.loads(ref.read_text())["steps"], steps) > 0
    assert not [x for x in lines if x["kind"] in ("error", "nonfinite")]
    report = report_of(out)
    assert report["totals"]["first_nonfinite"] is None
    assert report["totals"]["models"][0]["steps"] == int(args[1])
    assert "act" in steps[-1]["modules"][""]  # activation statistics from step 2 on
    # the report's per-step series (the html page's charts) against the reference too
    series = report["steps"]
    refs = json.loads(ref.read_text())["steps"]
    assert [s["step"] for s in series] == [r["step"] for r in refs]
    for got, want in zip(series, refs, strict=True):
        assert float(got["loss"]).hex() == want["loss_hex"]
        assert close(got["grad_norm"], want["grad_norm"])
        for mod, figures in want["modules"].items():
            assert close(got["modules"][mod]["grad_norm"], figures["grad_norm"]), mod


def test_two_models_two_optimizers_get_their_own_rows(tmp_path: Path) -> None:
    script = SCRIPTS / "two_models.py"
    ref = tmp_path / "ref.json"
    out = tmp_path / "run"
    args = ("--steps", "3", "--seed", "2")
    unwatched = plain(script, *args)
    r = hookcli_watch(out, "--every", "1", command=python(script, *args, "--ref", str(ref)))
    assert r.returncode == 0, r.stderr[-3000:]
    assert trained(r.stderr) == trained(unwatched)
    lines = records(out / "steps.jsonl")
    models = {x["model"]: x for x in lines if x["kind"] == "model"}
    assert set(models) == {"Generator", "Discriminator"}
    assert models["Discriminator"]["opt"] == 0  # the discriminator steps first
    data = json.loads(ref.read_text())["models"]
    for label, key in (("Generator", "generator"), ("Discriminator", "discriminator")):
        steps = [x for x in lines if x["kind"] == "step" and x["model"] == label]
        assert compare(data[key]["steps"], steps) > 0
    report = report_of(out)
    assert {row["model"] for row in report["layers"]} == {"Generator", "Discriminator"}


@pytest.mark.slow
def test_a_compiled_submodule(tmp_path: Path) -> None:
    """``torch.compile`` (inductor where it runs here, else aot_eager: the script picks)."""
    script = SCRIPTS / "accumulate.py"
    ref = tmp_path / "ref.json"
    out = tmp_path / "run"
    args = ("--steps", "3", "--accum", "2", "--compile", "--seed", "0")
    unwatched = plain(script, *args)
    r = hookcli_watch(out, "--every", "1", command=python(script, *args, "--ref", str(ref)))
    assert r.returncode == 0, r.stderr[-3000:]
    assert trained(r.stderr) == trained(unwatched)
    steps = [x for x in records(out / "steps.jsonl") if x["kind"] == "step"]
    assert compare(json.loads(ref.read_text())["steps"], steps) > 0


# -- the first NaN ----------------------------------------------------------------------


@pytest.mark.parametrize("phase", ["forward", "backward"])
@pytest.mark.parametrize("device", DEVICES)
def test_nan_origin_names_the_step_phase_and_module(
    phase: str, device: str, tmp_path: Path
) -> None:
    script = SCRIPTS / "goes_nan.py"
    ref = tmp_path / "ref.json"
    out = tmp_path / "run"
    args = ("--steps", "5", "--nan-step", "3", "--phase", phase, "--seed", "0", "--device", device)
    unwatched = plain(script, *args)
    r = hookcli_watch(
        out,
        "--nan-origin",
        "--fail-on",
        "nan",
        command=python(script, *args, "--ref", str(ref)),
    )
    assert r.returncode == 1, r.stderr[-3000:]  # the command passed, the check failed
    assert trained(r.stderr) == trained(unwatched)
    expected = json.loads(ref.read_text())["nan"]
    events = [x for x in records(out / "steps.jsonl") if x["kind"] == "nonfinite"]
    first = events[0]
    assert (first["step"], first["phase"], first["module"]) == (
        expected["step"],
        expected["phase"],
        expected["module"],
    )
    assert first["exact"] is True
    report = report_of(out)
    check = next(c for c in report["checks"] if c["name"] == "nan")
    assert not check["passed"] and expected["module"] in check["layers"]
    assert f"step {expected['step']}" in check["detail"]


@pytest.mark.parametrize("device", DEVICES)
def test_default_nan_detection_and_stop_on(device: str, tmp_path: Path) -> None:
    """Without --nan-origin: the step and phase every step, the module named (as an
    estimate) in the backward; --stop-on nan ends the run before step() applies it."""
    script = SCRIPTS / "goes_nan.py"
    ref = tmp_path / "ref.json"
    out = tmp_path / "run"
    args: tuple[str, ...] = ("--steps", "8", "--nan-step", "3", "--phase", "backward")
    args += ("--seed", "0", "--device", device)
    r = hookcli_watch(out, "--stop-on", "nan", command=python(script, *args, "--ref", str(ref)))
    assert r.returncode == 1, r.stderr[-3000:]
    lines = records(out / "steps.jsonl")
    event = next(x for x in lines if x["kind"] == "nonfinite")
    assert (event["step"], event["phase"], event["exact"]) == (3, "backward", False)
    assert event["module"] is not None
    assert [x["step"] for x in lines if x["kind"] == "stop"] == [3]
    # stopped before step 3's optimizer step: no step 3 or later was recorded or printed
    assert max(x["step"] for x in lines if x["kind"] == "step") == 2
    assert "step 4 loss" not in r.stderr
    report = report_of(out)
    assert [c["name"] for c in report["checks"] if not c["passed"]] == ["stop-on"]


# -- torchrun ----------------------------------------------------------------------------


@pytest.mark.distributed
def test_torchrun_nan_on_rank_1_alone_fails_the_run_and_names_rank_1(tmp_path: Path) -> None:
    script = SCRIPTS / "ddp_nan.py"
    ref = tmp_path / "ref.json"
    out = tmp_path / "run"
    command = [
        str(TORCHRUN),
        "--nproc_per_node",
        "2",
        "--master_port",
        str(29500 + os.getpid() % 1000),
        str(script),
        "--steps",
        "5",
        "--nan-step",
        "3",
        "--seed",
        "0",
        "--ref",
        str(ref),
    ]
    r = hookcli_watch(out, "--every", "1", "--nan-origin", "--fail-on", "nan", command=command)
    assert r.returncode == 1, r.stderr[-3000:]
    for rank in (0, 1):
        lines = records(out / f"steps.rank{rank}.jsonl")
        start = lines[0]
        assert (start["rank"], start["world_size"]) == (rank, 2)
        expected = json.loads((tmp_path / f"ref.rank{rank}.json").read_text())
        steps = [x for x in lines if x["kind"] == "step"]
        # per-rank figures up to the NaN step (after it every figure is NaN)
        good = [s for s in expected["steps"] if s["step"] < expected["nan"]["step"]]
        compare(good, [s for s in steps if s["step"] < expected["nan"]["step"]])
        event = next(x for x in lines if x["kind"] == "nonfinite")
        assert (event["step"], event["phase"]) == (
            expected["nan"]["step"],
            expected["nan"]["phase"],
        )
        if expected["nan"]["module"] is not None:
            assert event["module"] == expected["nan"]["module"]
    report = report_of(out)
    first = report["totals"]["first_nonfinite"]
    assert (first["rank"], first["phase"], first["module"]) == (
        1,
        "forward",
        "module.encoder.norm",
    )
    check = next(c for c in report["checks"] if c["name"] == "nan")
    assert not check["passed"] and "rank 1" in check["detail"]
    assert report["totals"]["ranks"] == [0, 1]
    row = next(r for r in report["layers"] if r["name"] == "module.encoder.proj")
    assert len(row["grad_norm_per_rank"]) == 2


# -- exit statuses, usage, signals ---------------------------------------------------------


def test_the_commands_own_failure_passes_through(tmp_path: Path) -> None:
    r = hookcli_watch(
        tmp_path / "run", "--fail-on", "nan", command=python(TINY, "--steps", "2", "--exit", "3")
    )
    assert r.returncode == 3, r.stderr[-2000:]
    report = report_of(tmp_path / "run")
    assert report["error"] == "the command ended with status 3"
    assert report["totals"]["models"][0]["steps"] == 2


def test_a_failed_check_is_exit_1_and_the_report_says_which(tmp_path: Path) -> None:
    r = hookcli_watch(
        tmp_path / "run",
        "--fail-on",
        "unused,dead",
        "--every",
        "1",
        command=python(TINY, "--steps", "3", "--unused", "--dead"),
    )
    assert r.returncode == 1, r.stderr[-2000:]
    checks = {c["name"]: c for c in report_of(tmp_path / "run")["checks"]}
    assert checks["unused"]["layers"] == ["spare.weight", "spare.bias"]
    assert "act" in checks["dead"]["layers"]  # the ReLU after fc1 (bias -100) outputs 0
    assert "FAIL  unused" in r.stdout


@pytest.mark.parametrize(
    ("options", "command", "words"),
    [
        ((), [], "needs the command to run"),
        ((), ["no-such-program-hookcli"], "command not found"),
        (("--stop-on", "dead"), ["true"], "in --stop-on"),
        (("--fail-on", "nope"), ["true"], "unknown check"),
        (("--every", "0"), ["true"], "--every"),
        (("--plot", "x.jpg"), ["true"], "PNG"),
    ],
    ids=["no-command", "unknown-command", "stop-on", "fail-on", "every", "plot"],
)
def test_usage_errors_are_one_line_and_exit_2(
    options: tuple[str, ...], command: list[str], words: str, tmp_path: Path
) -> None:
    r = hookcli_watch(tmp_path / "run", *options, command=command)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hookcli: error:"), r.stderr
    assert words in lines[0]
    assert not (tmp_path / "run").exists()


def test_sigterm_reaches_the_group_and_what_was_recorded_is_written(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hookcli",
            "watch",
            "--out",
            str(out),
            "--every",
            "1",
            "--",
            *python(TINY, "--steps", "10000", "--sleep", "0.05"),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + TIMEOUT
        steps = out / "steps.jsonl"
        while time.monotonic() < deadline:
            if steps.exists() and steps.read_text().count('"kind":"step"') >= 3:
                break
            time.sleep(0.1)
        start = json.loads(steps.read_text().splitlines()[0])
        proc.send_signal(signal.SIGTERM)  # to hookcli alone: it passes it on to the group
        stdout, stderr = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, stderr[-2000:]
    report = report_of(out)
    assert report["totals"]["models"][0]["steps"] >= 3
    assert "SIGTERM" in report["error"]
    assert stdout.startswith("hookcli watch ")
    with pytest.raises(ProcessLookupError):  # the training process is gone too
        os.kill(start["pid"], 0)
    records(steps)  # every line whole


# -- output: the table, --plot, --tensorboard ------------------------------------------------


def test_plot_and_tensorboard_hold_the_steps(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    png = tmp_path / "watch.png"
    board = tmp_path / "tb"
    r = hookcli_watch(
        out,
        "--every",
        "2",
        "--plot",
        str(png),
        "--tensorboard",
        str(board),
        command=python(TINY, "--steps", "4", "--opt", "adam"),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    steps = [x for x in records(out / "steps.jsonl") if x["kind"] == "step"]
    events = EventAccumulator(str(board))
    events.Reload()
    losses = events.Scalars("Net/loss")
    assert [e.step for e in losses] == [1, 2, 3, 4]
    for e, s in zip(losses, steps, strict=True):
        assert math.isclose(e.value, s["loss"], rel_tol=1e-6)  # TensorBoard keeps float32
    assert [e.step for e in events.Scalars("Net/grad_norm/fc1")] == [1, 2, 4]
    assert "\r" not in r.stderr  # no live status line into a pipe


def test_the_live_status_line_only_on_a_terminal(tmp_path: Path) -> None:
    import pty

    master, slave = pty.openpty()
    try:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "hookcli",
                "watch",
                "--out",
                str(tmp_path / "run"),
                "--",
                *python(TINY, "--steps", "6", "--sleep", "0.2"),
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=slave,
            timeout=TIMEOUT,
            env={**os.environ, "TERM": "xterm"},
        )
        os.close(slave)
        seen = b""
        with __import__("contextlib").suppress(OSError):
            while chunk := os.read(master, 65536):
                seen += chunk
    finally:
        os.close(master)
    assert r.returncode == 0
    assert b"hookcli watch: Net step" in seen and b"\r\x1b[K" in seen
    assert b"hookcli watch: Net step" not in r.stdout


# -- the Python twin ---------------------------------------------------------------------------


def test_the_python_api_matches_plain_pytorch_and_leaves_no_hooks() -> None:
    import torch
    from torch import nn

    import hookcli
    from tests.conftest import global_hook_counts

    before = global_hook_counts()
    real_backward = torch.autograd.backward
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(inplace=True), nn.Linear(12, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    expected = []
    with hookcli.watch(model, opt, every=1) as w:
        for _ in range(3):
            loss = model(torch.randn(8, 6)).pow(2).mean()
            loss.backward()
            grads = {n: p.grad.double().norm().item() for n, p in model.named_parameters()}
            before_w = {n: p.detach().double().clone() for n, p in model.named_parameters()}
            opt.step()
            ratio0 = math.hypot(
                *(
                    (model[0].get_parameter(k).double() - before_w[f"0.{k}"]).norm().item()
                    for k in ("weight", "bias")
                )
            ) / math.hypot(*(before_w[f"0.{k}"].norm().item() for k in ("weight", "bias")))
            expected.append((loss.item(), math.hypot(*grads.values()), grads, ratio0))
            opt.zero_grad()
    report = w.report()
    assert global_hook_counts() == before and torch.autograd.backward is real_backward
    steps = [r for r in w.records if r["kind"] == "step"]
    for s, (loss, total, grads, ratio0) in zip(steps, expected, strict=True):
        assert s["loss"] == loss
        assert math.isclose(s["grad_norm"], total, rel_tol=REL)
        g0 = math.hypot(grads["0.weight"], grads["0.bias"])
        assert math.isclose(s["modules"]["0"]["grad_norm"], g0, rel_tol=REL)
        assert math.isclose(s["modules"]["0"]["update_ratio"], ratio0, rel_tol=REL)
    assert report.command == "watch" and report.passed
    assert [r["name"] for r in report.layers if r.get("grad_norm") is not None] == ["0", "2"]
    assert REPORT_VALIDATOR.is_valid(json.loads(report.to_json()))


def test_the_python_api_stop_on_raises_and_removes_its_hooks() -> None:
    import torch
    from torch import nn

    import hookcli
    from hookcli.watch.monitor import StopTraining
    from tests.conftest import global_hook_counts

    before = global_hook_counts()
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w0 = model.weight.detach().clone()
    with pytest.raises(StopTraining), hookcli.watch(model, stop_on="nan") as w:
        model(torch.full((2, 3), float("nan"))).sum().backward()
        opt.step()
    assert torch.equal(model.weight.detach(), w0)  # stopped before the step
    assert global_hook_counts() == before
    report = w.report()
    assert [c.name for c in report.failed_checks] == ["stop-on"]


# -- the bootstrap -----------------------------------------------------------------------------


def _bootstrapped(tmp_path: Path, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    from hookcli.watch.config import WatchConfig
    from hookcli.watch.runner import environment

    config = WatchConfig(every=1, out=str(tmp_path / "run"))
    full = environment(config)
    full.update(env)
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=full,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


TRAIN = (
    "import torch; m = torch.nn.Linear(2, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
    "m(torch.ones(1, 2)).sum().backward(); o.step()\n"
)


def test_the_bootstrap_chains_to_the_sitecustomize_it_hides(tmp_path: Path) -> None:
    other = tmp_path / "theirs"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['THEIRS'] = 'ran'\n")
    from hookcli.watch.runner import BOOTSTRAP

    r = _bootstrapped(
        tmp_path,
        "import os, sys; print(os.environ.get('THEIRS'), 'torch' in sys.modules)\n" + TRAIN,
        PYTHONPATH=os.pathsep.join([str(BOOTSTRAP), str(other), str(REPO)]),
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ran", "False"]  # theirs ran; torch not imported by ours
    assert [x["kind"] for x in records(tmp_path / "run" / "steps.jsonl")][:3] == [
        "start",
        "model",
        "step",
    ]


def test_processes_that_do_not_train_write_nothing_and_hookcli_watch_0_opts_out(
    tmp_path: Path,
) -> None:
    r = _bootstrapped(tmp_path, "import torch; torch.nn.Linear(2, 2)(torch.ones(1, 2))")
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "run").exists()
    r = _bootstrapped(tmp_path, TRAIN, HOOKCLI_WATCH="0")
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "run").exists()
    r = _bootstrapped(tmp_path, TRAIN)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "run" / "steps.jsonl").exists()


def test_watch_is_not_run_under_the_exit_guard() -> None:
    from hookcli.exitguard import runs_model, should_guard

    assert not should_guard(["watch", "--", "python", "train.py"])
    assert not runs_model("watch")


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "popen-wait"])
def test_the_parent_sees_the_command_exit_with_or_without_a_pidfd(
    pidfd: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hookcli.watch import runner

    if not pidfd:  # as where os has no pidfd_open (not Linux)
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read(); sys.exit(3)"], stdin=subprocess.PIPE
    )
    # whether this machine gives a pidfd (Python and kernel), asked apart from hookcli:
    # where it does not, hookcli must take Popen's wait, and the wait must work either way
    try:
        os.close(os.pidfd_open(proc.pid))
        available = True
    except (AttributeError, OSError):
        available = False
    exited = runner._Exit(proc)
    try:
        assert (exited.fd is not None) is available
        assert not exited.within(0.05)  # still running: the wait ends at its limit
        assert proc.stdin is not None
        proc.stdin.close()
        assert exited.within(30)
        assert proc.returncode == 3
        assert exited.within(0)  # and stays seen
    finally:
        exited.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert exited.fd is None


@pytest.mark.parametrize(
    "argv",
    [
        ["--", "python", "train.py", "--lr", "3"],
        ["python", "train.py", "--every", "5"],
        ["--every", "5", "--nan-origin", "--fail-on", "nan,dead", "--", "python", "t.py"],
        ["--every=3", "--stop-on=nan", "--max-grad-norm", "10", "--min-grad-norm=1e-9", "x"],
        ["--max-update-ratio", "0.5", "--out", "d", "--plot", "p.png", "--tensorboard", "tb", "x"],
        ["-f", "json", "-o", "r.json", "--debug", "--", "x", "--debug"],
        ["--format=csv", "--output=-", "x"],
    ],
)
def test_the_fast_path_parses_as_the_cli_does(
    argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """hookcli.entry hands watch lines to hookcli/watch/fastpath.py first: it must read
    them exactly as the Typer command does (both call cli_command)."""
    from hookcli.watch import command as watch_command
    from hookcli.watch.fastpath import parse
    from tests.conftest import invoke

    seen: dict[str, Any] = {}

    def record(**kwargs: Any) -> int:
        seen.update(kwargs)
        return 0

    monkeypatch.setattr(watch_command, "cli_command", record)
    monkeypatch.setenv("HOOKCLI_NO_CONFIG", "1")
    result = invoke("watch", *argv)
    assert result.exit_code == 0, result.stderr
    assert parse(argv) == seen


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["-h"],
        [],
        ["--every", "x", "--", "x"],
        ["--every", "0", "x"],
        ["--max-grad-norm", "-1", "x"],
        ["--format", "yaml", "x"],
        ["--bogus", "x"],
        ["--every"],
        ["--nan-origin=1", "x"],
    ],
)
def test_the_fast_path_leaves_the_rest_to_the_cli(argv: list[str]) -> None:
    from hookcli.watch.fastpath import parse

    assert parse(argv) is None


# -- more of the process: forks, models the registry did not see, no optimizer ------------------


def test_a_forked_child_records_nothing_and_an_unseen_model_is_still_found(
    tmp_path: Path,
) -> None:
    """A child forked after the monitor started (as a data-loader worker is) writes no
    line, even when it steps; a model copied whole (``deepcopy``: no registration hook
    fires) is found by one scan of the process's objects, with the right names."""
    code = (
        "import copy, os, torch\n"
        "m = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))\n"
        "m = copy.deepcopy(m)\n"
        "o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for _ in range(2):\n"
        "    m(torch.ones(1, 2)).sum().backward(); o.step()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    m(torch.ones(1, 2)).sum().backward(); o.step(); os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
    )
    r = _bootstrapped(tmp_path, code)
    assert r.returncode == 0, r.stderr
    files = list((tmp_path / "run").glob("steps*.jsonl"))
    assert [f.name for f in files] == ["steps.jsonl"]
    lines = records(files[0])
    model = next(x for x in lines if x["kind"] == "model")
    assert [m["name"] for m in model["modules"] if m["stepped"]] == ["0", "1"]
    assert [x["step"] for x in lines if x["kind"] == "step"] == [1, 2]
    assert {x.get("pid") for x in lines if x["kind"] == "start"} != {None}


def test_without_an_optimizer_each_backward_is_a_step() -> None:
    import torch
    from torch import nn

    import hookcli

    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    norms = []
    with hookcli.watch(model, every=1) as w:
        for _ in range(3):
            model(torch.randn(5, 4)).pow(2).sum().backward()
            norms.append(math.hypot(*(p.grad.double().norm().item() for p in model.parameters())))
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.01 * p.grad
                    p.grad = None
    steps = [r for r in w.records if r["kind"] == "step"]
    assert [s["step"] for s in steps] == [1, 2, 3]
    for s, expected in zip(steps, norms, strict=True):
        assert math.isclose(s["grad_norm"], expected, rel_tol=REL)
        assert s["modules"]["0"]["update_ratio"] is None  # no optimizer step to measure
    assert next(r for r in w.records if r["kind"] == "model")["mode"] == "backward"


def test_an_optimizer_of_another_model_leaves_backward_steps_on() -> None:
    """An optimizer alive elsewhere in the process (another model's, or one a previous
    piece of code left for the garbage collector) does not step this model: each of its
    backwards is still a step (it was none, which made the test above order-dependent)."""
    import torch
    from torch import nn

    import hookcli

    other = nn.Linear(3, 3)
    other_opt = torch.optim.SGD(other.parameters(), lr=0.1)
    model = nn.Linear(4, 1)
    with hookcli.watch(model, every=1) as w:
        for _ in range(2):
            model(torch.randn(5, 4)).sum().backward()
            model.zero_grad(set_to_none=True)
    assert [r["step"] for r in w.records if r["kind"] == "step"] == [1, 2]
    assert other_opt.param_groups  # alive through the run


def test_the_python_api_removes_its_hooks_after_keyboard_interrupt() -> None:
    import torch
    from torch import nn

    import hookcli
    from tests.conftest import global_hook_counts

    before = global_hook_counts()
    real = (torch.autograd.backward, torch.optim.Optimizer.__init__)
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(KeyboardInterrupt), hookcli.watch(model, opt):
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        raise KeyboardInterrupt
    assert global_hook_counts() == before
    assert (torch.autograd.backward, torch.optim.Optimizer.__init__) == real


@pytest.mark.slow
def test_sigint_reaches_torchrun_and_every_rank(tmp_path: Path) -> None:
    """Ctrl-C to hookcli watch over torchrun: passed on to the group, every rank ends,
    both ranks' lines so far are merged, exit 130."""
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hookcli",
            "watch",
            "--out",
            str(out),
            "--",
            str(TORCHRUN),
            "--nproc_per_node",
            "2",
            "--master_port",
            str(30500 + os.getpid() % 1000),
            str(SCRIPTS / "ddp_nan.py"),
            "--steps",
            "100000",
            "--nan-step",
            "0",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + TIMEOUT
        files = [out / "steps.rank0.jsonl", out / "steps.rank1.jsonl"]
        while time.monotonic() < deadline:
            if all(f.exists() and f.read_text().count('"kind":"step"') >= 3 for f in files):
                break
            time.sleep(0.2)
        pids = [json.loads(f.read_text().splitlines()[0])["pid"] for f in files]
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stderr[-3000:]
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    report = report_of(out)
    assert report["totals"]["ranks"] == [0, 1]
    assert "SIGINT" in report["error"]


@pytest.mark.distributed
def test_stop_on_under_torchrun_ends_every_rank(tmp_path: Path) -> None:
    out = tmp_path / "run"
    command = [
        str(TORCHRUN),
        "--nproc_per_node",
        "2",
        "--master_port",
        str(31500 + os.getpid() % 1000),
        str(SCRIPTS / "ddp_nan.py"),
        "--steps",
        "50",
        "--nan-step",
        "3",
    ]
    r = hookcli_watch(out, "--stop-on", "nan", command=command)
    assert r.returncode == 1, r.stderr[-3000:]
    stops = [
        x
        for rank in (0, 1)
        if (out / f"steps.rank{rank}.jsonl").exists()
        for x in records(out / f"steps.rank{rank}.jsonl")
        if x["kind"] == "stop"
    ]
    assert stops and all(s["step"] == 3 for s in stops)
    assert "rank 0 step 10 " not in r.stderr and "rank 1 step 10 " not in r.stderr
    report = report_of(out)
    assert [c["name"] for c in report["checks"] if not c["passed"]] == ["stop-on"]


def test_the_html_page_of_a_run_draws_the_reports_own_steps(tmp_path: Path) -> None:
    # --format html: the page embeds the report's per-step series and draws its charts
    from hookcli.html.page import script_json  # noqa: F401  (the page's own module)

    out, page = tmp_path / "run", tmp_path / "run.html"
    script = REPO / "docs" / "examples" / "watch_train.py"
    r = hookcli_watch(out, "-o", str(page), command=python(script, "--steps", "12"))
    assert r.returncode == 0, r.stderr[-3000:]
    report = report_of(out)
    steps = [x for x in records(out / "steps.jsonl") if x["kind"] == "step"]
    assert [s["step"] for s in report["steps"]] == [s["step"] for s in steps] == list(range(1, 13))
    assert [s["loss"] for s in report["steps"]] == [s["loss"] for s in steps]
    text = page.read_text()
    assert 'id="chart-watch-lines"' in text and 'id="chart-watch-heatmap"' in text


@pytest.mark.parametrize(
    ("text", "may"),
    [
        ("[tool.hookcli]\nevery = 5\n", True),
        ("[ tool . 'hookcli' ]\n", True),
        ('["tool"."hookcli".kwargs]\na = 1\n', True),
        ("tool.hookcli.every = 5\n", True),
        ("[tool]\nhookcli = { every = 5 }\n", True),
        ("tool = { hookcli = { every = 5 } }\n", True),
        (
            '[project]\nname = "x"\ndependencies = ["hookcli"]\n[tool.ruff]\nline-length = 9\n',
            False,
        ),
        ("", False),
    ],
)
def test_the_fast_path_reads_pyproject_only_where_a_table_may_be(text: str, may: bool) -> None:
    """Before COMMAND starts the fast path loads no TOML parser unless the file may hold
    ``[tool.hookcli]``; every way TOML can spell that key says it may (and the parser
    agrees where it holds one)."""
    from hookcli.watch.fastpath import _may_hold_table

    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on

    assert _may_hold_table(text.encode()) is may
    holds = "hookcli" in tomllib.loads(text).get("tool", {})
    assert not holds or may


def test_large_cpu_tensors_are_normed_by_rows_to_float64_accuracy() -> None:
    """From ``hookcli.norms.BLOCKED_FROM`` elements a CPU tensor's norm is taken by rows:
    every grad, weight and update figure within 1e-6 of float64 (a one-pass float32 norm
    of 4M elements drifts further than that on the CPU), a channels-last gradient read
    where it lies, a tensor whose size is no multiple of the row, a 1-D tensor (read as
    rows of its flat view, the last one shorter), and a NaN or an Inf in one element of
    a large gradient still seen on its step."""
    import torch
    from torch import nn

    import hookcli
    from hookcli.norms import BLOCK, BLOCKED_FROM

    class Offset(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.table = nn.Parameter(torch.randn(n) / 100)

        def forward(self, x):
            return x + self.table.square().mean()

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(128, 128, 3, padding=1),  # 147,456 weights: channels last below
        nn.Flatten(),
        nn.Linear(128 * 4 * 4, 2048),  # 4,194,304 weights
        nn.ReLU(),
        nn.Linear(2048, 500),  # 1,024,000 weights: a last, shorter row
        Offset(3 * BLOCK + 77),  # one dimension
    ).to(memory_format=torch.channels_last)
    conv, big, odd, flat = model[0].weight, model[2].weight, model[4].weight, model[5].table
    assert not conv.is_contiguous() and big.numel() >= BLOCKED_FROM
    assert odd.numel() % BLOCK != 0 and flat.dim() == 1 and flat.numel() % BLOCK != 0
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    poison = {2: float("nan"), 3: float("inf")}  # step -> what one element of big's grad becomes
    now = {"step": 0}

    def spoil(grad: torch.Tensor) -> torch.Tensor:
        if now["step"] in poison:
            grad = grad.clone()
            grad[7, 11] = poison[now["step"]]
        return grad

    big.register_hook(spoil)

    def clean(*_: object) -> None:  # after the monitor's read: the weights stay finite
        for p in model.parameters():
            if p.grad is not None:
                p.grad.nan_to_num_(0.0, 0.0, 0.0)

    opt.register_step_pre_hook(clean)
    expected = []
    with hookcli.watch(model, opt, every=1) as w:
        for step in (1, 2, 3):
            now["step"] = step
            x = torch.randn(4, 128, 4, 4).to(memory_format=torch.channels_last)
            model(x).square().mean().backward()
            assert conv.grad is not None and not conv.grad.is_contiguous()
            grads = {n: p.grad.double().norm().item() for n, p in model.named_parameters()}
            weights = {n: p.detach().double().norm().item() for n, p in model.named_parameters()}
            before = {n: p.detach().double() for n, p in model.named_parameters()}
            opt.step()
            moved = {
                n: (p.detach().double() - before[n]).norm().item()
                for n, p in model.named_parameters()
            }
            total = math.sqrt(sum(g * g for g in grads.values()))
            expected.append((total, grads, weights, moved))
            opt.zero_grad()
    steps = [r for r in w.records if r["kind"] == "step"]
    total, grads, weights, moved = expected[0]
    s = steps[0]
    assert math.isclose(s["grad_norm"], total, rel_tol=1e-6)
    for name in ("0", "2", "4"):
        want = math.hypot(grads[f"{name}.weight"], grads[f"{name}.bias"])
        assert math.isclose(s["modules"][name]["grad_norm"], want, rel_tol=1e-6), name
        want = math.hypot(weights[f"{name}.weight"], weights[f"{name}.bias"])
        assert math.isclose(s["modules"][name]["weight_norm"], want, rel_tol=1e-6), name
        ratio = math.hypot(moved[f"{name}.weight"], moved[f"{name}.bias"]) / want
        assert math.isclose(s["modules"][name]["update_ratio"], ratio, rel_tol=1e-6), name
    entry = s["modules"]["5"]
    assert math.isclose(entry["grad_norm"], grads["5.table"], rel_tol=1e-6)
    assert math.isclose(entry["weight_norm"], weights["5.table"], rel_tol=1e-6)
    ratio = moved["5.table"] / weights["5.table"]
    assert math.isclose(entry["update_ratio"], ratio, rel_tol=1e-6)
    assert math.isnan(float(steps[1]["grad_norm"]))
    assert float(steps[2]["grad_norm"]) == math.inf
    found = {(r["step"], r["what"]) for r in w.records if r["kind"] == "nonfinite"}
    assert (2, "nan") in found and (3, "inf") in found, w.records
