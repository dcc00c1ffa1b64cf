"""The Python twin of ``hookcli watch``: ``with hookcli.watch(model) as w: ...``.

The same monitor as the command's, restricted to one model (and optimizer), keeping
its records in memory; ``w.report()`` is the same ``watch`` Report.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from hookcli.errors import UsageError
from hookcli.report import Report

if TYPE_CHECKING:
    from torch import nn

    from hookcli.watch.monitor import Monitor


class Watch:
    """A context manager: the monitor's hooks while the block runs, removed after it
    (also when it raises). ``records`` are the steps-file lines; ``report()`` the
    Report."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: Any = None,
        every: int = 10,
        *,
        nan_origin: bool = False,
        stop_on: str | tuple[str, ...] | None = None,
        fail_on: str | tuple[str, ...] | None = None,
        min_grad_norm: float | None = None,
        max_grad_norm: float | None = None,
        max_update_ratio: float | None = None,
    ) -> None:
        from torch import nn

        from hookcli.cliopts import parse_fail_on
        from hookcli.validate import check_number
        from hookcli.watch.config import FAIL_ON, STOP_ON, WatchConfig, WatchGates

        if not isinstance(model, nn.Module):
            raise TypeError(
                f"hookcli.watch() takes the nn.Module being trained, got {type(model).__name__}"
            )
        if optimizer is not None and not hasattr(optimizer, "param_groups"):
            raise TypeError(
                "hookcli.watch(model, optimizer): optimizer must be a torch.optim.Optimizer "
                f"or None, got {type(optimizer).__name__}"
            )
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise UsageError(f"every must be an integer >= 1, got {every!r}")
        stops = _names(stop_on)
        if any(s not in STOP_ON for s in stops):
            raise UsageError(f"stop_on takes {', '.join(STOP_ON)}, got {stop_on!r}")
        self.model = model
        self.optimizer = optimizer
        # as the options are checked: a NaN, infinite or negative threshold is a gate
        # that could never fail (UsageError, as hookcli.grads and hookcli.ablate raise)
        self.gates = WatchGates(
            fail_on=parse_fail_on(",".join(_names(fail_on)), FAIL_ON),
            min_grad_norm=check_number(min_grad_norm, "min_grad_norm"),
            max_grad_norm=check_number(max_grad_norm, "max_grad_norm"),
            max_update_ratio=check_number(max_update_ratio, "max_update_ratio"),
        )
        self.config = WatchConfig(every=every, nan_origin=nan_origin, stop_on=stops, t0=time.time())
        self._monitor: Monitor | None = None
        self.records: list[dict[str, Any]] = []

    def __enter__(self) -> Watch:
        from hookcli.watch.monitor import MemorySink, Monitor

        if self._monitor is not None:
            raise UsageError("this hookcli.watch(...) is already in use; make a new one")
        sink = MemorySink()
        self.records = sink.records
        self._monitor = Monitor(
            self.config, sink, model=self.model, optimizer=self.optimizer
        ).install()
        return self

    def __exit__(self, kind: object, value: BaseException | None, tb: object) -> None:
        if value is not None:  # the user's error, without the monitor's frames
            from hookcli.watch.frames import strip

            strip(value)
        monitor = self._monitor
        if monitor is not None:
            try:
                monitor.finish()
            finally:
                monitor.uninstall()

    def report(self) -> Report:
        """The ``watch`` Report of what was recorded so far."""
        from hookcli.watch.checks import gate_results
        from hookcli.watch.merge import read_records
        from hookcli.watch.summary import build_report

        processes = read_records(self.records)
        # nothing watched is never a pass, as in hookcli watch
        checks = gate_results(self.gates, self.config.stop_on, processes, self._unwatched)
        settings = {
            "every": self.config.every,
            "nan_origin": self.config.nan_origin,
            "fail_on": list(self.gates.checks),
            "thresholds": self.gates.thresholds(),
            "stop_on": list(self.config.stop_on),
        }
        spec = f"hookcli.watch({type(self.model).__name__})"
        return build_report(processes, checks, settings, spec)

    def _unwatched(self) -> str:
        """Why the block recorded no step, in a clause."""
        if self.optimizer is not None:
            name = type(self.optimizer).__name__
            return f"no step recorded: the block never called {name}.step()"
        return (
            "no step recorded: the block ran no optimizer.step() over the model's parameters "
            "(nor, with no optimizer, a backward)"
        )


def _names(value: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    parts = value.split(",") if isinstance(value, str) else list(value)
    return tuple(dict.fromkeys(p.strip() for p in parts if p.strip()))


def watch(
    model: nn.Module,
    optimizer: Any = None,
    every: int = 10,
    *,
    nan_origin: bool = False,
    stop_on: str | tuple[str, ...] | None = None,
    fail_on: str | tuple[str, ...] | None = None,
    min_grad_norm: float | None = None,
    max_grad_norm: float | None = None,
    max_update_ratio: float | None = None,
) -> Watch:
    """Watch ``model``'s training in this process, as ``hookcli watch`` watches a run::

        with hookcli.watch(model, optimizer, every=10, fail_on="nan") as w:
            for x, y in data:
                loss = loss_fn(model(x), y)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
        report = w.report()          # the same Report as the command's report.json
        assert report.passed

    A step is one ``optimizer.step()`` of ``optimizer`` (None: of any optimizer over
    ``model``'s parameters; with no optimizer in the process, each completed backward).
    ``every``: per-module figures on the first step and every N-th. ``nan_origin``:
    check every module's output and input gradients each step (exact NaN origin,
    slower). ``stop_on="nan"``: raise ``hookcli.watch.monitor.StopTraining`` out of
    ``optimizer.step()`` at the first NaN, before it is applied. ``fail_on`` and the
    thresholds: the report's checks (docs/watch.md), checked as the options are (a NaN,
    infinite or negative threshold raises ``UsageError``); a block that recorded no step
    fails every check asked for. The training is not changed.
    """
    return Watch(
        model,
        optimizer,
        every,
        nan_origin=nan_origin,
        stop_on=stop_on,
        fail_on=fail_on,
        min_grad_norm=min_grad_norm,
        max_grad_norm=max_grad_norm,
        max_update_ratio=max_update_ratio,
    )
