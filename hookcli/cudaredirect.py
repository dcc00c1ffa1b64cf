"""CUDA placements in a model's construction code, redirected to the run's device.

Published code often writes ``torch.zeros(...).cuda()``, ``nn.Linear(..., device="cuda")``
or ``self.cuda()`` in ``__init__``; on a machine without CUDA (or with ``--device cpu``)
torch stops it with "Found no NVIDIA driver", naming no line of the model. While the
model is built on a device that is not CUDA, such calls make their tensors on the run's
device instead, and one note names the model's first such line (``redirecting_cuda``).
With ``--device cuda`` nothing is redirected. (On meta, ``hookcli.metavalues`` sends
every placement to meta already.)
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode


def _is_cuda(dev: Any) -> bool:
    if not isinstance(dev, (str, torch.device)):
        return False
    try:
        return torch.device(dev).type == "cuda"
    except (RuntimeError, TypeError):
        return False


class _CudaRedirect(TorchFunctionMode):
    """A factory's ``device="cuda"``, ``Tensor.to("cuda")`` and ``Tensor.cuda()`` (so
    ``Module.cuda()`` and ``Module.to("cuda")`` too) made on ``target`` instead."""

    def __init__(self, target: torch.device) -> None:
        super().__init__()
        self.target = target
        self.first: str | None = None  # the model's first line that asked for cuda

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        # the common case first: nothing asks for cuda (every op of a build passes here)
        if func is torch.Tensor.cuda and args:
            self._seen()
            keep = {k: v for k, v in kwargs.items() if k in ("non_blocking", "memory_format")}
            return args[0].to(self.target, **keep)
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs = {**kwargs, "device": self.target}
            kwargs.pop("pin_memory", None)  # pinning needs CUDA
            self._seen()
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], self.target, *args[2:])
            self._seen()
        return func(*args, **kwargs)

    def _seen(self) -> None:
        if self.first is None:
            self.first = _model_line()


def _model_line() -> str:
    """``path:line`` of the innermost frame that is neither torch's, the standard
    library's nor hookcli's: the model's line that asked (``?`` when there is none)."""
    import os

    from hookcli.failure import _roots, _shown, _skipped

    skip, own = _roots()
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        real = os.path.realpath(path) if not path.startswith("<") else path
        if not (path.startswith("<") or real.startswith(own) or _skipped(real, skip)):
            return f"{_shown(real, frame.f_globals.get('__name__'))}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return "?"


def wanted(device: torch.device | None) -> torch.device | None:
    """Where CUDA placements go while building for ``device``: the device itself unless
    it is CUDA or meta; for no device, the CPU where CUDA is not available; else None."""
    if device is None:
        return None if torch.cuda.is_available() else torch.device("cpu")
    if device.type in ("cuda", "meta"):
        return None
    return device


@contextlib.contextmanager
def redirecting_cuda(device: torch.device | None) -> Iterator[None]:
    """Build with CUDA placements sent to ``device`` (see the module docstring); after a
    build that asked, one note on stderr."""
    target = wanted(device)
    if target is None:
        yield
        return
    mode = _CudaRedirect(target)
    try:
        with mode:
            yield
    finally:
        if mode.first is not None:
            print(
                f"hookcli: note: {mode.first} asks for cuda; built on {target}",
                file=sys.stderr,
                flush=True,
            )
