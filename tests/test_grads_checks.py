"""``hookcli grads`` CI gates and exit codes; what should fail is worked out by hand."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch
from torch import nn

from sample_models import InfModel, LeNet, NaNModel, UnusedBranch
from tests.conftest import invoke, invoke_json

HERE = __name__


def run_json(*args: str) -> tuple[int, dict[str, Any]]:
    result = invoke(*args, "-f", "json")
    return result.exit_code, json.loads(result.stdout)


def check(report: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in report["checks"] if c["name"] == name]
    return found


# -- models with one thing wrong ----------------------------------------------------------
class Gated(nn.Module):
    """``gate`` is multiplied by zero: its parameters get all-zero gradients."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.gate = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + 0.0 * self.gate(x)


class DeadRelu(nn.Module):
    """A bias of -100 before the ReLU: ``act`` outputs only zeros."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.ReLU()
        self.head = nn.Linear(4, 2)
        with torch.no_grad():
            self.fc.bias.fill_(-100.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.act(self.fc(x)))


class _Boom(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("boom in backward")


class BoomLayer(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Boom.apply(x)


class BackwardRaises(nn.Module):
    """Forward is fine; backward raises inside ``boom``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.boom = BoomLayer()
        self.fc2 = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.boom(self.fc1(x)))


def seeded_input(*shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(0))


def hand(cls: type[nn.Module], x: torch.Tensor | None = None) -> tuple[nn.Module, torch.Tensor]:
    """Build as hookcli does (seed 0), train mode, sum loss, backward; the model and loss."""
    torch.manual_seed(0)
    m = cls()
    m.train()
    x = m.example_input_array if x is None else x
    loss = m(x).sum()
    loss.backward()
    return m, loss


# -- unused ---------------------------------------------------------------------------------
def test_unused_fails_naming_the_parameters() -> None:
    code, report = run_json("grads", "sample_models:UnusedBranch", "--fail-on", "unused")
    m, _ = hand(UnusedBranch)
    no_grad = [n for n, p in m.named_parameters() if p.requires_grad and p.grad is None]
    assert no_grad == ["spare.weight", "spare.bias"]
    assert code == 1
    c = check(report, "unused")
    assert c["passed"] is False and c["layers"] == no_grad
    assert report["totals"]["unused_params"] == no_grad
    assert [r["name"] for r in report["layers"]] == ["", "used", "out"]  # spare never ran


def test_unused_table_still_printed_with_the_failure() -> None:
    result = invoke("grads", "sample_models:UnusedBranch", "--fail-on", "unused")
    assert result.exit_code == 1
    assert "FAIL  unused" in result.stdout and "spare.weight, spare.bias" in result.stdout
    assert "Unused params:" in result.stdout
    assert result.stderr == ""


def test_unused_row_column_lists_own_params() -> None:
    report = invoke_json("grads", f"{HERE}:PartlyUnused", "-i", "2x4")
    (row,) = [r for r in report["layers"] if r["name"] == "lin"]
    assert row["unused_params"] == ["lin.extra"]
    torch.manual_seed(0)
    m = PartlyUnused()
    m(seeded_input(2, 4)).sum().backward()
    assert m.lin.extra.grad is None
    used = torch.cat([m.lin.weight.grad.reshape(-1), m.lin.bias.grad])
    want = float(used.double().norm())
    assert row["grad_norm"] == pytest.approx(want, rel=1e-5)


class _LinearWithExtra(nn.Linear):
    def __init__(self) -> None:
        super().__init__(4, 3)
        self.extra = nn.Parameter(torch.ones(3))


