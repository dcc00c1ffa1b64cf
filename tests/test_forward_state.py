"""State a forward leaves on the model, as the commands that run it more than once see it
(issue 44, point 7 and the sweep's mode finding).

- Meta's Llama keeps its KV cache in plain tensor attributes (``self.cache_k``) that
  forward writes in place at ``start_pos``: ``cost --backward`` and ``profile --backward``
  put them back as found before each pass, run with exit 0, count the FLOPs that
  FlopCounterMode counts on one plain forward and backward (of that model, and of the same
  model without the cache), and leave every attribute as it was found.
- ``hookcli.cost`` (backward, checkpoint, amp) leaves each module's own ``training`` flag
  as it was: a frozen BatchNorm under a training root, a training one under an eval root.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import hookcli
from tests.conftest import invoke_json
from tests.fixtures import meta_llama as ml

ROOT = Path(__file__).resolve().parents[1]
FIX = "tests.fixtures.meta_llama"
INPUTS = ("--inputs-from", f"{FIX}:llama_inputs", "--seed", "0")


def run_json(*args: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    result = subprocess.run(
        [sys.executable, "-m", "hookcli", *args, "--format", "json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def flops_of(factory: Any) -> tuple[int, int]:
    """FlopCounterMode's forward and backward FLOPs of one plain forward and backward
    (loss: the sum of the output, as the commands' default), on a model built as
    ``--seed 0`` builds it."""
    torch.manual_seed(0)
    model = factory()
    tokens, start_pos = ml.llama_inputs()
    with FlopCounterMode(display=False) as forward:
        out = model(tokens, start_pos)
    with FlopCounterMode(display=False) as backward:
        out.sum().backward()
    return forward.get_total_flops(), backward.get_total_flops()


def attributes(model: nn.Module) -> dict[str, torch.Tensor]:
    return {
        f"{name}.{attr}": value
        for name, m in model.named_modules()
        for attr, value in vars(m).items()
        if isinstance(value, torch.Tensor)
    }


@pytest.fixture(scope="module")
def cost_llama() -> dict[str, Any]:
    """``cost --backward`` of Meta's Llama from the command line, run once for the module."""
    return run_json("cost", f"{FIX}:llama", *INPUTS, "--backward")


@pytest.fixture(scope="module")
def oracle() -> tuple[int, int]:
    with_cache = flops_of(ml.llama)
    assert with_cache == flops_of(ml.llama_no_cache)  # the cache adds no counted FLOP
    assert with_cache[0] > 0 and with_cache[1] > 0
    return with_cache


def test_cost_backward_runs_on_metas_kv_cache_and_counts_flopcountermode(
    oracle: tuple[int, int], cost_llama: dict[str, Any]
) -> None:
    report = cost_llama
    totals = report["totals"]
    assert report.get("error") is None
    assert (totals["flops"], totals["backward_flops"]) == oracle
    # the tracked training step ran too (two steps and an inference forward)
    assert totals.get("step_peak_error") is None and totals["step_peak_bytes"] > 0


def test_profile_backward_runs_on_metas_kv_cache(oracle: tuple[int, int]) -> None:
    report = run_json(
        "profile", f"{FIX}:llama", *INPUTS, "--backward", "--repeat", "3", "--warmup", "1"
    )
    totals = report["totals"]
    assert report.get("error") is None
    assert (totals["flops"], totals["backward_flops"]) == oracle
    assert totals["backward_ms"] > 0


def test_the_no_cache_model_gives_the_same_figures(cost_llama: dict[str, Any]) -> None:
    with_cache = cost_llama["totals"]
    without = invoke_json("cost", f"{FIX}:llama_no_cache", *INPUTS, "--backward")["totals"]
    for key in ("flops", "backward_flops", "params", "step_peak_bytes"):
        if key == "step_peak_bytes":  # the cache's own bytes are held in both
            assert with_cache[key] >= without[key] > 0
        else:
            assert with_cache[key] == without[key], key


def test_kv_cache_attributes_are_left_as_found_by_the_api() -> None:
    torch.manual_seed(0)
    model = ml.llama().train()
    tokens, start_pos = ml.llama_inputs()
    first = model.layers[0].attention
    with torch.no_grad():  # a cache holding earlier values: they must come back too
        first.cache_k.normal_()
    before = attributes(model)
    values = {k: v.clone() for k, v in before.items()}

    report = hookcli.cost(model, tokens, start_pos, backward=True, mode="train")
    assert report.error is None and report.totals["backward_flops"] > 0
    report = hookcli.profile(model, tokens, start_pos, backward=True, repeat=2, warmup=1)
    assert report.error is None

    after = attributes(model)
    assert after.keys() == before.keys()
    for name, tensor in after.items():
        assert tensor is before[name], name  # the same object, not a copy
        assert tensor.grad_fn is None and not tensor.requires_grad, name
        assert torch.equal(tensor, values[name]), name
    assert bool(first.cache_k.abs().sum() > 0)


class LazyCache(nn.Module):
    """A cache that starts as None and grows by ``torch.cat`` on each call, and a tensor
    attribute that the first call adds."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.past = None

    def forward(self, x):
        k = self.proj(x)
        if self.past is not None:
            k = torch.cat([self.past, k], dim=1)
        self.past = k
        self.seen = x.detach()
        return (x @ k.transpose(1, 2)).softmax(-1) @ k


def test_a_cache_grown_by_cat_starts_from_none_on_every_pass() -> None:
    torch.manual_seed(0)
    model = LazyCache()
    x = torch.randn(2, 3, 4)
    report = hookcli.cost(model, x, backward=True)
    assert report.error is None
    with FlopCounterMode(display=False) as forward:
        out = LazyCache()(x)
    with FlopCounterMode(display=False) as backward:
        out.sum().backward()
    # each pass saw one call's keys (3), not the keys of every pass before it
    assert report.totals["flops"] == forward.get_total_flops()
    assert report.totals["backward_flops"] == backward.get_total_flops()
    assert model.past is None and "seen" not in vars(model)


# -- each module's own training flag ---------------------------------------------------------


class FrozenBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.block = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())

    def forward(self, x):
        return self.block(self.bn(self.conv(x))).mean((2, 3))


def _mixed(root_training: bool) -> nn.Module:
    torch.manual_seed(0)
    model = FrozenBN().train(root_training)
    model.bn.train(not root_training)  # frozen under a train root, training under eval
    model.block[1].train(not root_training)
    return model


@pytest.mark.parametrize("root_training", [True, False], ids=["train-root", "eval-root"])
@pytest.mark.parametrize(
    "options",
    [
        {"backward": True},
        {"backward": True, "checkpoint": "Sequential"},
        {"backward": True, "amp": "bf16"},
        {"zero_grad": "zeros"},
    ],
    ids=["backward", "checkpoint", "amp", "zero_grad"],
)
def test_cost_api_leaves_every_modules_training_flag(
    root_training: bool, options: dict[str, Any]
) -> None:
    model = _mixed(root_training)
    flags = {name: m.training for name, m in model.named_modules()}
    mode = "train" if root_training else "eval"
    report = hookcli.cost(model, torch.randn(2, 3, 8, 8), mode=mode, **options)
    assert report.error is None
    assert {name: m.training for name, m in model.named_modules()} == flags
