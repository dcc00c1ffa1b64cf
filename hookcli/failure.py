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


# -- whose code raised ---------------------------------------------------------------------

# hookcli frames that only pass a model's op on (dispatch and function modes): an error
# raised beneath them is the op's, not hookcli's
_PASS_THROUGH = frozenset({"__torch_function__", "__torch_dispatch__"})


@dataclass(frozen=True)
class RaisedAt:
    """The innermost frame of an exception's traceback outside torch and the standard
    library: where the model's code (or hookcli's own, ``hookcli`` True) raised."""

    path: str
    line: int
    function: str
    hookcli: bool

    def suffix(self) -> str:
        """`` (raised at path/model.py:42 in forward)``."""
        return f" (raised at {self.path}:{self.line} in {self.function})"


def _roots() -> tuple[tuple[str, ...], str]:
    """(folders whose frames are skipped: torch's and the standard library's, hookcli's)."""
    import os

    import torch

    skip = [
        os.path.dirname(os.path.realpath(torch.__file__)),
        os.path.dirname(os.path.realpath(os.__file__)),  # the standard library
    ]
    own = os.path.dirname(os.path.realpath(__file__))  # this package's folder
    return tuple(p + os.sep for p in skip), own + os.sep


def _skipped(real: str, skip: tuple[str, ...]) -> bool:
    """torch's or the standard library's (a package installed under the latter's folder,
    in site-packages, is not)."""
    return real.startswith(skip) and (
        real.startswith(skip[0]) or not ("site-packages" in real or "dist-packages" in real)
    )


def _shown(path: str, module: str | None = None) -> str:
    """A path as the user knows it: an installed package's as its module names it
    (``torchvision/models/resnet.py``), else relative to the current folder when under it,
    else as its module names it (``sample_models.basic`` -> ``sample_models/basic.py``),
    else relative to the ``sys.path`` entry holding it, else as it is."""
    import os
    import sys

    def under(root: str) -> str | None:
        try:
            rel = os.path.relpath(path, root)
        except ValueError:  # another drive (Windows)
            return None
        return None if rel.startswith(os.pardir) else rel

    by_module = None
    if module and module != "__main__":
        parts = module.split(".")
        tail = path.split(os.sep)
        if tail and tail[-1] == "__init__.py":
            parts.append("__init__")
        if (
            len(tail) >= len(parts)
            and [t.removesuffix(".py") for t in tail[-len(parts) :]] == parts
        ):
            by_module = "/".join(tail[-len(parts) :])
    installed = "site-packages" in path or "dist-packages" in path
    here = None if installed and by_module else under(os.getcwd())
    if here is not None:
        return here
    if by_module is not None:
        return by_module
    roots = sorted(
        (os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)), key=len, reverse=True
    )
    for root in roots:
        rel = under(root)
        if rel is not None:
            return rel
    return path


# torch frames through which hookcli hands control to the model: a module call, backward
_INTO_MODEL = frozenset({"_call_impl", "_wrapped_call_impl", "_engine_run_backward"})


def raised_at(err: BaseException) -> RaisedAt | None:
    """Where ``err`` was raised, read from its own traceback (not its causes).

    The innermost frame that is not torch's, the standard library's, or a hookcli mode
    passing an op on. A hookcli frame there that called into the model (a module call or
    backward is deeper) only ran it: the error is the model's, raised in torch's own
    modules (the innermost frame, or None when that is autograd's engine). None when
    there is no frame to name.
    """
    import os

    skip, own = _roots()
    frames: list[tuple[str, int, str, bool, bool, str | None]] = []
    # path, line, function, skipped, hookcli's, module name
    tb = err.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        path = code.co_filename
        real = os.path.realpath(path) if not path.startswith("<") else path
        ours = real.startswith(own)
        skipped = path.startswith("<") or _skipped(real, skip)
        if ours and code.co_name in _PASS_THROUGH and tb.tb_next is not None:
            skipped = True
        module = tb.tb_frame.f_globals.get("__name__")
        frames.append((real, tb.tb_lineno, code.co_name, skipped, ours, module))
        tb = tb.tb_next
    inner = max((i for i, f in enumerate(frames) if not f[3]), default=None)
    if inner is None:
        return None
    path, line, name, _, ours, module = frames[inner]
    if ours and any(f[2] in _INTO_MODEL for f in frames[inner + 1 :]):
        last = frames[-1]
        if last[2] in _INTO_MODEL or last[2] == "backward":
            return None
        return RaisedAt(_shown(last[0], last[5]), last[1], last[2], False)
    shown = f"hookcli/{path[len(own) :]}" if ours else _shown(path, module)
    return RaisedAt(shown, line, name, ours)


# -- forwards that turn autograd off -------------------------------------------------------


def grad_off_layer(fn: Any) -> str | None:
    """``@torch.inference_mode()`` / ``@torch.no_grad()`` when ``fn`` itself is torch's
    wrapper for that decorator (its closure holds the context); None otherwise."""
    import torch

    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        ctx = getattr(value, "__self__", value)
        if isinstance(ctx, torch.inference_mode) and getattr(ctx, "mode", True):
            return "@torch.inference_mode()"
        if isinstance(ctx, torch.no_grad):
            return "@torch.no_grad()"
    return None


