"""Iterations the script discards: ``zero_grad`` after a backward, with no step between.

A loop that guards its steps (``if not torch.isfinite(gn): opt.zero_grad(); continue``)
runs the forward, the backward and the clipping of an iteration, then clears the
gradients instead of stepping. ``torch.optim.Optimizer.zero_grad`` and
``torch.nn.Module.zero_grad`` are wrapped: when a backward has run since the last step
(``pending()``, one attribute read), ``zeroing(obj)`` gets the optimizer or module first,
while the gradients are still there; then the original runs with the same arguments and
its result is returned. Gradient accumulation (several backwards, one step, then
``zero_grad``) never calls it between its backwards.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from hookcli.watch.frames import hide


class ZeroGradWatch:
    """The two wrappers, installed and removed as one."""

    def __init__(self, pending: Callable[[], bool], zeroing: Callable[[Any], None]) -> None:
        self.pending = pending
        self.zeroing = zeroing
        self._saved: list[tuple[Any, Any, Any]] = []  # (class, real, wrapper)

    def install(self) -> ZeroGradWatch:
        for cls in (torch.optim.Optimizer, torch.nn.Module):
            real = cls.__dict__.get("zero_grad")
            if real is None:
                continue
            wrapper = self._wrap(real)
            cls.zero_grad = wrapper  # type: ignore[method-assign]
            self._saved.append((cls, real, wrapper))
        return self

    def uninstall(self) -> None:
        for cls, real, wrapper in self._saved:
            if cls.__dict__.get("zero_grad") is wrapper:
                cls.zero_grad = real
        self._saved.clear()

    def _wrap(self, real: Callable[..., Any]) -> Callable[..., Any]:
        pending, zeroing = self.pending, self.zeroing

        @functools.wraps(real)
        def zero_grad(obj: Any, *args: Any, **kwargs: Any) -> Any:
            if pending():
                zeroing(obj)
            try:
                return real(obj, *args, **kwargs)
            except BaseException as err:
                hide(err)
                raise

        return zero_grad
