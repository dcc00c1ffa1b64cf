"""Where a model raised, read from the exception's traceback: no second run needed.

``features`` hooks only the modules ``--layer`` selects, so the session's own
frames cannot say which module raised when it is not one of them. Every module
call goes through ``nn.Module._call_impl``, whose frame holds the module
(``self``) and the very arguments it was called with (``args``, ``kwargs``); the
traceback keeps those frames, so the innermost one of a module of the model is
where the model failed, with its input shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class FailedCall:
    """The innermost module call of the model on a traceback."""

    name: str
    type: str
    input_shapes: tuple[tuple[int, ...], ...]

    def message(self, reason: str) -> str:
        """The same words as the session's: 'forward failed in NAME (Type) with input shapes'."""
        shapes = (
            ", ".join("[" + ", ".join(str(d) for d in s) + "]" for s in self.input_shapes)
            or "no tensors"
        )
        where = f"{self.name or '(root)'} ({self.type})"
        return f"forward failed in {where} with input shapes {shapes}: {reason}"


def failed_call(err: BaseException, model: nn.Module) -> FailedCall | None:
    """The innermost call of a module of ``model`` on ``err``'s traceback, or None."""
    from torch import nn

    from hookcli.modelinfo import module_names
    from hookcli.structures import shapes_of

    names = module_names(model)
    calls = {nn.Module._call_impl.__code__}
    found: tuple[str, Any, Any, Any] | None = None
    tb = err.__traceback__
    while tb is not None:  # outermost first: the last match is the innermost call
        frame = tb.tb_frame
        if frame.f_code in calls:
            module = frame.f_locals.get("self")
            if id(module) in names:
                found = (
                    names[id(module)],
                    module,
                    frame.f_locals.get("args"),
                    frame.f_locals.get("kwargs"),
                )
        tb = tb.tb_next
    if found is None:
        return None
    name, module, args, kwargs = found
    return FailedCall(name, type(module).__name__, shapes_of(args or (), kwargs or None))
