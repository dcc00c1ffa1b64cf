"""``FeatureProbe``: copies of the outputs of the modules ``--layer`` selects.

Only the selected modules get hooks (``HookSession(only=...)``); every other module
runs untouched. A capture is keyed by the module's qualified name, ``name#N``
for its N-th repeated call, and ``[i]`` / ``[key]`` / ``.field`` suffixes when
the output holds several tensors (``lstm[0]``, ``lstm[1][0]``, ``heads[logits]``).
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hookcli.checks import layer_label
from hookcli.errors import UsageError
from hookcli.session import CallRecord, Frame, HookSession, Probe

ROOT_ALIASES = ("", "(root)")


def named_tensors(
    obj: Any, prefix: str = "", _depth: int = 0
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(suffix, tensor)`` for every tensor in ``obj``, in ``iter_tensors`` order."""
    if _depth > 32 or obj is None:
        return
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            yield from named_tensors(value, f"{prefix}[{key}]", _depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from named_tensors(value, f"{prefix}[{i}]", _depth + 1)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from named_tensors(getattr(obj, f.name, None), f"{prefix}.{f.name}", _depth + 1)
    elif (
        hasattr(obj, "__dict__")
        and not isinstance(obj, (nn.Module, type, str, bytes))
        and not callable(obj)
        and _depth < 4
    ):
        for key, value in vars(obj).items():
            yield from named_tensors(value, f"{prefix}.{key}", _depth + 1)


def _matches(name: str, pattern: str) -> bool:
    if pattern in ROOT_ALIASES:
        return name == ""
    return name == pattern or fnmatch.fnmatchcase(name, pattern)


def select_modules(model: nn.Module, patterns: Sequence[str]) -> list[tuple[str, nn.Module]]:
    """The ``(name, module)`` pairs any pattern matches, in ``named_modules()`` order.

    A pattern is a qualified name (``layer4``; ``""`` or ``(root)`` for the root)
    or a glob (``layer3.*.conv2``). A pattern that matches nothing is exit 2,
    naming the closest module names.
    """
    named = list(model.named_modules())
    names = [n for n, _ in named]
    for pattern in patterns:
        if not any(_matches(n, pattern) for n in names):
            raise UsageError(f"--layer {pattern!r} matches no module; {_suggest(pattern, names)}")
    return [(n, m) for n, m in named if any(_matches(n, p) for p in patterns)]


def _suggest(pattern: str, names: Sequence[str]) -> str:
    real = [n for n in names if n]
    stripped = pattern.replace("*", "").replace("?", "").strip(".")
    close = difflib.get_close_matches(pattern, real, n=6, cutoff=0.5)
    close += [n for n in real if stripped and stripped in n and n not in close]
    close = close[:6]
    if close:
        return "close names: " + ", ".join(close)
    shown = ", ".join(real[:8]) + (", ..." if len(real) > 8 else "")
    return f"module names look like: {shown} (hookcli inspect MODEL lists them all)"


@dataclass(frozen=True)
class Feature:
    """One captured tensor (a copy on the CPU)."""

    key: str
    index: int  # the call it came from
    tensor: torch.Tensor


class FeatureProbe(Probe):
    """Copies every tensor in the selected modules' outputs; moved to the CPU at ``finish``."""

    def __init__(self) -> None:
        self._pending: list[tuple[str, int, torch.Tensor]] = []
        self.features: list[Feature] = []

    def on_forward(
        self, frame: Frame, module: nn.Module, args: Any, kwargs: Any, output: Any
    ) -> None:
        if frame.failed:
            return
        base = layer_label(frame.name, frame.call)
        # A clone: a later in-place op (ReLU(inplace=True)) must not change the copy.
        for suffix, t in named_tensors(output):
            self._pending.append((base + suffix, frame.index, t.detach().clone()))

    def finish(self, session: HookSession) -> None:
        # In the order the calls began (as the rows), not the order they returned.
        ordered = sorted(self._pending, key=lambda item: item[1])
        self.features = [Feature(key, index, t.cpu()) for key, index, t in ordered]
        self._pending.clear()

    def tensors(self) -> dict[str, torch.Tensor]:
        """key -> tensor, in capture order."""
        return {f.key: f.tensor for f in self.features}

    def columns(self, record: CallRecord) -> dict[str, Any]:
        mine = [f for f in self.features if f.index == record.index]
        return {
            "keys": [f.key for f in mine],
            "dtypes": [str(f.tensor.dtype).removeprefix("torch.") for f in mine],
            "bytes": sum(f.tensor.numel() * f.tensor.element_size() for f in mine),
        }
