"""L2 norms of large CPU tensors that are both accurate and fast, and the flat view
they read.

A CPU reduction of a whole tensor to one value accumulates float32 lane by lane on one
thread, and its error grows with the tensor: on an AMD EPYC (torch 2.15) the fused
``torch._foreach_norm`` that ``clip_grad_norm_`` uses was up to 1.5e-5 (relative) from
float64 on resnet18's gradients and 7.4e-5 on a model whose 4.2M-element Linear weight
dominates it (tests/test_watch.py). Read as rows of ``BLOCK`` elements instead, each
row's sum is short, and torch spreads the rows over its threads: ``blocked_norm`` takes
the norm of each row, then the norm of those, within 2.3e-7 of float64 on those
resnet18 gradients. Inside a resnet18 training step on that machine (11M gradient elements, 2
threads) it also took about 1.1 to 1.4 ms against 2.3 to 2.9 ms. On CUDA a reduction
is a tree already: the plain norm.

``hookcli grads`` (parameter and gradient norms) and ``hookcli watch`` (the per-step
gradient norm, weight norms, update ratios) take their large CPU norms here; ``hookcli
stats`` reads its outputs through ``flat_view``.
"""

from __future__ import annotations

import torch

# Elements per row; a CPU tensor of at least ``BLOCKED_FROM`` elements is read by rows.
BLOCK = 16384
BLOCKED_FROM = 2 * BLOCK
LOW_PRECISION = (torch.float16, torch.bfloat16)


def flat_view(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a 1-D view of its elements, in memory order (a copy only if it overlaps
    or has gaps): for figures that do not depend on the order (sums, norms, extremes).
    A channels-last or transposed tensor is read where it lies, not copied."""
    if x.is_contiguous():
        return x.view(-1)
    by_stride = x.permute(sorted(range(x.dim()), key=x.stride, reverse=True))
    return by_stride.view(-1) if by_stride.is_contiguous() else x.reshape(-1)


def blocked_norm(t: torch.Tensor) -> torch.Tensor:
    """The L2 norm of one dense floating or complex tensor as a 0-dim tensor (half
    types accumulated in float32): by rows on the CPU from ``BLOCKED_FROM`` elements,
    else ``torch.linalg.vector_norm``. NaN and Inf come through as they do there."""
    dtype = torch.float32 if t.dtype in LOW_PRECISION else None
    n = t.numel()
    if t.device.type != "cpu" or n < BLOCKED_FROM:
        return torch.linalg.vector_norm(t, dtype=dtype)
    flat = flat_view(t)
    k = n // BLOCK
    parts = torch.linalg.vector_norm(flat[: k * BLOCK].view(k, BLOCK), dim=1, dtype=dtype)
    if k * BLOCK < n:
        rest = torch.linalg.vector_norm(flat[k * BLOCK :], dtype=dtype).reshape(1)
        parts = torch.cat([parts, rest])
    return torch.linalg.vector_norm(parts)
