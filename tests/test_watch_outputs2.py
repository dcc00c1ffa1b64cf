"""``watch``, round 2 (issue 45), the runner and API side: two runs started in one
second never share a default ``--out``; ``-o ''`` is refused by name on both paths of
the CLI; ``hookcli.watch`` refuses thresholds that could never fail and never passes
a check on a run that recorded nothing; a check whose figures were never recorded
(``dead`` without activation statistics, ``vanishing``/``exploding`` without a grad
norm) fails; the early NaN record under ``--stop-on`` carries its time; the update
ratio of NaN weights is NaN.

The oracles are the filesystem, the scripts' own schedule and printed lines, the
model's own tensors, and ``hookcli.grads``' refusal of the same argument, never the
watch report alone.
"""

from __future__ import annotations

import json
import math
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import hookcli
from hookcli.errors import UsageError
from hookcli.fmt import number
from tests.test_watch_runner import TINY, watch

STAMP = datetime(2026, 11, 29, 13, 5, 7)


class _Clock:
    @staticmethod
    def now() -> datetime:
        return STAMP


# -- the default --out folder ----------------------------------------------------------------


def test_two_runs_started_in_one_second_get_two_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another ``hookcli watch`` started in the same second creates the folder between
    this run's choice of name and its start: this run takes ``<stamp>-2`` and writes
    nothing into the other's folder."""
    from hookcli.watch import runner
    from hookcli.watch.config import WatchGates

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runner, "datetime", _Clock)
    other = tmp_path / "hookcli-runs" / "20261129-130507"
    real_check = runner.check_run

    def check_run(run: runner.WatchRun, out: Path | None = None) -> None:
        real_check(run, out)
        other.mkdir(parents=True)  # the other run, at the same second, comes first
        (other / "steps.pid1.jsonl").write_text("")

    monkeypatch.setattr(runner, "check_run", check_run)
    run = runner.WatchRun(
        command=(sys.executable, str(TINY), "--steps", "3"),
        every=1,
        gates=WatchGates(fail_on=("nan",)),
    )
    _report, code, _ = runner.watch_command(run)
    assert code == 0
    assert sorted(p.name for p in other.iterdir()) == ["steps.pid1.jsonl"]
    mine = tmp_path / "hookcli-runs" / "20261129-130507-2"
    assert sorted(p.name for p in mine.iterdir()) == ["report.json", "steps.jsonl"]
    saved = json.loads((mine / "report.json").read_text())
    assert saved["totals"]["processes"] == 1
    assert saved["totals"]["files"]["out"] == str(Path("hookcli-runs/20261129-130507-2"))


