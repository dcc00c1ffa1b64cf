"""L2 norms of large CPU tensors that are both accurate and fast, and the flat view
they read.

A CPU reduction of a whole tensor to one value accumulates float32 lane by lane on one
thread, and its error grows with the tensor: on an AMD EPYC (torch 2.15) the fused
``torch._foreach_norm`` that ``clip_grad_norm_`` uses was up to 1.5e-5 (relative) from
float64 on resnet18's gradients and 7.4e-5 on a model whose 4.2M-element Linear weight
dominates it (tests/test_watch.py). Read by rows instead (``RowNorms``: the elements
under one index of its leading dimensions, 128 to ``BLOCK`` of them, as a Conv2d or
Linear weight's output channels hold; else rows of ``BLOCK`` elements of its flat
view), each row's sum is short, torch spreads the rows over its threads, and the rows'
squares add up in float64: within 2.3e-7 of float64 on those resnet18 gradients. Inside
a resnet18 training step on that machine (11M gradient elements, 2 threads) it also
took about 1.1 to 1.4 ms against 2.3 to 2.9 ms. On CUDA a reduction is a tree already:
the plain norm.

``hookcli grads`` (parameter and gradient norms, through ``blocked_norm``) and ``hookcli
watch`` (the per-step gradient norm, weight norms, update ratios, through ``RowNorms``)
take their large CPU norms here; ``hookcli stats`` reads its outputs through
``flat_view``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

# Elements per row; a CPU tensor of at least ``BLOCKED_FROM`` elements is read by rows.
BLOCK = 16384
BLOCKED_FROM = 2 * BLOCK
LOW_PRECISION = (torch.float16, torch.bfloat16)
# a row shorter than this is read as part of BLOCK-element rows of the flat tensor
MIN_ROW = 128


def flat_view(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a 1-D view of its elements, in memory order (a copy only if it overlaps
    or has gaps): for figures that do not depend on the order (sums, norms, extremes).
    A channels-last or transposed tensor is read where it lies, not copied."""
    if x.is_contiguous():
        return x.view(-1)
    by_stride = x.permute(sorted(range(x.dim()), key=x.stride, reverse=True))
    return by_stride.view(-1) if by_stride.is_contiguous() else x.reshape(-1)


def row_dims(shape: torch.Size) -> tuple[int, ...] | None:
    """The trailing dimensions that make a tensor's rows (``MIN_ROW`` to ``BLOCK``
    elements under one index of the leading ones), or None: rows of its flat view."""
    for j in range(1, len(shape)):
        row = math.prod(shape[j:])
        if row <= BLOCK:
            return tuple(range(j, len(shape))) if row >= MIN_ROW else None
    return None


def _rows_of(t: torch.Tensor, dims: tuple[int, ...] | None, low: bool) -> list[torch.Tensor]:
    """The norms of ``t``'s rows (``row_dims``), as 1-D tensors (half types in float32)."""
    dtype = torch.float32 if low else None
    if dims is not None:
        rows = torch.linalg.vector_norm(t, dim=dims, dtype=dtype)
        return [rows if dims[0] == 1 else rows.reshape(-1)]
    flat = flat_view(t)
    n = flat.numel()
    k = n // BLOCK
    parts = [torch.linalg.vector_norm(flat[: k * BLOCK].view(k, BLOCK), dim=1, dtype=dtype)]
    if k * BLOCK < n:
        parts.append(torch.linalg.vector_norm(flat[k * BLOCK :], dim=0, keepdim=True, dtype=dtype))
    return parts


def _row_count(shape: torch.Size, dims: tuple[int, ...] | None) -> int:
    n = math.prod(shape)
    if dims is not None:
        return n // math.prod(shape[dims[0] :])
    return n // BLOCK + (1 if n % BLOCK else 0)


@dataclass(frozen=True)
class RowNorms:
    """The norms of large CPU tensors in a few operations, read by rows (the module
    docstring): each tensor's rows normed in float32 (one reduction over its trailing
    dimensions, wherever they lie in memory; else ``BLOCK``-element rows of its flat
    view), and every row norm then summed into its tensor's norm in float64 with one
    ``index_add_``. NaN and Inf come through as ``torch.linalg.vector_norm`` gives them
    (a NaN anywhere in a tensor: NaN). Made once for a list of tensors (``of``), it
    reads any list of the same shapes (``norms``)."""

    shapes: tuple[torch.Size, ...]
    dims: tuple[tuple[int, ...] | None, ...]  # reduced dimensions; None: flat rows
    low: tuple[bool, ...]
    # the tensor (0..n-1) of each row norm: follows from the shapes and dims
    segments: torch.Tensor = field(compare=False)

    @staticmethod
    def of(tensors: list[torch.Tensor]) -> RowNorms:
        dims = [row_dims(t.shape) for t in tensors]
        counts = [_row_count(t.shape, d) for t, d in zip(tensors, dims, strict=True)]
        segments = torch.repeat_interleave(
            torch.arange(len(tensors)), torch.tensor(counts, dtype=torch.long)
        )
        return RowNorms(
            tuple(t.shape for t in tensors),
            tuple(dims),
            tuple(t.dtype in LOW_PRECISION for t in tensors),
            segments,
        )

    def norms(
        self, tensors: list[torch.Tensor], each: Callable[[int], Any] | None = None
    ) -> torch.Tensor:
        """Each tensor's norm, one float64 vector (a shape other than the plan's:
        ``RuntimeError``). ``each(j)`` runs just before tensor j is read (a copy or a
        difference made while the tensor is in the cache)."""
        squares = torch.cat(self.rows(tensors, each)).to(torch.float64).square_()
        sums = torch.zeros(len(tensors), dtype=torch.float64)
        return sums.index_add_(0, self.segments, squares).sqrt_()

    def rows(
        self, tensors: list[torch.Tensor], each: Callable[[int], Any] | None = None
    ) -> list[torch.Tensor]:
        """The row norms of ``norms``, 1-D tensors in the order of ``segments``, not yet
        added up (a caller that adds more values in the same sum: ``hookcli watch``)."""
        parts: list[torch.Tensor] = []
        for j, (t, shape, dims, low) in enumerate(
            zip(tensors, self.shapes, self.dims, self.low, strict=True)
        ):
            if t.shape != shape:
                raise RuntimeError("a tensor changed its shape")
            if each is not None:
                each(j)
            parts.extend(_rows_of(t, dims, low))
        return parts


def blocked_norm(t: torch.Tensor) -> torch.Tensor:
    """The L2 norm of one dense floating or complex tensor as a 0-dim tensor of its real
    dtype (half types accumulated in float32, and given so): by rows on the CPU from
    ``BLOCKED_FROM`` elements (``RowNorms``, the squares added in float64), else
    ``torch.linalg.vector_norm``. NaN and Inf come through as they do there."""
    low = t.dtype in LOW_PRECISION
    if t.device.type != "cpu" or t.numel() < BLOCKED_FROM:
        return torch.linalg.vector_norm(t, dtype=torch.float32 if low else None)
    parts = _rows_of(t, row_dims(t.shape), low)
    rows = parts[0] if len(parts) == 1 else torch.cat(parts)
    return rows.to(torch.float64).square_().sum().sqrt_().to(rows.dtype)
