"""The NaN/Inf origin: the first module call whose output holds NaN/Inf from finite inputs.

One rule, shared by ``stats`` (its header, ``totals.nonfinite_origin`` and the
``nan``/``inf`` checks) and ``grads`` (``--fail-on nan,inf`` names where the
forward pass first produced the value).

Forward hooks fire as calls *return*, and a parent returns after its children,
so "first" is in completion order: the innermost offender comes before the
ancestors whose inputs it poisoned. A call whose inputs already held NaN/Inf
only passes them on and is never the origin; where the inputs were not
watched, they count as finite.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


def nonfinite_origin(
    completed: Iterable[int],
    holds: Callable[[int], bool],
    inputs_finite: Callable[[int], bool] | None = None,
) -> int | None:
    """The first call of ``completed`` (frame indices in the order their forward returned)
    whose output ``holds`` NaN/Inf while ``inputs_finite``; None when there is none."""
    for index in completed:
        if holds(index) and (inputs_finite is None or inputs_finite(index)):
            return index
    return None
