"""The scalar loss backward starts from (``--loss``, docs/grads.md#the-loss).

``sum`` (the default) and ``mean`` reduce every floating-point element of the output
structure; ``random`` projects every floating output on a fixed, seeded random direction;
``output:KEY`` takes one element of the output; ``fn:FILE.py:FUNCTION`` calls the user's
function. A default ``sum`` on an output that holds the model's own loss (a scalar named
``loss``, or a tuple ending in a scalar) says so once, with the option that would use it.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from hookcli.errors import RunError, UsageError
from hookcli.options import Loss, LossKind, check_loss_fn, loss_arg
from hookcli.structures import iter_tensors

# The random projection's seed: fixed, so two runs (and two machines) project on the
# same direction whatever --seed drew the inputs with.
RANDOM_SEED = 0


def reduce_output(output: Any, kind: str | Loss | LossFunction = "sum") -> torch.Tensor:
    """The scalar loss of ``output``: ``kind`` as ``--loss`` takes it (or a LossFunction)."""
    if isinstance(kind, LossFunction):
        return kind(output)
    loss = loss_arg(kind)
    if loss.kind in (LossKind.SUM, LossKind.MEAN):
        return _reduce(output, loss.kind)
    return LossFunction(loss)(output)


def _grad_tensors(output: Any) -> list[torch.Tensor]:
    return [
        t
        for t in iter_tensors(output)
        if (t.is_floating_point() or t.is_complex()) and t.requires_grad
    ]


class NothingToBackpropagate(UsageError):
    """The loss has no floating-point tensor that requires grad to start backward from;
    ``reason`` says what the output is (``the model's output is a int64 Tensor [8, 2]``)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def _nothing(output: Any, what: str = "the model's output") -> UsageError:
    reason = f"{what} is {describe_output(output)}"
    return NothingToBackpropagate(
        f"nothing to backpropagate: {reason}; backward needs a floating-point tensor that "
        f"requires grad in the output{_why(output)}",
        reason,
    )


def _why(output: Any) -> str:
    """Why floating outputs carry no grad, where that can be told: made under
    ``torch.inference_mode()`` (inference tensors), else grad off or detached."""
    floating = [t for t in iter_tensors(output) if t.is_floating_point() or t.is_complex()]
    if not floating:
        return ""
    if any(t.is_inference() for t in floating):
        return (
            " (the output was made under torch.inference_mode(): does forward, or code it "
            "calls, run in inference mode?)"
        )
    return (
        " (no floating output is attached to autograd: does forward run under "
        "torch.no_grad() or detach its output?)"
    )


def _reduce(output: Any, kind: LossKind, what: str = "the model's output") -> torch.Tensor:
    """Sum (or mean) of every floating-point element that requires grad in ``output``.

    ``sum`` adds every element of every floating tensor; ``mean`` averages over
    all those elements together. Tensors that do not require grad are skipped
    (they cannot carry a gradient back); complex ones count by their real part.
    """
    tensors = _grad_tensors(output)
    if not tensors:
        raise _nothing(output, what)
    total = tensors[0].real.sum() if tensors[0].is_complex() else tensors[0].sum()
    for t in tensors[1:]:
        total = total + (t.real.sum() if t.is_complex() else t.sum())
    if kind is LossKind.MEAN:
        count = sum(t.numel() for t in tensors)
        return total / max(count, 1)
    return total


# A sum of n independent zero-mean values is about ||x||_2 in size (N(0, ||x||_2^2)); one
# under 1e-3 of that happens by chance about once in 1,250 runs, while a normalised output
# (LayerNorm, softmax minus its mean) sums to rounding noise, ~1e-7 of it in float32. Half
# types round each element by their epsilon, so there the bound is 8 epsilons.
CANCELLED_SUM = 1e-3


def cancelled_sum(output: Any, total: torch.Tensor) -> str | None:
    """A note when the sum loss of ``output`` cancels out (|sum| under ``CANCELLED_SUM``
    times the L2 norm of the summed elements, in half types 8 epsilons): its gradients are
    then rounding noise. None otherwise, and on meta."""
    tensors = [t.real if t.is_complex() else t for t in _grad_tensors(output)]
    if not tensors or total.is_meta or any(t.layout != torch.strided for t in tensors):
        return None
    with torch.no_grad():
        norm = float(torch.stack([t.detach().double().norm() for t in tensors]).norm())
        value = float(total.detach())
    bound = max([CANCELLED_SUM] + [8 * torch.finfo(t.dtype).eps for t in tensors])
    if not norm or abs(value) >= bound * norm or not math.isfinite(value):
        return None
    from hookcli.render import fmt_float

    return (
        f"note: the sum of the output is {fmt_float(value)}, next to an L2 norm of "
        f"{fmt_float(norm)}: it cancels out (a normalised output sums to ~0 whatever the "
        "weights), so its gradients are rounding noise; pass --loss random (a fixed "
        "random projection), or --loss output:KEY / fn:FILE.py:FUNCTION for a real loss"
    )


def random_projection(output: Any) -> torch.Tensor:
    """sum_i <R_i, out_i> over the floating outputs that require grad, in output order,
    with R_i ~ N(0, 1) of out_i's shape drawn on the CPU from one generator seeded with
    ``RANDOM_SEED`` (complex outputs: their real part; sparse ones: densified)."""
    tensors = _grad_tensors(output)
    if not tensors:
        raise _nothing(output)
    gen = torch.Generator().manual_seed(RANDOM_SEED)
    total: torch.Tensor | None = None
    for t in tensors:
        value = t.real if t.is_complex() else t
        if value.layout != torch.strided:
            value = value.to_dense()
        direction = torch.randn(tuple(value.shape), generator=gen, dtype=torch.float32)
        term = (value * direction.to(device=value.device, dtype=value.dtype)).sum()
        total = term if total is None else total + term
    assert total is not None
    return total


# -- output:KEY ----------------------------------------------------------------------------


def _keys(obj: Any) -> list[str]:
    """What ``output:KEY`` can name in ``obj`` (empty for a leaf)."""
    if isinstance(obj, Mapping):
        return [str(k) for k in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [f.name for f in dataclasses.fields(obj)]
    if isinstance(obj, (tuple, list)):
        fields = list(getattr(obj, "_fields", ()))  # a namedtuple's names too
        return [str(i) for i in range(len(obj))] + fields
    return []


def _child(obj: Any, part: str) -> tuple[bool, Any]:
    """(found, value) of one step of ``output:KEY``."""
    if isinstance(obj, Mapping):
        if part in obj:
            return True, obj[part]
        for k in obj:
            if str(k) == part:
                return True, obj[k]
        return False, None
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        names = {f.name for f in dataclasses.fields(obj)}
        return (True, getattr(obj, part, None)) if part in names else (False, None)
    if isinstance(obj, (tuple, list)):
        if part in getattr(obj, "_fields", ()):
            return True, getattr(obj, part)
        try:
            index = int(part)
        except ValueError:
            return False, None
        if -len(obj) <= index < len(obj):
            return True, obj[index]
    return False, None


def _kind_of(obj: Any) -> str:
    if isinstance(obj, torch.Tensor):
        return "a tensor"
    name = type(obj).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def select_output(output: Any, key: str) -> Any:
    """The element ``key`` names: ``loss``, ``1``, ``-1``, ``aux.loss`` (dots go deeper);
    a missing key is a UsageError that lists the keys there are."""
    obj = output
    walked: list[str] = []
    for part in key.split("."):
        found, value = _child(obj, part)
        if not found:
            where = "the model's output" if not walked else f"output:{'.'.join(walked)}"
            keys = _keys(obj)
            has = (
                f"its keys are {', '.join(keys)}"
                if keys
                else f"it is {describe_output(obj)}, which has no keys"
            )
            raise UsageError(
                f"--loss output:{key}: {where} ({_kind_of(obj)}) has no {part!r}; {has}"
            )
        walked.append(part)
        obj = value
    if obj is None:
        raise UsageError(
            f"--loss output:{key}: the model returned None there (a model computes its loss "
            "when it is given targets or labels: pass them as inputs, -i targets=...)"
        )
    return obj


def _as_loss(value: Any, what: str) -> torch.Tensor:
    """A scalar tensor as it is; a larger tensor or a structure: the sum of its floating
    elements."""
    if (
        isinstance(value, torch.Tensor)
        and value.numel() == 1
        and value.layout == torch.strided
        and (value.is_floating_point() or value.is_complex())
        and value.requires_grad
    ):
        scalar = value.reshape(())
        return scalar.real if scalar.is_complex() else scalar
    return _reduce(value, LossKind.SUM, what)


# -- fn:FILE.py:FUNCTION -------------------------------------------------------------------


def load_loss_fn(spec: str) -> Callable[..., Any]:
    """Import the user's loss function (exit 2 when it cannot be found)."""
    from hookcli.errors import LoadError
    from hookcli.loading import user_function

    where, attr = check_loss_fn(spec)
    try:
        fn = user_function(where, attr)
    except LoadError as err:
        raise UsageError(f"--loss fn:{spec}: {err.message}") from err
    if not callable(fn):
        raise UsageError(f"--loss fn:{spec}: {attr} is a {type(fn).__name__}, not a function")
    foreign = _not_a_loss(fn, where)
    if foreign:
        raise UsageError(
            f"--loss fn:{spec}: {attr} is {foreign}, not a loss function of yours: name a "
            "Python function that takes the output (and the model's inputs) and returns "
            "a scalar tensor"
        )
    return fn


def _code_of(fn: Any) -> Any:
    """The Python code object behind a callable (a function, a method, a partial, an object
    whose class defines ``__call__`` in Python); None for a built-in."""
    import functools

    target = fn
    while isinstance(target, functools.partial):
        target = target.func
    if inspect.ismethod(target):
        target = target.__func__
    if inspect.isfunction(target):
        return inspect.unwrap(target).__code__
    if inspect.isroutine(target) or isinstance(target, type):
        return None  # a built-in function; a class: its instance is no loss
    mro = type(target).__mro__
    call = next((c.__dict__["__call__"] for c in mro if "__call__" in c.__dict__), None)
    return getattr(call, "__code__", None)


def _not_a_loss(fn: Any, where: str) -> str:
    """What ``fn`` (found in ``where``) is when it cannot be a user's loss: a built-in
    (``os.system``, ``torch.sum``; also ``os._exit``, which hookcli stands in for while it
    runs), a function of Python's standard library; '' otherwise."""
    import os
    import sysconfig

    if isinstance(fn, type):
        return "a class"
    code = _code_of(fn)
    here = os.path.dirname(os.path.realpath(__file__)) + os.sep
    path = os.path.realpath(code.co_filename) if code is not None else here
    if path.startswith(here):
        return f"a built-in of {where}"
    paths = sysconfig.get_paths()
    stdlib = {os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib")}
    if any(path.startswith(root) for root in stdlib) and "-packages" not in path:
        return f"a function of Python's standard library ({where})"
    return ""


def _call_loss_fn(
    fn: Callable[..., Any], spec: str, output: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Any:
    """``fn(output, *args, **kwargs)`` when its signature takes the model's inputs after the
    output, else ``fn(output)``."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        sig = None
    call_args: tuple[Any, ...] = (output,)
    call_kwargs: dict[str, Any] = {}
    if sig is not None:
        try:
            sig.bind(output, *args, **kwargs)
            call_args, call_kwargs = (output, *args), dict(kwargs)
        except TypeError:
            try:
                sig.bind(output)
            except TypeError:
                raise UsageError(
                    f"--loss fn:{spec}: {getattr(fn, '__name__', spec)}{sig} takes neither "
                    "(output) nor (output, *the model's inputs)"
                ) from None
    try:
        return fn(*call_args, **call_kwargs)
    except KeyboardInterrupt:
        raise
    except (Exception, SystemExit) as err:
        from hookcli.errors import is_oom

        if is_oom(err):
            raise
        raise RunError(f"the loss function fn:{spec} {_failed(err, fn)}") from err


def _failed(err: BaseException, fn: Callable[..., Any]) -> str:
    """``raised: ValueError: ... (raised at loss.py:3 in f)``, ``called os._exit(3) (...)``:
    where in the user's code, never hookcli's frame (the ``os._exit`` stand-in)."""
    import os

    from hookcli.errors import first_line
    from hookcli.failure import raised_at

    what = (
        f"called {getattr(err, 'via', 'sys.exit')}({err.code!r})"
        if isinstance(err, SystemExit)
        else f"raised: {first_line(err)}"
    )
    at = raised_at(err)
    if at is not None and not at.hookcli:
        return what + at.suffix()
    code = _code_of(fn)
    own = os.path.realpath(code.co_filename) if code is not None else None
    line = None
    tb = err.__traceback__
    while tb is not None:  # the innermost frame in the loss function's own file
        if own is not None and os.path.realpath(tb.tb_frame.f_code.co_filename) == own:
            line = (tb.tb_lineno, tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    if line is None or code is None:
        return what
    from hookcli.failure import RaisedAt, _shown

    where = RaisedAt(_shown(own or "", getattr(fn, "__module__", None)), *line, False)
    return what + where.suffix()


# -- the loss of a run ---------------------------------------------------------------------


class LossFunction:
    """``--loss`` bound to a run: called with the output, returns the scalar loss.

    ``natural`` is set after a default ``sum``/``mean`` call on an output that holds the
    model's own loss: the ``--loss`` that would pick it (``output:loss``, ``output:1``).
    """

    def __init__(
        self,
        loss: str | Loss | None = None,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.loss = loss_arg(loss)
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})
        self.natural: str | None = None
        self.natural_value: float | None = None
        self._looked = False
        self._fn: Callable[..., Any] | None = None
        if self.loss.kind is LossKind.FN:
            assert self.loss.arg is not None
            self._fn = load_loss_fn(self.loss.arg)

    @property
    def value(self) -> str:
        return self.loss.value

    def __call__(self, output: Any) -> torch.Tensor:
        loss = self.loss
        if loss.kind in (LossKind.SUM, LossKind.MEAN):
            total = _reduce(output, loss.kind)
            if not loss.explicit and not self._looked:
                self._looked = True
                self._look_for_natural(output)
                from hookcli.streams import progress

                if self.natural is not None:
                    value = None if total.is_meta else float(total.detach())
                    progress(f"hookcli: {self.note(value)}")
                elif loss.kind is LossKind.SUM:
                    cancelled = cancelled_sum(output, total)
                    if cancelled is not None:
                        progress(f"hookcli: {cancelled}")
            return total
        if loss.kind is LossKind.RANDOM:
            return random_projection(output)
        assert loss.arg is not None
        if loss.kind is LossKind.OUTPUT:
            return _as_loss(select_output(output, loss.arg), f"output:{loss.arg}")
        assert self._fn is not None
        value = _call_loss_fn(self._fn, loss.arg, output, self.args, self.kwargs)
        if not isinstance(value, torch.Tensor):
            raise UsageError(
                f"--loss fn:{loss.arg} returned {describe_output(value)}, not a tensor"
            )
        return _as_loss(value, f"what fn:{loss.arg} returned")

    def _look_for_natural(self, output: Any) -> None:
        found = natural_loss(output)
        if found is not None:
            self.natural, tensor = found
            self.natural_value = None if tensor.is_meta else float(tensor.detach().real.sum())

    def note(self, reduced: float | None = None) -> str | None:
        """One line naming the model's own loss and how to use it (None when there is none)."""
        if self.natural is None:
            return None
        from hookcli.render import fmt_float

        own = "" if self.natural_value is None else f" ({fmt_float(self.natural_value)})"
        this = "" if reduced is None else f" ({fmt_float(reduced)})"
        what = "mean" if self.loss.kind is LossKind.MEAN else "sum"
        return (
            f"note: the output holds the model's own loss, {self.natural}{own}; this run "
            f"backpropagated the {what} of every output{this}: pass --loss {self.natural} "
            "to use the model's"
        )


def _scalar(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.numel() == 1
        and value.dim() <= 1
        and (value.is_floating_point() or value.is_complex())
        and value.requires_grad
    )


def natural_loss(output: Any) -> tuple[str, torch.Tensor] | None:
    """``("output:loss", t)`` when the output holds a scalar named ``loss`` (a dict key,
    a dataclass or namedtuple field), ``("output:N", t)`` for a tuple or list of two or
    more whose last element N is a scalar; else None."""
    if isinstance(output, torch.Tensor) or output is None:
        return None
    found, value = _child(output, "loss")
    if found and _scalar(value):
        return "output:loss", value
    if isinstance(output, (tuple, list)) and len(output) >= 2 and _scalar(output[-1]):
        return f"output:{len(output) - 1}", output[-1]
    return None


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


def loss_notes(
    loss_fn: LossFunction, loss: float | None, totals: dict[str, Any]
) -> tuple[str, ...]:
    """The model's own loss, when a default sum ran past it (the loss function said so on
    stderr): a note in the report and ``totals.natural_loss``, the ``--loss`` that picks it."""
    note = loss_fn.note(loss)
    if note is None:
        return ()
    totals["natural_loss"] = loss_fn.natural
    return (note,)


def loss_words(loss: Loss) -> str:
    """The loss in words, for a report's header: 'sum of the outputs', 'output:loss'."""
    return {
        LossKind.SUM: "sum of the outputs",
        LossKind.MEAN: "mean of the outputs",
        LossKind.RANDOM: f"a random projection of the outputs, seed {RANDOM_SEED}",
    }.get(loss.kind, loss.value)


def make_loss(loss: str | Loss | None, inputs: Any = None) -> LossFunction:
    """A LossFunction for a run over ``inputs`` (an ``Inputs``: its args and kwargs go to
    ``fn:`` functions)."""
    args = getattr(inputs, "args", ()) if inputs is not None else ()
    kwargs = getattr(inputs, "kwargs", {}) if inputs is not None else {}
    return LossFunction(loss, args, kwargs)
