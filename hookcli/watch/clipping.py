"""The grad norm before clipping: torch's clipping functions, observed.

``clip_grad_norm_`` (and ``clip_grad_value_``, ``clip_grads_with_norm_``, the
deprecated ``clip_grad_norm``) are replaced, in ``torch.nn.utils`` and
``torch.nn.utils.clip_grad``, by wrappers that call ``before(params)`` with the
parameters about to be clipped, then the original with the same arguments (a
generator of parameters is read into a list first: the original gets the same
tensors), and hand what a norm-clipping call returned (the total norm, of the
``norm_type`` it was asked for) to ``after``: the step's ``grad_norm`` is that value,
as the script got it. Lightning, accelerate, Hugging Face ``Trainer`` and nanoGPT call these by
attribute (``torch.nn.utils.clip_grad_norm_(...)``), and a script's ``from
torch.nn.utils import clip_grad_norm_`` runs after the monitor is armed (at ``import
torch``), so each gets the wrapper.

FSDP1's own ``FullyShardedDataParallel.clip_grad_norm_`` does not go through them: it is
wrapped the same way once ``torch.distributed.fsdp`` is imported (``late``, checked at
each backward, so before a step's clipping). A call that returns the whole model's
norm where each rank holds a shard (FSDP1's method; ``clip_grad_norm_`` over FSDP2's
DTensor gradients, whose result is replicated) hands that norm to ``after``: the ranks'
local figures cannot make it.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import torch

from hookcli.watch.frames import hide

_NAMES = ("clip_grad_norm_", "clip_grad_value_", "clip_grads_with_norm_", "clip_grad_norm")
_MODULES = ("torch.nn.utils", "torch.nn.utils.clip_grad")
_NORMS = ("clip_grad_norm_", "clip_grad_norm")  # those that return the total norm
_FSDP1 = "torch.distributed.fsdp.fully_sharded_data_parallel"


class ClipWatch:
    """The wrappers, installed and removed as one."""

    def __init__(
        self,
        before: Callable[[list[torch.Tensor]], Any],
        after: Callable[[Any, torch.Tensor, float | None], None],
    ) -> None:
        self.before = before  # returns what ``after`` gets with the returned norm
        self.after = after
        self._saved: list[tuple[Any, str, Any, Any]] = []  # (module, name, real, wrapper)
        self._installed = False
        self._fsdp = False  # FSDP1's method wrapped (or looked for, once imported)

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
                    wrapper = wrappers[id(real)] = self._wrap(real, name in _NORMS)
                setattr(module, name, wrapper)
                self._saved.append((module, name, real, wrapper))
        self._installed = True
        self.late()
        return self

    def late(self) -> None:
        """FSDP1's ``clip_grad_norm_`` method wrapped, once its module is imported."""
        if self._fsdp or not self._installed:
            return
        module = sys.modules.get(_FSDP1)
        cls = getattr(module, "FullyShardedDataParallel", None)
        if cls is None:
            return
        self._fsdp = True
        real = cls.__dict__.get("clip_grad_norm_")
        if real is None:
            return
        before, after = self.before, self.after

        @functools.wraps(real)
        def clip_grad_norm_(fsdp: Any, *args: Any, **kwargs: Any) -> Any:
            seen = before(list(fsdp.parameters()))
            try:
                total = real(fsdp, *args, **kwargs)
            except BaseException as err:
                hide(err)
                raise
            after(seen, total, _norm_type(args[1:2], kwargs))
            return total

        cls.clip_grad_norm_ = clip_grad_norm_
        self._saved.append((cls, "clip_grad_norm_", real, clip_grad_norm_))

    def uninstall(self) -> None:
        for owner, name, real, wrapper in self._saved:
            if owner.__dict__.get(name) is wrapper or getattr(owner, name, None) is wrapper:
                setattr(owner, name, real)
        self._saved.clear()
        self._installed = False
        self._fsdp = False

    def _wrap(self, real: Callable[..., Any], norm: bool) -> Callable[..., Any]:
        before, after = self.before, self.after

        @functools.wraps(real)
        def clip(parameters: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(parameters, torch.Tensor):
                seen = before([parameters])
            else:
                parameters = list(parameters)
                seen = before(parameters)
            try:
                total = real(parameters, *args, **kwargs)
            except BaseException as err:
                hide(err)
                raise
            if norm and isinstance(total, torch.Tensor):
                if _replicated(total):
                    local = total.to_local()  # type: ignore[attr-defined]
                    after(seen, local, _norm_type(args[1:2], kwargs))
                elif not hasattr(total, "placements"):  # (a sharded DTensor: no)
                    after(seen, total, _norm_type(args[1:2], kwargs))
            return total

        return clip


def _norm_type(positional: tuple[Any, ...], kwargs: dict[str, Any]) -> float | None:
    """A clipping call's ``norm_type`` (after ``max_norm``): 2.0, ``inf``, 1.0, ...;
    None where it is not a number torch reads as one."""
    norm_type = positional[0] if positional else kwargs.get("norm_type", 2.0)
    try:
        return float(norm_type)
    except (TypeError, ValueError):
        return None


def _replicated(total: Any) -> bool:
    """A DTensor norm whose every placement is ``Replicate`` (FSDP2's clipping): its
    local value is the whole model's norm, read without a collective."""
    placements = getattr(total, "placements", None) or ()
    return bool(placements) and all(type(p).__name__ == "Replicate" for p in placements)
