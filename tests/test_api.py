"""The Python API on live models: figures against plain PyTorch, the process left as found."""

from __future__ import annotations

import copy
import json
import math
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

import hookcli
from hookcli.errors import RunError, UsageError
from sample_models import BNMLP, LeNet, UnusedBranch
from tests.conftest import (
    assert_no_hooks,
    assert_same_state,
    global_hook_counts,
    invoke_json,
    state_snapshot,
)
from tests.fixtures.broken import RaisesInMiddle


def lenet() -> LeNet:
    """LeNet built as the CLI builds it (torch.manual_seed(0) right before)."""
    torch.manual_seed(0)
    return LeNet()


def test_inspect_shapes_and_params_by_hand() -> None:
    model = lenet()
    x = torch.randn(2, 1, 32, 32)
    report = hookcli.inspect(model, x)
    rows = {r["name"]: r for r in report.layers}
    with torch.no_grad():
        a = model.conv1(x)
        b = model.pool1(torch.relu(a))
        c = model.conv2(b)
    assert rows["conv1"]["input_shapes"] == [list(x.shape)]
    assert rows["conv1"]["output_shapes"] == [list(a.shape)]
    assert rows["pool1"]["output_shapes"] == [list(b.shape)]
    assert rows["conv2"]["output_shapes"] == [list(c.shape)]
    assert rows["fc3"]["output_shapes"] == [[2, 10]]
    for name, m in model.named_modules():
        assert rows[name]["params"] == sum(p.numel() for p in m.parameters())
    assert report.totals["params"] == sum(p.numel() for p in model.parameters())
    assert report.inputs == ({"name": "x", "shape": [2, 1, 32, 32], "dtype": "float32"},)
    assert report.passed and report.checks == ()


def test_grads_match_autograd() -> None:
    model = lenet()
    x = torch.randn(3, 1, 32, 32)
    report = hookcli.grads(model, x)
    ref = copy.deepcopy(model)
    ref.train()
    ref(x).sum().backward()
    rows = {r["name"]: r for r in report.layers}
    for name, m in ref.named_modules():
        own = list(m.parameters(recurse=False))
        if not own:
            continue
        want = float(torch.cat([p.grad.double().reshape(-1) for p in own]).norm())  # type: ignore[union-attr]
        assert math.isclose(rows[name]["grad_norm"], want, rel_tol=1e-5), name
    total = torch.nn.utils.get_total_norm([p.grad for p in ref.parameters()])
    assert math.isclose(report.totals["grad_norm"], float(total), rel_tol=1e-5)
    assert math.isclose(report.totals["loss"], float(ref(x).sum().detach()), rel_tol=1e-5)
    assert all(p.grad is None for p in model.parameters())  # the caller's model: no grads left


def test_stats_match_the_outputs() -> None:
    model = lenet()
    x = torch.randn(2, 1, 32, 32)
    report = hookcli.stats(model, x)
    with torch.no_grad():
        out = model.conv1(x).double()
    row = next(r for r in report.layers if r["name"] == "conv1")
    assert math.isclose(row["mean"], float(out.mean()), rel_tol=1e-6, abs_tol=1e-9)
    assert math.isclose(row["std"], float(out.std()), rel_tol=1e-5)
    assert row["max"] == pytest.approx(float(out.max()))


def test_report_objects() -> None:
    report = hookcli.grads(UnusedBranch(), torch.randn(4, 8), fail_on="unused")
    assert not report.passed
    assert [c.name for c in report.failed_checks] == ["unused"]
    assert set(report.checks[0].layers) == {"spare.weight", "spare.bias"}
    data = report.to_dict()
    assert data == json.loads(report.to_json())
    assert data["command"] == "grads" and data["model"]["class"] == "UnusedBranch"
    assert data["model"]["spec"] is None
    assert report.render().startswith("hookcli grads")
    assert report.render("csv").splitlines()[0].startswith("name,type,depth,call")


def test_api_and_cli_give_the_same_report() -> None:
    cli = invoke_json("grads", "sample_models:LeNet", "--per-param")
    api = hookcli.grads(lenet(), per_param=True, seed=0).to_dict()  # example_input_array
    assert api["layers"] == cli["layers"]
    assert api["params"] == cli["params"]
    assert api["totals"] == cli["totals"]
    assert api["inputs"] == cli["inputs"]
    assert {k: v for k, v in api["settings"].items()} == cli["settings"]
    assert hookcli.diff(cli, api).to_dict()["totals"]["differences"] == 1  # model.spec only


def test_model_rng_and_path_left_as_found() -> None:
    model = BNMLP()  # dropout and batch norm: train mode draws random numbers, moves buffers
    model.eval()
    model.net[0].weight.grad = torch.full_like(model.net[0].weight, 3.0)
    x = torch.randn(4, 16, requires_grad=True)
    x.grad = torch.ones_like(x)
    before = state_snapshot(model)
    hooks = global_hook_counts()
    torch_state = torch.get_rng_state()
    py_state = random.getstate()
    np_state = np.random.get_state()
    path = list(sys.path)
    first = hookcli.grads(model, x, fail_on="nan,inf,unused,dead")
    hookcli.stats(model, x, backward=True)
    hookcli.inspect(model, x, hooks="pre,forward,tensor")
    assert_same_state(before, state_snapshot(model))
    assert_no_hooks(model, hooks)
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert random.getstate() == py_state
    after = np.random.get_state()
    assert after[0] == np_state[0] and np.array_equal(after[1], np_state[1])
    assert sys.path == path
    assert torch.equal(x.grad, torch.ones_like(x))
    # the same state again gives the same figures
    assert hookcli.grads(model, x, fail_on="nan,inf,unused,dead").to_dict() == first.to_dict()


