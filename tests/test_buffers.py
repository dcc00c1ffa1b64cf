"""``hookcli buffers``: summaries before/after N steps, checked against buffers compared by hand."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from sample_models import BNMLP
from tests.conftest import (
    assert_no_hooks,
    assert_same_state,
    global_hook_counts,
    invoke,
    invoke_json,
    state_snapshot,
)
from tests.fixtures import instances

NO_GLOBAL_HOOKS = dict.fromkeys(global_hook_counts(), 0)


def by_hand(t: torch.Tensor) -> dict[str, float] | None:
    """mean, population std, min, max in float64, or None for empty / bool tensors."""
    if t.numel() == 0 or t.dtype == torch.bool:
        return None
    x = t.detach().double().reshape(-1)
    return {
        "mean": x.mean().item(),
        "std": x.std(correction=0).item(),
        "min": x.min().item(),
        "max": x.max().item(),
    }


def check_against(report: dict, model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    """Every row of the report agrees with ``model``'s buffers now and ``before``."""
    rows = {r["name"]: r for r in report["buffers"]}
    assert list(rows) == [n for n, _ in model.named_buffers()]
    state_keys = set(model.state_dict())
    for name, buf in model.named_buffers():
        r = rows[name]
        owner = name.rpartition(".")[0]
        assert r["module"] == owner
        assert r["shape"] == list(buf.shape)
        assert r["dtype"] == str(buf.dtype).removeprefix("torch.")
        assert r["persistent"] == (name in state_keys)
        for side, tensor in (("before", before[name]), ("after", buf)):
            expected = by_hand(tensor)
            if expected is None:
                assert r[side] is None
            else:
                assert r[side] == pytest.approx(expected, rel=1e-9, abs=1e-12), (name, side)
        assert r["changed"] == (not torch.equal(before[name], buf)), name


def run_by_hand(model: nn.Module, x: torch.Tensor, steps: int, train: bool) -> dict:
    before = {n: b.clone() for n, b in model.named_buffers()}
    model.train(train)
    with torch.no_grad():
        for _ in range(steps):
            model(x)
    return before


@pytest.mark.parametrize("steps", [1, 3])
def test_bnmlp_train_mode_updates_running_stats(steps: int) -> None:
    args = ["buffers", "sample_models:BNMLP"] + (["--steps", str(steps)] if steps != 1 else [])
    report = invoke_json(*args)
    assert report["settings"]["mode"] == "train" and report["settings"]["steps"] == steps
    torch.manual_seed(0)
    model = BNMLP()
    before = run_by_hand(model, model.example_input_array, steps, train=True)
    check_against(report, model, before)
    rows = {r["name"]: r for r in report["buffers"]}
    for bn in ("net.1", "net.5"):
        for buf in ("running_mean", "running_var", "num_batches_tracked"):
            assert rows[f"{bn}.{buf}"]["changed"] is True
        assert rows[f"{bn}.num_batches_tracked"]["after"]["max"] == steps
    # a non-persistent buffer is listed as such, and the forward leaves it alone
    assert rows["step_scale"]["persistent"] is False
    assert rows["step_scale"]["changed"] is False
    assert "step_scale" not in model.state_dict()
    assert report["totals"]["changed"] == 6
    assert report["totals"]["non_persistent"] == 1


def test_bnmlp_eval_mode_changes_nothing() -> None:
    report = invoke_json("buffers", "sample_models:BNMLP", "--mode", "eval", "--steps", "2")
    torch.manual_seed(0)
    model = BNMLP()
    before = run_by_hand(model, model.example_input_array, 2, train=False)
    check_against(report, model, before)
    assert all(r["changed"] is False for r in report["buffers"])
    assert all(r["before"] == r["after"] for r in report["buffers"])
    assert report["totals"]["changed"] == 0


def test_resnet18_train_and_eval() -> None:
    import torchvision

    def fresh() -> nn.Module:
        torch.manual_seed(0)
        return torchvision.models.resnet18(weights=None)

    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    report = invoke_json("buffers", "resnet18", "-i", "2x3x64x64")
    model = fresh()
    before = run_by_hand(model, x, 1, train=True)
    check_against(report, model, before)
    assert len(report["buffers"]) == 60
    assert all(r["changed"] for r in report["buffers"])
    assert {r["name"].rpartition(".")[2] for r in report["buffers"]} == {
        "running_mean",
        "running_var",
        "num_batches_tracked",
    }

    report = invoke_json("buffers", "resnet18", "-i", "2x3x64x64", "--mode", "eval")
    model = fresh()
    before = run_by_hand(model, x, 1, train=False)
    check_against(report, model, before)
    assert not any(r["changed"] for r in report["buffers"])
    assert global_hook_counts() == NO_GLOBAL_HOOKS


