"""What a ``profile`` run is asked (``ProfilePlan``) and what its passes measured
(``Measured``): the records the runner, the renderer and the trace writer share."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hookcli.options import DEFAULT_LOSS, Loss
from hookcli.profile.figures import CallTree, Timings

if TYPE_CHECKING:
    from hookcli.cost.probe import CostProbe
    from hookcli.profile.clocks import Clock
    from hookcli.profile.hooks import TimingHooks


class SortKey(str, enum.Enum):
    """The table order (``--sort``): most first."""

    SELF = "self"
    INCLUSIVE = "inclusive"
    CALLS = "calls"
    FLOPS = "flops"


@dataclass(frozen=True)
class ProfilePlan:
    """The options of ``profile``, checked."""

    backward: bool = False
    warmup: int = 2
    repeat: int = 10
    sort: SortKey = SortKey.SELF
    max_ms: tuple[tuple[str, float], ...] = ()
    sync: bool = False
    depth: int | None = None
    trace_out: Path | None = None
    plot: Path | None = None
    top: int = 20
    progress: bool = False  # a progress bar on stderr (the CLI, on a terminal)
    loss: Loss = DEFAULT_LOSS  # --loss: where --backward starts


@dataclass
class Measured:
    """Everything the passes measured (raw: the report is built from it)."""

    tree: CallTree
    probe: CostProbe
    clock: Clock
    hooks: TimingHooks | None = None
    timings: Timings | None = None
    bare_ns: tuple[int, ...] = ()
    hooked_ns: tuple[int, ...] = ()
    backward_ns: tuple[int, ...] = ()
    pass_starts: tuple[int, ...] = ()  # perf_counter_ns at each timed forward's start
    backward_starts: tuple[int, ...] = ()
    memory: list[int] | None = None  # per module slot, bytes (cuda)
