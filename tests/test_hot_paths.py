"""The speed work on the hot paths (issue 28) keeps what the hooks see and leave behind.

Each test checks against plain PyTorch what a shortcut must not change: grads' forward
flags read once per piece of memory (a parent's output is its last child's, behind the
session's detached alias), ``model.train`` still called where a class has its own, every
buffer put back, and the rows' parameter counts.
"""

from __future__ import annotations

import importlib

import torch
from torch import nn

import hookcli

grads_probe = importlib.import_module("hookcli.grads.probe")


def _nested() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), nn.Sequential(nn.Tanh()))


def test_grads_reads_each_forward_output_once_behind_the_aliases(monkeypatch):
    model = _nested()
    x = torch.randn(3, 4)
    seen: list[int] = []
    original = grads_probe._forward_flags

    def counting(t: torch.Tensor) -> torch.Tensor:
        seen.append(t.numel())
        return original(t)

    monkeypatch.setattr(grads_probe, "_forward_flags", counting)
    report = hookcli.grads(model, x, fail_on="nan,inf,dead")
    # plain PyTorch: three tensors come out of the leaves (Linear, ReLU, Tanh); the
    # Sequentials return their last child's output, so nothing else needs reading
    assert len(seen) == 3
    assert report.passed


def test_grads_flags_a_dead_parent_whose_output_is_its_childs():
    model = nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
    with torch.no_grad():
        model[0][0].weight.zero_()
        model[0][0].bias.fill_(-1.0)  # ReLU(-1) = 0 everywhere: the whole chain is dead
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert not model(x).any()  # plain PyTorch says so
    report = hookcli.grads(model, x, fail_on="dead")
    failed = {c.name: c for c in report.failed_checks}
    assert "dead" in failed
    # the ReLU, the inner Sequential and the root output the same zeros
    assert {"0.1", "0", "(root)"} <= {layer.split("#")[0] for layer in failed["dead"].layers}


class _OwnTrain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.calls: list[bool] = []

    def train(self, mode: bool = True) -> _OwnTrain:
        self.calls.append(mode)
        return super().train(mode)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def test_a_class_with_its_own_train_is_still_asked():
    model = _OwnTrain().eval()
    model.calls.clear()
    hookcli.inspect(model, torch.randn(1, 2))  # eval, already in eval mode
    assert model.calls == [False]
    assert not model.training and not model.lin.training


def test_modes_come_back_module_by_module():
    model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(), nn.Linear(2, 2))
    model.train()
    model[1].eval()  # a mix, as a fine-tuning script leaves it
    hookcli.inspect(model, torch.randn(1, 2))  # runs in eval
    assert [m.training for m in model.modules()] == [True, True, False, True]
    hookcli.grads(model, torch.randn(2, 2))  # runs in train
    assert [m.training for m in model.modules()] == [True, True, False, True]


class _Counting(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.register_buffer("seen", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps += 1
        self.seen.copy_(x.detach()[0])
        return x * 2


def test_every_buffer_comes_back_values_and_identity():
    model = nn.Sequential(_Counting(), _Counting())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = {k: id(v) for k, v in model.named_buffers()}
    hookcli.inspect(model, torch.randn(1, 3))
    hookcli.grads(model, torch.randn(2, 3, requires_grad=True))
    after = model.state_dict()
    assert set(after) == set(before)
    for k, v in before.items():
        assert after[k].shape == v.shape and torch.equal(after[k], v), k
    assert {k: id(v) for k, v in model.named_buffers()} == ids


def test_row_param_counts_match_plain_pytorch():
    shared = nn.Linear(3, 3)
    model = nn.Sequential(shared, nn.ReLU(), shared, nn.Linear(3, 2, bias=False))
    report = hookcli.inspect(model, torch.randn(1, 3))
    total = sum(p.numel() for p in model.parameters())
    assert report.totals["params"] == total
    shown = sum(r.display["shown_params"] for r in report.layers)
    assert shown == total  # every tensor once, the tied one at its first row


def test_stats_reads_a_chunks_min_and_max_with_amin_and_amax_not_aminmax(monkeypatch):
    # aminmax's CPU kernel takes longer than amin and amax together (docs/stats-speed.md)
    stats_probe = importlib.import_module("hookcli.stats.probe")
    x = torch.randn(5000, generator=torch.Generator().manual_seed(0))  # mixed signs, no zero
    calls: list[str] = []
    for owner, name in ((torch.Tensor, "amin"), (torch.Tensor, "amax"), (torch, "aminmax")):
        original = getattr(owner, name)

        def counted(*a, _name=name, _original=original, **k):  # type: ignore[no-untyped-def]
            calls.append(_name)
            return _original(*a, **k)

        monkeypatch.setattr(owner, name, counted)
    vec = stats_probe.host_vector(x, stats_probe.Scratch())
    monkeypatch.undo()
    # the chunk's amin and amax, then |x|'s amin (is there a zero to count?)
    assert calls == ["amin", "amax", "amin"]
    assert vec[2] == x.min().item() and vec[3] == x.max().item()


def test_stats_min_and_max_of_signed_zeros_are_amin_and_amax():
    stats_probe = importlib.import_module("hookcli.stats.probe")
    for values in ([0.0, -0.0, 1.0], [-0.0, 0.0, -1.0], [0.0, -0.0]):
        x = torch.tensor(values)
        vec = stats_probe.host_vector(x, stats_probe.Scratch())
        lo, hi = x.amin().item(), x.amax().item()
        assert (vec[2], str(vec[2])) == (lo, str(lo))
        assert (vec[3], str(vec[3])) == (hi, str(hi))
