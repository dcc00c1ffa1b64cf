"""The grad norm before clipping: torch's clipping functions, observed.

``clip_grad_norm_`` (and ``clip_grad_value_``, ``clip_grads_with_norm_``, the
deprecated ``clip_grad_norm``) are replaced, in ``torch.nn.utils`` and
``torch.nn.utils.clip_grad``, by wrappers that call ``before(params)`` with the
parameters about to be clipped, then the original with the same arguments (a
generator of parameters is read into a list first: the original gets the same
tensors). Lightning, accelerate, Hugging Face ``Trainer`` and nanoGPT call these by
attribute (``torch.nn.utils.clip_grad_norm_(...)``), and a script's ``from
torch.nn.utils import clip_grad_norm_`` runs after the monitor is armed (at ``import
torch``), so each gets the wrapper. FSDP1's own ``FullyShardedDataParallel.clip_grad_norm_``
does not go through them.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import torch

_NAMES = ("clip_grad_norm_", "clip_grad_value_", "clip_grads_with_norm_", "clip_grad_norm")
_MODULES = ("torch.nn.utils", "torch.nn.utils.clip_grad")


class ClipWatch:
    """The wrappers, installed and removed as one."""

    def __init__(self, before: Callable[[list[torch.Tensor]], None]) -> None:
        self.before = before
        self._saved: list[tuple[Any, str, Any, Any]] = []  # (module, name, real, wrapper)

    def install(self) -> ClipWatch:
        wrappers: dict[int, Any] = {}
        for modname in _MODULES:
            module = sys.modules.get(modname)
            if module is None:
                continue
            for name in _NAMES:
                real = getattr(module, name, None)
                if real is None:  # another monitor's wrapper is wrapped in turn (nested)
                    continue
                wrapper = wrappers.get(id(real))
                if wrapper is None:
                    wrapper = wrappers[id(real)] = self._wrap(real)
                setattr(module, name, wrapper)
                self._saved.append((module, name, real, wrapper))
        return self

    def uninstall(self) -> None:
        for module, name, real, wrapper in self._saved:
            if getattr(module, name, None) is wrapper:
                setattr(module, name, real)
        self._saved.clear()

    def _wrap(self, real: Callable[..., Any]) -> Callable[..., Any]:
        before = self.before

        @functools.wraps(real)
        def clip(parameters: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(parameters, torch.Tensor):
                before([parameters])
            else:
                parameters = list(parameters)
                before(parameters)
            return real(parameters, *args, **kwargs)

        return clip
