"""``hookcli grads`` leaves the model as it found it: hooks, ``.grad``, modes, buffers.

Each test runs on a module-level instance (the CLI uses an instance as is), so
the model can be examined afterwards; after success, after the model raises in
forward or backward, and after KeyboardInterrupt.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from torch import nn

from hookcli.grads.probe import GradProbe
from hookcli.options import HookKind, Mode
from hookcli.session import HookSession
from sample_models import BNMLP
from tests.conftest import (
    assert_no_hooks,
    assert_same_state,
    global_hook_counts,
    hook_count,
    invoke,
    state_snapshot,
)

HERE = __name__
ALL_KINDS = frozenset({HookKind.FORWARD, HookKind.BACKWARD_PRE, HookKind.BACKWARD, HookKind.TENSOR})


def backward_hook_forward() -> Any:
    """``BackwardHookFunction.forward``, which grads patches while it runs and must put
    back; None where torch moved that private class (those assertions are then skipped,
    the rest of each test still runs)."""
    try:
        from torch.nn.modules import _functions

        return _functions.BackwardHookFunction.__dict__["forward"]
    except (ImportError, AttributeError, KeyError):
        return None


HOOK_FORWARD = backward_hook_forward()


def test_torch_still_has_the_patched_function() -> None:
    if HOOK_FORWARD is None:
        pytest.skip(
            "torch.nn.modules._functions.BackwardHookFunction (private) moved in this torch: "
            "the checks that grads puts its forward back are skipped"
        )
    assert callable(HOOK_FORWARD)


NO_GLOBAL = dict.fromkeys(global_hook_counts(), 0)


class ConvBN(nn.Module):
    """BatchNorm2d, an in-place ReLU and an in-place residual add on a hooked output."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)
        self.relu = nn.ReLU(inplace=True)
        self.head = nn.Linear(3 * 4 * 4, 2)
        self.example_input_array = torch.randn(2, 3, 4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn(self.conv(x))
        out += x  # in place on the batch norm's (hooked) output, like torchvision's ResNet
        return self.head(torch.flatten(self.relu(out), 1))


class Interrupts(nn.Module):
    """Raises KeyboardInterrupt from a middle layer once ``armed``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)
        self.fc2 = nn.Linear(4, 2)
        self.armed = True
        self.example_input_array = torch.randn(3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.bn(self.fc1(x))
        if self.armed:
            raise KeyboardInterrupt
        return self.fc2(x)


class _BoomBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("boom in backward")


class BackwardRaises(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)
        self.head = nn.Linear(4, 2)
        self.example_input_array = torch.randn(3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(_BoomBackward.apply(self.bn(self.fc(x))))


BN = BNMLP()
CONV = ConvBN()
INTERRUPTS = Interrupts()
BW_RAISES = BackwardRaises()


def prime(model: nn.Module) -> dict[str, torch.Tensor]:
    """Eval mode and a .grad on the first parameter: the state grads must put back."""
    model.eval()
    first = next(model.parameters())
    first.grad = torch.full_like(first, 7.0)
    return {"first": first.grad}


def assert_as_found(model: nn.Module, before: dict[str, Any], primed: dict[str, Any]) -> None:
    assert_no_hooks(model, NO_GLOBAL)
    assert_same_state(before, state_snapshot(model))
    assert next(model.parameters()).grad is primed["first"]  # the very same tensor
    assert backward_hook_forward() is HOOK_FORWARD
    assert not model.training


@pytest.mark.parametrize("spec", ["BN", "CONV"])
def test_state_restored_after_success(spec: str) -> None:
    model = globals()[spec]
    primed = prime(model)
    before = state_snapshot(model)
    for extra in ([], ["--global-hooks"], ["--per-param", "--fail-on", "nan,inf,dead"]):
        result = invoke("grads", f"{HERE}:{spec}", *extra)
        assert result.exit_code == 0, result.stderr
        assert_as_found(model, before, primed)
    assert CONV.relu.inplace is True


def test_state_restored_after_forward_raises() -> None:
    primed = prime(BN)
    before = state_snapshot(BN)
    result = invoke("grads", f"{HERE}:BN", "-b", "1")  # batch norm on one sample, train mode
    assert result.exit_code == 4
    assert_as_found(BN, before, primed)


def test_state_restored_after_backward_raises() -> None:
    primed = prime(BW_RAISES)
    before = state_snapshot(BW_RAISES)
    result = invoke("grads", f"{HERE}:BW_RAISES")
    assert result.exit_code == 4 and "boom in backward" in result.stderr
    assert_as_found(BW_RAISES, before, primed)


def test_state_restored_after_keyboard_interrupt_in_cli() -> None:
    primed = prime(INTERRUPTS)
    before = state_snapshot(INTERRUPTS)
    result = invoke("grads", f"{HERE}:INTERRUPTS")
    assert result.exit_code == 130
    assert "interrupted" in result.stderr
    assert_as_found(INTERRUPTS, before, primed)


class InterruptingProbe(GradProbe):
    """Presses Ctrl-C from inside autograd, in the middle of the backward pass."""

    def __init__(self) -> None:
        super().__init__(ALL_KINDS)
        self.seen: list[str] = []

    def on_backward(self, frame: Any, module: nn.Module, grad_input: Any, grad_output: Any) -> None:
        super().on_backward(frame, module, grad_input, grad_output)
        self.seen.append(frame.name)
        if frame.name == "net.4":
            raise KeyboardInterrupt


@pytest.mark.parametrize("global_hooks", [False, True])
def test_session_restores_after_keyboard_interrupt_mid_backward(global_hooks: bool) -> None:
    model = BNMLP()
    primed = prime(model)
    before = state_snapshot(model)
    probe = InterruptingProbe()
    x = model.example_input_array
    with (
        pytest.raises(KeyboardInterrupt),
        HookSession(model, [probe], mode=Mode.TRAIN, global_hooks=global_hooks) as session,
    ):
        loss = session.forward((x,)).sum()
        # the run really changed what must be restored
        assert model.training
        assert not torch.equal(
            model.net[1].running_mean, before["buffers"]["net.1.running_mean"][1]
        )
        assert next(model.parameters()).grad is None
        assert all(p._backward_hooks for p in model.parameters())  # tensor hooks on params
        assert (global_hook_counts() != NO_GLOBAL) if global_hooks else hook_count(model) > 0
        assert HOOK_FORWARD is None or backward_hook_forward() is not HOOK_FORWARD
        session.backward(loss)
    assert probe.seen[-1] == "net.4"
    assert_as_found(model, before, primed)


def test_session_restores_after_keyboard_interrupt_in_forward() -> None:
    model = Interrupts()
    primed = prime(model)
    before = state_snapshot(model)
    with (
        pytest.raises(KeyboardInterrupt),
        HookSession(model, [GradProbe(ALL_KINDS)], mode=Mode.TRAIN) as session,
    ):
        session.forward((model.example_input_array,))
    assert_as_found(model, before, primed)


# -- property: random small MLPs ------------------------------------------------------------
@st.composite
def mlp_specs(draw: Any) -> dict[str, Any]:
    widths = draw(st.lists(st.integers(1, 6), min_size=2, max_size=4))
    bias = draw(st.booleans())
    assume(len(widths) > 2 or bias)  # one frozen weight must leave something to train
    return {
        "widths": widths,
        "bias": bias,
        "bn": draw(st.booleans()),
        "freeze": draw(st.integers(0, len(widths) - 2)),
        "batch": draw(st.integers(2, 4)),
        "seed": draw(st.integers(0, 2**16)),
    }


def build_mlp(spec: dict[str, Any]) -> nn.Sequential:
    torch.manual_seed(spec["seed"])
    layers: list[nn.Module] = []
    w = spec["widths"]
    for i in range(len(w) - 1):
        layers.append(nn.Linear(w[i], w[i + 1], bias=spec["bias"]))
        if spec["bn"]:
            layers.append(nn.BatchNorm1d(w[i + 1]))
        layers.append(nn.Tanh())
    model = nn.Sequential(*layers)
    frozen = [m for m in model if isinstance(m, nn.Linear)][spec["freeze"]]
    frozen.weight.requires_grad_(False)
    return model


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mlp_specs())
def test_random_mlps_match_autograd_and_are_restored(spec: dict[str, Any]) -> None:
    model = build_mlp(spec)
    x = torch.randn(spec["batch"], spec["widths"][0], generator=torch.Generator().manual_seed(1))
    model.eval()
    before = state_snapshot(model)
    probe = GradProbe(ALL_KINDS)
    with HookSession(model, [probe], mode=Mode.TRAIN) as session:
        session.backward(session.forward((x,)).sum())
        session.finish()
    assert_no_hooks(model, NO_GLOBAL)
    assert_same_state(before, state_snapshot(model))
    found = probe.findings
    assert found is not None
    # by hand, on a copy
    ref = build_mlp(spec)
    ref.train()
    ref(x).sum().backward()
    named = dict(ref.named_parameters())
    grads = [p.grad for p in named.values() if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads) if grads else None
    if total is None:
        assert found.total_grad_norm is None
    else:
        assert found.total_grad_norm == pytest.approx(float(total), rel=1e-5, abs=1e-9)
    for pg in found.params:
        p = named[pg.name]
        assert pg.requires_grad == p.requires_grad
        if p.grad is None:
            assert pg.grad_norm is None
        else:
            assert pg.grad_norm == pytest.approx(float(p.grad.double().norm()), rel=1e-5, abs=1e-9)
