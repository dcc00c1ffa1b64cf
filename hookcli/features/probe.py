"""``FeatureProbe``: copies of the outputs of the modules ``--layer`` selects.

Only the selected modules get hooks (``HookSession(only=...)``); every other module
runs untouched. A capture is keyed by the module's qualified name, ``name#N``
for its N-th repeated call, and ``[i]`` / ``[key]`` / ``.field`` suffixes when
the output holds several tensors (``lstm[0]``, ``lstm[1][0]``, ``heads[logits]``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hookcli.checks import layer_label
from hookcli.session import CallRecord, Frame, HookSession, Probe
from hookcli.structures import iter_named_tensors


def named_tensors(obj: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """``(suffix, tensor)`` for every tensor in ``obj``, in ``iter_tensors`` order."""
    return iter_named_tensors(obj, prefix)


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
