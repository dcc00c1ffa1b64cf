"""The clocks the timing hooks read.

- CPU: ``time.perf_counter_ns`` in each hook.
- CUDA (default): a CUDA event recorded in each hook, read after the pass. The
  figure is the GPU time between the two points of the stream; the hooks never
  stall the GPU, so the run keeps its asynchronous overlap, and a module whose
  kernels are queued behind earlier work is still charged only for its own span of
  the stream.
- ``--sync`` (CUDA, MPS; MPS always): ``synchronize()`` then ``perf_counter_ns`` in
  each hook. Each span is then the wall time of the module with its kernels
  finished, including the CPU's launch overhead, which events miss; the price is a
  stall per hook, so the whole pass runs slower and loses CPU/GPU overlap.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PERF_COUNTER = "perf_counter_ns"
CUDA_EVENTS = "cuda-events"
SYNC = "synchronize+perf_counter_ns"


def _nothing() -> None:
    return None


@dataclass(frozen=True)
class Clock:
    """How hooks stamp a call: ``now()`` or an ``event()`` to record; ``synchronize``
    runs at pass boundaries (outside every timed span)."""

    name: str
    now: Callable[[], int] | None = None
    event: Callable[[], Any] | None = None
    synchronize: Callable[[], None] = _nothing

    @property
    def uses_events(self) -> bool:
        return self.event is not None


def synced(synchronize: Callable[[], None]) -> Callable[[], int]:
    """A ``now()`` that waits for the device first."""
    counter = time.perf_counter_ns

    def now() -> int:
        synchronize()
        return counter()

    return now


def make_clock(device: str, sync: bool = False) -> Clock:
    """The clock for a device: perf_counter on cpu, events (or --sync) on cuda."""
    import torch

    kind = device.split(":")[0]
    if kind == "cuda":
        dev = torch.device(device)

        def cuda_sync() -> None:
            torch.cuda.synchronize(dev)

        if sync:
            return Clock(SYNC, now=synced(cuda_sync), synchronize=cuda_sync)

        def event() -> Any:
            return torch.cuda.Event(enable_timing=True)

        return Clock(CUDA_EVENTS, event=event, synchronize=cuda_sync)
    if kind == "mps":
        mps_sync = torch.mps.synchronize
        return Clock(SYNC, now=synced(mps_sync), synchronize=mps_sync)
    return Clock(PERF_COUNTER, now=time.perf_counter_ns)
