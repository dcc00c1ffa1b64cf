"""Reduce a model's output structure to a scalar loss (``--loss sum|mean``)."""

from __future__ import annotations

from typing import Any

import torch

from hookcli.errors import UsageError
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
        raise UsageError(
            f"nothing to backpropagate: the model's output is {describe_output(output)}; "
            "backward needs a floating-point tensor that requires grad in the output"
        )
    total = tensors[0].real.sum() if tensors[0].is_complex() else tensors[0].sum()
    for t in tensors[1:]:
        total = total + (t.real.sum() if t.is_complex() else t.sum())
    if kind == "mean":
        count = sum(t.numel() for t in tensors)
        return total / max(count, 1)
    return total


def describe_output(output: Any, _depth: int = 0) -> str:
    """The output's type in words: 'None', 'an int', 'a float32 Tensor [2, 4] (no grad)'."""
    if output is None:
        return "None"
    if isinstance(output, torch.Tensor):
        dtype = str(output.dtype).removeprefix("torch.")
        shape = "[" + ", ".join(str(d) for d in output.shape) + "]"
        floating = output.is_floating_point() or output.is_complex()
        why = " that does not require grad" if floating and not output.requires_grad else ""
        return f"a {dtype} Tensor {shape}{why}"
    name = type(output).__name__
    article = "an" if name[:1].lower() in "aeiou" else "a"
    if _depth < 1 and isinstance(output, (list, tuple)) and output:
        inner = ", ".join(describe_output(v, _depth + 1) for v in list(output)[:3])
        more = ", ..." if len(output) > 3 else ""
        return f"{article} {name} of {len(output)} ({inner}{more})"
    if _depth < 1 and isinstance(output, dict) and output:
        inner = ", ".join(
            f"{k}: {describe_output(v, _depth + 1)}" for k, v in list(output.items())[:3]
        )
        more = ", ..." if len(output) > 3 else ""
        return f"{article} {name} ({inner}{more})"
    return f"{article} {name}"