class PartlyUnused(nn.Module):
    """``lin`` has a parameter of its own that its forward never uses."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = _LinearWithExtra()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


# -- nan / inf ----------------------------------------------------------------------------
def expected_nonfinite(
    cls: type[nn.Module], mid: str, test: Any
) -> tuple[set[str], str | None, float]:
    """fc1 -> mid -> fc2 by hand: the layers with a bad gradient, the forward origin, the loss."""
    torch.manual_seed(0)
    m = cls()
    m.train()
    x = m.example_input_array
    a = m.fc1(x)
    b = getattr(m, mid)(a)
    y = m.fc2(b)
    loss = y.sum()
    ga, gb, gy = torch.autograd.grad(loss, [a, b, y], retain_graph=True)
    loss.backward()

    def bad(*ts: torch.Tensor | None) -> bool:
        return any(t is not None and bool(test(t).any()) for t in ts)

    layers = set()
    if bad(gy, gb, m.fc2.weight.grad, m.fc2.bias.grad):  # fc2: grad_output, grad_input, params
        layers.add("fc2")
    if bad(gb, ga):
        layers.add(mid)
    if bad(ga, m.fc1.weight.grad, m.fc1.bias.grad):
        layers.add("fc1")
    if bad(gy):
        layers.add("")
    origin = next((n for n, t in (("fc1", a), (mid, b), ("fc2", y)) if bad(t)), None)
    return layers, origin, float(loss.detach())


def test_nan_fails_naming_the_module() -> None:
    code, report = run_json("grads", "sample_models:NaNModel", "--fail-on", "nan")
    layers, origin, loss = expected_nonfinite(NaNModel, "log", torch.isnan)
    assert code == 1
    c = check(report, "nan")
    assert not c["passed"]
    assert layers == {"fc2"}  # log's own gradients stay finite: d log(x) = 1/x
    assert origin == "log"
    assert c["layers"] == ["fc2", "log"]  # gradient first, then where the forward made it
    assert "the loss is nan" in c["detail"] and math.isnan(loss)
    assert "fc2.weight" in c["detail"]
    assert "first produced NaN in log" in c["detail"]


def test_inf_fails_naming_the_modules() -> None:
    code, report = run_json("grads", "sample_models:InfModel", "--fail-on", "inf,nan")
    layers, origin, loss = expected_nonfinite(InfModel, "blowup", torch.isinf)
    assert code == 1
    c = check(report, "inf")
    assert not c["passed"]
    assert set(c["layers"]) == layers | {origin}
    assert origin == "blowup"
    assert "first grad_input holding Inf in backward order: blowup" in c["detail"]
    nan_layers, _, _ = expected_nonfinite(InfModel, "blowup", torch.isnan)
    assert nan_layers <= set(check(report, "nan")["layers"])
    assert f"the loss is {'nan' if math.isnan(loss) else 'inf'}" in c["detail"]


def test_healthy_models_pass_every_check() -> None:
    for spec in ("sample_models:LeNet", "sample_models:BNMLP", "sample_models:LSTMModel"):
        code, report = run_json("grads", spec, "--fail-on", "nan,inf,unused,zero-grad,dead")
        assert code == 0, spec
        assert [c["name"] for c in report["checks"]] == [
            "nan",
            "inf",
            "unused",
            "zero-grad",
            "dead",
        ]
        assert all(c["passed"] and c["layers"] == [] for c in report["checks"])


# -- zero-grad / dead ------------------------------------------------------------------------
def test_zero_grad_names_parameters_with_all_zero_gradients() -> None:
    code, report = run_json("grads", f"{HERE}:Gated", "-i", "3x4", "--fail-on", "zero-grad")
    m, _ = hand(Gated, seeded_input(3, 4))
    zero = [n for n, p in m.named_parameters() if p.grad is not None and not p.grad.any()]
    assert zero == ["gate.weight", "gate.bias"]
    assert code == 1
    assert check(report, "zero-grad")["layers"] == zero


def test_dead_names_the_module_with_all_zero_output() -> None:
    code, report = run_json("grads", f"{HERE}:DeadRelu", "-i", "3x4", "--fail-on", "dead")
    torch.manual_seed(0)
    m = DeadRelu()
    h = m.act(m.fc(seeded_input(3, 4)))
    assert not h.any()
    assert code == 1
    assert check(report, "dead")["layers"] == ["act"]


# -- grad-norm bounds ---------------------------------------------------------------------
def lenet_layer_norms() -> dict[str, float]:
    m, _ = hand(LeNet)
    return {
        name: float(torch.cat([p.grad.reshape(-1) for p in mod.parameters(recurse=False)]).norm())
        for name, mod in m.named_modules()
        if list(mod.parameters(recurse=False))
    }


def test_max_and_min_grad_norm_bound_every_layer() -> None:
    norms = lenet_layer_norms()
    ranked = sorted(norms.values())
    upper = (ranked[2] + ranked[3]) / 2  # halfway between layers: no rounding question
    lower = (ranked[1] + ranked[2]) / 2
    code, report = run_json(
        "grads", "sample_models:LeNet", "--max-grad-norm", str(upper), "--min-grad-norm", str(lower)
    )
    assert code == 1
    high = [n for n, v in norms.items() if v > upper]
    low = [n for n, v in norms.items() if v < lower]
    assert len(high) == 2 and len(low) == 2
    assert check(report, "max-grad-norm")["layers"] == high
    assert check(report, "min-grad-norm")["layers"] == low
    top = max(norms.values())
    code, report = run_json("grads", "sample_models:LeNet", "--max-grad-norm", str(top * 1.01))
    assert code == 0 and check(report, "max-grad-norm")["passed"]


def test_nan_grad_norm_fails_a_bound() -> None:
    code, report = run_json("grads", "sample_models:NaNModel", "--max-grad-norm", "1e30")
    assert code == 1
    assert check(report, "max-grad-norm")["layers"] == ["fc2"]


def test_failed_check_report_goes_to_output_file(tmp_path: Any) -> None:
    out = tmp_path / "r.json"
    result = invoke(
        "grads", "sample_models:UnusedBranch", "--fail-on", "unused", "-f", "json", "-o", str(out)
    )
    assert result.exit_code == 1 and result.stdout == ""
    assert check(json.loads(out.read_text()), "unused")["layers"] == ["spare.weight", "spare.bias"]
    md = invoke("grads", "sample_models:UnusedBranch", "--fail-on", "unused", "-f", "markdown")
    assert md.exit_code == 1 and "**FAIL** `unused`" in md.stdout


# -- usage errors: exit 2, one line ---------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fail-on", "nan,bogus"], "unknown check 'bogus'"),
        (["--hooks", "backward-pre,backward", "--fail-on", "zero-grad"], "add the tensor kind"),
        (["--hooks", "backward", "--max-grad-norm", "1"], "add the tensor kind"),
        (["--hooks", "backward", "--per-param"], "add the tensor kind"),
        (["--hooks", "nope"], "unknown hook kind"),
        (["--device", "meta"], "--device meta"),
        (["--max-grad-norm", "-1"], "--max-grad-norm"),
        (["--loss", "median"], "median"),
    ],
)
def test_bad_options_exit_2(args: list[str], message: str) -> None:
    result = invoke("grads", "sample_models:LeNet", *args)
    assert result.exit_code == 2, result.stdout
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


# -- the model fails while running: exit 4 ---------------------------------------------------
def test_batchnorm_batch_of_one_exits_4_with_a_hint() -> None:
    result = invoke("grads", "sample_models:BNMLP", "-b", "1")
    assert result.exit_code == 4
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "net.1" in err and "BatchNorm1d" in err
    assert "-b 2" in err and "--mode eval" in err
    assert "net.0" in result.stdout  # the layers that ran are still reported
    code, report = run_json("grads", "sample_models:BNMLP", "-b", "1")
    assert code == 4 and "-b 2" in report["error"]
    assert report["totals"]["unused_params"] is None  # unknown: backward never ran
    assert [r["name"] for r in report["layers"]][:4] == ["", "net", "net.0", "net.1"]
    assert invoke("grads", "sample_models:BNMLP", "-b", "1", "--mode", "eval").exit_code == 0


def test_backward_failure_exits_4_naming_the_module() -> None:
    result = invoke("grads", f"{HERE}:BackwardRaises", "-i", "2x4")
    assert result.exit_code == 4
    assert "backward failed in boom (BoomLayer)" in result.stderr
    assert "boom in backward" in result.stderr
    assert "fc1" in result.stdout
    code, report = run_json("grads", f"{HERE}:BackwardRaises", "-i", "2x4")
    assert code == 4 and report["totals"]["unused_params"] is None
    assert all(r["unused_params"] == [] for r in report["layers"])


# -- the CPU fast paths of the NaN/Inf/dead flags --------------------------------------------
@pytest.mark.parametrize(
    "values",
    [
        [1.0, -2.0, 3.0],  # finite, non-zero sum: one sum decides
        [0.0, 0.0, 0.0],  # dead
        [1.0, -1.0, 0.0],  # a zero sum that is not dead
        [1.0, float("nan"), 2.0],
        [1.0, float("inf"), 2.0],
        [float("-inf"), 0.0, 0.0],
        [float("inf"), float("-inf"), 1.0],  # the sum is NaN, yet no NaN is there
        [float("nan"), float("inf"), 0.0],  # NaN hides the Inf from a sum
        [3e38, 3e38, -0.0],  # finite, though its sum (and norm) overflow float32
    ],
)
def test_forward_flags_and_grad_inf_flag_equal_exact_scans(values):
    from hookcli.grads.probe import GradProbe, _forward_flags

    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        t = torch.tensor(values, dtype=dtype)
        exact = [bool(torch.isnan(t).any()), bool(torch.isinf(t).any()), bool((t != 0).any())]
        assert _forward_flags(t).tolist() == exact, dtype
        strided = torch.stack([t, t]).t()  # not contiguous
        assert _forward_flags(strided).tolist() == exact, dtype
    t = torch.tensor(values)
    expected = [bool(torch.isnan(t).any()), bool(torch.isinf(t).any()), bool((t != 0).any())]
    _, inf = GradProbe(frozenset(), flag_inf=True)._one(t)
    assert bool(inf) == expected[1]
