"""``--fit SIZE``: the largest batch size whose training-step peak fits in SIZE.

``largest_fitting`` searches a peak that grows with the batch (the tracker's, on meta):
batch 1, then an extrapolation of the line through the first two points, doubled until
a batch does not fit, then interpolation and bisection by turns between the last batch
that fits and the first that does not. A step's peak is close to linear in the batch
(piecewise: where it moves from the optimizer's step into backward, its slope changes),
so a handful of steps answer; each is one tracked step on meta.

``rebatched`` makes the inputs of another batch size on meta: every tensor input whose
first dim is the run's batch size gets the new one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAX_BATCH = 1 << 24  # the search's bound: an answer of MAX_BATCH says "this or more"


@dataclass(frozen=True)
class Fit:
    """The answer: ``batch`` fits (0: not even batch 1), ``batch + 1`` does not."""

    limit: int
    batch: int
    peak: int | None  # at ``batch`` (None when it is 0)
    next_peak: int | None  # at ``batch + 1`` (None at MAX_BATCH)
    evaluations: int


def largest_fitting(peak_at: Callable[[int], int], limit: int) -> Fit:
    """The largest batch b with ``peak_at(b) <= limit`` (peak_at taken as non-decreasing)."""
    seen: dict[int, int] = {}

    def peak(b: int) -> int:
        if b not in seen:
            seen[b] = peak_at(b)
        return seen[b]

    def answer(b: int) -> Fit:
        nxt = peak(b + 1) if b < MAX_BATCH else None
        return Fit(limit, b, seen.get(b) if b else None, nxt, len(seen))

    if peak(1) > limit:
        return answer(0)
    lo = 1
    p2 = peak(2)
    if p2 > limit:
        return answer(1)
    lo, slope = 2, max(p2 - seen[1], 1)
    hi = min(MAX_BATCH, max(lo + 1, lo + (limit - p2) // slope + 1))
    while peak(hi) <= limit:  # a batch above the answer: the line's guess, doubled
        lo = hi
        if hi == MAX_BATCH:
            return answer(MAX_BATCH)
        hi = min(MAX_BATCH, hi * 2)
    interpolate = True
    while hi - lo > 1:  # seen[lo] <= limit < seen[hi]
        # interpolation and bisection by turns: the line's guess is right on a line,
        # and bisection bounds the steps where the peak curves (it stalls there)
        guess = (lo + hi) // 2
        if interpolate:
            span = max(seen[hi] - seen[lo], 1)
            guess = min(max(lo + (limit - seen[lo]) * (hi - lo) // span, lo + 1), hi - 1)
        if peak(guess) <= limit:
            lo = guess
        else:
            hi = guess
        # after a guess from the line, its neighbour often settles it
        if interpolate and hi - lo > 1 and lo + 1 not in seen:
            if peak(lo + 1) > limit:
                hi = lo + 1
            else:
                lo += 1
        interpolate = not interpolate
    return answer(lo)


def rebatched(values: Any, batch: int, new: int) -> Any:
    """``values`` (args or kwargs, nested) with every tensor whose first dim is ``batch``
    made again on meta with ``new`` there (values do not matter on meta); other tensors
    not on meta made there with their shape."""
    import torch

    if isinstance(values, torch.Tensor):
        if values.dim() >= 1 and values.shape[0] == batch:
            out = torch.empty(
                (new, *values.shape[1:]), dtype=values.dtype, device="meta"
            ).requires_grad_(values.requires_grad)
            return out
        if not values.is_meta:  # the model searched on a meta copy of a CPU/CUDA one
            return torch.empty_like(values, device="meta").requires_grad_(values.requires_grad)
        return values
    if isinstance(values, tuple):
        return tuple(rebatched(v, batch, new) for v in values)
    if isinstance(values, list):
        return [rebatched(v, batch, new) for v in values]
    if isinstance(values, dict):
        return {k: rebatched(v, batch, new) for k, v in values.items()}
    return values


def batch_of(values: Any) -> int | None:
    """The first dim of the first tensor with one (the run's batch size)."""
    import torch

    if isinstance(values, torch.Tensor):
        return int(values.shape[0]) if values.dim() >= 1 else None
    items = values.values() if isinstance(values, dict) else values
    if isinstance(items, (tuple, list)) or isinstance(values, dict):
        for v in items:
            found = batch_of(v)
            if found is not None:
                return found
    return None
