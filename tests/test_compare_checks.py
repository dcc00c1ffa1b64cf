"""compare's checks where values cannot decide alone: shapes on meta, complex outputs, and
tolerances that would make the check pass whatever the values."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import torch
from torch import nn

import hookcli
from hookcli.errors import UsageError
from tests.conftest import invoke

M = "tests.test_compare_models"
HERE = "tests.test_compare_checks"


class Wider(nn.Module):
    """MLPNet's modules, with fc1 and fc2 twice as wide: every name aligns, shapes part."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 64)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(64, 32)
        self.fc3 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc3(self.act(self.fc2(self.act(self.fc1(x)))))


class Rotary(nn.Module):
    """A rotary embedding the way Meta's Llama code applies it: complex multiplication."""

    def __init__(self, k=1.0):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.register_buffer("freqs", torch.polar(torch.ones(8), k * torch.arange(8.0)))

    def forward(self, x):
        z = torch.view_as_complex(self.proj(x).float().reshape(*x.shape[:-1], 8, 2))
        return z * self.freqs


def test_meta_a_shape_that_differs_fails_the_check() -> None:
    wider = invoke("compare", f"{M}:MLPNet", f"{HERE}:Wider", "--device", "meta", "-i", "4x16",
                   "--fail-on", "divergence", "-f", "json")  # fmt: skip
    assert wider.exit_code == 1, wider.stderr
    first = json.loads(wider.stdout)["first_divergence"]
    assert (first["module"], first["problem"]) == ("fc1", "shape")  # 32 against 64 features
    same = invoke("compare", f"{M}:MLPNet", f"{M}:MLPNet", "--device", "meta", "-i", "4x16",
                  "--fail-on", "divergence")  # fmt: skip
    assert same.exit_code == 0, same.stderr
    assert "shapes agree; on meta no values are compared" in same.stdout


def test_complex_outputs_differ_by_their_imaginary_parts() -> None:
    """B turns each frequency further: the figures are the complex ones, against complex128
    by hand; the same model passes."""
    torch.manual_seed(0)
    a, b = Rotary(), Rotary(k=1.5)
    b.load_state_dict({"proj.weight": a.proj.weight, "proj.bias": a.proj.bias}, strict=False)
    x = torch.randn(4, 16)
    report = hookcli.compare(a, b, (x,), fail_on="divergence")
    assert not report.passed
    root = next(r for r in report.to_dict()["calls"] if r["name"] == "")  # the root
    with torch.no_grad():
        za, zb = a(x).to(torch.complex128), b(x).to(torch.complex128)
    assert root["rel_l2"] == pytest.approx(float((zb - za).norm() / za.norm()), rel=1e-6)
    assert report.to_dict()["first_divergence"]["module"] == ""
    assert hookcli.compare(a, copy.deepcopy(a), (x,), fail_on="divergence").passed


@pytest.mark.parametrize("option", ["--rtol", "--atol"])
@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_a_tolerance_no_value_can_fail_is_exit_2(option: str, value: str) -> None:
    result = invoke("compare", f"{M}:MLPNet", "--vs", "dtype=float16", "-i", "4x16",
                    option, value, "--fail-on", "divergence")  # fmt: skip
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    assert option in result.stderr and (
        "finite number >= 0" in result.stderr or "not in the range x>=0" in result.stderr
    )
    assert len(result.stderr.strip().splitlines()) == 1
    with pytest.raises(UsageError, match="must be a finite number >= 0"):
        hookcli.compare(nn.Linear(2, 2), inputs=(torch.ones(1, 2),), vs="dtype=float16",
                        **{option.lstrip("-"): float(value)})  # fmt: skip


def test_vs_compile_traces_none_of_hookcli(caplog: pytest.LogCaptureFixture) -> None:
    """torch.compile runs hookcli's hooks eagerly at B's module boundaries: dynamo logs no
    graph break inside hookcli's code (it traced the figures before), and B's figures are
    those of the compiled calls (eager backend: equal to A's)."""
    import logging

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))
    with caplog.at_level(logging.WARNING, logger="torch._dynamo"):
        report = hookcli.compare(model, inputs=(torch.randn(4, 16),), vs="compile=eager",
                                 fail_on="divergence")  # fmt: skip
    assert report.passed
    assert not [r for r in caplog.records if "hookcli" in r.getMessage()]
    assert all(r["rel_l2"] == 0.0 for r in report.to_dict()["calls"])


