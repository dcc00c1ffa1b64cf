"""``cost``: FLOPs, MACs and memory per module call; training and inference totals.

``plan_cost`` checks the options, ``run_cost`` measures a prepared model and builds
the report (``hookcli cost`` and ``hookcli.cost`` both go through them). The
counting itself is ``hookcli.cost.probe``; the FLOP formulas ``hookcli.cost.flops``.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

from hookcli.options import DEFAULT_LOSS, Loss, Mode, loss_arg
from hookcli.render import fmt_bytes

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch import nn

    from hookcli.cost.probe import CallCost, CostProbe
    from hookcli.distributed.strategy import Launch
    from hookcli.errors import RunError
    from hookcli.memory.fsdp import FsdpPlan
    from hookcli.pipeline import Outcome, Prepared
    from hookcli.report import CheckResult, Column, Report, Row
    from hookcli.session import CallRecord


# Memory in binary units (KiB, MiB, GiB), as cost has always printed it.
_size = functools.partial(fmt_bytes, binary=True)


class Optimizer(str, enum.Enum):
    """Optimizer whose state the training-step total holds (``--optimizer``)."""

    ADAM = "adam"
    ADAMW = "adamw"
    SGD = "sgd"
    SGD_MOMENTUM = "sgd-momentum"
    ADAFACTOR = "adafactor"
    NONE = "none"


class ZeroGrad(str, enum.Enum):
    """How the step's ``zero_grad`` leaves the gradients (``--zero-grad``)."""

    NONE = "none"  # set_to_none=True: freed until backward makes them again
    ZEROS = "zeros"  # set_to_none=False: kept, zeroed, alive through the whole step


# Tensors of state per trainable parameter element, each the parameter's size and dtype:
# Adam/AdamW keep exp_avg and exp_avg_sq, SGD with momentum a momentum buffer, all made
# with zeros_like/clone of the parameter, so float16 parameters have float16 state
# (checked against a real optimizer step in tests/test_cost_real.py).
# (Adam's per-parameter `step` is a 0-d float32 tensor on the CPU, left out.)
STATE_COPIES = {
    Optimizer.ADAM: 2,
    Optimizer.ADAMW: 2,
    Optimizer.SGD: 0,
    Optimizer.SGD_MOMENTUM: 1,
    Optimizer.ADAFACTOR: 0,  # factored: a row and a column vector per matrix (_state_bytes)
    Optimizer.NONE: 0,
}


