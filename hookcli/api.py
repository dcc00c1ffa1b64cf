"""The Python API: hookcli's reports for a live ``nn.Module`` and real tensors.

    import hookcli

    report = hookcli.grads(model, x, fail_on="unused", max_grad_norm=10.0)
    assert report.passed, [c.detail for c in report.failed_checks]
    print(report.render())                # the table the CLI prints
    report.to_dict()["totals"]["grad_norm"]

Each function runs the model once inside a ``HookSession`` and returns the
``Report`` the CLI renders (``.layers``, ``.totals``, ``.checks``, ``.passed``,
``.to_dict()``, ``.to_json()``, ``.render(format)``). The model is left as found
(hooks, training flags, grads, buffers), and so are the global random number
generators (torch, CUDA, ``random``, NumPy) and ``sys.path``. The CLI commands
and these functions call the same runners, each in its capability's package
(``hookcli.grads.runner.plan_grads``/``run_grads``, ...). Bad options raise
``hookcli.errors.UsageError``; a model that raises gives ``RunError``.
"""

from __future__ import annotations

import contextlib
import functools
import random
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from hookcli.errors import UnknownOptionError, UsageError
from hookcli.options import Loss, Mode
from hookcli.report import Report

if TYPE_CHECKING:
    import torch
    from torch import nn

    from hookcli.options import Hooks, Names
    from hookcli.pipeline import Outcome, Prepared


# -- options shared by the functions ---------------------------------------------------

P = ParamSpec("P")
R = TypeVar("R")


def _api(fn: Callable[P, R]) -> Callable[P, R]:
    """An API function whose call is checked first: a keyword it does not take (or a
    missing or extra argument) raises ``UnknownOptionError``, a ``UsageError`` naming it
    and its options (and a ``TypeError``, as Python's own error for such a call is)."""
    import inspect as pyinspect

    sig = pyinspect.signature(fn)
    named = pyinspect.Parameter.POSITIONAL_OR_KEYWORD, pyinspect.Parameter.KEYWORD_ONLY
    takes = [n for n, p in sig.parameters.items() if p.kind in named]
    options = [n for n, p in sig.parameters.items() if p.kind is pyinspect.Parameter.KEYWORD_ONLY]

    @functools.wraps(fn)
    def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        unknown = [k for k in kwargs if k not in takes]
        if unknown:
            raise UnknownOptionError(_unknown_options(fn.__name__, unknown, options))
        try:
            sig.bind(*args, **kwargs)
        except TypeError as err:
            raise UnknownOptionError(f"hookcli.{fn.__name__}(): {err}") from None
        return fn(*args, **kwargs)

    return checked


def _unknown_options(function: str, unknown: Sequence[str], options: Sequence[str]) -> str:
    """``hookcli.grads() has no option 'max_norm' (did you mean 'max_grad_norm'?); ...``"""
    import difflib

    names = ", ".join(repr(k) for k in unknown)
    close = [c for k in unknown for c in difflib.get_close_matches(k, options, n=1)]
    hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
    which = "option" if len(unknown) == 1 else "options"
    return f"hookcli.{function}() has no {which} {names}{hint}; its options: {', '.join(options)}"


def _mode(value: str | Mode) -> Mode:
    from hookcli.validate import choice

    return choice(value, Mode, "mode")


def _common(
    forward_kwargs: Any, seed: Any, depth: Any, global_hooks: Any = False, **flags: Any
) -> None:
    """The arguments every API function shares, checked as the CLI checks its options."""
    from hookcli.validate import check_depth, check_flag, check_mapping, check_seed

    check_mapping(forward_kwargs, "forward_kwargs")
    check_seed(seed, "seed")
    check_depth(depth, "depth")
    check_flag(global_hooks, "global_hooks")
    for name, value in flags.items():
        check_flag(value, name)


# -- running on a live model -----------------------------------------------------------