def grad_off_decorator(fn: Any) -> str | None:
    """``@torch.inference_mode()`` / ``@torch.no_grad()`` when ``fn`` (or a function it
    wraps) is decorated so; None otherwise."""
    seen: set[int] = set()
    while fn is not None and id(fn) not in seen:
        seen.add(id(fn))
        found = grad_off_layer(fn)
        if found is not None:
            return found
        fn = getattr(fn, "__wrapped__", None)
    return None


def _defined_at(fn: Any) -> str:
    """``path.py:LINE`` of the function a decorator wraps ('' when unknown)."""
    import inspect

    try:
        inner = inspect.unwrap(fn)
        code = inner.__code__
    except (AttributeError, ValueError):
        return ""
    return f"{_shown(code.co_filename)}:{code.co_firstlineno}"


@dataclass(frozen=True)
class GradOff:
    """A module whose ``forward`` is decorated to run without autograd."""

    name: str
    type: str
    decorator: str
    where: str

    def label(self) -> str:
        at = f" ({self.where})" if self.where else ""
        return f"{self.type}.forward{at} is decorated with {self.decorator}"


def grad_off_forwards(model: nn.Module) -> list[GradOff]:
    """Every module of ``model`` (root first) whose forward runs without autograd."""
    by_class: dict[Any, str | None] = {}
    found = []
    for name, m in model.named_modules():
        fn = m.__dict__.get("forward") or getattr(type(m), "forward", None)
        key = id(fn)
        if key not in by_class:
            by_class[key] = grad_off_decorator(fn)
        decorator = by_class[key]
        if decorator is not None:
            found.append(GradOff(name, type(m).__name__, decorator, _defined_at(fn)))
    return found


def refuse_grad_off_root(model: nn.Module, why: str = "backward") -> None:
    """A UsageError before any work when the root's forward runs without autograd."""
    from hookcli.errors import UsageError

    off = grad_off_forwards(model)
    if off and off[0].name == "":
        raise UsageError(
            f"{why} needs gradients, but {off[0].label()}: nothing it returns carries a "
            "gradient, so there is nothing to backpropagate; pass --enable-grad to run it "
            "with gradients (as fine-tuning it does), or remove the decorator"
        )


# -- hookcli's own failures, state kept across calls ---------------------------------------


def deliberate(err: BaseException) -> bool:
    """What hookcli raises on purpose, naming its own cause (a usage error, a stated limit,
    meta's NeedsValues, cost's "hookcli cost: ..."): never called an internal error."""
    from hookcli.errors import HookcliError

    return (
        isinstance(err, (SystemExit, HookcliError))
        or type(err).__module__.split(".")[0] == "hookcli"
        or str(err).startswith("hookcli")
    )


def internal_error(
    err: BaseException, at: RaisedAt, phase: str, module: str | None = None
) -> Exception:
    """hookcli's own code raised while the model ran: an InternalError that says so."""
    from hookcli.errors import InternalError, first_line

    during = f"the {phase} of {module}" if module else f"the {phase}"
    return InternalError(
        f"internal error in hookcli during {during}: {first_line(err)} (raised at "
        f"{at.path}:{at.line} in {at.function}); this is hookcli's fault, not the model's: "
        "please report it, with the traceback --debug prints"
    )


_REUSED_GRAPH = (
    "backward through the graph a second time",
    "ran backward inside its forward",
    "modified by an inplace operation",
)


def carried_state(model: nn.Module) -> list[str]:
    """Tensors held in plain module attributes (neither parameters nor buffers) that
    carry autograd history: state one call leaves for the next (a KV cache)."""
    import torch

    found = []
    for name, m in model.named_modules():
        for attr, value in vars(m).items():
            if attr.startswith("_") or not isinstance(value, torch.Tensor):
                continue
            if value.grad_fn is not None:
                found.append(f"{name}.{attr}" if name else attr)
    return found


def carried_state_reason(err: BaseException, model: nn.Module) -> str:
    """When backward failed on an earlier call's graph and the model keeps tensors with
    autograd history in attributes: the reason naming them (in place of the error's
    own first line); else ''."""
    text = str(err)
    if not any(marker in text for marker in _REUSED_GRAPH):
        return ""
    state = carried_state(model)
    if not state:
        return ""
    from hookcli.errors import first_line

    shown = ", ".join(state[:4]) + (f" and {len(state) - 4} more" if len(state) > 4 else "")
    # hookcli's own words for the symptom ("ran backward inside its forward") mislead here
    torch_said = "" if text.startswith("hookcli") else f" ({first_line(err)})"
    return (
        f"the model keeps state from call to call in module attributes ({shown}: a KV "
        "cache?) that carries autograd history, so this backward reaches into an earlier "
        "call's graph; hookcli runs forward more than once here: detach or reset that "
        f"state in forward, or use a command that runs one forward (grads){torch_said}"
    )
