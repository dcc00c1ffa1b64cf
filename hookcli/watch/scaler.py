"""GradScaler, observed: the loss as the script computed it, and the skipped iterations.

``GradScaler.scale(loss)`` is wrapped to remember which scaled tensor came from which
loss (the loss recorded for a step is then the one the script computed, not ``loss x
scale``), and ``GradScaler.step(optimizer)`` to tell ``skipped(optimizer)`` when it
did not call ``optimizer.step()`` (an Inf or NaN in the scaled gradients): that
iteration is recorded as a skipped one, never added into the next step. Both call the
originals with the same arguments and return what they return.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from hookcli.watch.frames import hide


class ScalerWatch:
    """The two wrappers on ``torch.amp.GradScaler`` (``torch.cuda.amp.GradScaler`` and
    ``torch.cpu.amp.GradScaler`` are its subclasses)."""

    def __init__(self, stepped: Callable[[], int], skipped: Callable[[Any], None]) -> None:
        self.stepped = stepped  # the number of optimizer pre-hooks seen so far
        self.skipped = skipped
        self.scaled: dict[int, tuple[weakref.ref[torch.Tensor], torch.Tensor]] = {}
        self._cls: Any = None
        self._real: tuple[Any, Any] | None = None

    def install(self) -> ScalerWatch:
        try:
            from torch.amp.grad_scaler import GradScaler
        except ImportError:  # a torch without it: nothing to observe
            return self
        real_scale, real_step = GradScaler.scale, GradScaler.step
        scaled = self.scaled
        watch = self

        def scale(scaler: Any, outputs: Any) -> Any:
            try:
                out = real_scale(scaler, outputs)
            except BaseException as err:
                hide(err)
                raise
            if isinstance(outputs, torch.Tensor) and isinstance(out, torch.Tensor):
                if len(scaled) > 64:
                    scaled.clear()
                scaled[id(out)] = (weakref.ref(out), outputs.detach())
            return out

        def step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            before = watch.stepped()
            try:
                out = real_step(scaler, optimizer, *args, **kwargs)
            except BaseException as err:
                hide(err)
                raise
            if watch.stepped() == before and getattr(scaler, "_enabled", True):
                watch.skipped(optimizer)
            return out

        pairs: tuple[tuple[Any, Any], ...] = ((scale, real_scale), (step, real_step))
        for wrapper, real in pairs:
            wrapper.__wrapped__ = real
            wrapper.__doc__ = real.__doc__
            wrapper.__name__ = real.__name__
            wrapper.__qualname__ = real.__qualname__
        GradScaler.scale = scale  # type: ignore[assignment,method-assign]
        GradScaler.step = step  # type: ignore[assignment,method-assign]
        self._cls, self._real = GradScaler, (real_scale, real_step)
        self._wrappers = (scale, step)
        return self

    def uninstall(self) -> None:
        if self._cls is None or self._real is None:
            return
        if self._cls.scale is self._wrappers[0]:
            self._cls.scale = self._real[0]
        if self._cls.step is self._wrappers[1]:
            self._cls.step = self._real[1]
        self._cls = None

    def unscaled(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss the script computed, when ``loss`` is a GradScaler's scaled one."""
        entry = self.scaled.pop(id(loss), None)
        if entry is not None and entry[0]() is loss:
            return entry[1]
        return loss
