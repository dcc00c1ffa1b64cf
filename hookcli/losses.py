"""Reduce a model's output structure to a scalar loss (``--loss sum|mean``)."""

from __future__ import annotations

from typing import Any

import torch

from hookcli.errors import RunError
from hookcli.structures import iter_tensors


def reduce_output(output: Any, kind: str = "sum") -> torch.Tensor:
    """Sum (or mean) of every floating-point element that requires grad in ``output``.

    ``sum`` adds every element of every floating tensor; ``mean`` averages over
    all those elements together. Tensors that do not require grad are skipped
    (they cannot carry a gradient back).
    """
    tensors = [
        t
        for t in iter_tensors(output)
        if (t.is_floating_point() or t.is_complex()) and t.requires_grad
    ]
    if not tensors:
        raise RunError(
            "the output holds no floating-point tensor that requires grad: nothing to backpropagate"
        )
    total = tensors[0].real.sum() if tensors[0].is_complex() else tensors[0].sum()
    for t in tensors[1:]:
        total = total + (t.real.sum() if t.is_complex() else t.sum())
    if kind == "mean":
        count = sum(t.numel() for t in tensors)
        return total / max(count, 1)
    return total