def test_the_default_folder_is_created_once_per_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claimed with mkdir (no exist_ok): three runs of one second get three folders."""
    from hookcli.watch.runner import claim_default_out

    monkeypatch.chdir(tmp_path)
    got = [claim_default_out(STAMP) for _ in range(3)]
    assert [str(p) for p in got] == [
        "hookcli-runs/20261129-130507",
        "hookcli-runs/20261129-130507-2",
        "hookcli-runs/20261129-130507-3",
    ]
    assert all(p.is_dir() and not any(p.iterdir()) for p in got)


# -- -o '' -----------------------------------------------------------------------------------


def test_an_empty_output_is_refused_by_name_on_the_full_cli(tmp_path: Path) -> None:
    """The Typer command (which the fast path hands over to on anything it does not
    read) keeps -o as typed: '' is not taken for '.'."""
    from tests.conftest import invoke

    marker = tmp_path / "started"
    result = invoke("watch", "--out", str(tmp_path / "run"), "-o", "", "--", "touch", str(marker))
    assert result.exit_code == 2, result.stderr
    assert "--output '': an empty path" in result.stderr
    assert not marker.exists() and not (tmp_path / "run").exists()


def test_an_empty_output_is_refused_by_name_on_the_fast_path(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    r = watch("--out", str(tmp_path / "run"), "-o", "", "--", "touch", str(marker), cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == "hookcli: error: --output '': an empty path; give a path"
    assert not marker.exists() and not (tmp_path / "run").exists()


# -- hookcli.watch: thresholds, and nothing watched ------------------------------------------


def _mlp() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


@pytest.mark.parametrize("name", ["min_grad_norm", "max_grad_norm", "max_update_ratio"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0, pytest.param(10**400, id="10**400")])
def test_a_threshold_that_could_never_fail_is_refused_from_python(name: str, value: float) -> None:
    """As ``hookcli watch --max-grad-norm nan`` is (exit 2), and with what
    ``hookcli.grads`` raises for the same argument."""
    model, opt = _mlp()
    with pytest.raises(UsageError) as info:
        hookcli.watch(model, opt, **{name: value})
    assert str(info.value).startswith(f"{name} must be ")
    if value != -1.0:  # an int beyond any float (10**400) is not finite either
        assert str(info.value).startswith(f"{name} must be a finite number, got ")
    if name != "max_update_ratio":  # grads has the two grad-norm bounds
        with pytest.raises(UsageError) as twin:
            hookcli.grads(model, "2,8", **{name: value})
        assert str(info.value) == str(twin.value)


@pytest.mark.parametrize(
    "asked",
    [
        {"stop_on": "nan"},
        {"max_grad_norm": 1.0},
        {"min_grad_norm": 1e-8},
        {"max_update_ratio": 0.5},
        {"fail_on": "dead,unused"},
        {"fail_on": "nan,inf,exploding,vanishing"},
    ],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()),
)
def test_a_block_that_never_trained_passes_no_check(asked: dict[str, Any]) -> None:
    """The block runs a forward and forgets the training: nothing was checked, so every
    check asked for fails, saying so."""
    model, opt = _mlp()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with hookcli.watch(model, opt, **asked) as w:
        model(torch.randn(2, 8))
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # it never stepped
    report = w.report()
    assert not report.passed
    assert report.checks and all(not c.passed for c in report.checks)
    assert all(c.detail.startswith("nothing checked: no step recorded") for c in report.checks)
    assert "SGD.step()" in report.checks[0].detail
    wanted = {
        "stop_on": ["stop-on"],
        "max_grad_norm": ["exploding"],
        "min_grad_norm": ["vanishing"],
        "max_update_ratio": ["exploding"],
    }
    names = [c.name for c in report.checks]
    for key, value in asked.items():
        expected = str(value).split(",") if key == "fail_on" else wanted[key]
        assert all(n in names for n in expected), names


def test_a_block_without_checks_reports_no_failed_check() -> None:
    model, opt = _mlp()
    with hookcli.watch(model, opt) as w:
        model(torch.randn(2, 8))
    report = w.report()
    assert report.passed and not report.checks


# -- a check whose figures were never recorded ---------------------------------------------


@pytest.mark.parametrize("dead", [False, True], ids=["alive", "dead"])
def test_dead_without_activation_statistics_fails(dead: bool, tmp_path: Path) -> None:
    """5 steps at the default --every 10: the only logged step is step 1, whose forward
    ran before the monitor started, so no module output was measured (the steps file
    holds no ``act``). ``dead`` cannot pass on that, whether or not the ReLU is dead."""
    out = tmp_path / "run"
    args = ["--steps", "5", *(["--dead"] if dead else [])]
    r = watch("--out", str(out), "--fail-on", "dead,nan", "--", sys.executable, str(TINY), *args)
    assert r.returncode == 1, r.stderr[-2000:]
    assert len([ln for ln in r.stderr.splitlines() if ln.startswith("step ")]) == 5
    rows = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    steps = [row for row in rows if row["kind"] == "step"]
    assert len(steps) == 5
    assert not any("act" in e for s in steps for e in (s.get("modules") or {}).values())
    checks = {c["name"]: c for c in json.loads((out / "report.json").read_text())["checks"]}
    assert checks["nan"]["passed"]
    assert not checks["dead"]["passed"]
    assert "no activation statistics were recorded for Net" in checks["dead"]["detail"]
    assert "FAIL  dead: no activation statistics" in r.stdout


def test_a_model_whose_parameters_never_got_a_gradient_passes_no_bound() -> None:
    """The loss never reaches the model (a script that forgot to use its output): the
    steps have no grad norm, so ``vanishing`` and ``exploding`` checked nothing."""
    model, opt = _mlp()
    w0 = torch.ones(1, requires_grad=True)
    with hookcli.watch(model, opt, every=1, fail_on="vanishing,exploding,nan") as w:
        for _ in range(3):
            model(torch.randn(2, 8))
            (w0 * 2.0).sum().backward()
            opt.step()
            opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    assert len([r for r in w.records if r["kind"] == "step"]) == 3
    checks = {c.name: c for c in w.report().checks}
    assert checks["nan"].passed
    for name in ("vanishing", "exploding"):
        assert not checks[name].passed
        assert "grad norm was recorded for Sequential" in checks[name].detail


# -- the figures of item 9 -------------------------------------------------------------------


def test_the_early_nan_record_under_stop_on_carries_its_time(tmp_path: Path) -> None:
    """tiny.py sleeps 0.3 s after each of its steps: its 4th forward (NaN) comes at
    least 0.9 s after the command started, and after step 3's record."""
    out = tmp_path / "run"
    started = time.time()
    r = watch(
        "--out",
        str(out),
        "--stop-on",
        "nan",
        "--",
        sys.executable,
        str(TINY),
        "--steps",
        "8",
        "--nan-at",
        "4",
        "--sleep",
        "0.3",
    )
    elapsed = time.time() - started
    assert r.returncode == 1, r.stderr[-2000:]
    printed = [ln for ln in r.stderr.splitlines() if ln.startswith("step ")]
    assert len(printed) == 3  # steps 1-3 ran; the 4th was stopped
    rows = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    (event,) = [row for row in rows if row["kind"] == "nonfinite"]
    last = [row for row in rows if row["kind"] == "step"][-1]
    assert event["step"] == 4 and last["step"] == 3
    assert 0.9 <= event["time"] <= elapsed
    assert event["time"] >= last["time"]


def test_the_update_ratio_of_nan_weights_is_nan() -> None:
    """A weight turned NaN before step 3: that module's update/weight ratio is NaN, as
    its weight norm is (null stays for a zero weight norm); the other module's is
    finite."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1), nn.Linear(1, 1))
    with torch.no_grad():
        model[3].weight.zero_()
        model[3].bias.zero_()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with hookcli.watch(model, opt, every=1) as w:
        for step in range(1, 4):
            model(torch.randn(8, 4)).pow(2).mean().backward()
            if step == 3:
                with torch.no_grad():
                    model[0].weight[0, 0] = float("nan")
            opt.step()
            opt.zero_grad()
    assert torch.isnan(model[0].weight).any()
    steps = [r for r in w.records if r["kind"] == "step"]
    first, last = steps[0]["modules"], steps[-1]["modules"]
    assert math.isnan(number(last["0"]["weight_norm"]))  # type: ignore[arg-type]
    assert math.isnan(number(last["0"]["update_ratio"]))  # type: ignore[arg-type]
    assert math.isfinite(number(last["2"]["update_ratio"]))  # type: ignore[arg-type]
    assert first["3"]["weight_norm"] == 0.0 and first["3"]["update_ratio"] is None
