"""`hookcli compare --backward`'s local gradients against plain autograd: each module of B
fed A's input and A's grad_output for the call, its grad_input and parameter grads
computed by hand with ``torch.autograd.grad``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from tests.conftest import invoke, invoke_json
from tests.test_compare import close, metrics
from tests.test_compare_models import BUGS, Decoder, Mix

M = "tests.test_compare_models"
T = "tests.test_compare_local_grads"


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


class Twice(nn.Module):
    """One layer called twice (its parameters' grads sum over the calls), an in-place
    ReLU between; ``bug``: the layer multiplies by its weight transposed."""

    def __init__(self, bug=None):
        super().__init__()
        self.inp = nn.Linear(6, 8)
        self.mix = Mix(8, bug)
        self.act = nn.ReLU(inplace=True)
        self.out = nn.Linear(8, 3)
        self.example_input_array = torch.randn(4, 6)

    def forward(self, x):
        x = self.inp(x)
        x = self.act(self.mix(x))
        return self.out(self.mix(x))


def test_a_module_called_twice_has_its_parameter_grads_summed_over_its_calls() -> None:
    report = invoke_json(
        "compare", f"{T}:Twice", f"{T}:Twice", "--b-kwargs", "bug='transpose'", "--backward"
    )
    torch.manual_seed(0)
    a = Twice().train(False)
    a.act.inplace = False  # (full backward hooks refuse an in-place op on their output)
    torch.manual_seed(0)
    b = Twice(bug="transpose").train(False)
    seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    xs: list[torch.Tensor] = []
    h1 = a.mix.register_forward_pre_hook(lambda m, args: xs.append(args[0].detach().clone()))
    h2 = a.mix.register_full_backward_hook(
        lambda m, gi, go: seen.insert(0, (xs[len(xs) - 1 - len(seen)], gi[0], go[0]))
    )
    loss = a(a.example_input_array).sum()
    loss.backward()
    h1.remove()
    h2.remove()
    assert close(report["totals"]["loss_a"], float(loss.detach()))
    rows = {(r["name"], r["call"]): r for r in report["calls"]}
    total = {n: torch.zeros_like(p) for n, p in b.mix.named_parameters()}
    for call, (x, grad_in, grad_out) in enumerate(seen):
        x = x.clone().requires_grad_(True)
        got = torch.autograd.grad(b.mix(x), [x, b.mix.weight, b.mix.bias], grad_out)
        want = metrics(grad_in, got[0])["rel_l2"]
        assert close(rows[("mix", call)]["local_grad_input_rel_l2"], want), call
        total["weight"] += got[1]
        total["bias"] += got[2]
    want = max(metrics(p.grad, total[n])["rel_l2"] for n, p in a.mix.named_parameters())
    assert want > 1e-4
    assert close(rows[("mix", 0)]["local_param_grad_rel_l2"], want)
    assert rows[("mix", 1)]["local_param_grad_rel_l2"] is None  # on the first call only
    assert report["local_grad_ranking"][0]["module"] == "mix"
    assert rows[("out", 0)]["local_grad_rel_l2"] < 1e-6


class Tied(nn.Module):
    """An embedding and a head that share one weight (as GPT-2 ties them)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.mid = nn.Linear(8, 8)
        self.head = nn.Linear(8, 20, bias=False)
        self.head.weight = self.emb.weight
        self.example_input_array = torch.randint(0, 20, (2, 5))

    def forward(self, idx):
        return self.head(torch.tanh(self.mid(self.emb(idx))))


def test_a_tied_parameter_has_no_local_grad_of_one_module() -> None:
    # A's grad of the tied weight sums the embedding's part and the head's: neither
    # module's own backward, so no local parameter figure (not a false divergence)
    report = invoke_json("compare", f"{T}:Tied", "--vs", "dtype=float64", "--backward")
    rows = {r["name"]: r for r in report["calls"]}
    assert rows["emb"]["local_param_grad_rel_l2"] is None
    assert rows["head"]["local_param_grad_rel_l2"] is None
    assert rows["mid"]["local_param_grad_rel_l2"] is not None
    assert rows["mid"]["local_param_grad_rel_l2"] < 1e-6
    assert report["first_grad_divergence_local"] is None
