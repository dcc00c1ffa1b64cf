"""``grads --depth N`` (issue 44, point 8): a row whose children the depth hides stands for
its whole subtree, so a block whose hidden children hold the gradient shows it, not "-".
The oracle: plain autograd on Meta's Llama (tests/fixtures/meta_llama.py), the L2 norm of
the subtree's parameter grads in float64."""

from __future__ import annotations

import math
from typing import Any

import torch

from tests.conftest import invoke_json
from tests.fixtures import meta_llama as ml

FIX = "tests.fixtures.meta_llama"
ARGS = ("grads", f"{FIX}:llama", "--inputs-from", f"{FIX}:llama_inputs", "--seed", "0")


def autograd_model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = ml.llama().train()
    tokens, start_pos = ml.llama_inputs()
    model(tokens, start_pos).sum().backward()
    return model


def l2(tensors: list[Any]) -> float:
    return float(torch.cat([t.detach().double().reshape(-1) for t in tensors]).norm())


def close(a: float | None, b: float) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=1e-5)


def test_rows_at_the_depth_show_their_subtree_and_rows_above_their_own() -> None:
    report = invoke_json(*ARGS, "--depth", "2")
    rows = {r["name"]: r for r in report["layers"]}
    model = autograd_model()
    for name in ("layers.0", "layers.1"):  # TransformerBlocks: no parameter of their own
        block = model.get_submodule(name)
        assert not list(block.parameters(recurse=False))
        assert close(rows[name]["grad_norm"], l2([p.grad for p in block.parameters()]))
        assert close(rows[name]["weight_norm"], l2(list(block.parameters())))
    leaf = model.get_submodule("output")
    assert close(rows["output"]["grad_norm"], l2([leaf.weight.grad]))
    # the root's children have rows: it keeps its own (no parameter, no norm)
    assert rows[""]["grad_norm"] is None
    # the totals are unchanged: every parameter once
    assert close(report["totals"]["grad_norm"], l2([p.grad for p in model.parameters()]))


def test_without_depth_a_block_shows_its_own_parameters_only() -> None:
    report = invoke_json(*ARGS)
    rows = {r["name"]: r for r in report["layers"]}
    assert rows["layers.0"]["grad_norm"] is None  # every parameter is in a row below it
    model = autograd_model()
    wq = model.get_submodule("layers.0.attention.wq")
    assert close(rows["layers.0.attention.wq"]["grad_norm"], l2([wq.weight.grad]))
