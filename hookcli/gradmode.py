"""``--enable-grad``: run forwards that torch's grad-mode decorators turn autograd off in
(``@torch.no_grad()``, ``@torch.inference_mode()``: SAM's ``Sam.forward``, Meta Llama's
``Transformer.forward``) with gradients, as fine-tuning such a model does.

The CLI holds the choice for one command (``requested``); ``pipeline.prepare`` lifts the
decorators off the built model (``lift_requested``) for the rest of that command, and
``requested`` puts everything back when the command ends, also after a failure:

- a module whose ``forward`` (its class's, or one set on the instance) is torch's wrapper
  gets, in its instance ``__dict__``, the function the wrapper holds (``__wrapped__``)
  bound to it: that module runs undecorated, its class and other instances do not;
- a grad-off wrapper beneath another decorator (``@other`` over ``@torch.no_grad()``)
  cannot be taken out of the chain: its context factory is a null context until the
  command ends (the function is the class's, so every instance runs it so meanwhile).

Nothing else changes: hookcli's own ``torch.no_grad()`` blocks and a ``with
torch.no_grad():`` written inside a forward's body run as they are, and the forward runs
in the grad mode the command runs it in (``grads``: enabled; ``inspect``: inference).
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from hookcli.failure import GradOff

_requested = False  # --enable-grad, for the command under way
_undo: list[Callable[[], None]] = []  # what lift_requested changed, undone by requested


@contextlib.contextmanager
def requested(value: bool) -> Iterator[None]:
    """Hold ``--enable-grad`` for one command; every forward lifted meanwhile is put
    back at the end, whatever happened."""
    global _requested
    before, _requested = _requested, bool(value)
    mark = len(_undo)
    try:
        yield
    finally:
        _requested = before
        while len(_undo) > mark:
            _undo.pop()()


def current() -> bool:
    """Whether the command was given ``--enable-grad``."""
    return _requested


def lift_requested(model: nn.Module) -> list[GradOff]:
    """Under ``--enable-grad``: lift the model's grad-off decorators until the command
    ends, with a note on stderr saying which; the forwards lifted (none without it)."""
    if not _requested:
        return []
    from hookcli.streams import progress

    undo, lifted = lift(model)
    _undo.append(undo)
    if not lifted:
        progress(
            "hookcli: note: --enable-grad: no forward of the model is decorated with "
            "@torch.no_grad() or @torch.inference_mode(); it runs as it is"
        )
        return lifted
    first = lifted[0]
    more = f" and {len(lifted) - 1} more module(s)" if len(lifted) > 1 else ""
    progress(
        f"hookcli: note: --enable-grad: {first.name or '(root)'} ({first.type}.forward) "
        f"runs without its {first.decorator}{more}, with gradients"
    )
    return lifted


def lift(model: nn.Module) -> tuple[Callable[[], None], list[GradOff]]:
    """Every module of ``model`` whose forward is decorated to run without autograd runs
    undecorated; returns the function that puts them back and the forwards lifted."""
    from hookcli.failure import grad_off_forwards

    off = grad_off_forwards(model)
    undo: list[Callable[[], None]] = []
    neutral: set[int] = set()  # wrappers beneath other decorators, already nulled
    try:
        by_name = dict(model.named_modules())
        for found in off:
            module = by_name[found.name]
            undo.extend(_lift_module(module, neutral, found))
    except BaseException:
        _run(undo)
        raise
    return (lambda: _run(undo)), off


def _run(undo: list[Callable[[], None]]) -> None:
    while undo:
        undo.pop()()


def _lift_module(module: nn.Module, neutral: set[int], found: GradOff) -> list[Callable[[], None]]:
    from hookcli.failure import grad_off_layer

    own = module.__dict__.get("forward")
    fn: Any = own if own is not None else getattr(type(module), "forward", None)
    owner: Any = module if own is None else None  # a class function binds to the module
    if isinstance(fn, types.MethodType):
        fn, owner = fn.__func__, fn.__self__
    inner = fn
    while grad_off_layer(inner) is not None and callable(getattr(inner, "__wrapped__", None)):
        inner = inner.__wrapped__
    undo = []
    layer = getattr(inner, "__wrapped__", None)
    seen: set[int] = set()
    while layer is not None and id(layer) not in seen:  # grad-off wrappers deeper down
        seen.add(id(layer))
        if grad_off_layer(layer) is not None and id(layer) not in neutral:
            undo.append(_null_context(layer, found))
            neutral.add(id(layer))
        layer = getattr(layer, "__wrapped__", None)
    if inner is not fn:
        dict_ = module.__dict__
        dict_["forward"] = inner if owner is None else types.MethodType(inner, owner)

        def put_back() -> None:
            if own is None:
                dict_.pop("forward", None)
            else:
                dict_["forward"] = own

        undo.append(put_back)
    return undo


def _null_context(layer: Any, found: GradOff) -> Callable[[], None]:
    """torch's wrapper ``layer`` enters a null context instead of its grad-off one."""
    from hookcli.errors import UsageError

    names = layer.__code__.co_freevars
    if "ctx_factory" not in names:
        raise UsageError(
            f"--enable-grad: {found.label()} beneath another decorator, in a form this "
            "torch does not let hookcli lift; remove the decorator to run it with gradients"
        )
    cell = layer.__closure__[names.index("ctx_factory")]
    before = cell.cell_contents
    cell.cell_contents = contextlib.nullcontext

    def put_back() -> None:
        cell.cell_contents = before

    return put_back
