"""`hookcli compare`'s inputs, gradients present on one side only, tolerances under
autocast and modules called in another order: each against plain PyTorch (a plain
forward on the user's values, plain autograd)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

from tests.conftest import invoke_json
from tests.test_compare import metrics

T = "tests.test_compare_inputs"


class Inplace(nn.Module):
    """Its forward doubles its input in place (as some published code does); ``bug``:
    its output scaled by 1.5."""

    def __init__(self, bug=False):
        super().__init__()
        self.lin = nn.Linear(16, 4)
        self.relu = nn.ReLU(inplace=True)
        self.bug = bug
        self.example_input_array = torch.randn(2, 16)

    def forward(self, x):
        x.mul_(2)
        y = self.lin(self.relu(x))
        return y * 1.5 if self.bug else y


def _plain(bug: bool) -> torch.Tensor:
    torch.manual_seed(0)
    model = Inplace(bug).eval()
    with torch.no_grad():
        return model(model.example_input_array.clone())


# every way compare runs its passes: in step, one after the other, the extra passes of
# --copy-weights and --backward, the settings that are the process's
RUNS = [
    (),
    ("--mode", "train"),
    ("--backward",),
    ("--align", "order"),
    ("--copy-weights",),
    ("--rtol", "1e-3"),
]


@pytest.mark.parametrize("extra", RUNS, ids=lambda e: " ".join(e) or "plain")
def test_every_pass_gets_the_users_inputs_when_forward_writes_them(extra: tuple[str, ...]) -> None:
    report = invoke_json("compare", f"{T}:Inplace", f"{T}:Inplace", "--b-kwargs", "bug=True",
                         *extra)  # fmt: skip
    want_a, want_b = _plain(False), _plain(True)
    root = report["calls"][0]
    assert root["name"] == "" and root["rel_l2"] == pytest.approx(
        metrics(want_a, want_b)["rel_l2"], rel=1e-6
    )
    d = report["first_divergence"]
    assert d["module"] == ""
    at = tuple(d["worst"])
    assert d["value_a"] == pytest.approx(want_a[at].item(), rel=1e-6)
    assert d["value_b"] == pytest.approx(want_b[at].item(), rel=1e-6)
    # local: the root fed A's input (the user's) adds the scale alone
    assert root["local_rel_l2"] == pytest.approx(0.5, rel=1e-6)
    assert [r["module"] for r in report["local_ranking"] if r["rel_l2"]] == [""]


@pytest.mark.parametrize("vs", ["threads=1", "deterministic", "seed=3", "dtype=float32"])
def test_a_setting_that_changes_nothing_finds_nothing_when_forward_writes_its_input(
    vs: str,
) -> None:
    # (drawn inputs: hookcli's own tensors, which a forward can write)
    report = invoke_json("compare", f"{T}:Inplace", "--vs", vs, "-i", "2x16")
    assert report["first_divergence"] is None
    assert report["first_divergence_local"] is None
    assert all(r["max_abs"] == 0 for r in report["calls"])


def test_the_api_leaves_the_users_input_tensors_as_they_were() -> None:
    import hookcli

    torch.manual_seed(0)
    a = Inplace().eval()
    b = copy.deepcopy(a)
    x = a.example_input_array.clone()
    before = x.clone()
    report = hookcli.compare(a, b, (x,), vs=None).to_dict()
    assert torch.equal(x, before)
    assert report["first_divergence"] is None
