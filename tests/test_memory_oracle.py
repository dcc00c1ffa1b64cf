"""The memory oracle (tests/memory_oracle.py) against peaks counted by hand.

A two-layer Linear stack without biases, ``loss = out.sum()``: every tensor the step
allocates is known, so the peak is a sum written below, term by term. The oracle must
find it to the byte, up to the two 4-byte scalars (the loss and its gradient) and, on
CUDA, the caching allocator's 512-byte rounding of them.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from tests.memory_oracle import (
    held_bytes,
    measure_inference,
    measure_peak,
    measure_step,
    steady_step,
)

B, A, H, C = 64, 256, 1024, 128  # batch, in, hidden, out: W1 is H x A, W2 is C x H
F = 4  # float32
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _toy(device: str) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(A, H, bias=False), nn.Linear(H, C, bias=False)).to(device)
    return model, torch.randn(B, A, device=device)


def _slack(device: str) -> int:
    # the loss and its gradient: 4 bytes each, a 512-byte block each on CUDA
    return 2 * 512 if device == "cuda" else 8


PARAMS = F * (H * A + C * H)
INPUT = F * B * A


@pytest.mark.parametrize("device", DEVICES)
def test_sgd_step_set_to_none(device: str) -> None:
    model, x = _toy(device)
    got = measure_step(steady_step(model, (x,), optimizer="sgd", foreach=False))
    assert got.held_bytes == PARAMS + INPUT
    # in backward at the first layer: W2's grad, the hidden activation's grad and W1's
    # grad are alive at once (h, saved for W2's grad, was freed with W2's node)
    hand = PARAMS + INPUT + F * (C * H + B * H + H * A)
    assert 0 <= got.peak_bytes - hand <= _slack(device)
    assert got.end_bytes == 0


@pytest.mark.parametrize("device", DEVICES)
def test_sgd_step_zero_grads_kept(device: str) -> None:
    model, x = _toy(device)
    got = measure_step(steady_step(model, (x,), optimizer="sgd", zero_grad="zeros", foreach=False))
    assert got.held_bytes == 2 * PARAMS + INPUT  # the zeroed grads stay
    # the new W1 grad is made, then added into the old one: grad of h + W1's new grad
    hand = 2 * PARAMS + INPUT + F * (B * H + H * A)
    assert 0 <= got.peak_bytes - hand <= _slack(device)


@pytest.mark.parametrize("device", DEVICES)
def test_forloop_adam_holds_two_temporaries_of_the_largest_param(device: str) -> None:
    model, x = _toy(device)
    step = steady_step(model, (x,), optimizer="adam", foreach=False)
    got = measure_step(step)
    steps = held_bytes(s["step"] for s in step.optimizer.state.values())  # type: ignore[union-attr]
    assert got.held_bytes == 3 * PARAMS + INPUT + steps
    # in step(), at W1: both grads, then exp_avg_sq.sqrt() and its quotient by the bias
    # correction (each W1's size) before addcdiv_
    hand = 3 * PARAMS + INPUT + steps + PARAMS + 2 * F * H * A
    assert 0 <= got.peak_bytes - hand <= _slack(device) + 2 * 512


def test_inference_peak_is_both_activations() -> None:
    model, x = _toy("cpu")
    got = measure_inference(model, (x,))
    assert got.held_bytes == PARAMS + INPUT
    assert got.peak_bytes == PARAMS + INPUT + F * (B * H + B * C)


def test_held_bytes_counts_each_storage_once() -> None:
    w = torch.zeros(10, 10)
    assert held_bytes([w, w[0], w.t(), None, 3]) == 400


class _FakeCuda:
    """torch.cuda's counters for a step that allocates 1000 bytes, frees them, then 300."""

    def __init__(self) -> None:
        self.now, self.high = 5000, 9999
        self.calls: list[str] = []

    def synchronize(self) -> None:
        self.calls.append("sync")

    def reset_peak(self) -> None:
        self.calls.append("reset")
        self.high = self.now

    def allocated(self) -> int:
        return self.now

    def max_allocated(self) -> int:
        return self.high

    def step(self) -> None:
        self.calls.append("step")
        self.high = max(self.high, self.now + 1000)
        self.now += 300


@pytest.mark.parametrize("device", DEVICES)
def test_cuda_path_reads_the_high_water_mark_above_the_start(device: str) -> None:
    """The CUDA path with the allocator's counters faked (any machine), and for real
    on the toy where a GPU is present (test_sgd_step_* above run there too)."""
    fake = _FakeCuda()
    held = [torch.zeros(25)]
    got = measure_peak(fake.step, held, device, cuda_stats=fake)
    assert fake.calls == ["sync", "reset", "step", "sync"]
    assert (got.rise_bytes, got.end_bytes, got.peak_bytes) == (1000, 300, 1100)
    assert got.method == "cuda-max-allocated"
    if device == "cuda":
        model, x = _toy(device)
        real = measure_step(steady_step(model, (x,), optimizer="sgd", foreach=False))
        assert real.method == "cuda-max-allocated"


def test_checkpoint_drops_the_saved_hidden_activation() -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(32, 128, bias=False)  # activations outweigh the weights
            self.b = nn.Linear(128, 32, bias=False)

        def forward(self, x: Any) -> Any:
            return self.b(torch.relu(self.a(x)))

    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block(), Block(), Block())
    x = torch.randn(2048, 32)
    plain = measure_step(steady_step(model, (x,), optimizer="none"))
    ckpt = measure_step(steady_step(model, (x,), optimizer="none", checkpoint="Block"))
    assert ckpt.peak_bytes < plain.peak_bytes
    assert type(model[0]).forward is Block.forward and "forward" not in vars(model[0])
