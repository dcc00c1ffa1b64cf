"""Closure steps: ``optimizer.step(closure)`` (Lightning's automatic optimization,
LBFGS), where the forward and backward run inside ``step()``. The step pre-hook hands
``step()`` the same closure wrapped: called with the same arguments, returning what it
returns, and telling the monitor when it first returns (the step's forward and
backward are done, its update not yet made)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hookcli.watch.frames import hide


def closure_of(opt: Any, args: Any, kwargs: Any) -> Callable[..., Any] | None:
    """The closure given to ``step()``, if one was (the hooks' args begin with the
    optimizer itself)."""
    if "closure" in kwargs:
        closure = kwargs["closure"]
    else:
        rest = args[1:] if args and args[0] is opt else args
        closure = rest[0] if rest else None
    return closure if callable(closure) else None


def with_closure(args: Any, kwargs: Any, closure: Any, done: Callable[[], None]) -> tuple[Any, Any]:
    """``step()``'s arguments (the hooks' ``args`` begin with the optimizer) with
    ``closure`` wrapped: ``done()`` runs when its first call returns."""
    calls = [0]

    def closure_of_step(*a: Any, **k: Any) -> Any:
        calls[0] += 1
        try:
            out = closure(*a, **k)
        except BaseException as err:
            hide(err)
            raise
        if calls[0] == 1:
            done()
        return out

    if "closure" in kwargs:
        return args, {**kwargs, "closure": closure_of_step}
    at = 1 if args and args[0] is not closure else 0
    return (*args[:at], closure_of_step, *args[at + 1 :]), kwargs
