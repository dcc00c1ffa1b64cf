"""``FeatureProbe``: copies of the outputs of the modules ``--layer`` selects.

Only the selected modules get hooks (``HookSession(only=...)``); every other module
runs untouched. A capture is keyed by the module's qualified name, ``name#N``
for its N-th repeated call, and ``[i]`` / ``[key]`` / ``.field`` suffixes when
the output holds several tensors (``lstm[0]``, ``lstm[1][0]``, ``heads[logits]``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hookcli.checks import layer_label
from hookcli.session import CallRecord, Frame, HookSession, Probe


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
