"""``hookcli.cost()`` takes the training-step options of ``hookcli cost``: ``loss``,
``zero_grad``, ``checkpoint``, ``foreach``, ``amp`` and ``fit``, with the CLI's names
and meanings: on the same model it returns the report the CLI prints as JSON."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import hookcli
from hookcli.errors import UsageError
from sample_models.decoder import Decoder
from tests.conftest import run_json


def _meta_decoder() -> tuple[Decoder, torch.Tensor]:
    with torch.device("meta"):
        model = Decoder()
    return model, model.example_input_array.to("meta")


def test_the_api_returns_the_clis_report() -> None:
    cli = run_json(
        "cost", "sample_models.decoder:Decoder", "--device", "meta", "--optimizer", "sgd",
        "--zero-grad", "zeros", "--checkpoint", "Block", "--amp", "bf16", "--fit", "64MiB",
        "--no-foreach", "--loss", "mean",
    )  # fmt: skip
    model, x = _meta_decoder()
    api = hookcli.cost(
        model,
        x,
        optimizer="sgd",
        zero_grad="zeros",
        checkpoint="Block",
        amp="bf16",
        fit="64MiB",
        foreach=False,
        loss="mean",
    ).to_dict()
    assert api["totals"] == cli["totals"]
    assert "fit_batch" in api["totals"] and api["totals"]["step_checkpointed_modules"] > 0
    assert {k: v for k, v in api["settings"].items() if k != "seed"} == {
        k: v for k, v in cli["settings"].items() if k != "seed"
    }
    assert api["settings"]["amp_policy"] == "cuda" and api["settings"]["zero_grad"] == "zeros"
    assert api["settings"]["loss"] == "mean"


def test_each_step_option_turns_backward_on() -> None:
    model, x = _meta_decoder()
    plain = hookcli.cost(model, x)
    assert not plain.settings["backward"] and "backward_flops" not in plain.totals
    assert plain.totals["step_peak_bytes"] > 0  # the training figure needs no --backward
    for kw in ({"zero_grad": "none"}, {"foreach": True}, {"checkpoint": "Block"}):
        report = hookcli.cost(model, x, optimizer="sgd", **kw)
        assert report.settings["backward"] and report.totals["backward_flops"] > 0, kw


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"zero_grad": "some"}, "zero_grad must be one of none, zeros"),
        ({"foreach": "yes"}, "foreach must be True, False or None"),
        ({"amp": "fp8"}, "--amp must be one of bf16, fp16"),
        ({"checkpoint": "not a class"}, "module class name"),
        ({"fit": "lots"}, "fit"),
        ({"fit": -1}, "fit must be a whole number"),
    ],
)
def test_bad_step_options_are_usage_errors(kw: dict[str, Any], needle: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    with pytest.raises(UsageError, match=needle.replace("(", r"\(")):
        hookcli.cost(model, torch.zeros(3, 4), **kw)


def test_amp_on_the_cpu_is_torchs_autocast() -> None:
    """On the CPU the API's amp is torch.autocast itself: a Linear's output is bfloat16."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU())
    x = torch.randn(8, 16)
    plain = hookcli.cost(model, x).to_dict()
    half = hookcli.cost(model, x, amp="bf16").to_dict()
    out = {r["name"]: r["output_bytes"] for r in plain["layers"]}
    assert {r["name"]: r["output_bytes"] for r in half["layers"]}["0"] * 2 == out["0"]
    assert half["settings"]["amp"] == "bf16" and "amp_policy" not in half["settings"]
    assert not torch.is_autocast_enabled("cpu")  # off again after the call
