"""Tensors inside nested inputs/outputs, flattened in order.

Tuples, lists, namedtuples, dicts (values in the dict's own key order),
dataclasses, and plain objects holding tensors in attributes (torchvision's
``ImageList``; attribute order, three levels deep at most) are walked; None and
other leaves are skipped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import torch

_MAX_DEPTH = 32


def _is_record(obj: Any) -> bool:
    """A plain object holding data in attributes (torchvision's ImageList, say)."""
    return (
        hasattr(obj, "__dict__")
        and not isinstance(obj, (torch.nn.Module, type))
        and not callable(obj)
        and not isinstance(obj, (str, bytes))
    )


def iter_tensors(obj: Any, _depth: int = 0) -> Iterator[torch.Tensor]:
    """Every tensor in ``obj``, depth first, in order."""
    if _depth > _MAX_DEPTH or obj is None:
        return
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, Mapping):
        for value in obj.values():
            yield from iter_tensors(value, _depth + 1)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from iter_tensors(value, _depth + 1)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from iter_tensors(getattr(obj, f.name, None), _depth + 1)
    elif _is_record(obj) and _depth < 4:
        for value in vars(obj).values():
            yield from iter_tensors(value, _depth + 1)


def shapes_of(*objs: Any) -> tuple[tuple[int, ...], ...]:
    """Shapes of every tensor in ``objs``."""
    out = []
    for obj in objs:
        # the common cases, once per module call: a tensor, a tuple of tensors, no kwargs
        if type(obj) is torch.Tensor or isinstance(obj, torch.Tensor):
            out.append(tuple(obj.shape))
        elif type(obj) is tuple and all(type(t) is torch.Tensor for t in obj):
            out.extend(tuple(t.shape) for t in obj)
        elif obj is None or (type(obj) is dict and not obj):
            continue
        else:
            out.extend(tuple(t.shape) for t in iter_tensors(obj))
    return tuple(out)
