"""`hookcli compare --backward`'s local gradients against plain autograd: each module of B
fed A's input and A's grad_output for the call, its grad_input and parameter grads
computed by hand with ``torch.autograd.grad``."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.conftest import invoke, invoke_json
from tests.test_compare import close, metrics
from tests.test_compare_models import BUGS, Decoder

M = "tests.test_compare_models"


def by_hand(bug: str, name: str) -> dict[str, float]:
    """A's backward (loss: the output's sum, hookcli's default) with hooks keeping the
    input and grad_output of ``name``; B's ``name`` run on that input and sent back from
    that grad_output. The relative L2 of B's grad_input and of each of its parameters'
    grads against A's."""
    torch.manual_seed(0)
    a = Decoder().train(False)
    torch.manual_seed(0)
    b = Decoder(bug=bug).train(False)
    kept: dict[str, Any] = {}
    mod_a = a.get_submodule(name)
    h1 = mod_a.register_forward_pre_hook(lambda m, args: kept.__setitem__("x", args[0].detach()))
    h2 = mod_a.register_full_backward_hook(
        lambda m, gi, go: kept.update(grad_in=gi[0], grad_out=go[0])
    )
    out = a(a.example_input_array)
    loss = out.sum()
    loss.backward()
    h1.remove()
    h2.remove()
    mod_b = b.get_submodule(name)
    x = kept["x"].clone().requires_grad_(True)
    params_b = dict(mod_b.named_parameters(recurse=False))
    got = torch.autograd.grad(mod_b(x), [x, *params_b.values()], kept["grad_out"])
    want = {"grad_input": metrics(kept["grad_in"], got[0])["rel_l2"], "loss": float(loss.detach())}
    params_a = dict(mod_a.named_parameters(recurse=False))
    if params_a:
        want["param"] = max(
            metrics(params_a[k].grad, g)["rel_l2"] for k, g in zip(params_b, got[1:], strict=True)
        )
    return want


@pytest.mark.parametrize("bug", ["gelu", "transpose"])
def test_local_grads_equal_plain_autograd_and_name_the_planted_module(bug: str) -> None:
    planted = BUGS[bug]
    report = invoke_json(
        "compare", f"{M}:Decoder", f"{M}:Decoder", "--b-kwargs", f"bug={bug!r}", "--backward"
    )
    want = by_hand(bug, planted)
    assert close(report["totals"]["loss_a"], want["loss"])  # the same weights and input
    rows = {(r["name"], r["call"]): r for r in report["calls"]}
    row = rows[(planted, 0)]
    assert want["grad_input"] > 1e-4  # the bug shows in the backward at all
    assert close(row["local_grad_input_rel_l2"], want["grad_input"])
    if "param" in want:
        assert want["param"] > 1e-4
        assert close(row["local_param_grad_rel_l2"], want["param"])
    ranking = report["local_grad_ranking"]
    assert ranking[0]["module"] == planted, ranking
    assert report["first_grad_divergence_local"]["module"] == planted
    # a module after the planted one, fed A's values, adds no gradient error of its own
    # (its propagated grads differ: they carry the bug's error)
    for after in ("h.1.mlp.proj", "h.2.mix", "head"):
        assert rows[(after, 0)]["local_grad_rel_l2"] < 1e-6, after
    assert rows[("head", 0)]["param_grad_rel_l2"] > 1e-6


def test_local_grads_are_in_table_csv_and_notes() -> None:
    args = ("compare", f"{M}:Decoder", f"{M}:Decoder", "--b-kwargs", "bug='gelu'", "--backward")
    table = invoke(*args).stdout
    assert "Local grad rel L2" in table
    assert "Local grad ranking:" in table and "forward only" not in table
    csv = invoke(*args, "--format", "csv").stdout
    assert "local_grad_input_rel_l2" in csv.splitlines()[0]
