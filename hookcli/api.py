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
are thin layers over the ``run_*`` functions here. Bad options raise
``hookcli.errors.UsageError``; a model that raises gives ``RunError``.
"""

from __future__ import annotations

import contextlib
import random
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hookcli.errors import RunError, UsageError
from hookcli.options import HookKind, LossKind, Mode, parse_hook_kinds
from hookcli.report import Report

if TYPE_CHECKING:
    import torch
    from torch import nn

    from hookcli.checks.grads import GradGates
    from hookcli.pipeline import Prepared
    from hookcli.probes.grads import GradFindings
    from hookcli.report import CheckResult, Row
    from hookcli.session import CallRecord

Hooks = str | Sequence[str | HookKind] | None
Names = str | Sequence[str] | None
Outcome = tuple[Report, RunError | None]  # the report (also of a failed run) and the failure


# -- options shared by the functions ---------------------------------------------------


def _kinds(hooks: Hooks) -> tuple[HookKind, ...] | None:
    if hooks is None or isinstance(hooks, str):
        return parse_hook_kinds(hooks)
    items = [k.value if isinstance(k, HookKind) else k for k in _strings(hooks, "hooks")]
    return parse_hook_kinds(",".join(items))


def _strings(value: Any, option: str) -> list[Any]:
    if isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        return list(value)
    raise UsageError(f"{option} must be a string or a list of strings, got {value!r}")


def _names(value: Names) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return ",".join(_strings(value, "fail_on"))


def _mode(value: str | Mode) -> Mode:
    from hookcli.validate import choice

    return choice(value, Mode, "mode")


def _loss(value: str | LossKind) -> LossKind:
    from hookcli.validate import choice

    return choice(value, LossKind, "loss")


def _common(forward_kwargs: Any, seed: Any, depth: Any, global_hooks: Any, **flags: Any) -> None:
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

    from hookcli.inputs import Inputs, _infos_of, build_inputs, positional_names
    from hookcli.loading import LoadedModel
    from hookcli.pipeline import Prepared, _model_dtype

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

    args = (*inputs, *(forward_kwargs or {}).values())
    with untouched(_tensors(args)):
        if seed is not None:
            torch.manual_seed(seed)  # dropout and other random ops reproducible
        report, error = run(live(model, inputs, forward_kwargs, mode, seed))
    if error is not None:
        raise error
    return report


# -- inspect ----------------------------------------------------------------------------


@dataclass(frozen=True)
class InspectPlan:
    """The options of ``inspect``, checked."""

    kinds: tuple[HookKind, ...]
    depth: int | None = None
    global_hooks: bool = False
    columns: tuple[str, ...] = ()  # --columns: kernel_size, groups, mult_adds, ...


INSPECT_KINDS = (HookKind.PRE, HookKind.FORWARD)


def plan_inspect(
    hooks: Hooks = None,
    depth: int | None = None,
    global_hooks: bool = False,
    columns: Names = None,
) -> InspectPlan:
    """Check the options of ``inspect`` (UsageError)."""
    from hookcli.layers import parse_columns

    cols = parse_columns(_names(columns))
    return InspectPlan(_kinds(hooks) or INSPECT_KINDS, _depth(depth), global_hooks, cols)


def _depth(depth: int | None) -> int | None:
    if depth is not None and depth < 0:
        raise UsageError(f"depth must be >= 0, got {depth}")
    return depth


def run_inspect(prepared: Prepared, plan: InspectPlan) -> Outcome:
    """Shapes and parameters per module call."""
    from hookcli.layers import (
        PARAM_COLUMNS,
        inspect_totals,
        layer_rows,
        param_totals,
        params_not_run,
        shape_columns,
        with_columns,
    )
    from hookcli.pipeline import run_session
    from hookcli.probes import backward_probes

    kinds = plan.kinds
    probes = backward_probes(kinds)
    mode = Mode(prepared.settings["mode"])
    outcome = run_session(prepared, probes, mode=mode, global_hooks=plan.global_hooks)
    rows, unshown = layer_rows(
        outcome.records, prepared.model, depth=plan.depth, kinds=kinds, probes=probes
    )
    model_totals, extra_cols = inspect_totals(prepared.model, probes)
    model_totals["params_not_run"] = params_not_run(outcome.records, prepared.model)
    rows, chosen = with_columns(
        prepared,
        rows,
        plan.columns,
        model_totals["params"],
        ran=outcome.error is None,
        global_hooks=plan.global_hooks,
    )
    report = Report(
        command="inspect",
        model=prepared.model_info(),
        settings=prepared.settings,
        inputs=prepared.input_dicts(),
        layers=rows,
        totals=model_totals,
        error=outcome.error.message if outcome.error else None,
        columns=(*shape_columns(kinds), *extra_cols, *PARAM_COLUMNS, *chosen),
        table_totals=tuple(param_totals(model_totals, unshown)),
    )
    return report, outcome.error


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
    plan = plan_inspect(hooks, depth, global_hooks, columns)
    return on_live(model, inputs, forward_kwargs, _mode(mode), seed, lambda p: run_inspect(p, plan))


# -- grads ----------------------------------------------------------------------------------

GRADS_KINDS = (HookKind.FORWARD, HookKind.BACKWARD_PRE, HookKind.BACKWARD, HookKind.TENSOR)
_BATCHNORM_MARKERS = (
    "Expected more than 1 value per channel when training",
    "Expected more than 1 spatial element when training",
)
_TARGETS_MARKERS = ("targets should not be none when in training mode",)
_TRAIN_MODE_HINTS = (
    (
        _BATCHNORM_MARKERS,
        "in train mode batch norm needs more than one value per channel: pass a larger "
        "batch (-b 2) or --mode eval",
    ),
    (
        _TARGETS_MARKERS,
        "in train mode a torchvision detection model needs targets (boxes and labels) and "
        "returns losses: pass --mode eval to run it on images alone",
    ),
)


@dataclass(frozen=True)
class GradsPlan:
    """The options of ``grads``, checked."""

    kinds: tuple[HookKind, ...]
    explicit: bool
    loss: LossKind
    per_param: bool
    gates: GradGates
    plot: Path | None = None
    depth: int | None = None
    global_hooks: bool = False
    wide: bool = False  # per-parameter rows are the primary list (CSV/Markdown)


def plan_grads(
    hooks: Hooks = None,
    loss: str | LossKind = "sum",
    per_param: bool = False,
    fail_on: Names = None,
    max_grad_norm: float | None = None,
    min_grad_norm: float | None = None,
    plot: str | Path | None = None,
    depth: int | None = None,
    global_hooks: bool = False,
    device: str | None = None,
    ddp: bool = False,
) -> GradsPlan:
    """Check the options of ``grads`` (UsageError), before any model is built.

    ``desync`` is a check across ranks: it needs ``ddp`` (the CLI's --ddp).
    """
    from hookcli.checks.grads import FAIL_ON, NEED_PARAM_GRADS, GradGates
    from hookcli.cliopts import parse_fail_on

    explicit_kinds = _kinds(hooks)
    kinds = explicit_kinds or GRADS_KINDS
    for name, bound in (("max_grad_norm", max_grad_norm), ("min_grad_norm", min_grad_norm)):
        if bound is not None and not bound >= 0:
            raise UsageError(f"{name} must be >= 0, got {bound}")
    gates = GradGates(
        parse_fail_on(_names(fail_on), (*FAIL_ON, "desync")), max_grad_norm, min_grad_norm
    )
    if "desync" in gates.fail_on and not ddp:
        raise UsageError("--fail-on desync needs --ddp (under torchrun or srun)")
    plot_path = None if plot is None else Path(plot)
    if HookKind.TENSOR not in kinds:
        needs = [f"--fail-on {n}" for n in gates.fail_on if n in NEED_PARAM_GRADS]
        needs += ["--max-grad-norm"] if max_grad_norm is not None else []
        needs += ["--min-grad-norm"] if min_grad_norm is not None else []
        needs += ["--plot"] if plot_path is not None else []
        needs += ["--per-param"] if per_param else []
        if needs:
            raise UsageError(
                f"{', '.join(needs)} needs parameter grads: add the tensor kind to --hooks"
            )
    if device is not None and device.strip().lower() == "meta":
        raise UsageError("grads needs real gradient values; --device meta only gives shapes")
    if plot_path is not None:
        from hookcli.plot import require_matplotlib
        from hookcli.plot.gradflow import check_plot_path

        require_matplotlib()  # exit 2 before any work when matplotlib is missing
        check_plot_path(plot_path)
    return GradsPlan(
        kinds=kinds,
        explicit=explicit_kinds is not None,
        loss=_loss(loss),
        per_param=per_param,
        gates=gates,
        plot=plot_path,
        depth=_depth(depth),
        global_hooks=global_hooks,
    )


def run_grads(prepared: Prepared, plan: GradsPlan) -> Outcome:
    """Gradient flow per module call, the totals and the checks."""
    from hookcli.checks.grads import run_checks
    from hookcli.layers import (
        PARAM_COLUMNS,
        layer_rows,
        param_totals,
        params_not_run,
        shape_columns,
    )
    from hookcli.losses import reduce_output
    from hookcli.modelinfo import totals
    from hookcli.pipeline import progress, run_session
    from hookcli.probes.grads import GradProbe

    if prepared.settings["device"] == "meta":
        raise UsageError("grads needs real gradient values; the meta device only gives shapes")
    kinds, gates, loss_kind = plan.kinds, plan.gates, plan.loss
    mode = Mode(prepared.settings["mode"])
    probe = GradProbe(
        frozenset(kinds),
        per_param=plan.per_param,
        output_hooks=plan.explicit and HookKind.TENSOR in kinds,
        watch_forward=bool({"nan", "inf", "dead"} & set(gates.fail_on)),
        flag_inf="inf" in gates.fail_on,
    )
    outcome = run_session(
        prepared,
        [probe],
        mode=mode,
        global_hooks=plan.global_hooks,
        backward=True,
        loss_fn=lambda output: reduce_output(output, loss_kind.value),
    )
    error = _with_hint(outcome.error, mode)
    findings = probe.findings
    assert findings is not None
    checks = () if error is not None else run_checks(gates, findings, outcome.records, outcome.loss)
    rows, unshown = layer_rows(
        outcome.records, prepared.model, depth=plan.depth, kinds=kinds, probes=[probe]
    )
    rows = _mark(rows, checks, findings, outcome.records)
    model_totals: dict[str, Any] = dict(totals(prepared.model))
    model_totals["params_not_run"] = params_not_run(outcome.records, prepared.model)
    model_totals["loss"] = outcome.loss
    model_totals.update(probe.totals())
    settings = {**prepared.settings, "loss": loss_kind.value}
    lists: dict[str, tuple[Row, ...]] = {}
    if plan.per_param:
        lists["params"] = _param_rows(findings)
    report = Report(
        command="grads",
        model=prepared.model_info(),
        settings=settings,
        inputs=prepared.input_dicts(),
        layers=rows,
        totals=model_totals,
        checks=checks,
        lists=lists,
        primary="params" if plan.per_param and plan.wide else "layers",
        error=error.message if error else None,
        columns=(*shape_columns(kinds), *probe.table_columns, PARAM_COLUMNS[0]),
        table_totals=(*param_totals(model_totals, unshown), *_grad_totals(model_totals)),
    )
    if plan.plot is not None and error is None:
        from hookcli.plot.gradflow import plot_gradflow

        spec = prepared.loaded.spec or type(prepared.model).__name__
        title = f"gradient flow: {spec} ({loss_kind.value} loss)"
        plot_gradflow(_flow_points(findings, outcome.records, prepared), plan.plot, title)
        progress(f"gradient-flow plot written to {plan.plot}")
    return report, error


def grads(
    model: nn.Module,
    *inputs: Any,
    forward_kwargs: Mapping[str, Any] | None = None,
    mode: str | Mode = "train",
    loss: str | LossKind = "sum",
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

    Runs forward and ``loss.backward()`` once (``loss``: ``"sum"`` or ``"mean"`` of
    every floating-point output element); the parameters' ``.grad`` are restored
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
    from hookcli.validate import check_number

    _common(forward_kwargs, seed, depth, global_hooks, per_param=per_param)
    check_number(max_grad_norm, "max_grad_norm")
    check_number(min_grad_norm, "min_grad_norm")
    plan = plan_grads(
        hooks, loss, per_param, fail_on, max_grad_norm, min_grad_norm, plot, depth, global_hooks
    )
    return on_live(model, inputs, forward_kwargs, _mode(mode), seed, lambda p: run_grads(p, plan))


def _with_hint(error: RunError | None, mode: Mode) -> RunError | None:
    """A failure that train mode causes (batch norm on a batch of one, a detection model
    wanting targets): say how to get past it."""
    if error is None or mode is not Mode.TRAIN:
        return error
    for markers, hint in _TRAIN_MODE_HINTS:
        if any(m in error.message for m in markers):
            hinted = RunError(f"{error.message}; hint: {hint}", module=error.module)
            hinted.__cause__ = error.__cause__
            return hinted
    return error


def _mark(
    rows: tuple[Row, ...],
    checks: tuple[CheckResult, ...],
    findings: GradFindings,
    records: tuple[CallRecord, ...],
) -> tuple[Row, ...]:
    """Rows that failed a check get '<- FAIL name, ...' after their name in the table."""
    from hookcli.checks import layer_label
    from hookcli.report import Row

    failed = [c for c in checks if not c.passed]
    if not failed:
        return rows
    module_ids = {r.name: r.module_id for r in records}
    marked: list[Row] = []
    for row in rows:
        name, call = row.data["name"], row.data["call"]
        labels = {layer_label(name, call), layer_label(name)}
        module_id = module_ids.get(name)
        own = set(findings.module_params.get(module_id, ())) if module_id is not None else set()
        hits = []
        for c in failed:
            layers = set(c.layers)
            per_call = c.name in ("nan", "inf", "dead")
            if (layer_label(name, call) in layers if per_call else labels & layers) or own & layers:
                hits.append(c.name)
        if hits:
            mark = f"<- FAIL {', '.join(hits)}"
            if row.display.get("mark"):
                mark = f"{row.display['mark']} {mark}"
            marked.append(Row.of(row.data, {**row.display, "mark": mark}))
        else:
            marked.append(row)
    return tuple(marked)


def _param_rows(findings: GradFindings) -> tuple[Row, ...]:
    from hookcli.report import Row

    return tuple(
        Row.of(
            {
                "name": p.name,
                "shape": list(p.shape),
                "dtype": p.dtype,
                "requires_grad": p.requires_grad,
                "grad_norm": p.grad_norm,
                "weight_norm": p.weight_norm,
                "grad_weight_ratio": p.ratio,
                "nan_count": p.nan_count,
                "inf_count": p.inf_count,
            }
        )
        for p in findings.params
    )


def _grad_totals(t: dict[str, Any]) -> list[tuple[str, str]]:
    from hookcli.render import fmt_float

    out = [("Loss", fmt_float(t.get("loss")))]
    if "grad_norm" in t:
        out.append(("Total grad norm", fmt_float(t["grad_norm"])))
    if t.get("unused_params"):
        out.append(("Unused params", ", ".join(t["unused_params"])))
    return out


def _flow_points(
    findings: GradFindings, records: tuple[CallRecord, ...], prepared: Prepared
) -> list[Any]:
    """One point per module owning trainable params: forward order, then modules never run."""
    from hookcli.plot.gradflow import FlowPoint

    points = []
    seen: set[int] = set()
    for r in records:
        if r.module_id in seen or not findings.module_params.get(r.module_id):
            continue
        seen.add(r.module_id)
        points.append(FlowPoint(r.name or "(root)", findings.modules[r.module_id].grad_norm))
    for name, m in prepared.model.named_modules():
        if id(m) not in seen and findings.module_params.get(id(m)):
            seen.add(id(m))
            points.append(FlowPoint(name or "(root)", findings.modules[id(m)].grad_norm))
    return points


# -- stats ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StatsPlan:
    """The options of ``stats``, checked."""

    kinds: tuple[HookKind, ...]
    checks: tuple[str, ...]
    backward: bool
    loss: LossKind
    dead_threshold: float | None = None
    depth: int | None = None
    global_hooks: bool = False


def plan_stats(
    hooks: Hooks = None,
    backward: bool = False,
    loss: str | LossKind = "sum",
    fail_on: Names = None,
    dead_threshold: float | None = None,
    depth: int | None = None,
    global_hooks: bool = False,
    ddp: bool = False,
) -> StatsPlan:
    """Check the options of ``stats`` (UsageError), before any model is built.

    ``desync`` is a check across ranks: it needs ``ddp`` (the CLI's --ddp).
    """
    from hookcli.checks.stats import STATS_CHECKS
    from hookcli.cliopts import parse_fail_on

    given = _kinds(hooks)
    if given is not None:
        kinds = given
    else:
        kinds = (HookKind.FORWARD, HookKind.BACKWARD_PRE) if backward else (HookKind.FORWARD,)
    checks = parse_fail_on(_names(fail_on), (*STATS_CHECKS, "desync") if ddp else STATS_CHECKS)
    if dead_threshold is not None:
        if not 0 < dead_threshold <= 1:
            raise UsageError(f"--dead-threshold must be in (0, 1], got {dead_threshold:g}")
        if "dead" not in checks:
            checks = (*checks, "dead")
    if "dead" in checks and HookKind.FORWARD not in kinds:
        raise UsageError("--fail-on dead needs the forward statistics: add forward to --hooks")
    stat_kinds = [k for k in kinds if k is not HookKind.PRE]
    if checks and not stat_kinds:
        raise UsageError(
            f"--fail-on {','.join(checks)} needs statistics: add forward (or a backward kind) "
            "to --hooks"
        )
    return StatsPlan(
        kinds=kinds,
        checks=checks,
        backward=backward,
        loss=_loss(loss),
        dead_threshold=dead_threshold,
        depth=_depth(depth),
        global_hooks=global_hooks,
    )


def run_stats(prepared: Prepared, plan: StatsPlan) -> Outcome:
    """Activation statistics per module call, the NaN/Inf origin and the checks."""
    from functools import partial

    from hookcli.checks import layer_label
    from hookcli.checks.stats import CallStats, stats_checks
    from hookcli.layers import layer_rows, shape_columns
    from hookcli.losses import reduce_output
    from hookcli.pipeline import run_session
    from hookcli.probes.stats import StatsProbe

    if prepared.settings["device"] == "meta":
        raise UsageError("stats needs values: --device meta holds shapes only")
    kinds = plan.kinds
    probe = StatsProbe(kinds)
    run_backward = plan.backward or any(k.is_backward for k in kinds)
    outcome = run_session(
        prepared,
        [probe],
        mode=Mode(prepared.settings["mode"]),
        global_hooks=plan.global_hooks,
        backward=run_backward,
        loss_fn=partial(reduce_output, kind=plan.loss.value),
    )
    error = _with_hint(outcome.error, Mode(prepared.settings["mode"]))
    rows, _ = layer_rows(
        outcome.records, prepared.model, depth=plan.depth, kinds=kinds, probes=[probe]
    )
    calls = [
        CallStats(
            label=layer_label(r.name, r.call),
            output=probe.forward_stats(r.index),
            grads=probe.grad_stats(r),
        )
        for r in outcome.records
    ]
    origin = probe.origin.label if probe.origin else None
    results = stats_checks(
        calls,
        plan.checks,
        origin=origin,
        dead_threshold=plan.dead_threshold,
        with_grads=run_backward,
    )
    totals = dict(probe.totals())
    if outcome.loss is not None:
        totals["loss"] = outcome.loss
    report = Report(
        command="stats",
        model=prepared.model_info(),
        settings=prepared.settings,
        inputs=prepared.input_dicts(),
        layers=rows,
        totals=totals,
        checks=results,
        notes=_stats_notes(probe, outcome.loss, plan.loss.value),
        error=error.message if error else None,
        columns=(*shape_columns(kinds), *probe.table_columns),
    )
    return report, error


def stats(
    model: nn.Module,
    *inputs: Any,
    forward_kwargs: Mapping[str, Any] | None = None,
    mode: str | Mode = "eval",
    backward: bool = False,
    loss: str | LossKind = "sum",
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
        backward: also run backward (``loss``: ``"sum"`` or ``"mean"``) and add the
            statistics of grad_output.
        fail_on: ``"nan"``, ``"inf"``, ``"dead"`` (a string or a list).
        dead_threshold: ``dead`` fails a module when at least this fraction of its
            outputs is zero (implies ``fail_on="dead"``).

    Returns:
        The ``Report``; rows add ``mean``, ``std``, ``min``, ``max``, ``mean_abs``,
        ``zero_fraction``, ``nan``, ``inf`` of the outputs (``grad_*`` with backward);
        ``report.notes`` names the first module producing NaN/Inf.
    """
    from hookcli.validate import check_number

    _common(forward_kwargs, seed, depth, global_hooks, backward=backward)
    check_number(dead_threshold, "dead_threshold")
    plan = plan_stats(hooks, backward, loss, fail_on, dead_threshold, depth, global_hooks)
    return on_live(model, inputs, forward_kwargs, _mode(mode), seed, lambda p: run_stats(p, plan))


def _stats_notes(probe: Any, loss: float | None, loss_kind: str) -> tuple[str, ...]:
    """Header lines of the table: the NaN/Inf origin and the loss."""
    from hookcli.render import fmt_float

    notes: list[str] = []
    if HookKind.FORWARD in probe.kinds:
        if probe.origin is not None:
            notes.append(
                f"NaN/Inf origin: {probe.origin.label} ({probe.origin.type}), the first module "
                f"to output NaN/Inf from finite inputs; {probe.nonfinite_calls} call(s) "
                "output NaN/Inf"
            )
        elif probe.nonfinite_calls:
            notes.append(
                f"NaN/Inf in {probe.nonfinite_calls} call(s), but no module turned finite "
                "inputs into them (do the model's inputs hold NaN/Inf?)"
            )
        else:
            notes.append("NaN/Inf origin: none (no module output holds NaN or Inf)")
    if loss is not None:
        notes.append(f"loss ({loss_kind} of the outputs): {fmt_float(loss)}")
    return tuple(notes)


# -- cost ----------------------------------------------------------------------------------


def cost(
    model: nn.Module,
    *inputs: Any,
    forward_kwargs: Mapping[str, Any] | None = None,
    mode: str | Mode = "eval",
    backward: bool = False,
    optimizer: str = "adam",
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
        backward: also run a backward pass and count ``backward_flops``.
        optimizer: ``"adam"``, ``"adamw"``, ``"sgd"``, ``"sgd-momentum"`` or ``"none"``:
            whose state the training-step total holds.
        max_memory: a ``max-memory`` check on the total ``memory_for`` names
            (``"train"`` or ``"inference"``): bytes, or a size such as ``"24GiB"``.
        max_flops: a ``max-flops`` check on the forward FLOPs (``"4.1G"`` or a number).

    Returns:
        The ``Report``; rows add ``flops``, ``macs``, ``own_flops``, ``param_bytes``,
        ``output_bytes``, ``saved_bytes``...; ``totals`` the memory totals in bytes;
        ``report.lists["uncounted_ops"]`` every op that ran without a FLOP formula.
    """
    from hookcli.costing import MemoryTotal, Optimizer, plan_cost, run_cost
    from hookcli.sizes import parse_count, parse_size
    from hookcli.validate import check_size, choice

    _common(forward_kwargs, seed, depth, global_hooks, backward=backward)
    optimizer = choice(optimizer, Optimizer, "optimizer").value
    memory_for = choice(memory_for, MemoryTotal, "memory_for").value
    max_memory = check_size(max_memory, "max_memory", parse_size)
    max_flops = check_size(max_flops, "max_flops", parse_count)
    plan = plan_cost(backward, optimizer, max_memory, memory_for, max_flops, depth, global_hooks)
    return on_live(model, inputs, forward_kwargs, _mode(mode), seed, lambda p: run_cost(p, plan))


# -- profile -------------------------------------------------------------------------------


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
    """
    from hookcli.profile.runner import plan_profile, run_profile

    plan = plan_profile(backward, warmup, repeat, sort, max_ms, sync, depth, trace_out, plot)
    return on_live(model, inputs, forward_kwargs, _mode(mode), seed, lambda p: run_profile(p, plan))


# -- diff -------------------------------------------------------------------------------------


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


__all__ = ["Report", "cost", "diff", "grads", "inspect", "profile", "stats"]