def test_seed_makes_dropout_reproducible() -> None:
    model = BNMLP()
    x = torch.randn(4, 16)
    torch.manual_seed(1)
    a = hookcli.grads(model, x, seed=5)
    torch.manual_seed(2)
    b = hookcli.grads(model, x, seed=5)
    assert a.to_dict() == b.to_dict()
    assert a.settings["seed"] == 5


def test_keyword_inputs() -> None:
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
            return self.fc(x) * scale

    report = hookcli.inspect(Scaled(), torch.randn(5, 3), forward_kwargs={"scale": torch.ones(1)})
    assert [i["name"] for i in report.inputs] == ["x", "scale"]
    assert report.layers[1]["output_shapes"] == [[5, 2]]


def test_errors() -> None:
    with pytest.raises(UsageError, match=r"nn\.Module"):
        hookcli.inspect("resnet18")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="no inputs"):
        hookcli.inspect(nn.Linear(2, 2))
    with pytest.raises(UsageError, match="unknown check"):
        hookcli.grads(nn.Linear(2, 2), torch.randn(1, 2), fail_on="nope")
    with pytest.raises(UsageError, match="mode"):
        hookcli.stats(nn.Linear(2, 2), torch.randn(1, 2), mode="test")
    model = RaisesInMiddle()
    before = state_snapshot(model)
    with pytest.raises(RunError, match=r"block\.1"):
        hookcli.grads(model)
    assert_no_hooks(model)
    assert_same_state(before, state_snapshot(model))


def test_diff_of_reports() -> None:
    model = lenet()
    x = torch.randn(1, 1, 32, 32)
    a = hookcli.grads(model, x)
    assert hookcli.diff(a, a).passed
    with torch.no_grad():
        model.fc3.weight.mul_(2)
    changed = hookcli.diff(a, hookcli.grads(model, x), only="grad_norm")
    assert not changed.passed
    items = {r["item"] for r in changed.rows("differences")}
    # fc3's own grad (sum loss: ones x its input) stays; the layers before it change
    assert {"fc2", "fc1", ""} <= items and "fc3" not in items


def test_pytest_style_gate() -> None:
    """The README example: no unused parameters, every layer's grad norm within bounds."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    report = hookcli.grads(
        model, torch.randn(8, 16), fail_on="unused,nan,inf", max_grad_norm=100.0, min_grad_norm=1e-8
    )
    assert report.passed, [c.detail for c in report.failed_checks]
    norms = [r["grad_norm"] for r in report.layers if r["grad_norm"] is not None]
    assert len(norms) == 2 and all(1e-8 <= n <= 100 for n in norms)


def test_import_hookcli_does_not_import_torch() -> None:
    code = "import sys, hookcli; assert 'torch' not in sys.modules; print(hookcli.grads.__name__)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "grads"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_model_rng_left_as_found() -> None:
    model = BNMLP().cuda()
    x = torch.randn(4, 16, device="cuda")
    states = torch.cuda.get_rng_state_all()
    report = hookcli.grads(model, x)
    assert report.settings["device"] == "cuda:0"
    assert all(
        torch.equal(a, b) for a, b in zip(states, torch.cuda.get_rng_state_all(), strict=True)
    )


class _SeesCollector(nn.Module):
    """Records whether the cyclic garbage collector ran during its forward."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.fail = fail
        self.seen: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import gc

        self.seen.append(gc.isenabled())
        if self.fail:
            raise ValueError("boom")
        return self.lin(x)


@pytest.mark.parametrize("call", ["inspect", "grads", "stats", "cost", "profile"])
def test_the_collector_is_paused_during_a_call_and_back_after(call: str) -> None:
    """The API pauses the cyclic collector for the call (full collections over torch's
    objects were most of a deep model's inspect) and turns it back on, also when the
    model raises; it freezes nothing (the CLI's gc.freeze is the CLI's alone)."""
    import gc

    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    model = _SeesCollector()
    getattr(hookcli, call)(model, torch.randn(2, 4))
    assert model.seen and not any(model.seen)
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen
    failing = _SeesCollector(fail=True)
    with pytest.raises(RunError):
        hookcli.inspect(failing, torch.randn(2, 4))
    assert failing.seen == [False]
    assert gc.isenabled()


def test_a_collector_the_caller_turned_off_stays_off() -> None:
    import gc

    gc.disable()
    try:
        model = _SeesCollector()
        hookcli.inspect(model, torch.randn(2, 4))
        assert model.seen == [False]
        assert not gc.isenabled()
    finally:
        gc.enable()
