"""What ``hookcli watch`` tells the monitor in each process, through the environment.

No torch here: the parent (the CLI) and the bootstrap both read it.

- ``HOOKCLI_WATCH_CONFIG``: the options as JSON (``WatchConfig``); its presence is what
  turns the monitor on in a process that imports torch.
- ``HOOKCLI_WATCH=0``: no monitor in this process (nor in the processes it starts).
- ``HOOKCLI_WATCH_PATH``: the folder hookcli is imported from, for a Python that
  cannot import it by itself (another venv).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

ENV_CONFIG = "HOOKCLI_WATCH_CONFIG"
ENV_OFF = "HOOKCLI_WATCH"
ENV_PATH = "HOOKCLI_WATCH_PATH"

DEFAULT_EVERY = 10
ARMED = ".armed"  # in the --out folder: one line (a pid) per process that armed the monitor
STEPS_SCHEMA = "hookcli.steps/1"  # the "schema" of each steps.jsonl start record

# --fail-on names and --stop-on names
FAIL_ON = ("nan", "inf", "dead", "vanishing", "exploding", "unused")
STOP_ON = ("nan", "inf")

# The thresholds a check uses when --fail-on names it and no option gives one.
DEFAULT_MIN_GRAD_NORM = 1e-8  # vanishing: a module's grad_norm below it
DEFAULT_MAX_GRAD_NORM = 1e3  # exploding: a module's grad_norm above it
DEFAULT_MAX_UPDATE_RATIO = 1.0  # exploding: an update as large as the weights


@dataclass(frozen=True)
class WatchConfig:
    """The monitor's options: figures every ``every`` steps, exact NaN origin, stops."""

    every: int = DEFAULT_EVERY
    nan_origin: bool = False
    stop_on: tuple[str, ...] = ()
    out: str | None = None  # the folder of the steps files (None: in memory only)
    parent: int | None = None  # the pid of ``hookcli watch``, told when a stop is due
    t0: float | None = None  # time.time() when the run began
    extra: dict[str, Any] = field(default_factory=dict)

    def to_env(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @staticmethod
    def from_env(text: str | None = None) -> WatchConfig:
        raw = json.loads(text if text is not None else os.environ.get(ENV_CONFIG, "{}"))
        return WatchConfig(
            every=max(1, int(raw.get("every") or DEFAULT_EVERY)),
            nan_origin=bool(raw.get("nan_origin")),
            stop_on=tuple(raw.get("stop_on") or ()),
            out=raw.get("out"),
            parent=raw.get("parent"),
            t0=raw.get("t0"),
            extra=dict(raw.get("extra") or {}),
        )


def logged(step: int, every: int) -> bool:
    """Whether ``step`` (from 1) carries the per-module figures: the first, then every Nth."""
    return step == 1 or step % every == 0


@dataclass(frozen=True)
class WatchGates:
    """The gates a run asked for (``fail_on`` in the order given)."""

    fail_on: tuple[str, ...] = ()
    min_grad_norm: float | None = None
    max_grad_norm: float | None = None
    max_update_ratio: float | None = None

    @property
    def checks(self) -> tuple[str, ...]:
        """``fail_on``, plus the checks a threshold given alone asks for."""
        out = list(self.fail_on)
        if self.min_grad_norm is not None and "vanishing" not in out:
            out.append("vanishing")
        if (
            self.max_grad_norm is not None or self.max_update_ratio is not None
        ) and "exploding" not in out:
            out.append("exploding")
        return tuple(out)

    def thresholds(self) -> dict[str, float]:
        wanted = self.checks
        out = {}
        if "vanishing" in wanted:
            out["min_grad_norm"] = (
                self.min_grad_norm if self.min_grad_norm is not None else DEFAULT_MIN_GRAD_NORM
            )
        if "exploding" in wanted:
            out["max_grad_norm"] = (
                self.max_grad_norm if self.max_grad_norm is not None else DEFAULT_MAX_GRAD_NORM
            )
            out["max_update_ratio"] = (
                self.max_update_ratio
                if self.max_update_ratio is not None
                else DEFAULT_MAX_UPDATE_RATIO
            )
        return out
