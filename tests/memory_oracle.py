"""The memory oracle: the real peak of one training step, measured at the allocator.

Independent of hookcli's estimator (``hookcli.memory``): it shares no code with it and
counts what the allocator hands out, not tensors.

- On the CPU: ``torch.profiler`` with ``profile_memory=True`` records one ``[memory]``
  event per allocation and per free of the CPU allocator (tensors, and the buffers
  oneDNN and other kernels take from it); ``measure_peak`` adds them up in time order.
- On CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, the
  caching allocator's own high-water mark (block sizes rounded to 512 bytes).

Both answer the same figure: the bytes alive before the step that the caller names
(``held``: parameters, buffers, gradients, optimizer state, inputs; each storage once)
plus the highest rise of allocated bytes over the step. What else the process held before
(a cuBLAS workspace, other tests' tensors) is in neither term.

``steady_step`` builds the step the way a training loop writes it, in plain PyTorch:
forward (under autocast with ``amp``; ``torch.utils.checkpoint`` around every module of
the class ``checkpoint``), the loss, backward, ``optimizer.step()`` with the state made
by one step before, ``optimizer.zero_grad(set_to_none=...)``. Validated on hand-counted
toys in tests/test_memory_oracle.py.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

OPTIMIZERS = ("adam", "adamw", "sgd", "sgd-momentum", "adafactor", "none")


@dataclass(frozen=True)
class Measured:
    """One measured step: ``peak_bytes = held_bytes + rise_bytes``."""

    peak_bytes: int
    held_bytes: int  # the storages named as alive before the step, each once
    rise_bytes: int  # the highest rise of allocated bytes above the step's start
    end_bytes: int  # allocated at the end minus at the start
    device: str
    method: str  # "profiler" or "cuda-max-allocated"


def held_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of the distinct storages under ``tensors`` (None and non-tensors skipped)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.layout is torch.strided:
            st = t.untyped_storage()
            seen[st.data_ptr() if st.device.type != "meta" else id(st)] = st.nbytes()
    return sum(seen.values())


def _profiler_rise(step: Callable[[], Any]) -> tuple[int, int]:
    """(highest rise, end - start) of the CPU allocator's bytes over ``step``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = [
        e
        for e in prof.profiler.kineto_results.events()  # type: ignore[union-attr]
        if e.name() == "[memory]" and e.device_type() == torch._C._autograd.DeviceType.CPU
    ]
    events.sort(key=lambda e: e.start_ns())
    live = rise = 0
    for e in events:
        live += e.nbytes()
        rise = max(rise, live)
    return rise, live


class CudaStats:
    """What the CUDA path reads: ``torch.cuda``'s allocator counters (a test passes a fake)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def allocated(self) -> int:
        return int(torch.cuda.memory_allocated(self.device))

    def max_allocated(self) -> int:
        return int(torch.cuda.max_memory_allocated(self.device))


def _cuda_rise(step: Callable[[], Any], stats: Any) -> tuple[int, int]:
    stats.synchronize()
    start = stats.allocated()
    stats.reset_peak()
    step()
    stats.synchronize()
    return stats.max_allocated() - start, stats.allocated() - start


def measure_peak(
    step: Callable[[], Any],
    held: Iterable[Any],
    device: str | torch.device = "cpu",
    cuda_stats: Any = None,
) -> Measured:
    """Run ``step`` once and measure its peak at the allocator (see the module's doc)."""
    dev = torch.device(device)
    base = held_bytes(held)
    if dev.type == "cuda" or cuda_stats is not None:
        stats = cuda_stats if cuda_stats is not None else CudaStats(dev)
        rise, end = _cuda_rise(step, stats)
        method = "cuda-max-allocated"
    elif dev.type == "cpu":
        rise, end = _profiler_rise(step)
        method = "profiler"
    else:
        raise ValueError(f"no allocator oracle for device {dev.type}")
    return Measured(base + rise, base, rise, end, str(dev), method)


# -- the training step, as a plain training loop writes it ------------------------------------


def make_optimizer(
    name: str, params: list[nn.Parameter], foreach: bool | None = None
) -> torch.optim.Optimizer | None:
    """torch's optimizer for a ``--optimizer`` name; ``foreach=None``: torch's default."""
    if name == "none":
        return None
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4, foreach=foreach)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, foreach=foreach)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-4, foreach=foreach)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-4, momentum=0.9, foreach=foreach)
    if name == "adafactor":
        return torch.optim.Adafactor(params, lr=1e-4, foreach=foreach)  # type: ignore[attr-defined]
    raise ValueError(f"unknown optimizer {name}")