def _state_bytes(optimizer: Optimizer, params: list[Any]) -> int:
    """Bytes of the optimizer's state tensors for the trainable ``params``."""
    if optimizer is not Optimizer.ADAFACTOR:
        return STATE_COPIES[optimizer] * sum(p.numel() * p.element_size() for p in params)
    total = 0
    for p in params:  # torch's Adafactor: row and column variances of a matrix, else in full
        if p.dim() >= 2:
            rows, cols = p.shape[-2], p.shape[-1]
            total += (p.numel() // cols + p.numel() // rows) * p.element_size()
        else:
            total += p.numel() * p.element_size()
    return total


class MemoryTotal(str, enum.Enum):
    """Which memory total ``--max-memory`` checks (``--memory-for``)."""

    TRAIN = "train"
    INFERENCE = "inference"


@dataclass(frozen=True)
class CostPlan:
    """The options of ``cost``, checked."""

    backward: bool = False
    optimizer: Optimizer = Optimizer.ADAM
    max_memory: int | None = None  # bytes
    memory_for: MemoryTotal = MemoryTotal.TRAIN
    max_flops: int | None = None
    depth: int | None = None
    global_hooks: bool = False
    loss: Loss = DEFAULT_LOSS  # --loss: where --backward starts
    zero_grad: ZeroGrad = ZeroGrad.NONE
    checkpoint: str | None = None  # --checkpoint CLASS
    fit: int | None = None  # --fit SIZE, bytes
    foreach: bool | None = None  # --foreach/--no-foreach; None: torch's choice

    @property
    def step(self) -> bool:
        """Whether one steady-state training step runs under the live-bytes tracker: always
        (the training and inference figures are its peaks)."""
        return True


def plan_cost(
    backward: bool = False,
    optimizer: str | Optimizer = Optimizer.ADAM,
    max_memory: str | int | None = None,
    memory_for: str | MemoryTotal = MemoryTotal.TRAIN,
    max_flops: str | int | None = None,
    depth: int | None = None,
    global_hooks: bool = False,
    loss: str | Loss | None = None,
    zero_grad: str | ZeroGrad | None = None,
    checkpoint: str | None = None,
    fit: str | int | None = None,
    foreach: bool | None = None,
) -> CostPlan:
    """Check the options of ``cost`` (UsageError): sizes like ``24GiB``, counts like ``4.1G``.

    ``--zero-grad``, ``--checkpoint`` and ``--fit`` are about the training step: each
    turns ``--backward`` on."""
    from hookcli.cost.sizes import parse_count, parse_size
    from hookcli.errors import UsageError

    try:
        opt, total = Optimizer(optimizer), MemoryTotal(memory_for)
        zeros = ZeroGrad(zero_grad) if zero_grad is not None else ZeroGrad.NONE
    except ValueError as err:
        raise UsageError(str(err)) from None
    if checkpoint is not None and not checkpoint.isidentifier():
        raise UsageError(f"--checkpoint takes a module class name, got {checkpoint!r}")
    limit = parse_size(max_memory) if isinstance(max_memory, str) else max_memory
    flops = parse_count(max_flops) if isinstance(max_flops, str) else max_flops
    fit_bytes = parse_size(fit, "--fit") if isinstance(fit, str) else fit
    if fit_bytes is not None and fit_bytes <= 0:
        raise UsageError("--fit needs a size above 0")
    backward = backward or any(v is not None for v in (zero_grad, checkpoint, fit, foreach))
    return CostPlan(
        backward,
        opt,
        limit,
        total,
        flops,
        depth,
        global_hooks,
        loss_arg(loss),
        zeros,
        checkpoint,
        fit_bytes,
        foreach,
    )


def _progress(message: str) -> None:
    if sys.stderr.isatty():
        from hookcli.pipeline import progress

        progress(f"cost: {message}")


def measure(
    prepared: Prepared,
    *,
    mode: Mode,
    global_hooks: bool = False,
    backward: bool = False,
    loss: str | Loss | None = None,
) -> tuple[CostProbe, tuple[CallRecord, ...], RunError | None]:
    """The measured pass (and, with ``backward``, a forward and backward that count it).

    Returns the probe, the records of the measured pass and the failure, if any.
    """

    from hookcli.cost.probe import CostProbe
    from hookcli.errors import RunError
    from hookcli.failure import refuse_grad_off_root
    from hookcli.losses import make_loss
    from hookcli.pipeline import note_meta_assumptions
    from hookcli.session import HookSession

    assert prepared.inputs is not None
    if backward:
        refuse_grad_off_root(prepared.model)  # before any work
    loss_fn = make_loss(loss, prepared.inputs)
    args, kwargs = prepared.inputs.args, dict(prepared.inputs.kwargs)
    model = prepared.model
    probe = CostProbe(model, fused_attention=prepared.settings.get("device") == "meta")
    error: RunError | None = None
    with HookSession(model, [probe], mode=mode, global_hooks=global_hooks, grad=True) as session:
        try:
            _progress("forward (counting FLOPs, saved tensors, live activations)")
            with probe.measuring([args, kwargs]):
                output = session.forward(args, kwargs)
            del output  # frees the pass's graph before the next one
            if backward:
                _progress("forward and backward (counting backward FLOPs)")
                for p in model.parameters():
                    p.grad = None  # the session puts the user's grads back
                with probe.mapping_nodes([args, kwargs]):
                    output = session.forward(args, kwargs)
                loss_t = loss_fn(output)
                with probe.counting_backward():
                    session.backward(loss_t)
                del output, loss_t
        except RunError as err:
            error = err
        session.finish()
        note_meta_assumptions(session, prepared.settings)
        n = probe.measured_calls if probe.measured_calls is not None else len(session.frames)
        records = session.records[:n]
    return probe, records, error


def step_memory(prepared: Prepared, plan: CostPlan, fsdp: FsdpPlan | None = None) -> dict[str, Any]:
    """The live-bytes tracker's peaks: one steady-state training step, one inference
    forward (``hookcli.memory``), as totals; ``step_peak_error`` (``inference_peak_error``)
    where one failed. A forward that cannot train gets no step (``cannot_train``).
    ``fsdp``: the step as one rank runs it under FSDP2 (``hookcli.memory.fsdp``)."""
    from hookcli import amp
    from hookcli.errors import HookcliError, UsageError, first_line
    from hookcli.losses import NothingToBackpropagate, make_loss
    from hookcli.memory.step import track_inference, track_step
    from hookcli.preserve import kept_attributes, training_flags

    assert prepared.inputs is not None
    model = prepared.model
    if plan.checkpoint is not None:
        classes = {type(m).__name__ for m in model.modules()}
        if plan.checkpoint not in classes:
            shown = ", ".join(sorted(classes)[:8])
            raise UsageError(
                f"--checkpoint {plan.checkpoint}: no module of that class in the model "
                f"(its classes: {shown}{', ...' if len(classes) > 8 else ''})"
            )
    args, kwargs = prepared.inputs.args, dict(prepared.inputs.kwargs)
    on_meta = prepared.settings.get("device") == "meta"
    cannot = _cannot_train(model)

    def run_context(meta: bool = on_meta) -> contextlib.AbstractContextManager[Any]:
        from hookcli.cost.probe import _FusedAttentionOnMeta
        from hookcli.metavalues import MetaValues

        attributes.reset()  # each step's forward starts from the KV cache as found
        stack = contextlib.ExitStack()
        if meta:  # the CPU's attention kernel, as the measured pass counts it, and
            # values where the model reads some (a packed-sequence check in train mode)
            stack.enter_context(_FusedAttentionOnMeta())
            stack.enter_context(MetaValues())
        return stack

    def forward_context() -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        stack.enter_context(run_context())
        stack.enter_context(amp.autocast())
        return stack

    loss_fn = make_loss(plan.loss, prepared.inputs)
    # no look at the output for a note on the loss (the counting pass's, with --backward):
    # its work (a float64 copy of the output) is no part of the step the tracker measures
    loss_fn._looked = True

    def step(m: nn.Module, a: tuple[Any, ...], k: dict[str, Any], meta: bool = on_meta) -> Any:
        return track_step(
            m,
            a,
            k,
            loss_fn,
            optimizer=plan.optimizer.value,
            foreach=plan.foreach,
            forward_context=amp.autocast,
            run_context=lambda: run_context(meta),
            zero_grad=plan.zero_grad.value,
            checkpoint=plan.checkpoint,
            recompute_context=amp.recompute,
            fsdp=fsdp,
        )

    out: dict[str, Any] = {}
    # every module's own mode and the plain tensor attributes as found, whatever the step did
    with training_flags(model), kept_attributes(model) as attributes:
        if cannot is not None:
            out["step_peak_bytes"] = None  # no training figure: the forward cannot train
        else:
            _progress("one steady-state training step under the live-bytes tracker")
            try:
                found = step(model, args, kwargs)
            except NothingToBackpropagate as err:
                if plan.backward:  # asked for: the counting pass says it as the error
                    raise
                out["step_peak_bytes"] = None  # the default figure: no training peak, why
                out["cannot_train"] = err.reason
            except HookcliError:
                raise
            except Exception as err:  # the model's own failure in train mode: said, not fatal
                out["step_peak_error"] = first_line(err)
            else:
                peak = found.train
                out.update(
                    step_peak_bytes=peak.bytes,
                    step_peak_phase=peak.phase,
                    step_peak_module=peak.module,
                    step_peak_op=peak.op,
                    step_peak_by_kind=peak.as_dict()["by_kind"],
                    step_optimizer_foreach=found.foreach,
                    step_checkpointed_modules=found.checkpointed,
                )
        _progress("one inference forward under the live-bytes tracker")
        try:
            inference = track_inference(model, args, kwargs, forward_context, fsdp)
        except HookcliError:
            raise
        except Exception as err:
            out["inference_peak_error"] = first_line(err)
        else:
            out.update(
                inference_peak_bytes=inference.bytes,
                inference_peak_module=inference.module,
                inference_peak_by_kind=inference.as_dict()["by_kind"],
            )
        if fsdp:
            out["step_peak_fsdp"] = {"rank": fsdp.rank, "world_size": fsdp.world}
        if plan.fit is not None and "step_peak_bytes" in out:
            if on_meta:
                out.update(_fit(plan.fit, lambda a, k: step(model, a, k), args, kwargs))
            else:
                meta = _meta_copy(model, prepared.settings.get("device"))
                out.update(_fit(plan.fit, lambda a, k: step(meta, a, k, True), args, kwargs))
    return out


def _meta_copy(model: nn.Module, device: Any) -> nn.Module:
    """A copy of ``model`` on meta for ``--fit``'s search (said on stderr): its parameters,
    buffers and tensor attributes made there empty, never copied on ``device``."""
    import copy
    import itertools

    import torch
    from torch import nn

    from hookcli.errors import UsageError, first_line

    print(
        f"hookcli cost: --fit searches batch sizes on meta, on a copy of the model "
        f"(the other figures are measured on {device})",
        file=sys.stderr,
    )
    memo: dict[int, Any] = {}
    for t in itertools.chain(model.parameters(), model.buffers()):
        empty = torch.empty_like(t, device="meta")
        memo[id(t)] = nn.Parameter(empty, t.requires_grad) if isinstance(t, nn.Parameter) else empty
    try:
        copied = copy.deepcopy(model, memo)
    except Exception as err:  # an attribute deepcopy cannot copy (a lock, a handle)
        raise UsageError(
            f"--fit: the model cannot be copied to meta ({first_line(err)}); "
            "build it there with --device meta"
        ) from None
    for m in copied.modules():
        for name, value in list(vars(m).items()):
            if isinstance(value, torch.Tensor) and not value.is_meta:
                object.__setattr__(m, name, torch.empty_like(value, device="meta"))
    return copied


def _fit(limit: int, step: Callable[..., Any], args: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """--fit: the largest batch whose tracked step peak fits in ``limit`` (on meta)."""
    from hookcli.errors import UsageError
    from hookcli.memory.fit import MAX_BATCH, batch_of, largest_fitting, rebatched

    batch = batch_of([args, kwargs])
    if batch is None:
        raise UsageError("--fit: no input tensor has a batch dimension to vary")

    def peak_at(b: int) -> int:
        _progress(f"--fit: batch {b}")
        return int(step(rebatched(args, batch, b), rebatched(kwargs, batch, b)).train.bytes)

    found = largest_fitting(peak_at, limit)
    return {
        "fit_limit_bytes": found.limit,
        "fit_batch": found.batch,
        "fit_peak_bytes": found.peak,
        "fit_next_peak_bytes": found.next_peak,
        "fit_evaluations": found.evaluations,
        "fit_search_bound": MAX_BATCH,
        "fit_at_bound": found.batch == MAX_BATCH,
    }


def memory_totals(model: nn.Module, probe: CostProbe, optimizer: Optimizer) -> dict[str, Any]:
    """The memory totals in bytes: components, a training step, inference."""
    from hookcli.modelinfo import totals

    t = totals(model)
    params = list({id(p): p for p in model.parameters()}.values())
    grad_bytes = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    state = _state_bytes(optimizer, [p for p in params if p.requires_grad])
    saved = probe.total_saved_bytes()
    peak = probe.ledger.peak_bytes
    # tensors in plain module attributes (a KV cache): held by the model, not activations
    held = t["param_bytes"] + t["buffer_bytes"] + probe.attribute_bytes()
    out: dict[str, Any] = {
        "param_bytes": t["param_bytes"],
        "buffer_bytes": t["buffer_bytes"],
        "attribute_bytes": probe.attribute_bytes(),
        "grad_bytes": grad_bytes,
        "optimizer_state_bytes": state,
        "optimizer_state_dtypes": sorted(
            {str(p.dtype).removeprefix("torch.") for p in params if p.requires_grad}
        )
        if state
        else [],
        "saved_bytes": saved,
        "input_bytes": probe.input_bytes,
        "peak_activation_bytes": peak,
    }
    # sums of the parts above (the page's memory breakdown draws them): not the figures,
    # which are the tracked peaks (step_peak_bytes, inference_peak_bytes)
    parts = {
        "train_step_bytes": held + grad_bytes + state + saved,
        "inference_bytes": held + peak,
    }
    if probe.backward_ran:
        # measured over the second forward and the backward: activations, saved
        # tensors, activation gradients and parameter grads alive at once
        live = probe.train_ledger.peak_bytes
        parts["train_peak_activation_bytes"] = live
        parts["train_peak_bytes"] = held + state + live
    out["memory_parts"] = parts
    return out


def _subtree_bytes(model: nn.Module) -> dict[int, tuple[int, int]]:
    """id(module) -> (param bytes, buffer bytes) of its subtree, each tensor once."""
    import torch

    memo: dict[int, tuple[dict[int, int], dict[int, int]]] = {}

    def sizes(tensors: Any) -> dict[int, int]:
        return {id(t): t.numel() * t.element_size() for t in tensors if t is not None}

    def walk(m: nn.Module) -> tuple[dict[int, int], dict[int, int]]:
        # children first, merged upward: linear in the tree, tied tensors counted once
        if id(m) not in memo:
            ps, bs = sizes(m._parameters.values()), sizes(m._buffers.values())
            for child in m._modules.values():
                if child is not None:
                    cp, cb = walk(child)
                    ps.update(cp)
                    bs.update(cb)
            memo[id(m)] = (ps, bs)
        return memo[id(m)]

    with torch.no_grad():
        walk(model)
    return {k: (sum(p.values()), sum(b.values())) for k, (p, b) in memo.items()}


class _CostColumns:
    """The probe-like column source layer_rows calls for each row."""

    def __init__(self, probe: CostProbe, model: nn.Module) -> None:
        self.probe = probe
        self.modules = {id(m): m for m in model.modules()}
        self.bytes = _subtree_bytes(model)

    def columns(self, rec: CallRecord) -> dict[str, Any]:
        """The cost columns of a call's row (or of a container row, by its module)."""
        return self._data(self.probe.record_cost(rec, self.modules), rec.module_id)

    def container_columns(self, module: nn.Module) -> dict[str, Any]:
        """A module never called whose descendants ran: the sums of its subtree's calls."""
        return self._data(self.probe.module_cost(module), id(module))

    def _data(self, cost: CallCost | None, module_id: int) -> dict[str, Any]:
        pb, bb = self.bytes.get(module_id, (0, 0))
        data: dict[str, Any] = {}
        if cost is None:
            data.update(flops=None, own_flops=None, macs=None, own_macs=None)
        else:
            data.update(
                flops=cost.flops,
                own_flops=cost.own_flops,
                macs=cost.flops // 2,
                own_macs=cost.own_flops // 2,
            )
            if cost.backward_flops is not None:
                data["backward_flops"] = cost.backward_flops
                data["own_backward_flops"] = cost.own_backward_flops
        data["param_bytes"] = pb
        data["buffer_bytes"] = bb
        data["output_bytes"] = None if cost is None else cost.output_bytes
        data["saved_bytes"] = None if cost is None else cost.saved_bytes
        data["own_saved_bytes"] = None if cost is None else cost.own_saved_bytes
        return data


def _uncounted_rows(probe: CostProbe) -> tuple[Row, ...]:
    from hookcli.report import Row

    return tuple(
        Row.of(
            {
                "op": u.op,
                "phase": u.phase,
                "calls": u.calls,
                "output_elements": u.output_elements,
                "modules": list(u.modules or {}),
            }
        )
        for u in probe.uncounted_ops()
    )


def _sparse_rows(probe: CostProbe) -> tuple[Row, ...]:
    from hookcli.report import Row

    return tuple(
        Row.of(
            {
                "op": u.op,
                "phase": u.phase,
                "calls": u.calls,
                "nonzeros": u.nonzeros,
                "flops": u.flops,
                "dense_flops": u.dense_flops,
                "modules": list(u.modules or {}),
            }
        )
        for u in probe.sparse_ops()
    )


def _attribute_rows(probe: CostProbe) -> tuple[Row, ...]:
    from hookcli.report import Row

    return tuple(
        Row.of(
            {
                "module": a.module,
                "attribute": a.attribute,
                "shape": list(a.shape),
                "dtype": a.dtype,
                "bytes": a.bytes,
            }
        )
        for a in probe.attributes
    )


def _sparse_note(probe: CostProbe) -> str | None:
    from hookcli.render import fmt_count, fmt_int

    ops = [u for u in probe.sparse_ops() if u.phase == "forward"]
    if not ops:
        return None
    shown = ", ".join(
        f"{u.op.removeprefix('aten.')} x{u.calls} ({fmt_int(u.nonzeros)} nonzeros)" for u in ops[:4]
    )
    more = f", +{len(ops) - 4} more" if len(ops) > 4 else ""
    flops = sum(u.flops for u in ops)
    dense = sum(u.dense_flops for u in ops)
    return (
        f"{shown}{more}: {fmt_count(flops)} FLOPs counted by their nonzeros "
        f"(the dense shapes would be {fmt_count(dense)}; JSON sparse_ops)"
    )


def _attribute_note(probe: CostProbe) -> str | None:
    rows = probe.attributes
    if not rows:
        return None
    named = ", ".join(
        f"{a.module}.{a.attribute}" if a.module != "(root)" else a.attribute for a in rows[:3]
    )
    more = f", +{len(rows) - 3} more" if len(rows) > 3 else ""
    return (
        f"{_size(probe.attribute_bytes())} in {len(rows)} tensor(s) kept in module attributes, "
        f"neither parameters nor buffers (caches, tables): {named}{more}; not activations "
        "(JSON attribute_tensors)"
    )


def _uncounted_note(probe: CostProbe) -> str:
    ops = probe.uncounted_ops()
    if not ops:
        return "none: every op that ran has a FLOP formula"
    shown = [
        f"{u.op.removeprefix('aten.')}{' (bwd)' if u.phase == 'backward' else ''} x{u.calls}"
        for u in ops[:6]
    ]
    more = f", +{len(ops) - 6} more" if len(ops) > 6 else ""
    return (
        f"{', '.join(shown)}{more} (no FLOP formula: not in the FLOPs; JSON uncounted_ops "
        "says where they ran)"
    )


def _cannot_train(model: nn.Module) -> str | None:
    """Why the model cannot train (its root's forward runs without autograd), else None;
    never under ``--enable-grad``, which runs such a forward with gradients."""
    from hookcli import gradmode
    from hookcli.failure import grad_off_forwards

    if gradmode.current():
        return None

    off = grad_off_forwards(model)
    return off[0].label() if off and off[0].name == "" else None


def _checks(totals: dict[str, Any], plan: CostPlan) -> tuple[CheckResult, ...]:
    from hookcli.render import fmt_count
    from hookcli.report import CheckResult

    limit, memory_for, flop_limit = plan.max_memory, plan.memory_for, plan.max_flops
    out = []
    if flop_limit is not None:
        flops = totals["flops"]
        ok = flops <= flop_limit
        out.append(
            CheckResult(
                "max-flops",
                ok,
                f"forward FLOPs {fmt_count(flops)} {'<=' if ok else '>'} {fmt_count(flop_limit)}",
            )
        )
    if limit is not None:
        train = memory_for is MemoryTotal.TRAIN
        key = "step_peak_bytes" if train else "inference_peak_bytes"
        value = totals.get(key)
        if value is None:  # a forward that cannot train, or a figure not measured
            error = totals.get("step_peak_error" if train else "inference_peak_error")
            why = (
                f"no {memory_for.value} peak: not measured ({error})"
                if error is not None or not train
                else f"no training peak: {totals.get('cannot_train')}, so it cannot train; "
                "check the inference peak with --memory-for inference"
            )
            out.append(CheckResult("max-memory", False, why))
            return tuple(out)
        ok = value <= limit
        out.append(
            CheckResult(
                "max-memory",
                ok,
                f"{memory_for.value} peak {_size(value)} ({value:,} bytes) "
                f"{'<=' if ok else '>'} {_size(limit)} ({limit:,} bytes)",
            )
        )
    return tuple(out)


def build_report(
    prepared: Prepared,
    probe: CostProbe,
    records: tuple[CallRecord, ...],
    error: RunError | None,
    plan: CostPlan,
    peaks: dict[str, Any] | None = None,
) -> Report:
    """The cost report of a measured pass (table columns and totals included); ``peaks``:
    the tracked step's (``step_memory``)."""
    from hookcli import amp
    from hookcli.layers import layer_rows
    from hookcli.modelinfo import totals as model_totals
    from hookcli.options import HookKind
    from hookcli.report import Report

    optimizer, backward = plan.optimizer, plan.backward

    model = prepared.model
    kinds = (HookKind.PRE, HookKind.FORWARD)
    source = _CostColumns(probe, model)
    rows, _ = layer_rows(records, model, depth=plan.depth, kinds=kinds, probes=[source])  # type: ignore[list-item]
    totals: dict[str, Any] = dict(model_totals(model))
    flops = probe.total_flops()
    totals["flops"] = flops
    totals["macs"] = flops // 2
    if probe.backward_ran:
        bwd = probe.total_backward_flops() or 0
        totals["backward_flops"] = bwd
        totals["backward_macs"] = bwd // 2
    totals.update(memory_totals(model, probe, optimizer))
    totals.update(peaks or {})
    cannot = None if probe.backward_ran else _cannot_train(model) or totals.get("cannot_train")
    if cannot is not None:  # no training figure for a forward that cannot train
        totals["memory_parts"]["train_step_bytes"] = None
        totals["step_peak_bytes"] = None
        totals["cannot_train"] = cannot
    totals["uncounted_op_count"] = len(probe.uncounted)
    checks = () if error is not None else _checks(totals, plan)
    settings = {**prepared.settings, "optimizer": optimizer.value, "backward": backward}
    if settings.get("amp") and amp.emulated_policy() is not None:
        settings["amp_policy"] = amp.emulated_policy()  # autocast emulated on meta
    if backward:
        settings["loss"] = plan.loss.value
    if plan.step:
        settings["zero_grad"] = plan.zero_grad.value
        settings["checkpoint"] = plan.checkpoint
    return Report(
        command="cost",
        model=prepared.model_info(),
        settings=settings,
        inputs=prepared.input_dicts(),
        layers=rows,
        totals=totals,
        checks=checks,
        lists={
            "uncounted_ops": _uncounted_rows(probe),
            "sparse_ops": _sparse_rows(probe),
            "attribute_tensors": _attribute_rows(probe),
        },
        error=error.message if error else None,
        columns=tuple(_table_columns(kinds, probe.backward_ran)),
        table_totals=tuple(_table_totals(totals, probe, optimizer, plan)),
    )


@overload
def run_cost(prepared: Prepared, plan: CostPlan, launch: None = None) -> Outcome: ...
@overload
def run_cost(prepared: Prepared, plan: CostPlan, launch: Launch) -> Outcome | None: ...
def run_cost(prepared: Prepared, plan: CostPlan, launch: Launch | None = None) -> Outcome | None:
    """Measure the model (and its backward, with ``plan.backward``) and build the report.

    ``launch``: one process (the default), or every rank of ``--fsdp``: each rank adds its
    memory under FSDP2's shard plan, its step tracked as FSDP2 runs it on that rank
    (``hookcli.memory.fsdp``), and rank 0 sets it beside DDP's (None on the others).
    """

    def once(fsdp: FsdpPlan | None = None) -> Outcome:
        probe, records, error = measure(
            prepared,
            mode=Mode(prepared.settings["mode"]),
            global_hooks=plan.global_hooks,
            backward=plan.backward,
            loss=plan.loss,
        )
        tracked = plan.step and error is None
        peaks = step_memory(prepared, plan, fsdp) if tracked else None
        return build_report(prepared, probe, records, error, plan, peaks), error

    if launch is None or not launch.distributed:
        return once()
    return _memory_per_rank(prepared, plan, launch, once)


def _memory_per_rank(
    prepared: Prepared, plan: CostPlan, launch: Any, once: Callable[..., Outcome]
) -> Outcome | None:
    """The cost report, plus every rank's tracked peaks under FSDP2 (rank 0).

    The table gives each rank's tracked training and inference peaks; the sums of the
    shard plan's parts (FSDP2's per rank beside DDP's) stay in the JSON, marked as parts:
    ``memory_parts_per_rank`` and ``memory_parts``' ``*_per_rank`` keys."""
    import dataclasses

    from hookcli.memory.fsdp import FsdpPlan
    from hookcli.report import Row

    model = prepared.model
    units = launch.plan_units(model)
    ctx = launch.ctx

    def measure_rank() -> tuple[Report, RunError | None, dict[str, Any]]:
        report, error = once(FsdpPlan(tuple(units), ctx.world_size, ctx.rank))
        seen: list[str] = []
        for row in report.layers:
            name = str(row.data["name"])
            if name in units and name not in seen:
                seen.append(name)
        mem = launch.memory(model, units, seen, STATE_COPIES[plan.optimizer])
        for key in ("step_peak_bytes", "inference_peak_bytes", "fit_batch"):  # this rank's
            mem[key] = report.totals.get(key)
        return report, error, mem

    report, error, mem = launch.step("measuring", measure_rank)
    gathered = launch.gather(mem)
    if gathered is None:
        return None
    t = dict(report.totals)
    buffers, saved = int(t["buffer_bytes"]), int(t["saved_bytes"])
    ddp = {
        "param_bytes": int(t["param_bytes"]),
        "grad_bytes": int(t["grad_bytes"]),
        "optimizer_state_bytes": int(t["optimizer_state_bytes"]),
        "all_gather_peak_bytes": 0,
    }
    parts = [
        ("params", "param_bytes"),
        ("grads", "grad_bytes"),
        (f"{plan.optimizer.value} state", "optimizer_state_bytes"),
        ("all-gather peak (unsharded)", "all_gather_peak_bytes"),
    ]
    rows = [
        Row.of(
            {
                "component": label,
                "ddp_bytes": ddp[key],
                "fsdp_bytes_per_rank": [int(g[key]) for g in gathered],
            }
        )
        for label, key in parts
    ]
    rows.append(
        Row.of(
            {
                "component": "buffers + saved activations",
                "ddp_bytes": buffers + saved,
                "fsdp_bytes_per_rank": [buffers + saved] * len(gathered),
            }
        )
    )
    ddp_sum = sum(ddp.values()) + buffers + saved
    fsdp_sums = [sum(int(g[k]) for _, k in parts) + buffers + saved for g in gathered]
    rows.append(
        Row.of({"component": "sum", "ddp_bytes": ddp_sum, "fsdp_bytes_per_rank": fsdp_sums})
    )
    totals = {
        **t,
        "memory_parts": {
            **t["memory_parts"],
            "ddp_train_step_bytes": ddp_sum,
            "fsdp_train_step_bytes_per_rank": fsdp_sums,
            "all_gather_peak_units": gathered[0]["all_gather_peak_units"],
        },
    }
    lines = list(report.table_totals)
    head = f"FSDP2 on {len(gathered)} ranks (rank 0, 1, ...), each rank's step tracked"
    lines.append(("Memory per rank", head))
    figures = [
        ("training peak", "step_peak_bytes", "fsdp_step_peak_bytes_per_rank"),
        ("inference peak", "inference_peak_bytes", "fsdp_inference_peak_bytes_per_rank"),
    ]
    for label, key, total in figures:
        peaks = [g[key] for g in gathered]  # None: not measured on that rank (said above)
        totals[total] = peaks
        lines.append((f"  {label}", ", ".join("none" if p is None else _size(p) for p in peaks)))
    if "fit_batch" in t:
        batches = [g["fit_batch"] for g in gathered]
        totals["fsdp_fit_batch_per_rank"] = batches
        lines.append(
            (f"  fits in {_size(t['fit_limit_bytes'])}", ", ".join(f"batch {b}" for b in batches))
        )
    final = dataclasses.replace(
        report,
        model={**report.model, "class": type(model).__name__},
        settings=launch.unit_settings(report.settings, units),
        totals=totals,
        lists={**report.lists, "memory_parts_per_rank": tuple(rows)},
        notes=(launch.memory_note(units),),
        table_totals=tuple(lines),
    )
    return final, error


def over_memory(report: Report) -> CheckResult | None:
    """The failed ``max-memory`` check of a cost report (exit 5), if any."""
    return next((c for c in report.failed_checks if c.name == "max-memory"), None)


def _table_columns(kinds: Any, backward: bool) -> list[Column]:
    from hookcli.layers import shape_columns
    from hookcli.render import fmt_count
    from hookcli.report import Column

    cols = [c for c in shape_columns(kinds) if c.key != "input_shapes"]
    cols.append(Column("flops", "FLOPs", fmt_count, "right"))
    cols.append(Column("macs", "MACs", fmt_count, "right"))
    if backward:
        cols.append(Column("backward_flops", "Bwd FLOPs", fmt_count, "right"))
    cols.append(Column("param_bytes", "Params", _size, "right"))
    cols.append(Column("output_bytes", "Output", _size, "right"))
    cols.append(Column("saved_bytes", "Saved", _size, "right"))
    return cols


_KIND_WORDS = {
    "params": "params",
    "buffers": "buffers",
    "attributes": "attribute tensors",
    "inputs": "inputs",
    "grads": "grads",
    "optimizer_state": "{opt} state",
    "saved": "saved activations",
    "activations": "other activations and temporaries",
    "unsharded_params": "unsharded params (all-gathered)",
    "comm_buffers": "all-gather and reduce-scatter buffers",
}


def _kinds(by_kind: dict[str, int], optimizer: Optimizer) -> str:
    return ", ".join(
        f"{_KIND_WORDS[k].format(opt=optimizer.value)} {_size(v)}" for k, v in by_kind.items() if v
    )


def _peak_lines(t: dict[str, Any], optimizer: Optimizer, plan: CostPlan) -> list[tuple[str, str]]:
    """The two memory figures: the tracked training step's peak and inference's."""
    fsdp = t.get("step_peak_fsdp")
    of_rank = f", rank {fsdp['rank']} of {fsdp['world_size']}" if fsdp else ""
    label, infer = f"Training peak{of_rank}", f"Inference peak{of_rank}"
    out: list[tuple[str, str]] = []
    if "step_peak_error" in t:
        out.append((label, f"not measured: {t['step_peak_error']}"))
    elif t.get("step_peak_bytes") is None:
        why = f"none: {t.get('cannot_train')}, so it cannot train (no output carries a gradient)"
        out.append((label, why))
    else:
        where = t["step_peak_module"] or "(outside any module)"
        foreach = t["step_optimizer_foreach"]
        how = (
            f"{optimizer.value} ({'foreach' if foreach else 'for-loop'})"
            if foreach is not None
            else "no optimizer"
        )
        extra = f", --checkpoint {plan.checkpoint} x{t['step_checkpointed_modules']}"
        out.append(
            (
                label,
                f"{_size(t['step_peak_bytes'])} in {t['step_peak_phase']} at {where} "
                f"({t['step_peak_op']}); one steady-state step: {how}, "
                f"zero_grad {plan.zero_grad.value}{extra if plan.checkpoint else ''}",
            )
        )
        out.append(("  alive at it", _kinds(t["step_peak_by_kind"], optimizer)))
    if "inference_peak_error" in t:
        out.append((infer, f"not measured: {t['inference_peak_error']}"))
    elif "inference_peak_bytes" in t:
        out.append(
            (
                infer,
                f"{_size(t['inference_peak_bytes'])} at "
                f"{t['inference_peak_module'] or '(outside any module)'} (one no_grad forward)",
            )
        )
        out.append(("  alive at it", _kinds(t["inference_peak_by_kind"], optimizer)))
    return [*out, *_fit_lines(t)]


def _exact(n: int) -> str:
    """A size with its bytes: two peaks a batch apart differ in print."""
    return f"{_size(n)}, {n:,} bytes"


def _fit_lines(t: dict[str, Any]) -> list[tuple[str, str]]:
    if "fit_batch" not in t:
        return []
    limit, batch = _size(t["fit_limit_bytes"]), t["fit_batch"]
    if "step_peak_fsdp" in t:
        limit += " per rank"
    label = f"Fits in {limit}"
    nxt = t["fit_next_peak_bytes"]
    if batch == 0:
        return [(label, f"no batch: batch 1 peaks at {_exact(nxt)}")]
    tracked = f"{t['fit_evaluations']} steps tracked on meta"
    if t.get("fit_at_bound"):
        return [
            (
                label,
                f"batch {batch} or more: the search stops at its bound, batch {batch} "
                f"(2**{batch.bit_length() - 1}), which peaks at {_exact(t['fit_peak_bytes'])} "
                f"({tracked})",
            )
        ]
    return [
        (
            label,
            f"batch {batch} (peak {_exact(t['fit_peak_bytes'])}); batch {batch + 1} peaks "
            f"at {_exact(nxt)} ({tracked})",
        )
    ]


def _table_totals(
    t: dict[str, Any], probe: CostProbe, optimizer: Optimizer, plan: CostPlan
) -> list[tuple[str, str]]:
    from hookcli.render import fmt_count, fmt_int

    out = [
        ("Forward FLOPs", f"{fmt_count(t['flops'])} ({fmt_int(t['flops'])}; a multiply-add is 2)"),
        ("Forward MACs", f"{fmt_count(t['macs'])} ({fmt_int(t['macs'])} multiply-accumulates)"),
    ]
    if "backward_flops" in t:
        out.append(
            ("Backward FLOPs", f"{fmt_count(t['backward_flops'])} ({fmt_int(t['backward_flops'])})")
        )
    sparse = _sparse_note(probe)
    if sparse is not None:
        out.append(("Sparse ops", sparse))
    out.append(("Not counted", _uncounted_note(probe)))
    out.append(("Params", f"{fmt_int(t['params'])} ({_size(t['param_bytes'])})"))
    out.append(("Buffers", _size(t["buffer_bytes"])))
    attrs = _attribute_note(probe)
    if attrs is not None:
        out.append(("Attribute tensors", attrs))
    out.extend(_peak_lines(t, optimizer, plan))
    return out