@contextlib.contextmanager
def untouched(tensors: Sequence[Any] = ()) -> Iterator[None]:
    """Restore the global RNGs, ``sys.path`` and the inputs' ``.grad`` on the way out."""
    import torch

    path = list(sys.path)
    py_state = random.getstate()
    np_random = getattr(sys.modules.get("numpy"), "random", None)
    np_state = np_random.get_state() if np_random is not None else None
    cpu_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    grads = [(t, t.grad) for t in tensors if isinstance(t, torch.Tensor) and t.requires_grad]
    for t, _ in grads:
        t.grad = None  # backward would accumulate into the caller's tensor in place
    try:
        yield
    finally:
        for t, g in grads:
            t.grad = g
        torch.set_rng_state(cpu_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
        if np_random is not None and np_state is not None:
            np_random.set_state(np_state)
        random.setstate(py_state)
        sys.path[:] = path


def _tensors(value: Any) -> list[Any]:
    from hookcli.structures import iter_tensors

    return list(iter_tensors(value))


def live(
    model: nn.Module,
    inputs: Sequence[Any],
    forward_kwargs: Mapping[str, Any] | None,
    mode: Mode,
    seed: int | None,
) -> Prepared:
    """A Prepared for a model as it is (never moved or cast) and the caller's inputs.

    No inputs: the model's ``example_input_array``, as the CLI does.
    """
    from torch import nn

    from hookcli.inputs.grammar import Inputs, _infos_of, build_inputs, positional_names
    from hookcli.pipeline import Prepared, _model_dtype
    from hookcli.sources import LoadedModel

    if not isinstance(model, nn.Module):
        raise UsageError(f"model must be an nn.Module, got {type(model).__name__}")
    from hookcli.scripted import eager_module

    model, _ = eager_module(model)  # torch.compile'd: its eager module, run uncompiled
    if inputs or forward_kwargs:
        names = positional_names(model)
        infos = []
        for pos, value in enumerate(inputs):
            infos.extend(_infos_of(names[pos] if pos < len(names) else f"input{pos}", value))
        for key, value in (forward_kwargs or {}).items():
            infos.extend(_infos_of(key, value))
        drawn = Inputs(tuple(inputs), dict(forward_kwargs or {}), tuple(infos), "api")
    elif getattr(model, "example_input_array", None) is not None:
        drawn = build_inputs(model, (), device=str(_device_of(model)))
    else:
        raise UsageError(
            "no inputs: pass the tensors forward takes (hookcli.inspect(model, x)) or give "
            "the model an example_input_array attribute"
        )
    settings: dict[str, Any] = {
        "device": str(_device_of(model, drawn.args)),
        "dtype": _model_dtype(model),
        "mode": mode.value,
    }
    if seed is not None:
        settings["seed"] = seed
    loaded = LoadedModel(module=model, spec=None)  # type: ignore[arg-type]
    return Prepared(loaded=loaded, inputs=drawn, settings=settings)


def _device_of(model: nn.Module, args: Sequence[Any] = ()) -> torch.device:
    import torch

    for p in model.parameters():
        return p.device
    for b in model.buffers():
        return b.device
    for t in _tensors(args):
        return t.device
    return torch.device("cpu")


def on_live(
    model: nn.Module,
    inputs: Sequence[Any],
    forward_kwargs: Mapping[str, Any] | None,
    mode: Mode,
    seed: int | None,
    run: Callable[[Prepared], Outcome],
) -> Report:
    """Run one report function on a live model, leaving the process as found.

    A new API function is one call of this with the command's ``run_*``.
    """
    import torch

    from hookcli.pipeline import collection_paused

    args = (*inputs, *(forward_kwargs or {}).values())
    with untouched(_tensors(args)), collection_paused():
        if seed is not None:
            torch.manual_seed(seed)  # dropout and other random ops reproducible
        report, error = run(live(model, inputs, forward_kwargs, mode, seed))
    if error is not None:
        raise error
    return report


@_api
def inspect(
    model: nn.Module,
    *inputs: Any,
    forward_kwargs: Mapping[str, Any] | None = None,
    mode: str | Mode = "eval",
    hooks: Hooks = None,
    global_hooks: bool = False,
    depth: int | None = None,
    seed: int | None = None,
    columns: Names = None,
) -> Report:
    """Per-layer input/output shapes and parameter counts, like ``hookcli inspect``.

    Args:
        model: the module, used as it is (device and dtype untouched).
        *inputs: the positional inputs of ``forward``; none: ``model.example_input_array``.
        forward_kwargs: keyword inputs of ``forward``.
        mode: ``"eval"`` or ``"train"`` for the run (restored after).
        hooks: hook kinds replacing the default ``pre,forward`` (``"pre,forward,tensor"``
            or a list); backward kinds run a backward pass of the summed output.
        global_hooks: attach through the global ``register_module_*`` hooks.
        depth: rows for modules at depth <= N only.
        seed: ``torch.manual_seed(seed)`` before the run (the RNG state is restored after).
        columns: extra row keys, as ``--columns``: ``kernel_size``, ``groups``,
            ``param_percent``, ``mult_adds``, ``trainable`` (a comma string or a list).

    Returns:
        The ``Report``: ``layers`` rows with ``name``, ``type``, ``depth``, ``call``,
        ``input_shapes``, ``output_shapes``, ``params``, ``own_params``,
        ``trainable_params``; ``totals`` with ``params``, ``trainable_params``, bytes.

    Raises:
        UsageError: a bad option or no inputs known. RunError: the model raised.
    """
    _common(forward_kwargs, seed, depth, global_hooks)
    from hookcli.inspect.runner import plan_inspect, run_inspect

    plan = plan_inspect(hooks, depth, global_hooks, columns)
    return on_live(model, inputs, forward_kwargs, _mode(mode), seed, lambda p: run_inspect(p, plan))


@_api
def grads(
    model: nn.Module,
    *inputs: Any,
    forward_kwargs: Mapping[str, Any] | None = None,
    mode: str | Mode = "train",
    loss: str | Loss | None = None,
    hooks: Hooks = None,
    global_hooks: bool = False,
    depth: int | None = None,
    per_param: bool = False,
    fail_on: Names = None,
    max_grad_norm: float | None = None,
    min_grad_norm: float | None = None,
    plot: str | Path | None = None,
    seed: int | None = None,
) -> Report:
    """Gradient flow per layer and CI checks, like ``hookcli grads``.

    Runs forward and ``loss.backward()`` once (``loss``: as ``--loss`` takes it: ``"sum"``,
    the default, of every floating-point output element, ``"mean"``, ``"random"``,
    ``"output:KEY"``, ``"fn:FILE.py:fn"``); the parameters' ``.grad`` are restored
    after, so the caller's own gradients are untouched.

    Args:
        model, *inputs, forward_kwargs, mode, hooks, global_hooks, depth, seed: as
            for ``inspect`` (``mode`` defaults to ``"train"``).
        per_param: add ``report.lists["params"]``, a row per parameter.
        fail_on: checks that fail the report: ``"nan"``, ``"inf"``, ``"unused"``,
            ``"zero-grad"``, ``"dead"`` (a comma-separated string or a list).
        max_grad_norm, min_grad_norm: bounds on every layer's ``grad_norm``.
        plot: save a gradient-flow PNG there (needs matplotlib).

    Returns:
        The ``Report``; rows add ``grad_norm``, ``weight_norm``, ``grad_output_norm``,
        ``grad_input_norm``, ``unused_params``; ``totals`` add ``loss`` and
        ``grad_norm``; ``report.passed`` is False when a check failed.
    """
    from hookcli.grads.runner import plan_grads, run_grads
    from hookcli.validate import check_number, check_path

    _common(forward_kwargs, seed, depth, global_hooks, per_param=per_param)
    check_path(plot, "plot")
    check_number(max_grad_norm, "max_grad_norm")
    check_number(min_grad_norm, "min_grad_norm")
    plan = plan_grads(
        hooks, loss, per_param, fail_on, max_grad_norm, min_grad_norm, plot, depth, global_hooks
    )
    return on_live(model, inputs, forward_kwargs, _mode(mode), seed, lambda p: run_grads(p, plan))


@_api
def stats(
    model: nn.Module,
    *inputs: Any,
    forward_kwargs: Mapping[str, Any] | None = None,
    mode: str | Mode = "eval",
    backward: bool = False,
    loss: str | Loss | None = None,
    hooks: Hooks = None,
    global_hooks: bool = False,
    depth: int | None = None,
    fail_on: Names = None,
    dead_threshold: float | None = None,
    seed: int | None = None,
) -> Report:
    """Activation statistics per layer and the first module producing NaN/Inf, like
    ``hookcli stats``.

    Args:
        model, *inputs, forward_kwargs, mode, hooks, global_hooks, depth, seed: as
            for ``inspect``.
        backward: also run backward (``loss``: as ``--loss`` takes it) and add the
            statistics of grad_output.
        fail_on: ``"nan"``, ``"inf"``, ``"dead"`` (a string or a list).
        dead_threshold: ``dead`` fails a module when at least this fraction of its
            outputs is zero (implies ``fail_on="dead"``).

    Returns:
        The ``Report``; rows add ``mean``, ``std``, ``min``, ``max``, ``mean_abs``,
        ``zero_fraction``, ``nan``, ``inf`` of the outputs (``grad_*`` with backward);
        ``report.notes`` names the first module producing NaN/Inf.
    """
    from hookcli.stats.runner import plan_stats, run_stats
    from hookcli.validate import check_number

    _common(forward_kwargs, seed, depth, global_hooks, backward=backward)
    check_number(dead_threshold, "dead_threshold")
    plan = plan_stats(hooks, backward, loss, fail_on, dead_threshold, depth, global_hooks)
    return on_live(model, inputs, forward_kwargs, _mode(mode), seed, lambda p: run_stats(p, plan))


# -- cost ----------------------------------------------------------------------------------


@_api
def cost(
    model: nn.Module,
    *inputs: Any,
    forward_kwargs: Mapping[str, Any] | None = None,
    mode: str | Mode = "eval",
    backward: bool = False,
    loss: str | Loss | None = None,
    optimizer: str = "adam",
    zero_grad: str | None = None,
    checkpoint: str | None = None,
    foreach: bool | None = None,
    amp: str | None = None,
    fit: str | int | None = None,
    max_memory: str | int | None = None,
    memory_for: str = "train",
    max_flops: str | int | None = None,
    global_hooks: bool = False,
    depth: int | None = None,
    seed: int | None = None,
) -> Report:
    """FLOPs, MACs and memory per layer, and training and inference totals, like
    ``hookcli cost``. Works on a model on meta.

    Args:
        model, *inputs, forward_kwargs, mode, global_hooks, depth, seed: as for ``inspect``.
        backward: also run a backward pass and count ``backward_flops``; and one
            steady-state training step under the live-bytes tracker (its peak:
            ``totals["step_peak_bytes"]``).
        loss: where backward starts, as ``--loss`` takes it (``"sum"``, the default).
        optimizer: ``"adam"``, ``"adamw"``, ``"sgd"``, ``"sgd-momentum"``, ``"adafactor"``
            or ``"none"``: whose state the training-step total holds (and, with
            ``backward``, the optimizer of the tracked step).
        zero_grad: the step's ``zero_grad``: ``"none"`` (set_to_none, the default) or
            ``"zeros"``. Turns ``backward`` on, as ``checkpoint``, ``foreach`` and ``fit`` do.
        checkpoint: ``torch.utils.checkpoint`` around every module of this class name.
        foreach: the optimizer's foreach implementation on (True) or off (False); None:
            torch's choice on the device.
        amp: ``"bf16"`` or ``"fp16"``: every forward under ``torch.autocast`` on the
            model's device; on meta, autocast emulated with the CUDA policy
            (``settings["amp_policy"]``).
        fit: the largest batch whose training-step peak fits in this size (``"80GiB"`` or
            bytes), searched on meta (the model and inputs on meta): ``totals["fit_batch"]``.
        max_memory: a ``max-memory`` check on the total ``memory_for`` names
            (``"train"`` or ``"inference"``): bytes, or a size such as ``"24GiB"``.
        max_flops: a ``max-flops`` check on the forward FLOPs (``"4.1G"`` or a number).

    Returns:
        The ``Report``; rows add ``flops``, ``macs``, ``own_flops``, ``param_bytes``,
        ``output_bytes``, ``saved_bytes``...; ``totals`` the memory totals in bytes;
        ``report.lists["uncounted_ops"]`` every op that ran without a FLOP formula.
    """
    from hookcli.cost.runner import MemoryTotal, Optimizer, ZeroGrad, plan_cost, run_cost
    from hookcli.cost.sizes import MAX_COUNT, MAX_SIZE, parse_count, parse_size
    from hookcli.validate import check_size, choice

    _common(forward_kwargs, seed, depth, global_hooks, backward=backward)
    optimizer = choice(optimizer, Optimizer, "optimizer").value
    memory_for = choice(memory_for, MemoryTotal, "memory_for").value
    if zero_grad is not None:
        zero_grad = choice(zero_grad, ZeroGrad, "zero_grad").value
    if checkpoint is not None and not isinstance(checkpoint, str):
        raise UsageError(f"checkpoint must be a module class name, got {checkpoint!r}")
    if foreach is not None and not isinstance(foreach, bool):
        raise UsageError(f"foreach must be True, False or None, got {foreach!r}")
    max_memory = check_size(max_memory, "max_memory", parse_size, MAX_SIZE)
    max_flops = check_size(max_flops, "max_flops", parse_count, MAX_COUNT)
    fit = check_size(fit, "fit", parse_size, MAX_SIZE)
    plan = plan_cost(
        backward,
        optimizer,
        max_memory,
        memory_for,
        max_flops,
        depth,
        global_hooks,
        loss,
        zero_grad,
        checkpoint,
        fit,
        foreach,
    )

    def run(prepared: Prepared) -> Outcome:
        from hookcli import amp as autocast

        with autocast.requested(amp), autocast.meta_allowed():
            device = _device_of(prepared.model, prepared.inputs.args if prepared.inputs else ())
            if autocast.activate(autocast.check(amp, device), device) is not None:
                prepared.settings["amp"] = amp
            return run_cost(prepared, plan)

    return on_live(model, inputs, forward_kwargs, _mode(mode), seed, run)


# -- profile -------------------------------------------------------------------------------


@_api
def profile(
    model: nn.Module,
    *inputs: Any,
    forward_kwargs: Mapping[str, Any] | None = None,
    mode: str | Mode = "eval",
    backward: bool = False,
    warmup: int = 2,
    repeat: int = 10,
    sort: str = "self",
    max_ms: str | Sequence[str] | None = None,
    sync: bool = False,
    depth: int | None = None,
    trace_out: str | Path | None = None,
    plot: str | Path | None = None,
    seed: int | None = None,
) -> Report:
    """Time per module, forward (and backward), like ``hookcli profile``.

    Args:
        model, *inputs, forward_kwargs, mode, depth, seed: as for ``inspect``.
        backward: also time backward (loss: the sum of the outputs) per module.
        warmup, repeat: untimed passes first, then timed passes (median and IQR).
        sort: row order, most first: ``"self"``, ``"inclusive"``, ``"calls"``, ``"flops"``.
        max_ms: ``"GLOB:MS"`` gates (one or a list): a ``max-ms`` check fails when a
            matching module's median forward time is over MS milliseconds.
        sync: on cuda, synchronize in every hook instead of recording CUDA events.
        trace_out: write the timed passes as Chrome trace-event JSON to this path.
        plot: write a bar chart of the top 20 modules by self time (PNG).

    Returns:
        The ``Report``: ``report.rows("modules")`` one row per module (``forward_ms``,
        ``forward_self_ms``, ``backward_ms``, ``calls``, ``flops_per_s``...); ``totals``
        with ``forward_ms``, ``backward_ms`` and ``overhead_ratio``.

    Raises:
        UsageError: a bad argument (checked as the CLI checks its options, before the
            model runs) or no inputs known. RunError: the model raised.
    """
    from hookcli.profile.plan import SortKey
    from hookcli.profile.runner import plan_profile, run_profile
    from hookcli.validate import check_count, check_path, check_strings, choice

    _common(forward_kwargs, seed, depth, backward=backward, sync=sync)
    warmup = check_count(warmup, "warmup", 0)
    repeat = check_count(repeat, "repeat", 1)
    key = choice(sort, SortKey, "sort")
    gates = check_strings(max_ms, "max_ms")
    check_path(trace_out, "trace_out")
    check_path(plot, "plot")
    plan = plan_profile(backward, warmup, repeat, key, gates, sync, depth, trace_out, plot)
    return on_live(model, inputs, forward_kwargs, _mode(mode), seed, lambda p: run_profile(p, plan))


# -- diff -------------------------------------------------------------------------------------


@_api
def diff(
    old: Report | Mapping[str, Any] | str | Path,
    new: Report | Mapping[str, Any] | str | Path,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    only: Names = None,
    ignore: Names = None,
) -> Report:
    """Compare two reports of one command, like ``hookcli diff OLD NEW``.

    Args:
        old, new: ``Report`` objects, their ``to_dict()``, or paths of JSON reports.
            ``old`` is the expected one (the baseline).
        rtol, atol: tolerances of numeric values; default: ``torch.testing.assert_close``'s
            for the reports' dtype (float32: 1.3e-6, 1e-5), integers exact.
        only, ignore: the keys (columns, totals, settings; fnmatch patterns) to compare.

    Returns:
        A ``Report`` of command ``diff``: ``report.passed`` is True when the reports are
        the same within tolerance; ``report.rows("differences")`` lists each difference
        (``kind``, ``where``, ``item``, ``key``, ``change``, ``old``, ``new``,
        ``abs_diff``, ``rel_diff``).

    Raises:
        UsageError: an input is not a hookcli report, or the two come from different
            commands or schema versions.
    """
    from hookcli.diff import diff_reports, load_report, parse_keys, to_report
    from hookcli.validate import check_number

    check_number(rtol, "rtol")
    check_number(atol, "atol")
    for name, keys in (("only", only), ("ignore", ignore)):
        if keys is not None and not (
            isinstance(keys, str)
            or (isinstance(keys, Sequence) and all(isinstance(k, str) for k in keys))
        ):
            raise UsageError(f"{name} must be a string or a list of strings, got {keys!r}")

    def read(value: Report | Mapping[str, Any] | str | Path) -> tuple[Any, str]:
        if not isinstance(value, (Report, Mapping, str, Path)):
            raise UsageError(
                "old and new must be Reports, their to_dict(), or paths of JSON reports; "
                f"got {type(value).__name__}"
            )
        if isinstance(value, (str, Path)):
            return load_report(value), str(value)
        return value, "report"

    (a, la), (b, lb) = read(old), read(new)
    result = diff_reports(
        a,
        b,
        rtol=rtol,
        atol=atol,
        only=parse_keys(only),
        ignore=parse_keys(ignore),
        labels=(la if la != "report" else "old", lb if lb != "report" else "new"),
    )
    return to_report(result, la, lb)


# -- compare ---------------------------------------------------------------------------------


@_api
def compare(
    a: nn.Module,
    b: nn.Module | None = None,
    inputs: Any = (),
    *,
    forward_kwargs: Mapping[str, Any] | None = None,
    vs: str | Sequence[str] | None = None,
    map: str | Sequence[str] | None = None,  # the option's name, as --map
    align: str = "auto",
    copy_weights: bool = False,
    rtol: float | None = None,
    atol: float | None = None,
    fail_on: Names = None,
    mode: str | Mode = "eval",
    seed: int | None = None,
) -> Report:
    """Two models (or one model under one changed setting) on the same inputs, module call
    by module call, like ``hookcli compare``.

    Args:
        a: the reference model (run as it is).
        b: the other model; None with ``vs`` for a copy of ``a`` changed as ``vs`` says.
        inputs: the positional inputs of forward (a tensor or a tuple); B gets the same
            values (cast or moved where ``vs`` changes dtype or device); each pass runs
            on its own copy, so a forward writing its input leaves these as they are.
        forward_kwargs: keyword inputs.
        vs: ``"amp=bf16"``, ``"dtype=float16"``, ``"quantize=dynamic"``, ... (a string or
            a list), as ``--vs`` takes them.
        map: ``--map`` rules (``"transformer.h.{i}.attn=model.layers.{i}.self_attn"``).
        align: ``auto``, ``names`` or ``order``.
        copy_weights: give ``b`` a's parameters through the alignment (``b`` is changed).
        rtol, atol: the tolerance (default: ``torch.testing.assert_close``'s by dtype).
        fail_on: ``"divergence"``: the report's check fails at the first divergence.
        mode, seed: as for ``inspect``.

    Returns:
        The ``Report``: ``calls`` rows with both modes' figures; ``to_dict()`` holds
        ``first_divergence`` (``module``, ``partner``, ``call``, ...), its local twin,
        ``local_ranking``, ``unaligned_a`` and ``unaligned_b``.
    """
    import copy

    import torch

    from hookcli.cliopts import ci_options, parse_fail_on
    from hookcli.compare.align import parse_rules
    from hookcli.compare.runner import Plan, Side, run_compare
    from hookcli.compare.settings import Vs, caller, parse_vs, transform
    from hookcli.compare.settings import check as check_vs
    from hookcli.options import names_arg
    from hookcli.pipeline import Prepared, collection_paused
    from hookcli.sources import LoadedModel

    _common(forward_kwargs, seed, None, False, copy_weights=copy_weights)
    the_vs = parse_vs([vs] if isinstance(vs, str) else list(vs or ()))
    check_vs(the_vs, dtype=None, backward=False)  # (what --vs cannot do: before any run)
    if (b is None) == (not the_vs.given):
        raise UsageError("compare needs b (another model) or vs (a setting), one of them")
    rules = parse_rules([map] if isinstance(map, str) else list(map or ()))
    gates = parse_fail_on(names_arg(fail_on), ("divergence",))
    ci_options(None, False, None, None, rtol, atol)  # (negative, NaN, inf: UsageError)
    args = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    the_mode = _mode(mode)
    plan = Plan(rules, align, rtol, atol, "divergence" in gates, copy_weights)
    with untouched(_tensors((*args, *(forward_kwargs or {}).values()))), collection_paused():
        pa = live(a, args, forward_kwargs, the_mode, seed)
        if b is None:
            device = torch.device(the_vs.device) if the_vs.device else _device_of(a, args)
            b = copy.deepcopy(a)
            if the_vs.weights is not None:  # (B loads them, as --vs weights= does)
                from hookcli.compare.settings import weights_named
                from hookcli.weights import apply_weights

                with weights_named(the_vs):
                    apply_weights(b, the_vs.weights)
            b = transform(b, the_vs, device)
        pb = live(b, args, forward_kwargs, the_mode, seed)
        settings = dict(pb.settings)
        if the_vs.device:
            settings["device"] = str(torch.device(the_vs.device))
        pb = Prepared(LoadedModel(module=b, spec=None), None, settings)  # type: ignore[arg-type]
        side_a = Side("A", pa, pa.model, Vs(), 0 if seed is None else seed)
        side_b = Side("B", pb, caller(b, the_vs), the_vs, 0 if seed is None else seed)
        result = run_compare(side_a, side_b, plan, the_mode)
    assert not isinstance(result, str)
    return result


__all__ = ["Report", "compare", "cost", "diff", "grads", "inspect", "profile", "stats"]