@contextlib.contextmanager
def checkpointed(model: nn.Module, class_name: str | None) -> Iterator[int]:
    """``torch.utils.checkpoint`` (non-reentrant) around every module of ``class_name``;
    yields how many; the forwards are put back afterwards."""
    if not class_name:
        yield 0
        return
    from torch.utils.checkpoint import checkpoint

    wrapped = [m for m in model.modules() if type(m).__name__ == class_name]

    def wrap(forward: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(forward)
        def run(*args: Any, **kwargs: Any) -> Any:
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)

        return run

    for m in wrapped:
        m.forward = wrap(m.forward)  # type: ignore[method-assign]
    try:
        yield len(wrapped)
    finally:
        for m in wrapped:
            del m.forward


def _loss(output: Any) -> torch.Tensor:
    """``--loss sum``: the sum of every floating output tensor that requires grad, each in
    its own dtype."""
    if isinstance(output, torch.Tensor):
        return output.sum()
    if isinstance(output, dict):
        output = list(output.values())
    if hasattr(output, "to_tuple"):
        output = output.to_tuple()
    parts = [
        _loss(o) for o in output if isinstance(o, (torch.Tensor, tuple, list, dict)) and _has(o)
    ]
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    return total


def _has(o: Any) -> bool:
    if isinstance(o, torch.Tensor):
        return o.is_floating_point() and o.requires_grad
    if isinstance(o, dict):
        o = list(o.values())
    return any(_has(x) for x in o)


@dataclass
class Step:
    """A steady-state training step: ``run()`` it, measure with ``held()`` before."""

    model: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    optimizer: torch.optim.Optimizer | None
    amp: torch.dtype | None
    set_to_none: bool
    checkpoint: str | None
    loss: Callable[[Any], torch.Tensor] = _loss

    def run(self) -> None:
        device = next(self.model.parameters()).device.type
        with checkpointed(self.model, self.checkpoint):
            ctx = (
                torch.autocast(device, dtype=self.amp)
                if self.amp is not None
                else contextlib.nullcontext()
            )
            with ctx:
                loss = self.loss(self.model(*self.args, **self.kwargs))
            loss.backward()
            del loss
        if self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=self.set_to_none)
        else:
            for p in self.model.parameters():
                if self.set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()

    def held(self) -> list[Any]:
        """The tensors alive before a step: params, buffers, grads, optimizer state, inputs."""
        out: list[Any] = list(self.model.parameters()) + list(self.model.buffers())
        out += [p.grad for p in self.model.parameters()]
        if self.optimizer is not None:
            for state in self.optimizer.state.values():
                out += [v for v in state.values() if isinstance(v, torch.Tensor)]
        out += [a for a in self.args if isinstance(a, torch.Tensor)]
        out += [v for v in self.kwargs.values() if isinstance(v, torch.Tensor)]
        return out


def steady_step(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    *,
    optimizer: str = "adam",
    amp: torch.dtype | None = None,
    zero_grad: str = "none",
    checkpoint: str | None = None,
    loss: Callable[[Any], torch.Tensor] | None = None,
    foreach: bool | None = None,
) -> Step:
    """A step whose optimizer state exists (one step run first, in train mode)."""
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    step = Step(
        model,
        args,
        dict(kwargs or {}),
        make_optimizer(optimizer, params, foreach),
        amp,
        zero_grad == "none",
        checkpoint,
        loss or _loss,
    )
    step.run()
    return step


def measure_step(step: Step, cuda_stats: Any = None) -> Measured:
    """The allocator's peak of one more run of ``step``."""
    device = next(step.model.parameters()).device
    return measure_peak(step.run, step.held(), device, cuda_stats)


def measure_inference(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None
) -> Measured:
    """The allocator's peak of one eval, no_grad forward (the output dropped at once)."""
    model.eval()
    kwargs = dict(kwargs or {})

    def run() -> None:
        with torch.no_grad():
            model(*args, **kwargs)

    held: list[Any] = list(model.parameters()) + list(model.buffers())
    held += [a for a in args if isinstance(a, torch.Tensor)]
    held += [v for v in kwargs.values() if isinstance(v, torch.Tensor)]
    device = next(model.parameters()).device
    run()  # first-call caches (oneDNN primitives) out of the measurement
    return measure_peak(run, held, device)