def test_buffers_restored_and_no_hooks_left() -> None:
    model = instances.BN_MLP
    snapshot = state_snapshot(model)
    for args in ([], ["--steps", "3"], ["--mode", "eval"]):
        assert invoke("buffers", "tests.fixtures.instances:BN_MLP", *args).exit_code == 0
        assert_same_state(snapshot, state_snapshot(model))
        assert_no_hooks(model)


def test_restored_after_ctrl_c() -> None:
    model = instances.INTERRUPTS
    snapshot = state_snapshot(model)
    result = invoke("buffers", "tests.fixtures.instances:INTERRUPTS")
    assert result.exit_code == 130
    assert_same_state(snapshot, state_snapshot(model))
    assert_no_hooks(model)


MODEL_FILE = """
import torch
from torch import nn

class Odd(nn.Module):
    def __init__(self, fail=False):
        super().__init__()
        self.fail = fail
        self.bn = nn.BatchNorm1d(3)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64), persistent=False)
        self.register_buffer("mask", torch.tensor([True, False]))
        self.register_buffer("empty", torch.zeros(0))
        self.register_buffer("scale", torch.full((3,), 2.0), persistent=False)
        self.example_input_array = torch.randn(4, 3)

    def forward(self, x):
        self.calls += 1  # a counter kept by forward itself: changes even in eval mode
        x = self.bn(x) * self.scale
        if self.fail:
            raise RuntimeError("failed after the batch norm")
        return x
"""


def test_odd_buffers_by_hand(tmp_path: Path) -> None:
    path = tmp_path / "odd.py"
    path.write_text(textwrap.dedent(MODEL_FILE))
    report = invoke_json("buffers", f"{path}:Odd", "--mode", "eval", "--steps", "2")
    rows = {r["name"]: r for r in report["buffers"]}
    assert rows["calls"]["persistent"] is False and rows["scale"]["persistent"] is False
    assert rows["mask"]["persistent"] is True
    assert rows["calls"]["before"]["max"] == 0 and rows["calls"]["after"]["max"] == 2
    assert rows["calls"]["changed"] is True
    assert rows["mask"]["before"] is None and rows["mask"]["changed"] is False
    assert rows["empty"]["before"] is None and rows["empty"]["after"] is None
    assert rows["bn.running_mean"]["changed"] is False  # eval mode
    assert report["totals"]["non_persistent"] == 2


def test_failing_model_reports_then_exits_4(tmp_path: Path) -> None:
    path = tmp_path / "odd.py"
    path.write_text(textwrap.dedent(MODEL_FILE))
    result = invoke("buffers", f"{path}:Odd", "-k", "fail=True", "--format", "json")
    assert result.exit_code == 4
    assert "Traceback" not in result.stderr
    assert "failed after the batch norm" in result.stderr
    report = json.loads(result.stdout)
    rows = {r["name"]: r for r in report["buffers"]}
    # the batch norm ran before the failure: its running stats did change
    assert rows["bn.running_mean"]["changed"] is True
    assert rows["calls"]["after"]["max"] == 1
    assert "error" in report
    assert global_hook_counts() == NO_GLOBAL_HOOKS


def test_table_csv_markdown_output_and_usage(tmp_path: Path) -> None:
    table = invoke("buffers", "sample_models:BNMLP")
    assert table.exit_code == 0
    assert "Changed: 6 of 7 after 1 forward pass in train mode" in table.stdout
    assert "step_scale" in table.stdout and "non-persistent" in table.stdout

    csv_text = invoke("buffers", "sample_models:BNMLP", "--format", "csv").stdout
    lines = csv_text.splitlines()
    assert lines[0].split(",") == [
        "name",
        "module",
        "shape",
        "dtype",
        "persistent",
        "before",
        "after",
        "changed",
    ]
    assert len(lines) == 1 + 7

    md = invoke("buffers", "sample_models:BNMLP", "--format", "markdown").stdout
    assert sum(ln.startswith("| net.") for ln in md.splitlines()) == 6

    target = tmp_path / "out" / "b.json"
    result = invoke("buffers", "sample_models.basic.BNMLP", "-f", "json", "-o", str(target))
    assert result.exit_code == 0 and result.stdout == ""
    assert len(json.loads(target.read_text())["buffers"]) == 7

    assert invoke("buffers", "sample_models:BNMLP", "--steps", "0").exit_code == 2
    assert invoke("buffers", "sample_models:BNMLP", "--mode", "fast").exit_code == 2
    shallow = invoke_json("buffers", "sample_models:BNMLP", "--depth", "0")
    assert [r["name"] for r in shallow["buffers"]] == ["step_scale"]


def test_meta_device_has_no_values() -> None:
    report = invoke_json("buffers", "sample_models:BNMLP", "--device", "meta")
    assert len(report["buffers"]) == 7
    assert all(r["before"] is None and r["after"] is None for r in report["buffers"])
    assert all(r["changed"] is None for r in report["buffers"])