class TinyAndBig(nn.Module):
    """``tiny`` works on values near 1e-9 (far under atol), ``big`` on values near 1."""

    def __init__(self):
        super().__init__()
        self.tiny = nn.Linear(16, 16)
        self.big = nn.Linear(16, 16)
        with torch.no_grad():
            self.tiny.weight.mul_(1e-9)
            self.tiny.bias.mul_(1e-9)

    def forward(self, x):
        return self.big(x) + self.tiny(x)


def test_the_local_ranking_puts_calls_beyond_the_tolerance_first() -> None:
    """B's ``tiny`` is 50% off (a large relative error, all of it under atol), its ``big``
    0.1% off (beyond the tolerance): ``big`` tops the ranking, as isclose decides by hand."""
    torch.manual_seed(0)
    a = TinyAndBig()
    b = copy.deepcopy(a)
    with torch.no_grad():
        b.tiny.weight.mul_(1.5)
        b.big.weight.mul_(1.001)
    x = torch.randn(4, 16)
    with torch.no_grad():
        close = {n: bool(torch.isclose(getattr(b, n)(x), getattr(a, n)(x)).all())
                 for n in ("tiny", "big")}  # fmt: skip
    assert close == {"tiny": True, "big": False}
    report = hookcli.compare(a, b, (x,)).to_dict()
    ranking = report["local_ranking"]
    assert ranking[0]["module"] == "big" and ranking[0]["diverged"]
    tiny = next(r for r in ranking if r["module"] == "tiny")
    assert tiny["rel_l2"] > ranking[0]["rel_l2"] and not tiny["diverged"]


class Threaded(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 8)

    def forward(self, x):
        import threading

        res = {}

        def work():
            res["h"] = self.a(x)

        t = threading.Thread(target=work)
        t.start()
        t.join()
        return self.b(torch.relu(res["h"]))


def test_a_call_without_local_figures_is_named_in_a_note() -> None:
    """``a`` runs on a thread of the model's own, where B's call cannot be fed A's value:
    it has propagated figures and no local ones, and the note names it."""
    torch.manual_seed(0)
    report = hookcli.compare(Threaded(), inputs=(torch.randn(4, 16),), vs="dtype=float16")
    rows = {r["name"]: r for r in report.to_dict()["calls"]}
    assert rows["a"]["rel_l2"] is not None and rows["a"]["local_rel_l2"] is None
    assert rows["b"]["local_rel_l2"] is not None
    notes = [n for n in report.notes if "without local figures" in n]
    assert len(notes) == 1 and "(a)" in notes[0], report.notes


def test_the_python_twin_refuses_quantize_with_a_half_dtype_before_running() -> None:
    calls = []
    model = nn.Linear(2, 2)
    model.register_forward_hook(lambda *a: calls.append(1))
    with pytest.raises(UsageError, match="quantize=dynamic needs float32"):
        hookcli.compare(model, inputs=(torch.ones(1, 2),), vs=["quantize=dynamic", "dtype=float16"])
    assert not calls  # refused before any forward


def test_the_python_twin_loads_vs_weights(tmp_path: Any) -> None:
    """``vs="weights=FILE"``: B is A with FILE's weights, as on the command line; the
    error is FILE's against A's, by hand."""
    torch.manual_seed(0)
    a, other = nn.Linear(4, 4), nn.Linear(4, 4)
    path = tmp_path / "other.pt"
    torch.save(other.state_dict(), path)
    x = torch.randn(3, 4)
    before = a.weight.detach().clone()
    report = hookcli.compare(a, inputs=(x,), vs=f"weights={path}", fail_on="divergence")
    assert not report.passed
    with torch.no_grad():
        want = float((other(x) - a(x)).double().norm() / a(x).double().norm())
    assert report.to_dict()["calls"][0]["rel_l2"] == pytest.approx(want, rel=1e-6)
    assert torch.equal(a.weight, before)  # (A untouched: its copy took the weights)


@pytest.mark.parametrize("call", ["compare", "grads", "stats"])
def test_an_empty_fail_on_string_is_refused_by_the_python_twins(call: str) -> None:
    model, x = nn.Linear(2, 2), torch.ones(1, 2)
    with pytest.raises(UsageError, match="names nothing"):
        if call == "compare":
            hookcli.compare(model, inputs=(x,), vs="dtype=float16", fail_on="")
        else:
            getattr(hookcli, call)(model, x, fail_on=" , ")
    with pytest.raises(UsageError, match="names nothing"):
        hookcli.grads(model, x, fail_on=[""])
    assert hookcli.grads(model, x, fail_on=[]).passed  # (an empty list: no check)
