"""The one NaN/Inf origin rule (``hookcli.checks.origin``) and the two commands that use it."""

from __future__ import annotations

import json
from collections.abc import Callable

import torch
from torch import nn

from hookcli.checks.origin import nonfinite_origin
from tests.conftest import invoke, invoke_json


def test_first_offender_in_completion_order_wins():
    # Completion order 3, 1, 2: call 1 returns before call 2, though both hold NaN.
    assert nonfinite_origin([3, 1, 2], lambda i: i in (1, 2)) == 1


def test_a_call_fed_nonfinite_inputs_is_skipped():
    bad_out = {1, 2, 5}
    bad_in = {1}  # call 1 only passed on NaN it was given
    assert nonfinite_origin([0, 1, 2, 5], bad_out.__contains__, lambda i: i not in bad_in) == 2


def test_no_origin_when_every_offender_was_fed_nonfinite_inputs():
    assert nonfinite_origin([0, 1], lambda i: True, lambda i: False) is None


def test_no_origin_when_nothing_holds_nan_or_inf():
    assert nonfinite_origin(range(10), lambda i: False) is None
    assert nonfinite_origin([], lambda i: True) is None


def test_unwatched_inputs_count_as_finite():
    assert nonfinite_origin([4, 7], lambda i: i == 7) == 7


class LateBlowup(nn.Module):
    """``early`` turns a finite input into Inf, ``late`` into NaN: the origin is ``early``."""

    def __init__(self) -> None:
        super().__init__()
        self.early = Scale(1e30)
        self.late = Log()
        self.example_input_array = torch.tensor([[3e10, -1.0, 2.0]])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.early(x) + self.late(x)


class Scale(nn.Module):
    def __init__(self, k: float) -> None:
        super().__init__()
        self.k = nn.Parameter(torch.tensor(k))  # so that grads has something to backpropagate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.k


class Log(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


def _first_call_by_hand(bad: Callable[[torch.Tensor], torch.Tensor], inputs_finite: bool) -> str:
    """Plain forward hooks: the first module to return ``bad`` values (from finite inputs)."""
    model = LateBlowup()
    order: list[str] = []
    names = {id(m): n for n, m in model.named_modules()}

    def hook(m: nn.Module, inputs: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        fed_finite = all(torch.isfinite(t).all() for t in inputs)
        if bad(out).any() and (fed_finite or not inputs_finite):
            order.append(names[id(m)] or "(root)")

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    with torch.no_grad():
        model(model.example_input_array)
    for h in handles:
        h.remove()
    return order[0]


def test_stats_origin_is_the_first_call_to_return_nan_or_inf_from_finite_inputs():
    expected = _first_call_by_hand(lambda t: ~torch.isfinite(t), inputs_finite=True)
    assert expected == "early"
    stats = invoke_json("stats", "tests.test_origin:LateBlowup")
    assert stats["totals"]["nonfinite_origin"] == expected


def test_grads_nan_origin_is_the_first_call_to_return_nan():
    # grads watches outputs only, one value at a time: early holds Inf but no NaN.
    expected = _first_call_by_hand(torch.isnan, inputs_finite=False)
    assert expected == "late"
    result = invoke("grads", "tests.test_origin:LateBlowup", "--fail-on", "nan", "-f", "json")
    assert result.exit_code == 1
    (check,) = json.loads(result.stdout)["checks"]
    assert f"the forward pass first produced NaN in {expected}" in check["detail"]
