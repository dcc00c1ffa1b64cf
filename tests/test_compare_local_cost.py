"""compare's local mode in step (A's forward beside B's): B's fed values are copies of A's
taken as A makes them, except where B passes one on unchanged to the next fed call whose
input is that same tensor of A's; a module seen changing its input in place always gets
a copy. The oracle for the figures: B's module run on a copy of A's input for the call,
with plain hooks and plain torch (the figures of every leaf call)."""

from __future__ import annotations

import copy
import functools
import sys
from typing import Any

import pytest
import torch
from torch import nn

from hookcli.api import compare


def _jittered(model: nn.Module, seed: int = 1) -> nn.Module:
    """A copy of ``model`` with every parameter scaled by 1 + 1e-3 noise: every leaf's
    local error is its own and non-zero."""
    other = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(1 + 1e-3 * torch.randn(p.shape, generator=gen))
    return other


def _plain_local(a: nn.Module, b: nn.Module, x: torch.Tensor) -> dict[tuple[str, int], Any]:
    """(leaf name, call) -> (max |b - a|, ||b - a|| / ||a||): B's leaf run on a copy of
    A's input for that call, against A's output, both recorded by plain hooks."""
    seen: dict[str, int] = {}
    record: dict[tuple[str, int], Any] = {}
    handles = []
    for name, m in a.named_modules():
        if next(m.children(), None) is not None:
            continue

        def pre(mod: nn.Module, args: Any, name: str = name) -> None:
            call = seen.get(name, 0)
            seen[name] = call + 1
            record[(name, call)] = [tuple(t.clone() for t in args)]

        def post(mod: nn.Module, args: Any, out: Any, name: str = name) -> None:
            record[(name, seen[name] - 1)].append(out.clone())

        handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    with torch.no_grad():
        a(x)
    for h in handles:
        h.remove()
    mods_b = dict(b.named_modules())
    out = {}
    with torch.no_grad():
        for (name, call), (args, out_a) in record.items():
            out_b = mods_b[name](*(t.clone() for t in args))
            d = (out_b.double() - out_a.double()).flatten()
            out[(name, call)] = (
                float((out_b - out_a).abs().max()),
                float(d.norm() / out_a.double().flatten().norm()),
            )
    return out


class _Gate(nn.Module):  # scales its input in place when it is large (so: on A's values)
    def __init__(self, limit):
        super().__init__()
        self.limit = limit

    def forward(self, x):
        if x.abs().max() > self.limit:
            x.mul_(0.5)
        return x * 2.0


class _Gated(nn.Module):
    def __init__(self, scale=1.0):
        super().__init__()
        self.l1 = nn.Linear(16, 16)
        self.gate = _Gate(4.0)
        self.l2 = nn.Linear(16, 16)
        self.act = nn.ReLU(inplace=True)
        self.l3 = nn.Linear(16, 16)
        with torch.no_grad():
            self.l1.weight.mul_(scale)

    def forward(self, x):
        h = self.gate(self.l1(x))
        return self.l3(self.act(self.l2(h)))


def _models() -> list[tuple[str, nn.Module, nn.Module, torch.Tensor]]:
    import torchvision

    torch.manual_seed(0)
    r18 = torchvision.models.resnet18(weights=None).eval()
    gated = _Gated(scale=20.0).eval()  # A's l1 output passes the gate's limit
    b_gated = _jittered(gated)
    with torch.no_grad():  # B's stays under it: B's gate changes nothing in place
        b_gated.l1.weight.div_(20.0)
    return [
        ("resnet18", r18, _jittered(r18), torch.randn(2, 3, 32, 32)),
        ("gated", gated, b_gated, torch.randn(4, 16)),
    ]


@pytest.mark.parametrize("case", ["resnet18", "gated"])
def test_local_figures_of_every_leaf_are_bs_leaf_on_as_input(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every leaf call's local max abs and relative L2 equal those of B's leaf run on a copy
    of A's input (resnet18: in-place ReLUs, each block's input passed on through its first
    conv; ``gated``: a module that scales its input in place only on A's values, which
    the propagated pass cannot see, so the local pass runs again with every input copied)
    in step, and the same when A and B run one after the other."""
    from hookcli.compare import runner

    _, a, b, x = next(c for c in _models() if c[0] == case)
    expected = _plain_local(a, b, x)
    mods = dict(b.named_modules())
    passes: list[Any] = []
    real = runner._local_in_step_once
    monkeypatch.setattr(
        runner, "_local_in_step_once", lambda *args: passes.append(args[-1]) or real(*args)
    )
    stepped = compare(a, b, (x,)).to_dict()
    # gated: the first local pass kept A's values uncopied at the gate, which changed them
    assert [w is not None for w in passes] == ([True, False] if case == "gated" else [True])
    with monkeypatch.context() as m:
        m.setattr(runner, "_can_step", lambda *_: False)
        apart = compare(a, b, (x,)).to_dict()
    for report in (stepped, apart):
        rows = {(r["name"], r["call"]): r for r in report["calls"]}
        for key, (max_abs, rel_l2) in expected.items():
            assert rows[key]["local_max_abs"] == pytest.approx(max_abs, rel=1e-6, abs=1e-9), key
            assert rows[key]["local_rel_l2"] == pytest.approx(rel_l2, rel=1e-5, abs=1e-9), key
        weighted = [k for k in expected if list(mods[k[0]].parameters(recurse=False))]
        assert weighted and all(rows[k]["local_max_abs"] > 0 for k in weighted)
    for s, p in zip(stepped["calls"], apart["calls"], strict=True):
        assert (s["name"], s["local_max_abs"], s["local_rel_l2"]) == (
            p["name"], p["local_max_abs"], p["local_rel_l2"]
        )  # fmt: skip


def test_local_pass_copies_an_input_passed_on_unchanged_once() -> None:
    """The local pass in step copies A's outputs (B's parent goes on from them) and the
    inputs B's code made or changed, not a value B passes on unchanged: on resnet18 it
    copies fewer tensors than one per aligned call's input and output (each block's
    input goes into the block and its first conv uncopied; its in-place ReLUs get
    copies), where a copy of each was made before."""
    from hookcli.compare import record, runner

    _, a, b, x = _models()[0]
    calls: list[int] = []
    handles = [m.register_forward_hook(lambda *_: calls.append(1)) for m in a.modules()]
    with torch.no_grad():
        a(x)
    for h in handles:
        h.remove()
    counted: list[str] = []
    real = torch.Tensor.clone

    def clone(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        counted.append(sys._getframe(1).f_code.co_filename)  # (not the session's own)
        return real(self, *args, **kwargs)

    plan = runner.Plan
    with pytest.MonkeyPatch.context() as m:
        m.setattr(torch.Tensor, "clone", clone)
        m.setattr(runner, "Plan", functools.partial(plan, local=False))
        compare(a, b, (x,))
        propagated = counted.count(record.__file__)
        counted.clear()
        m.setattr(runner, "Plan", plan)
        compare(a, b, (x,))
    local = counted.count(record.__file__) - propagated
    assert propagated == 0  # (in step: A's outputs lent)
    assert len(calls) <= local < 1.5 * len(calls)
