"""``compare``'s run: build both sides, run A and B (propagated, then local), align,
measure, and build the report.

Each mode runs each model once. Where it can (``_can_step``), A runs in a greenlet of
its own in step with B (``record.Handoff``): A lends each output B's partner call will
measure and waits until it is measured, so nothing of A's is copied unless B asks
first for a later one. Else A runs first and keeps a copy of every call's inputs and
outputs (the reference), and B runs after it. B's outputs are measured as they come
(``record.Measure``) and not kept: its partners are foreseen by name (``--map`` rules,
else the same name); a call with none foreseen keeps a copy until the alignment is
known. The local mode is one more pass of B in which each aligned call runs its own
code on A's values (``record.Substitute``). The runs use ``HookSession`` as every
command does.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from hookcli.compare.metrics import TensorDiff
from hookcli.compare.settings import Vs
from hookcli.errors import RunError
from hookcli.options import Format, Mode
from hookcli.report import Report

if TYPE_CHECKING:
    from hookcli.compare.align import Alignment, CallInfo, Rule
    from hookcli.compare.metrics import CallDiff
    from hookcli.pipeline import Prepared
    from hookcli.report import Column, Row


@dataclass(frozen=True)
class CompareReport(Report):
    """A Report with compare's top-level keys (``first_divergence``, ...) in its JSON."""

    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    # the model raised: what the command raises after the report is written (exit 4)
    failure: RunError | None = field(default=None, compare=False, repr=False)
    markdown_notes: ClassVar[bool] = True  # (Markdown carries the notes, as the table)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["notes"] = list(self.notes)  # the lines the table prints under its header
        out.update({k: v for k, v in self.extra.items()})
        return out


@dataclass(frozen=True)
class Plan:
    """How to compare: the alignment, the tolerances, the gates."""

    rules: tuple[Rule, ...] = ()
    align: str = "auto"
    rtol: float | None = None
    atol: float | None = None
    fail_on_divergence: bool = False
    copy_weights: bool = False
    print_map: bool = False
    top: int = 5
    backward: bool = False
    loss: Any = None  # --loss as typed (None: sum)
    local: bool = True  # the local mode's passes (the benchmark times the modes apart)
    partial: bool = False  # the model raising: the report of the calls that ran (the CLI's)
    depth: int | None = None  # --depth: rows to this depth; the local mode feeds these alone


@dataclass
class Side:
    """One side of the comparison: its built model, what calls it, its settings."""

    label: str
    prepared: Prepared
    call: Any
    vs: Vs
    seed: int

    @property
    def model(self) -> Any:
        return self.prepared.model


@dataclass
class Pass:
    records: tuple[Any, ...]
    inputs: dict[int, list[Any]]
    outputs: dict[int, list[Any]]
    finished: list[int]
    kept: list[tuple[str, int]] = field(default_factory=list)
    backward_order: list[int] = field(default_factory=list)
    param_grads: dict[str, Any] = field(default_factory=dict)  # qualified name -> grad copy
    grad_outputs: dict[int, list[Any]] = field(default_factory=dict)  # (A's, for local)
    grad_inputs_pos: dict[int, list[Any]] = field(default_factory=dict)  # (by position)
    local_grads: dict[int, dict[str, Any]] = field(default_factory=dict)  # A's call ->
    first_grad_local: dict[str, Any] | None = None
    loss: float | None = None
    measured: dict[int, tuple[int, CallDiff]] = field(default_factory=dict)  # B's call ->
    in_diverged: dict[int, tuple[int, bool]] = field(default_factory=dict)  # B's call ->
    diffs: dict[int, CallDiff] | None = None  # A's call -> the figures, once final
    error: PassFailed | None = None  # (a local pass) the model raised: figures up to there


class PassFailed(RunError):
    """A side's pass in which the model raised: the ``RunError``, its message led by the
    side (``B:``, ``B (local mode):``), with the pass as far as it got (``partial``) and
    the call that failed (``where``: its frame; None when no module call is known)."""

    def __init__(self, err: RunError, side: str, stage: str, partial: Pass, where: Any) -> None:
        label = side if stage == "propagated" else f"{side} ({stage} mode)"
        super().__init__(f"{label}: {err.message}", module=err.module)
        self.reason = err.message
        self.side, self.stage, self.partial = side, stage, partial
        self.other: Pass | None = None  # (a run in step) the other side's, as far as it got
        self.also: PassFailed | None = None  # (a run in step) A's failure after B's
        self.phase = next((p for p in ("forward", "backward") if err.message.startswith(p)), "loss")
        self.where = None
        if where is not None:
            self.where = {
                "module": where.name,
                "type": where.type,
                "call": where.call,
                "input_shapes": [list(s) for s in where.input_shapes],
            }


def _infos(
    records: Sequence[Any], finished: Sequence[int] = (), done: bool = True
) -> list[CallInfo]:
    """The alignment's view of a pass's calls, each with the call it ran inside (the
    innermost that began before it and returned after it, by ``finished``): the calls
    that returned (``done``), or else those that never did (a failed pass's open calls,
    the parents of the calls that returned inside them)."""
    from hookcli.compare.align import CallInfo

    pos = {i: n for n, i in enumerate(finished)}
    parent: dict[int, int | None] = {}
    stack: list[int] = []
    for r in sorted(records, key=lambda r: r.index):
        at = pos.get(r.index, math.inf)
        while stack and pos.get(stack[-1], math.inf) < at:
            stack.pop()  # returned before this call returned: before it began
        parent[r.index] = stack[-1] if stack else None
        stack.append(r.index)
    return [
        CallInfo(
            r.index,
            r.name,
            r.type,
            r.call,
            r.depth,
            r.input_shapes,
            r.output_shapes,
            parent[r.index],
        )
        for r in records
        if bool(r.done) == done
    ]


def _run_pass(
    side: Side,
    args: Any,
    kwargs: Any,
    mode: Mode,
    *,
    inputs: bool = False,
    substitute: Any = None,
    keep: set[int] | None = None,
    loss: Any = None,
    input_refs: bool = False,
    measure: Any = None,
    extra: Sequence[Any] = (),
    outputs: bool = True,
    grad: bool = False,
    stage: str = "propagated",
) -> Pass:
    """One forward of a side inside a HookSession, recording every call; with ``loss``
    (a ``--loss`` spec) also backward from it, recording grad_input and parameter grads.
    The model raising is ``PassFailed``, holding the pass as far as it got."""
    import torch

    from hookcli.compare.record import Recorder
    from hookcli.compare.settings import running
    from hookcli.loading import keep_cwd
    from hookcli.pipeline import note_meta_assumptions
    from hookcli.session import HookSession

    args, kwargs = fresh_inputs(args), fresh_inputs(kwargs)  # (A's forward may write them)
    recorder = Recorder(
        inputs=inputs, keep=keep, input_refs=input_refs, outputs=outputs,
        grad_outputs=loss is not None and inputs,
    )  # fmt: skip
    probes: list[Any] = [recorder, *extra]
    if measure is not None:
        probes.append(measure)
    sub = substitute
    if sub is not None:
        probes.append(sub)
    device = _device(side)
    failed: RunError | None = None
    where: Any = None
    session: Any = None
    grads: dict[str, Any] = {}
    loss_value = None

    def made() -> Pass:
        """The pass as far as it got."""
        kept_inputs = recorder.inputs
        if input_refs:  # only the inputs no in-place op changed after the call
            kept_inputs = {
                i: refs
                for i in recorder.inputs
                if (refs := recorder.unchanged_inputs(i)) is not None
            }
        return Pass(
            session.records,
            kept_inputs,
            recorder.outputs,
            recorder.finished,
            sub.kept if sub else [],
            backward_order=recorder.backward_order,
            param_grads=grads,
            grad_outputs=recorder.grad_outputs,
            grad_inputs_pos=recorder.grad_inputs_pos,
            loss=loss_value,
            measured={} if measure is None else measure.diffs,
            in_diverged={} if measure is None else measure.in_diverged,
        )

    try:
        with (
            keep_cwd(),
            running(side.vs, device),
            HookSession(
                side.model,
                probes,
                mode=mode,
                call=side.call,
                backward=loss is not None,
                grad=grad,
            ) as session,
        ):
            torch.manual_seed(side.seed if side.vs.seed is None else side.vs.seed)
            try:
                output = session.forward(args, kwargs)
                if loss is not None:
                    from hookcli.losses import make_loss

                    value = make_loss(loss, side.prepared.inputs)(output)
                    loss_value = None if value.is_meta else float(value.detach())
                    session.backward(value)
                    grads = {
                        n: p.grad.detach().clone()
                        for n, p in side.model.named_parameters()
                        if p.grad is not None
                    }
            except RunError as err:  # the calls that ran are still reported (PassFailed)
                failed, where = err, session.failure or session.backward_failure
            session.finish()
            note_meta_assumptions(session, side.prepared.settings)
    except RunError as err:
        raise RunError(f"{side.label}: {err.message}", module=err.module) from err
    except BaseException as stop:  # the other side of a run in step stopped this one
        if session is not None:
            stop.partial = made()  # type: ignore[attr-defined]
        raise
    done = made()
    if failed is not None:
        raise PassFailed(failed, side.label, stage, done, where) from failed
    return done


def fresh_inputs(value: Any) -> Any:
    """A pass's own copy of the run's input tensors (the structures around them rebuilt
    as ``move_tensors`` rebuilds them): a forward that writes its input in place
    (``x.mul_(2)``, ``ReLU(inplace=True)`` on it) changes its own pass's copy only, so
    every pass of A and B starts from the user's values. Meta tensors, which hold no
    values, are kept."""
    import torch

    from hookcli.structures import _rebuildable, rebuild

    def leaf(v: Any) -> Any:
        if not isinstance(v, torch.Tensor) or v.is_meta:
            return v
        return v.detach().clone().requires_grad_(v.requires_grad)

    return rebuild(value, leaf, _rebuildable)


def _device(side: Side) -> Any:
    import torch

    return torch.device(side.prepared.settings["device"])


def b_inputs(a: Prepared, vs: Vs, device: Any) -> tuple[Any, dict[str, Any]]:
    """A's input tensors for B: the same objects, cast/moved only where --vs says so
    (each pass then runs on its own copy: ``fresh_inputs``)."""
    import torch

    from hookcli.structures import move_tensors

    assert a.inputs is not None
    args, kwargs = a.inputs.args, dict(a.inputs.kwargs)
    if vs.dtype is None and vs.device is None:
        return args, kwargs
    dtype = getattr(torch, vs.dtype) if vs.dtype else None
    return move_tensors(args, device, dtype), move_tensors(kwargs, device, dtype)


def run_compare(a: Side, b: Side, plan: Plan, mode: Mode) -> CompareReport | str:
    """Both sides' passes, the alignment and the figures: the report (or, for
    ``print_map``, the ``--map`` rules as text)."""
    from hookcli.compare.metrics import computed_in, release_scratch
    from hookcli.session import hooks_outside_compile

    try:  # (B under torch.compile: the hooks run eagerly where its graph breaks)
        with hooks_outside_compile(b.vs.compile is not None), computed_in(lowest_precision(b)):
            return _run_compare(a, b, plan, mode)
    finally:
        release_scratch()


def lowest_precision(b: Side) -> str | None:
    """The dtype B computes in below what its outputs show, whose default tolerance every
    floating pair then gets at least: autocast's (``--vs amp=bf16``: which op ran in
    bfloat16 no output says; a float32 residual add carries its children's rounding) and
    a half-precision ``--vs dtype`` (a float32 upcast of half-precision values)."""
    from hookcli.amp import CHOICES

    if b.vs.amp is not None:
        return CHOICES[b.vs.amp]
    if b.vs.dtype in ("float16", "bfloat16"):
        return b.vs.dtype
    return None


def _run_compare(a: Side, b: Side, plan: Plan, mode: Mode) -> CompareReport | str:
    from hookcli.compare.align import align, print_map
    from hookcli.errors import UsageError

    assert a.prepared.inputs is not None
    meta = (
        str(a.prepared.settings["device"]) == "meta" or str(b.prepared.settings["device"]) == "meta"
    )
    args_a, kwargs_a = a.prepared.inputs.args, dict(a.prepared.inputs.kwargs)
    args_b, kwargs_b = b_inputs(a.prepared, b.vs, _device(b))
    loss = (plan.loss or "sum") if plan.backward and not meta else None
    failures: list[PassFailed] = []

    def attempt(run: Callable[[], Pass]) -> Pass:
        """A pass; where the model raises and ``plan.partial`` asks for the report of
        what ran: the pass as far as it got, its failure noted (once per side and mode)."""
        try:
            return run()
        except PassFailed as failed:
            if not plan.partial:
                raise
            if not any((f.side, f.stage) == (failed.side, failed.stage) for f in failures):
                failures.append(failed)
            return failed.partial

    step = _can_step(a, b, plan, mode, meta)
    if step:  # A and B in step: A's outputs measured as they come, none kept
        pa, pb, foreseen, failures = _propagated_in_step(
            a, b, plan, mode, args_a, kwargs_a, args_b, kwargs_b
        )
    else:
        pa = attempt(lambda: _run_pass(a, args_a, kwargs_a, mode, inputs=not meta, loss=loss))
        # (with --copy-weights this pass only finds B's calls: B measured with A's weights)
        foreseen = None if meta or plan.copy_weights else _measure(_foreseen(pa, plan), pa, plan)
        # (on meta B's outputs are kept, shapes only, for the shape check)
        pb = attempt(
            lambda: _run_pass(b, args_b, kwargs_b, mode, loss=loss, measure=foreseen, outputs=meta)
        )
    if foreseen is not None:  # the calls with no partner foreseen: their copies, inputs
        pb.outputs = foreseen.outputs
        pb.inputs = {j: refs for j in foreseen.input_refs if (refs := foreseen.unchanged_inputs(j))}
    infos_a, infos_b = _infos(pa.records, pa.finished), _infos(pb.records, pb.finished)
    opened = (_infos(pa.records, pa.finished, False), _infos(pb.records, pb.finished, False))
    alignment = align(
        infos_a, infos_b, plan.rules, plan.align, stopped=bool(failures), opened=opened
    )
    if not alignment.pairs and not failures:
        raise UsageError(
            "A and B have nothing aligned: no module name, --map rule or call sequence pairs "
            "them; give --map 'A_PATTERN=B_PATTERN' rules"
        )
    by_a = {r.index: r for r in pa.records}
    by_b = {r.index: r for r in pb.records}
    module_pairs: list[tuple[str, str]] = []
    for i, j in sorted(alignment.pairs.items()):
        pair = (by_a[i].name, by_b[j].name)
        if pair not in module_pairs:
            module_pairs.append(pair)
    if plan.print_map:
        if failures:  # no map from a run that stopped
            raise failures[0]
        for note in alignment.notes:  # (a --map rule that matched no call)
            print(f"hookcli: note: {note}", file=sys.stderr, flush=True)
        text, left_out = print_map(infos_a, infos_b, alignment)
        for note in left_out:  # (modules whose calls no rule can pair)
            print(f"hookcli: note: {note}", file=sys.stderr, flush=True)
        return text
    copied = None
    if plan.copy_weights:
        from hookcli.compare.weights import copy_weights

        if meta:
            raise UsageError("--copy-weights needs values: --device meta holds shapes only")
        # after a failure, B's parameters of modules that returned no call stay as built
        # (nothing compared ran through them)
        returned = {r.name for r in pb.records if r.done}
        unrun = (
            [n for n, _ in b.model.named_parameters() if n.rpartition(".")[0] not in returned]
            if failures
            else []
        )
        copied = copy_weights(a.model, b.model, module_pairs, unrun)
        known = _measure(_partners(alignment, by_b), pa, plan, keep_rest=False)
        failures[:] = [f for f in failures if f.side != "B"]  # B runs again: its own now
        pb = attempt(  # A's weights
            lambda: _run_pass(b, args_b, kwargs_b, mode, loss=loss, measure=known, outputs=False)
        )
        infos_b2 = _infos(pb.records, pb.finished)
        if [(c.name, c.call) for c in infos_b2] != [(c.name, c.call) for c in infos_b]:
            raise UsageError("--copy-weights: B called other modules with A's weights")
    local = None
    if not meta:
        if step:  # the pairs measured against another call than foreseen: A's copies
            _recall(a, pa, pb, alignment, args_a, kwargs_a, mode, attempt)
        pb.diffs = _settle(b, pa, pb, alignment, plan, args_b, kwargs_b, mode, attempt)
    if not meta and plan.local and not failures:  # (after a failure: no local mode)
        fed = _fed(alignment, pa, plan.depth)
        if step:
            local = _local_in_step(a, b, pa, pb, fed, plan, mode, (args_a, kwargs_a),
                                   (args_b, kwargs_b), foreseen.writes)  # fmt: skip
        else:
            local = _local_passes(b, pa, pb, fed, plan, args_b, kwargs_b, mode, a.model)
        if local.error is not None:
            failures.append(local.error)
    return _report(a, b, plan, mode, pa, pb, local, alignment, meta, copied, failures)


def _fed(alignment: Alignment, pa: Pass, depth: int | None) -> Alignment:
    """The pairs the local mode feeds A's values to: with ``--depth N`` only the calls at
    depth <= N, so a call deeper runs B's own code and its error counts to its ancestor
    at depth N (a row folded by --depth shows what its whole subtree adds)."""
    if depth is None:
        return alignment
    depths = {r.index: r.depth for r in pa.records}
    pairs = {i: j for i, j in alignment.pairs.items() if depths[i] <= depth}
    return dataclasses.replace(alignment, pairs=pairs)


def _shown(i: int, pa: Pass, by_a: Any, depth: int | None) -> int:
    """The row that shows call ``i`` under ``--depth``: the call itself, or its enclosing
    call at depth N."""
    while depth is not None and by_a[i].depth > depth:
        up = _enclosing(i, pa)
        if up is None:
            break
        i = up
    return i


def _can_step(a: Side, b: Side, plan: Plan, mode: Mode, meta: bool) -> bool:
    """Whether A and B can run in step (A in a greenlet of its own): on the CPU, in eval,
    forward only, with partners foreseen by name, two distinct models, no profiler or
    tracer, and no setting that is the process's rather than the run's (autocast as
    hookcli sets it, the thread count, determinism, the global seed, a compiled B). Else
    they run one after the other, A's outputs copied."""
    import sys

    vs = b.vs
    if (
        meta
        # a profiler or tracer (cProfile, coverage, a debugger) keeps one frame stack per
        # thread: a switch between A's stack and B's would cross it
        or sys.getprofile() is not None
        or sys.gettrace() is not None
        or plan.copy_weights
        or plan.backward
        or plan.align == "order"
        or mode is not Mode.EVAL
        or vs.amp is not None
        or vs.threads is not None
        or vs.deterministic
        or vs.seed is not None
        or vs.compile is not None
        or _device(a).type != "cpu"
        or _device(b).type != "cpu"
    ):
        return False
    ids_a = {id(m) for m in a.model.modules()}
    return not any(id(m) in ids_a for m in b.model.modules())


class _ByName(Mapping[tuple[str, int], tuple[str, int]]):
    """B's (name, call) -> A's (name, call), through a map of names."""

    def __init__(self, names: Mapping[str, str]) -> None:
        self.names = names

    def __getitem__(self, key: tuple[str, int]) -> tuple[str, int]:
        return (self.names[key[0]], key[1])

    def __iter__(self) -> Any:
        return iter(())

    def __len__(self) -> int:
        return 0


class _Wanted:
    """The lists A offers B: inputs and outputs of the calls of the modules named."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def __contains__(self, item: Any) -> bool:
        return item[1][0] in self.names


def _in_step(a: Side, a_call: tuple[Any, Any], mode: Mode, handoff: Any, keep_rest: bool,
             run_b: Any, stage: str = "propagated", offer: Any = None,
             finish_a: bool = False) -> tuple[Pass, Any, Any]:  # fmt: skip
    """A's pass in a greenlet of its own, offering its tensors to ``run_b`` (B's pass,
    here) through ``handoff``; an error of either stops the other at once, and A's is
    raised here. Each session enters its own grad mode (``no_grad``: their probes read
    version counters); ``Handoff`` keeps each side's across the switches. A side's
    ``PassFailed`` is raised with the other side's pass as far as it got (``other``);
    with ``finish_a``, B's failure lets A's pass run on to its end (A's own failure, if it
    fails too, then in ``also``)."""
    from hookcli.compare.record import AFailed, Offer

    offer = offer or Offer(handoff, keep_rest)
    done: dict[str, Any] = {}

    def run_a() -> None:
        error = None
        try:
            done["pass"] = _run_pass(
                a, a_call[0], a_call[1], mode, keep=set(), extra=[offer], stage=stage
            )
        except BaseException as err:  # raised here (B stops at its next ask for A's)
            error = done["error"] = err
        finally:
            handoff.a_finished(error)

    handoff.start(run_a)
    try:
        pb = run_b()
    except AFailed as stop:
        pb = getattr(stop, "partial", None)
    except PassFailed as failed:  # B's model raised: A stops where it is, or runs on
        handoff.b_finished(failed=not finish_a)
        error = done.get("error")
        failed.other = done.get("pass") or getattr(error, "partial", None)
        failed.also = error if isinstance(error, PassFailed) else None
        raise
    except BaseException:
        handoff.b_finished(failed=True)  # A stops where it is
        raise
    handoff.b_finished()
    if "error" in done:
        if isinstance(done["error"], PassFailed):
            done["error"].other = pb
        raise done["error"]
    return done["pass"], pb, offer


def _propagated_in_step(
    a: Side, b: Side, plan: Plan, mode: Mode, args_a: Any, kwargs_a: Any, args_b: Any,
    kwargs_b: Any,
) -> tuple[Pass, Pass, Any, list[PassFailed]]:  # fmt: skip
    """The propagated mode with A and B in step: each of B's calls whose partner is
    foreseen by name (as ``_foreseen``) is measured against A's own output, lent while A
    waits; A keeps copies only of what B does not take."""
    from hookcli.compare.align import map_name
    from hookcli.compare.record import Handoff, Lent, Measure, Offer

    names: dict[str, str] = {}
    for name, _ in a.model.named_modules():
        names.setdefault(map_name(name, plan.rules)[0], name)
    handoff = Handoff(_Wanted(set(names.values())))
    measure = Measure(
        _ByName(names),
        Lent(handoff, "out"),
        plan.rtol,
        plan.atol,
        ref_inputs=Lent(handoff, "in"),
        keep_rest=True,
        track_writes=True,
    )
    offer = Offer(handoff, True)
    failures: list[PassFailed] = []
    try:
        pa, pb, _ = _in_step(
            a, (args_a, kwargs_a), mode, handoff, True,
            lambda: _run_pass(b, args_b, kwargs_b, mode, measure=measure, outputs=False),
            offer=offer, finish_a=plan.partial,
        )  # fmt: skip
    except PassFailed as failed:  # each side's pass as far as it got
        if not plan.partial:
            raise
        failures = [f for f in (failed.also, failed) if f is not None]
        mine, other = failed.partial, failed.other or Pass((), {}, {}, [])
        pa, pb = (mine, other) if failed.side == "A" else (other, mine)
    index_a = {(r.name, r.call): r.index for r in pa.records}
    pb.measured = {j: (index_a[k], d) for j, (k, d) in measure.diffs.items() if k in index_a}
    pb.in_diverged = {
        j: (index_a[k], v) for j, (k, v) in measure.in_diverged.items() if k in index_a
    }
    measure.diffs, measure.in_diverged = {}, {}
    pa.outputs = {**offer.outputs, **handoff.left("out")}
    pa.inputs = {**offer.inputs, **handoff.left("in")}
    return pa, pb, measure, failures


def _recall(
    a: Side, pa: Pass, pb: Pass, alignment: Alignment, args_a: Any, kwargs_a: Any, mode: Mode,
    attempt: Any,
) -> None:  # fmt: skip
    """(After a run in step) A's outputs again, by one more pass of A keeping only them,
    for the aligned calls that were measured against another call than the alignment's
    and whose copy A did not keep."""
    lost = {
        i
        for i, j in alignment.pairs.items()
        if (pb.measured.get(j) or (None,))[0] != i and i not in pa.outputs
    }
    if lost:
        again = attempt(lambda: _run_pass(a, args_a, kwargs_a, mode, keep=lost))
        pa.outputs.update(again.outputs)


def _local_in_step(
    a: Side, b: Side, pa: Pass, pb: Pass, alignment: Alignment, plan: Plan, mode: Mode,
    call_a: tuple[Any, Any], call_b: tuple[Any, Any], writes: set[str] | None = None,
) -> Pass:  # fmt: skip
    """The local mode (as ``_local_passes``) with A run again, in step: each aligned call
    of B gets a copy of A's input for the call and hands on a copy of A's output, taken
    as A makes them; nothing of A's is held beyond the call. A call whose inputs are
    those copies already, unchanged, keeps them where its module was not seen changing
    an input in place (``writes``: the propagated pass's); should it change them, the
    pass runs again with every input copied (``Unfed``)."""
    from hookcli.compare.record import Unfed

    if writes is not None:
        try:
            return _local_in_step_once(a, b, pa, pb, alignment, plan, mode, call_a, call_b,
                                       writes)  # fmt: skip
        except Unfed:
            pass
    return _local_in_step_once(a, b, pa, pb, alignment, plan, mode, call_a, call_b, None)


def _local_in_step_once(
    a: Side, b: Side, pa: Pass, pb: Pass, alignment: Alignment, plan: Plan, mode: Mode,
    call_a: tuple[Any, Any], call_b: tuple[Any, Any], writes: set[str] | None,
) -> Pass:  # fmt: skip
    from hookcli.compare.record import Handoff, Lent, Measure, Substitute

    by_a = {r.index: r for r in pa.records}
    by_b = {r.index: r for r in pb.records}
    partner = {
        (by_b[j].name, by_b[j].call): (by_a[i].name, by_a[i].call)
        for i, j in alignment.pairs.items()
    }
    handoff = Handoff({(k, akey) for akey in partner.values() for k in ("in", "out")})
    sub = Substitute(
        Lent(handoff, "in", partner),
        Lent(handoff, "out", partner),
        plan.rtol,
        plan.atol,
        names={n for n, _ in partner},
        copy=True,
        writes=writes,
    )
    measure = Measure(partner, Lent(handoff, "out", keep_lent=True), plan.rtol, plan.atol)
    error = None
    try:
        _in_step(
            a, call_a, mode, handoff, False,
            lambda: _run_pass(b, call_b[0], call_b[1], mode, substitute=sub, keep=set(),
                              measure=measure, stage="local"),
            stage="local",
        )  # fmt: skip
    except PassFailed as failed:  # the figures measured up to there
        if not plan.partial:
            raise
        error = failed
    index_a = {(r.name, r.call): r.index for r in pa.records}
    diffs: dict[int, CallDiff] = {index_a[k]: d for k, d in measure.diffs.values() if k in index_a}
    for bkey, handed in sub.handed.items():
        i = index_a.get(partner[bkey])
        if i is not None:
            given = _handed(handed, lambda k: partner[k][0] if k in partner else k[0])
            diffs[i] = _worst([d for d in (diffs.get(i), *given) if d is not None])
    pa.outputs, pa.inputs = {}, {}
    return Pass(pb.records, {}, {}, pb.finished, sub.kept, diffs=diffs, error=error)


def _foreseen(pa: Pass, plan: Plan) -> dict[tuple[str, int], int]:
    """B's (name, call) -> A's call, before B ran: the names the alignment pairs first
    (``--map`` rules, else the same name); none under ``--align order``."""
    from hookcli.compare.align import map_name

    if plan.align == "order":
        return {}
    out: dict[tuple[str, int], int] = {}
    for r in pa.records:
        if r.done:
            out.setdefault((map_name(r.name, plan.rules)[0], r.call), r.index)
    return out


def _partners(alignment: Alignment, by_b: Mapping[int, Any]) -> dict[tuple[str, int], int]:
    return {(by_b[j].name, by_b[j].call): i for i, j in alignment.pairs.items()}


def _measure(
    partner: Mapping[tuple[str, int], int],
    pa: Pass,
    plan: Plan,
    keep_rest: bool = True,
    inputs: bool = True,
) -> Any:
    from hookcli.compare.record import Measure

    return Measure(
        partner,
        pa.outputs,
        plan.rtol,
        plan.atol,
        ref_inputs=pa.inputs if inputs else None,
        keep_rest=keep_rest,
    )


def _settle(
    b: Side,
    pa: Pass,
    pb: Pass,
    alignment: Alignment,
    plan: Plan,
    args_b: Any,
    kwargs_b: Any,
    mode: Mode,
    attempt: Any,
) -> dict[int, CallDiff]:
    """The propagated figures of every aligned call: measured in B's pass where its
    partner was foreseen, else from the copy its call kept (then dropped); a call the
    alignment paired otherwise than foreseen, with no copy, is measured in one more pass
    of B that keeps those calls' outputs alone."""
    from hookcli.compare.metrics import call_diff
    from hookcli.compare.record import diverged

    out: dict[int, CallDiff] = {}
    missing: dict[int, int] = {}
    for i, j in alignment.pairs.items():
        measured = pb.measured.get(j)
        if measured is not None and measured[0] == i:
            out[i] = measured[1]
        elif j in pb.outputs and i in pa.outputs:
            out[i] = call_diff(pa.outputs[i], pb.outputs[j], plan.rtol, plan.atol)
            if j in pb.inputs and i in pa.inputs:
                ins = diverged(pa.inputs[i], pb.inputs[j], plan.rtol, plan.atol)
                pb.in_diverged[j] = (i, ins)
        elif i in pa.outputs:
            missing[j] = i
    pb.outputs, pb.inputs = {}, {}
    if missing:
        by_b = {r.index: r for r in pb.records}
        partner = {(by_b[j].name, by_b[j].call): i for j, i in missing.items()}
        extra = attempt(
            lambda: _run_pass(
                b,
                args_b,
                kwargs_b,
                mode,
                keep=set(),
                measure=_measure(partner, pa, plan, keep_rest=False),
            )
        )
        out.update({i: d for i, d in extra.measured.values()})
        pb.in_diverged.update(extra.in_diverged)
    pb.measured = {}
    return out


def _local_passes(
    b: Side,
    pa: Pass,
    pb: Pass,
    alignment: Alignment,
    plan: Plan,
    args_b: Any,
    kwargs_b: Any,
    mode: Mode,
    model_a: Any = None,
) -> Pass:
    """The local mode: one pass of B in which every aligned call runs its own code on
    A's values: its input is A's input for that call (a forward pre-hook) and its
    children's outputs are A's (a forward hook on each, after it was measured), so its
    error is the one its own code adds (with, where B's dtype is another, the rounding
    of its children's outputs handed on in B's dtype; and the whole error of a child
    with no partner, run as B's code). A call's
    local figures are the worst (by relative L2) of its outputs and of the inputs its code
    hands to its aligned children (code between two children shows only there). Each fed
    call is measured as it returns; A's copies are dropped after the pass."""
    from hookcli.compare.record import Substitute

    by_b = {r.index: r for r in pb.records}
    diffs: dict[int, CallDiff] = {}
    pairs = dict(alignment.pairs)
    kept: list[tuple[str, int]] = []
    local_grads: dict[int, dict[str, Any]] = {}
    first_grad_local = None
    error = None
    if pairs:
        sources = {
            (by_b[j].name, by_b[j].call): pa.inputs.pop(i)
            for i, j in pairs.items()
            if i in pa.inputs
        }
        partner = _partners(alignment, by_b)
        outputs = {k: pa.outputs[i] for k, i in partner.items() if i in pa.outputs}
        backward = plan.backward and bool(pa.grad_outputs)
        sub = Substitute(
            sources,
            outputs,
            plan.rtol,
            plan.atol,
            grad_outputs={k: pa.grad_outputs[i] for k, i in partner.items()
                          if i in pa.grad_outputs} if backward else None,
            grad_inputs={k: pa.grad_inputs_pos[i] for k, i in partner.items()
                         if i in pa.grad_inputs_pos} if backward else None,
            shared=_shared_params(b.model),
        )  # fmt: skip
        measure = _measure(partner, pa, plan, keep_rest=False, inputs=False)
        try:
            p = _run_pass(b, args_b, kwargs_b, mode, substitute=sub, keep=set(),
                          measure=measure, grad=backward, stage="local")  # fmt: skip
        except PassFailed as failed:  # the figures measured up to there
            if not plan.partial:
                raise
            p, error = failed.partial, failed
        del sources, outputs
        pa.grad_outputs = {}  # (grad_inputs_pos holds the report's grad_input tensors)
        if backward:
            local_grads, first_grad_local = _local_grad_report(
                sub, pa, pb, alignment, plan, _tied_names(model_a)
            )
        diffs.update({i: d for i, d in p.measured.values()})
        by_a = {r.index: r for r in pa.records}
        for key, handed in sub.handed.items():  # the code between a call's children
            i = partner[key]
            given = _handed(handed, lambda k: by_a[partner[k]].name if k in partner else k[0])
            diffs[i] = _worst([d for d in (diffs.get(i), *given) if d is not None])
        kept = p.kept
    pa.outputs, pa.inputs = {}, {}
    return Pass(pb.records, {}, {}, pb.finished, kept, diffs=diffs, local_grads=local_grads,
                first_grad_local=first_grad_local, error=error)  # fmt: skip


def _shared_params(model: Any) -> set[int]:
    """The ids of the parameters two or more modules hold (tied weights): the grad of
    one is the sum over all its modules', no one module's own."""
    seen: set[int] = set()
    shared: set[int] = set()
    for m in model.modules():
        for p in m.parameters(recurse=False):
            (shared if id(p) in seen else seen).add(id(p))
    return shared


def _tied_names(model: Any) -> set[str]:
    """The names (as ``named_parameters`` gives them) of a model's tied parameters."""
    if model is None:
        return set()
    shared = _shared_params(model)
    return {n for n, p in model.named_parameters() if id(p) in shared}


def _local_grad_report(
    sub: Any, pa: Pass, pb: Pass, alignment: Alignment, plan: Plan, tied_a: set[str]
) -> tuple[dict[int, dict[str, Any]], dict[str, Any] | None]:
    """The local pass's gradient figures by A's call (``local_grad_input_*``, and on a
    module's first call ``local_param_grad_*``: B's grads of its own parameters summed over
    its calls against A's, as A's accumulate, given only where every call of both was
    measured; tied parameters left out); and the first call, in A's backward order, out
    of tolerance."""
    import collections

    by_a = {r.index: r for r in pa.records}
    by_b = {r.index: r for r in pb.records}
    calls_a = collections.Counter(r.name for r in pa.records)
    calls_b = collections.Counter(r.name for r in pb.records)
    summed = {
        (f"{m}.{n}" if m else n): g for m, gs in sub.param_grads.items() for n, g in gs.items()
    }
    # A's grads of tied parameters hold every holder's part: not compared
    grads_a = {n: g for n, g in pa.param_grads.items() if n not in tied_a}
    cols: dict[int, dict[str, Any]] = {}
    diverged: dict[int, tuple[str, str | None]] = {}
    for i, j in alignment.pairs.items():
        ra, rb = by_a[i], by_b[j]
        gi = sub.grad_diffs.get((rb.name, rb.call))
        whole = (
            ra.call == 0
            and calls_a[ra.name] == calls_b[rb.name] == sub.grad_calls.get(rb.name, 0)
            and not sub.grad_missed.get(rb.name)
        )
        pg = _param_grads(grads_a, summed, ra, rb, plan) if whole else None
        data = _grad_columns(i, gi, pg, "local_", diverged)
        if data:
            cols[i] = data
    return cols, _first_in_backward(pa, diverged, by_a, by_b, alignment)


def _grad_columns(
    i: int,
    gi: CallDiff | None,
    pg: tuple[CallDiff, list[tuple[str, str]]] | None,
    prefix: str,
    diverged: dict[int, tuple[str, str | None]],
) -> dict[str, Any]:
    """A call's gradient columns (``PREFIXgrad_input_*``, ``PREFIXparam_grad_*`` and the
    per-parameter list), noting in ``diverged`` what of A's call ``i`` diverged (and the
    problem of its worst tensor: ``no grad in B``, ...)."""
    data: dict[str, Any] = {}
    if gi is not None:
        data.update(gi.summary(f"{prefix}grad_input_"))
        data[f"{prefix}grad_inputs"] = [t.to_dict() for t in gi.tensors]
        if gi.diverged:
            diverged[i] = ("grad_input", _problem(gi))
    if pg is not None:
        cd, names = pg
        data.update(cd.summary(f"{prefix}param_grad_"))
        data[f"{prefix}param_grads"] = [
            {"a": a, "b": b, **t.to_dict()} for (a, b), t in zip(names, cd.tensors, strict=True)
        ]
        if cd.diverged:
            diverged.setdefault(i, ("param_grad", _problem(cd)))
    return data


def _problem(cd: CallDiff) -> str | None:
    bad = cd.first_bad()
    return None if bad is None else bad.problem


def _first_in_backward(
    pa: Pass,
    diverged: Mapping[int, tuple[str, str | None]],
    by_a: Any,
    by_b: Any,
    alignment: Alignment,
) -> dict[str, Any] | None:
    """The first call of ``diverged``, in A's backward order, with its partner."""
    for i in pa.backward_order:
        if i in diverged:
            ra, rb = by_a[i], by_b[alignment.pairs[i]]
            what, problem = diverged[i]
            return {"module": ra.name, "partner": rb.name, "call": ra.call,
                    "partner_call": rb.call, "what": what, "problem": problem}  # fmt: skip
    return None


def _handed(handed: Sequence[tuple[Any, CallDiff]], name_a: Any) -> list[CallDiff]:
    """The figures of the inputs a call handed its children, each saying which child's
    (by A's name)."""
    return [
        dataclasses.replace(d, at=f"input of {name_a(child) or '(root)'}") for child, d in handed
    ]


def _worst(diffs: Sequence[CallDiff]) -> CallDiff:
    """The figures with the largest relative L2 (a NaN counts as largest)."""

    def key(d: CallDiff) -> float:
        v = d.rel_l2
        return -1.0 if v is None else (math.inf if math.isnan(v) else v)

    return max(diffs, key=key)


def _param_grads(
    grads_a: Mapping[str, Any],
    grads_b: Mapping[str, Any],
    ra: Any,
    rb: Any,
    plan: Plan,
    params_a: Sequence[str] | None = None,
    params_b: Sequence[str] | None = None,
) -> tuple[CallDiff, list[tuple[str, str]]] | None:
    """The grads of A's call's module's own parameters (``grads_a``: by qualified name)
    against its partner's (by local name, else by position; a Linear/Conv1D weight
    transposed). ``params_a``/``params_b``: every parameter of each side (qualified
    names), so that a parameter whose grad is None on one side only (B's backward never
    reached it: a ``detach()``) is a divergence (``no grad in B``), told apart from one
    that side lacks (``missing in B``); a parameter with no grad on either side (frozen
    on both) is left out."""
    from hookcli.compare.metrics import CallDiff, tensor_diff

    def own(names: Any, module: str) -> list[str]:
        prefix = f"{module}." if module else ""
        return [
            n[len(prefix) :] for n in names if n.startswith(prefix) and "." not in n[len(prefix) :]
        ]

    def qualified(module: str, name: str) -> str:
        return f"{module}.{name}" if module else name

    na = own(grads_a if params_a is None else params_a, ra.name)
    nb = own(grads_b if params_b is None else params_b, rb.name)
    crossed = {ra.type, rb.type} == {"Linear", "Conv1D"}
    tensors: list[Any] = []
    names: list[tuple[str, str]] = []
    for pos, name in enumerate(na):
        partner = name if name in nb else (nb[pos] if len(na) == len(nb) else "")
        g = grads_a.get(qualified(ra.name, name))
        other = grads_b.get(qualified(rb.name, partner)) if partner else None
        if g is None and other is None:
            continue  # no grad on either side (frozen on both), or B has no such parameter
        if other is not None and crossed and other.dim() == 2:
            other = other.t()
        if partner:
            tensors.append(_grad_diff(len(tensors), g, other, plan))
        else:  # B has no such parameter: "missing in B", listed, not a divergence
            tensors.append(tensor_diff(len(tensors), g, other, plan.rtol, plan.atol))
        names.append((name, partner))
    if not tensors:
        return None
    return CallDiff(tuple(tensors)), names


def _grad_diff(index: int, a: Any, b: Any, plan: Plan) -> TensorDiff:
    """A's gradient against B's; one that a side's backward left None is ``no grad in B``
    (``in A``): a divergence, unlike an output tensor one side lacks."""
    from hookcli.compare.metrics import tensor_diff

    d = tensor_diff(index, a, b, plan.rtol, plan.atol)
    if (a is None) == (b is None):
        return d
    return dataclasses.replace(d, problem="no grad in B" if b is None else "no grad in A")


def _grads_by_position(
    ga: Sequence[Any] | None, gb: Sequence[Any] | None, plan: Plan
) -> CallDiff | None:
    """A call's grad_input, A's against B's by position (None where no grad reached; a
    side whose backward never reached the call: None everywhere): a grad on one side
    only is ``_grad_diff``'s divergence; None on both is left out."""
    from hookcli.compare.metrics import CallDiff

    if ga is None and gb is None:
        return None
    ga = [None] * len(gb or ()) if ga is None else ga
    gb = [None] * len(ga) if gb is None else gb
    tensors: list[Any] = []
    for pos in range(max(len(ga), len(gb))):
        a = ga[pos] if pos < len(ga) else None
        b = gb[pos] if pos < len(gb) else None
        if a is None and b is None:
            continue
        tensors.append(_grad_diff(len(tensors), a, b, plan))
    return CallDiff(tuple(tensors)) if tensors else None


def _grad_report(
    pa: Pass,
    pb: Pass,
    alignment: Alignment,
    by_a: Any,
    by_b: Any,
    plan: Plan,
    params: tuple[Sequence[str], Sequence[str]] | None = None,
) -> tuple[dict[int, dict[str, Any]], dict[str, Any] | None]:
    """Per aligned call: its grad_input (by position) and (first call only) its
    parameters' grads; and the first divergence in A's backward order. ``params``: both
    sides' parameter names, given where both backwards ran to their end: a grad one side
    has and the other lacks (None; a call whose backward hook never ran) then diverges."""
    cols: dict[int, dict[str, Any]] = {}
    diverged: dict[int, tuple[str, str | None]] = {}
    for i, j in alignment.pairs.items():
        ga, gb = pa.grad_inputs_pos.get(i), pb.grad_inputs_pos.get(j)
        gi = _grads_by_position(ga, gb, plan) if params or (ga and gb) else None
        ra, rb = by_a[i], by_b[j]
        pg = (
            _param_grads(pa.param_grads, pb.param_grads, ra, rb, plan, *(params or (None, None)))
            if ra.call == 0
            else None
        )
        cols[i] = _grad_columns(i, gi, pg, "", diverged)
    return cols, _first_in_backward(pa, diverged, by_a, by_b, alignment)


def _diffs(pa: Pass, pb: Pass | None, alignment: Alignment, plan: Plan) -> dict[int, CallDiff]:
    from hookcli.compare.metrics import call_diff

    if pb is None:
        return {}
    if pb.diffs is not None:  # measured as the passes ran
        return pb.diffs
    out = {}
    cache: dict[tuple[int, int, int], Any] = {}  # (the copies stay alive while it is used)
    for i, j in alignment.pairs.items():
        if i in pa.outputs and j in pb.outputs:
            out[i] = call_diff(pa.outputs[i], pb.outputs[j], plan.rtol, plan.atol, cache)
    return out


def _input_diverged(i: int, pa: Pass, pb: Pass | None, alignment: Alignment, plan: Plan) -> bool:
    from hookcli.compare.metrics import call_diff

    j = alignment.pairs.get(i)
    tested = None if pb is None or j is None else pb.in_diverged.get(j)
    if tested is not None and tested[0] == i:  # tested as B ran
        return tested[1]
    if pb is None or j is None or i not in pa.inputs or j not in pb.inputs:
        return False
    return call_diff(pa.inputs[i], pb.inputs[j], plan.rtol, plan.atol).diverged


def _enclosing(i: int, pa: Pass) -> int | None:
    """The innermost call that began before call ``i`` and returned after it, or never
    returned (a failed pass: the calls still open when it stopped enclose ``i``)."""
    pos = {k: n for n, k in enumerate(pa.finished)}
    at = pos.get(i, math.inf)
    for j in range(i - 1, -1, -1):
        end = pos.get(j, math.inf)
        if end > at or (end == at == math.inf):
            return j
    return None


def _divergence(
    pa: Pass,
    diffs: Mapping[int, CallDiff],
    alignment: Alignment,
    by_a: Any,
    by_b: Any,
    pb: Pass | None = None,
    plan: Plan | None = None,
) -> dict[str, Any] | None:
    """The first call in A's order (of finishing: a module's output exists once it
    returned) whose output passes the tolerance. Where that call's input already differs
    (propagated mode, ``pb``), the error was made by the code around it: the enclosing
    call whose own code ran before it is named (the module that differs, not the first
    child that carries it)."""
    for i in pa.finished:
        d = diffs.get(i)
        if d is None or not d.diverged or i in alignment.doubtful:
            continue  # (a doubtful pair: another call order may pair other calls)
        if pb is not None and plan is not None:
            while _input_diverged(i, pa, pb, alignment, plan):
                up = _enclosing(i, pa)
                if up is None or up not in diffs or not diffs[up].diverged:
                    break
                i, d = up, diffs[up]
        t = d.first_bad()
        assert t is not None
        ra, rb = by_a[i], by_b[alignment.pairs[i]]
        return {
            "module": ra.name,
            "partner": rb.name,
            "call": ra.call,
            "partner_call": rb.call,
            "type": ra.type,
            "partner_type": rb.type,
            "input_shapes": [list(s) for s in ra.input_shapes],
            "output_shapes": [list(s) for s in ra.output_shapes],
            "output": t.index,
            "at": d.at or "output",
            "worst": None if t.worst is None else list(t.worst),
            "value_a": t.value_a,
            "value_b": t.value_b,
            "max_abs": t.max_abs,
            "rel_l2": t.rel_l2,
            "mismatched": t.mismatched,
            "problem": t.problem,
            "rtol": t.rtol,
            "atol": t.atol,
        }
    return None


def _ranking(
    diffs: Mapping[int, CallDiff], alignment: Alignment, by_a: Any, by_b: Any, top: int
) -> list[dict[str, Any]]:
    """Aligned calls by local relative L2, largest first, the calls beyond the tolerance
    before those within it (a relative error of rounding noise on values near zero, a
    gradient that is zero in exact arithmetic, is large but within ``atol``); a tie: the
    deeper module first, as a container whose last child made its output carries that
    child's error."""

    def key(i: int) -> tuple[bool, float, int]:
        v = diffs[i].rel_l2
        return (not diffs[i].diverged, -(math.inf if v is None or math.isnan(v) else v),
                -by_a[i].depth)  # fmt: skip

    ranked = sorted((i for i in diffs if diffs[i].rel_l2 is not None), key=key)
    return [
        {
            "module": by_a[i].name,
            "partner": by_b[alignment.pairs[i]].name,
            "call": by_a[i].call,
            "rel_l2": diffs[i].rel_l2,
            "sqnr_db": diffs[i].sqnr_db,
            "diverged": diffs[i].diverged,
        }
        for i in ranked[:top]
    ]


def _grad_ranking(rows: Sequence[Row], top: int) -> list[dict[str, Any]]:
    """Aligned calls by local gradient relative L2 (the larger of grad_input's and the
    parameters'), largest first, those beyond the tolerance first (as ``_ranking``); a
    tie: the deeper module first."""
    out = []
    for row in rows:
        d = row.data
        v = d.get("local_grad_rel_l2")
        if v is None:
            continue
        v = math.inf if math.isnan(v) else v
        out.append(
            {
                "module": d["name"],
                "partner": d["partner"],
                "call": d["call"],
                "rel_l2": v,
                "grad_input_rel_l2": d.get("local_grad_input_rel_l2"),
                "param_grad_rel_l2": d.get("local_param_grad_rel_l2"),
                "diverged": bool(
                    d.get("local_grad_input_diverged") or d.get("local_param_grad_diverged")
                ),
                "depth": d["depth"],
            }
        )
    out.sort(key=lambda r: (not r["diverged"], -r["rel_l2"], -r["depth"]))
    for r in out:
        del r["depth"]
    return out[:top]


def _report(
    a: Side,
    b: Side,
    plan: Plan,
    mode: Mode,
    pa: Pass,
    pb: Pass,
    local: Pass | None,
    alignment: Alignment,
    meta: bool,
    copied: Any,
    failures: Sequence[PassFailed] = (),
) -> CompareReport:
    from hookcli.compare.settings import idle_notes
    from hookcli.report import CheckResult, Row, shapes_list

    by_a = {r.index: r for r in pa.records}
    by_b = {r.index: r for r in pb.records}
    prop = _diffs(pa, pb, alignment, plan)  # (on meta: shapes only)
    loc = _diffs(pa, local, alignment, plan)
    first = _divergence(pa, prop, alignment, by_a, by_b, None if meta else pb, plan)
    grad_cols: dict[int, dict[str, Any]] = {}
    first_grad = None
    if plan.backward and not meta:
        whole = not failures  # (a backward that stopped: the grads that arrived only)
        params = (
            [n for n, _ in a.model.named_parameters()],
            [n for n, _ in b.model.named_parameters()],
        )
        grad_cols, first_grad = _grad_report(
            pa, pb, alignment, by_a, by_b, plan, params if whole else None
        )
    first_local = _divergence(pa, loc, alignment, by_a, by_b)
    marks = {}
    by_key = {(r.name, r.call): r.index for r in pa.records}
    if first_local is not None:
        marks[(first_local["module"], first_local["call"])] = "<- first divergence (local)"
    if first is not None:
        key = (first["module"], first["call"])
        row = by_a[_shown(by_key[key], pa, by_a, plan.depth)]
        if (row.name, row.call) != key:  # a call --depth hides: its row at depth N says so
            key = (row.name, row.call)
            marks[key] = "<- first divergence inside" + (
                "; first divergence (local)" if key in marks else ""
            )
        else:
            marks[key] = "<- first divergence" + (" (both)" if key in marks else "")
    sides, unreached = _failure_marks(failures, pa, b.model, plan, alignment)
    merged: dict[int, tuple[bool, list[str]]] = {}  # row -> (a call it hides, who failed)
    for i, who in sides.items():  # a failed call --depth hides: its row at depth N says so
        at = _shown(i, pa, by_a, plan.depth)
        inside, sofar = merged.get(at, (False, []))
        merged[at] = (inside or at != i, sofar + [w for w in who if w not in sofar])
    failed_marks = {
        at: f"<- failed {'inside' if inside else 'here'} ({' and '.join(who)})"
        for at, (inside, who) in merged.items()
    }
    rows = []
    for r in pa.records:
        if plan.depth is not None and r.depth > plan.depth:
            continue  # (the totals, the first divergence and the rankings cover every call)
        j = alignment.pairs.get(r.index)
        rb = by_b.get(j) if j is not None else None
        data: dict[str, Any] = {
            "name": r.name,
            "type": r.type,
            "depth": r.depth,
            "call": r.call,
            "partner": None if rb is None else rb.name,
            "partner_type": None if rb is None else rb.type,
            "partner_call": None if rb is None else rb.call,
            "aligned_by": alignment.how.get(r.index),
            "input_shapes": shapes_list(r.input_shapes),
            "output_shapes": shapes_list(r.output_shapes),
            "partner_output_shapes": None if rb is None else shapes_list(rb.output_shapes),
        }
        d, dl = prop.get(r.index), loc.get(r.index)
        for prefix, cd in (("", d), ("local_", dl)):
            if cd is None:
                data.update(
                    {
                        f"{prefix}{k}": None
                        for k in ("max_abs", "rel_l2", "cosine", "sqnr_db", "diverged")
                    }
                )
            else:
                data.update(cd.summary(prefix))
        if plan.backward:
            empty = {f"{p}{k}": None for p in ("grad_input_", "param_grad_", "local_grad_input_",
                                               "local_param_grad_")
                     for k in ("max_abs", "rel_l2", "cosine", "sqnr_db", "diverged")}  # fmt: skip
            local_g = {} if local is None else local.local_grads.get(r.index, {})
            data.update({**empty, **grad_cols.get(r.index, {}), **local_g})
            worst = [v for k in ("local_grad_input_rel_l2", "local_param_grad_rel_l2")
                     if (v := data[k]) is not None]  # fmt: skip
            data["local_grad_rel_l2"] = (
                max(worst, key=lambda v: math.inf if math.isnan(v) else v) if worst else None
            )
        display = _no_grad_cells(data) if plan.backward else {}
        data["outputs"] = [t.to_dict() for t in d.tensors] if d else []
        data["local_outputs"] = [t.to_dict() for t in dl.tensors] if dl else []
        if rb is not None and rb.name == r.name:
            # the same name: the table says so without repeating it (and the call, where
            # B's call of another number is the partner: another call order)
            display["partner"] = "=" if rb.call == r.call else f"= #{rb.call}"
        mark = marks.get((r.name, r.call))
        if r.index in failed_marks:  # (and the first divergence, where it is there)
            display["mark"] = failed_marks[r.index] + (f"; {mark[3:]}" if mark else "")
        elif rb is None and r.index in unreached:
            display["mark"] = "(not compared: B failed)"
        elif rb is None and r.done:
            display["mark"] = "(no partner)"
        elif mark:
            display["mark"] = mark
        rows.append(Row.of(data, display))
    unaligned_b = [
        Row.of(
            {
                "name": by_b[j].name,
                "type": by_b[j].type,
                "call": by_b[j].call,
                "output_shapes": shapes_list(by_b[j].output_shapes),
            }
        )
        for j in alignment.unaligned_b
    ]
    # A's calls with no partner because B stopped before (or in) their partner: not
    # compared, listed apart from the calls B has no partner for
    stopped = {i for i in alignment.unaligned_a if i in unreached or i in alignment.opened_pairs}
    unaligned_a = [
        {"name": by_a[i].name, "type": by_a[i].type, "call": by_a[i].call}
        for i in alignment.unaligned_a
        if by_a[i].done and i not in stopped
    ]
    not_compared = [
        {"name": by_a[i].name, "type": by_a[i].type, "call": by_a[i].call}
        for i in alignment.unaligned_a
        if by_a[i].done and i in stopped
    ]
    ranking = _ranking(loc, alignment, by_a, by_b, plan.top)
    grad_ranking = _grad_ranking(rows, plan.top) if plan.backward and not meta else []
    first_grad_local = None if local is None else local.first_grad_local
    checks: tuple[CheckResult, ...] = ()
    # a forward that stopped leaves the gate undecided, unless a divergence came first;
    # with --backward, a loss or backward that stopped leaves it so for the gradients
    grads = plan.backward and not meta
    undecided = any(f.stage == "propagated" and f.phase == "forward" for f in failures)
    # (a loss or backward that stopped: the forward is complete, the gradients are not)
    grads_cut = grads and any(f.stage == "propagated" for f in failures)
    if plan.fail_on_divergence and not (undecided and first is None and first_grad is None):
        if meta and first is None:
            detail = "every aligned call's shapes agree; on meta no values are compared"
            checks = (CheckResult("divergence", True, detail),)
        elif first is None and first_grad is None:
            detail = "every aligned call within tolerance" + (
                ", outputs (the gradients are not complete: the loss or backward failed)"
                if grads_cut
                else ", outputs and gradients"
                if grads
                else ""
            )
            checks = (CheckResult("divergence", True, detail),)
        elif first is None:
            assert first_grad is not None
            checks = (
                CheckResult(
                    "divergence",
                    False,
                    f"first grad divergence at {_grad_where(first_grad)}; the forward "
                    "outputs are within tolerance",
                    (first_grad["module"],),
                ),
            )
        else:
            checks = (
                CheckResult(
                    "divergence",
                    False,
                    f"first divergence at {_where(first)}",
                    (first["module"],),
                ),
            )
    settings = {**a.prepared.settings}
    settings["b"] = {
        k: v
        for k, v in b.prepared.settings.items()
        if a.prepared.settings.get(k) != v or k in ("device", "dtype")
    }
    if b.vs.given:
        settings["vs"] = list(b.vs.texts)
    settings["align"] = alignment.method
    if plan.rules:  # --map's rules, then --map-file's, in the order they are tried
        settings["map"] = [rule.text for rule in plan.rules]
    if plan.depth is not None:
        settings["depth"] = plan.depth
    settings["rtol"] = plan.rtol
    settings["atol"] = plan.atol
    totals: dict[str, Any] = {
        "values_compared": not meta,
        "aligned_calls": len(alignment.pairs),
        "calls_a": len([r for r in pa.records if r.done]),
        "calls_b": len([r for r in pb.records if r.done]),
        "unaligned_a": len(unaligned_a),
        "unaligned_b": len(unaligned_b),
        "not_compared": len(not_compared),
        "diverged_calls": sum(1 for d in prop.values() if d.diverged),
        "local_diverged_calls": sum(1 for d in loc.values() if d.diverged),
    }
    if plan.backward:
        totals["first_grad_divergence"] = first_grad
        totals["first_grad_divergence_local"] = first_grad_local
        totals["loss_a"], totals["loss_b"] = pa.loss, pb.loss
    root = prop.get(pa.records[0].index) if pa.records else None
    if root is not None:
        totals["output"] = root.summary()
    notes = [_side_line("A", a), _side_line("B", b), *alignment.notes]
    if meta:
        notes.append("on meta: alignment and shapes only; no values are compared")
    notes += idle_notes(b.vs, a.model, a.prepared.inputs, mode == Mode.TRAIN, a.seed, _device(a))
    if local is not None and local.kept:
        notes.append(
            f"local mode: {len(local.kept)} call(s) of B kept their own inputs or outputs "
            "(their number or shapes differ from A's, or their container cannot be rebuilt)"
        )
    # (a local pass that stopped: the calls after the failure have no local figures)
    fed = _fed(alignment, pa, plan.depth).pairs
    ok = local is not None and local.error is None
    unfed = [i for i in fed if i in prop and i not in loc] if ok else []
    if unfed:
        names = _cut([_name_call(by_a[i].name, by_a[i].call) for i in unfed])
        notes.append(
            f"local mode: {len(unfed)} aligned call(s) without local figures ({names}): "
            "B's call could not be fed A's values (a module run on a thread of the "
            "model's own is one such); their error counts to the calls around them"
        )
    notes += _failure_notes(failures)
    if plan.backward and not meta:
        notes.append(
            "--backward: propagated grads are each side's own backward; local grads are "
            "B's module's own backward from A's grad_output at A's input (none for a call "
            "whose children are fed A's values)"
        )
    if copied is not None:
        notes.append(
            f"--copy-weights: {len(copied.pairs)} parameter(s) copied from A"
            + (
                f", {len(copied.transposed)} transposed (Conv1D/Linear)"
                if copied.transposed
                else ""
            )
        )
    extra = {
        "values_compared": not meta,
        "first_divergence": first,
        "first_divergence_local": first_local,
        **(
            {
                "first_grad_divergence": first_grad,
                "first_grad_divergence_local": first_grad_local,
                "local_grad_ranking": grad_ranking,
            }
            if plan.backward
            else {}
        ),
        "local_ranking": ranking,
        "unaligned_a": unaligned_a,
        "not_compared": not_compared,
        "copied_weights": None
        if copied is None
        else [{"a": x, "b": y, "how": h} for x, y, h in copied.pairs],
    }
    error = _failure_error(failures)
    if error is not None:
        extra["failures"] = [
            {
                "side": f.side,
                "mode": f.stage,
                "phase": f.phase,
                **(f.where or {"module": None}),
                "error": f.reason,
            }
            for f in failures
        ]
    report = CompareReport(
        command="compare",
        model={
            "spec": a.prepared.loaded.spec,
            "class": type(a.model).__name__,
            "b_spec": b.prepared.loaded.spec,
            "b_class": type(b.model).__name__,
        },
        settings=settings,
        inputs=a.prepared.input_dicts(),
        totals=totals,
        checks=checks,
        lists={"calls": tuple(rows), "unaligned_b": tuple(unaligned_b)},
        primary="calls",
        notes=tuple(notes),
        error=None if error is None else error.message,
        failure=error,
        extra=extra,
        columns=tuple(_columns(meta, plan.backward)),
        table_totals=tuple(
            _totals_lines(
                first,
                first_local,
                ranking,
                alignment,
                totals,
                unaligned_a,
                unaligned_b,
                plan,
                grad_ranking,
                tensors=[t for d in prop.values() for t in d.tensors],
                failures=failures,
                not_compared=not_compared,
                local_ran=local is not None or not plan.local,
                floor=lowest_precision(b),
            )
        ),
    )
    return report


def _no_grad_cells(data: Mapping[str, Any]) -> dict[str, Any]:
    """The table's gradient cells of a call whose grads one side lacks: ``no grad in B``
    where there is no figure to show."""
    out: dict[str, Any] = {}
    for prefix in ("", "local_"):
        for key, tensors in (
            ("grad_input_rel_l2", "grad_inputs"),
            ("param_grad_rel_l2", "param_grads"),
        ):
            problems = sorted({
                t["problem"] for t in data.get(prefix + tensors) or ()
                if (t.get("problem") or "").startswith("no grad")
            })  # fmt: skip
            if problems and data.get(prefix + key) is None:
                out[prefix + key] = ", ".join(problems)
    return out


def _failure_marks(
    failures: Sequence[PassFailed], pa: Pass, model_b: Any, plan: Plan, alignment: Alignment
) -> tuple[dict[int, list[str]], set[int]]:
    """A's calls marked for a failure, with the sides that failed there: the call that
    failed (A's own, or for B's the call of A at its place in the alignment, else the one
    whose name maps to it, as ``--map`` maps names); and A's calls that B stopped before
    (B has the module, but no call of it returned)."""
    from hookcli.compare.align import map_name

    by_key = {(r.name, r.call): r.index for r in pa.records}
    mapped = {r.index: map_name(r.name, plan.rules)[0] for r in pa.records}
    sides: dict[int, list[str]] = {}
    for f in failures:
        if f.where is None:
            continue
        module, call = f.where["module"], f.where["call"]
        if f.side == "A":
            i = by_key.get((module, call))
        else:
            j = next((r.index for r in f.partial.records
                      if (r.name, r.call) == (module, call)), None)  # fmt: skip
            placed = {jb: ia for ia, jb in alignment.opened_pairs.items()}
            i = placed.get(j) if j is not None else None
            if i is None:
                i = next((r.index for r in pa.records
                          if r.call == call and mapped[r.index] == module), None)  # fmt: skip
        if i is not None:
            phase = f.phase if f.phase != "forward" else ""
            how = [w for w in (phase, f"{f.stage} mode" if f.stage != "propagated" else "") if w]
            sides.setdefault(i, []).append(f.side + (f" {', '.join(how)}" if how else ""))
    unreached: set[int] = set()
    if any(f.side == "B" and f.stage == "propagated" for f in failures):
        names_b = {n for n, _ in model_b.named_modules()}
        unreached = {r.index for r in pa.records if r.done and mapped[r.index] in names_b}
    return sides, unreached


def _failure_error(failures: Sequence[PassFailed]) -> RunError | None:
    """The one error of a run in which the model raised: one side's, or both sides' (one
    message where they failed alike: ``A and B: forward failed in ...``)."""
    if not failures:
        return None
    first = failures[0]
    if len(failures) == 1:
        return first
    if all(f.reason == first.reason and f.stage == first.stage for f in failures):
        label = " and ".join(f.side for f in failures)
        if first.stage != "propagated":
            label += f" ({first.stage} mode)"
        error = RunError(f"{label}: {first.reason}", module=first.module)
    else:
        error = RunError("; ".join(f.message for f in failures), module=first.module)
    error.__cause__ = first
    return error


def _failure_notes(failures: Sequence[PassFailed]) -> list[str]:
    """What the failures leave of the report (one note where both sides failed alike)."""
    first = failures[0] if failures else None
    if (
        first is not None
        and len(failures) == 2
        and all((f.reason, f.stage) == (first.reason, first.stage) for f in failures)
    ):
        return [_failure_note(first, "A and B")]
    return [_failure_note(f) for f in failures]


def _failure_note(f: PassFailed, who: str = "") -> str:
    """What a failure leaves of the report."""
    who = who or f.side
    where = f.where["module"] or "(root)" if f.where else "a call hookcli does not know"
    if f.stage != "propagated":
        return (
            f"{who} failed in the {f.stage} mode ({f.phase}, in {where}): the propagated "
            "figures are complete; the local ones are those of the calls before the failure"
        )
    if f.phase == "loss":
        return (
            f"{who} failed in {'their' if ' and ' in who else 'its'} loss: the forward "
            "figures are complete; no gradient figures; the local mode did not run"
        )
    if f.phase != "forward":
        return (
            f"{who} failed in {f.phase} (in {where}): the forward figures are complete; "
            "the gradient figures are those that arrived before the failure; the local mode "
            "did not run"
        )
    rest = (
        ""
        if " and " in who
        else f"; {'B' if f.side == 'A' else 'A'}'s calls after that point are not compared"
    )
    return (
        f"{who} failed in {where}: the figures are those of the calls that returned before "
        f"it{rest}; the local mode did not run"
    )


def _side_line(label: str, side: Side) -> str:
    s = side.prepared.settings
    what = side.prepared.loaded.spec or type(side.model).__name__
    extra = f" --vs {', '.join(side.vs.texts)}" if side.vs.given else ""
    return f"{label}: {what} ({type(side.model).__name__}){extra} | {s['device']} {s['dtype']}"


def _where(d: Mapping[str, Any]) -> str:
    call = f" #{d['call']}" if d["call"] else ""
    pcall = f" #{d['partner_call']}" if d["partner_call"] else ""
    a = f"{d['module'] or '(root)'}{call} ({d['type']})"
    return f"{a} <-> {d['partner'] or '(root)'}{pcall} ({d['partner_type']})"


def _grad_where(g: Mapping[str, Any]) -> str:
    """``l2 <-> l2 (grad_input: no grad in B)``."""
    call = f" #{g['call']}" if g.get("call") else ""
    what = g["what"] + (f": {g['problem']}" if g.get("problem") else "")
    return f"{g['module'] or '(root)'}{call} <-> {g['partner'] or '(root)'} ({what})"


def _div_lines(label: str, d: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    from hookcli.render import fmt_float, fmt_shapes

    if d is None:
        return [(label, "none (every aligned call within tolerance)")]
    text = f"{_where(d)}, in {fmt_shapes(d['input_shapes'])} out {fmt_shapes(d['output_shapes'])}"
    what = f"output {d['output']}" if d.get("at", "output") == "output" else d["at"]
    if d["problem"] == "shape":
        text += f"; {what}: shapes differ"
    else:
        text += (
            f"; {what} at {d['worst']}: A {fmt_float(d['value_a'], 6)} vs "
            f"B {fmt_float(d['value_b'], 6)} (max |diff| {fmt_float(d['max_abs'])}, "
            f"rel L2 {fmt_float(d['rel_l2'])}, rtol {d['rtol']:g} atol {d['atol']:g})"
        )
    return [(label, text)]


def _totals_lines(
    first: Any,
    first_local: Any,
    ranking: list[dict[str, Any]],
    alignment: Alignment,
    totals: Mapping[str, Any],
    unaligned_a: list[dict[str, Any]],
    unaligned_b: list[Row],
    plan: Plan,
    grad_ranking: Sequence[Mapping[str, Any]] = (),
    tensors: Sequence[Any] = (),
    failures: Sequence[PassFailed] = (),
    local_ran: bool = True,
    floor: str | None = None,
    not_compared: Sequence[Mapping[str, Any]] = (),
) -> list[tuple[str, str]]:
    """The lines under the table. After a failure, each line says how far its part got:
    the propagated forward stopped only where a propagated pass failed in its forward
    (one that failed in its loss or backward, or in the local mode, left it complete);
    the propagated gradients where a propagated pass failed at all; the local mode's
    figures where it failed, and ``not run`` where it did not run."""
    from hookcli.render import fmt_float

    fwd_cut = any(f.stage == "propagated" and f.phase == "forward" for f in failures)
    grad_cut = any(f.stage == "propagated" for f in failures)
    local_cut = any(f.stage != "propagated" for f in failures)

    lines = [
        (
            "Aligned",
            f"{totals['aligned_calls']} of {totals['calls_a']} calls of A "
            f"({totals['calls_b']} of B), by {alignment.method}",
        )
    ]
    if unaligned_a:
        lines.append(("Unaligned in A", _cut([_call_name(u) for u in unaligned_a])))
    if unaligned_b:
        lines.append(("Unaligned in B", _cut([_call_name(r.data) for r in unaligned_b])))
    if not_compared:
        lines.append(("Not compared (B failed)", _cut([_call_name(u) for u in not_compared])))
    if not totals.get("values_compared", True):
        if first is None:
            text = "none in shapes (on meta no values are compared)"
            lines.append(("First divergence", text))
        else:
            lines += _div_lines("First divergence (shapes)", first)
        return lines
    before = "none in the calls compared before the failure"
    not_run = "not run (the model failed before it)"
    lines += (
        [("First divergence", before)]
        if fwd_cut and first is None
        else _div_lines("First divergence", first)
    )
    if not local_ran:
        lines.append(("First divergence (local)", not_run))
    elif local_cut and first_local is None:
        lines.append(("First divergence (local)", before))
    else:
        lines += _div_lines("First divergence (local)", first_local)
    if plan.backward:
        for label, key, cut, ran in (
            ("First grad divergence", "first_grad_divergence", grad_cut, not fwd_cut),
            ("First grad divergence (local)", "first_grad_divergence_local", local_cut, local_ran),
        ):
            g = totals.get(key)
            if g is not None:
                text = _grad_where(g)
            elif not ran:
                text = not_run
            else:
                text = "none in the gradients that arrived before the failure" if cut else "none"
            lines.append((label, text))
    for label, ranks in (("Local ranking", ranking), ("Local grad ranking", grad_ranking)):
        adding = [r for r in ranks if r["rel_l2"]]
        if adding:
            top = [
                f"{_name_call(r['module'], r['call'])} "
                f"{fmt_float(r['rel_l2'])}" + ("" if r["diverged"] else " (within tolerance)")
                for r in adding[:3]
            ]
            lines.append((label, ", ".join(top)))
    lines.append(("Tolerance", _tolerance_words(plan, tensors, floor)))
    return lines


def _tolerance_words(plan: Plan, tensors: Sequence[Any], floor: str | None = None) -> str:
    """The tolerance line: a value given, and for one not given the default each dtype's
    tensors were held to (``rtol 0.1 (given), atol 1e-05 (float32's default)``); with
    ``floor`` (``lowest_precision``), the floating pairs' defaults are at least its."""
    from hookcli.compare.metrics import default_tolerance

    if plan.rtol is None and plan.atol is None:
        if floor is not None:
            rt, at = default_tolerance(floor, floor)
            return (
                f"assert_close's defaults by dtype, at least {floor}'s for every floating "
                f"pair (rtol {rt:g}, atol {at:g}): B computes in {floor}"
            )
        return "assert_close's defaults by dtype"
    if plan.rtol is not None and plan.atol is not None:
        return f"rtol {plan.rtol}, atol {plan.atol}"
    parts = []
    for key, given in (("rtol", plan.rtol), ("atol", plan.atol)):
        if given is not None:
            parts.append(f"{key} {given} (given)")
            continue
        by_value: dict[float, list[str]] = {}
        for t in tensors:
            da, db = t.dtype_a or t.dtype_b, t.dtype_b or t.dtype_a
            if da is None:
                continue
            # the looser dtype's default is the one used (B's computing dtype's, at least)
            name = da if default_tolerance(da, da) == default_tolerance(da, db) else db
            if (
                floor is not None
                and getattr(t, key)
                == dict(zip(("rtol", "atol"), default_tolerance(floor, floor), strict=True))[key]
                and default_tolerance(da, db) == default_tolerance(floor, floor)
            ):
                name = floor
            names = by_value.setdefault(getattr(t, key), [])
            if name not in names:
                names.append(name)
        if not by_value:
            parts.append(f"{key} assert_close's default by dtype")
        if by_value:
            parts.append(
                f"{key} "
                + " / ".join(
                    f"{value} ({', '.join(names)}'s default)"
                    for value, names in sorted(by_value.items(), reverse=True)
                )
            )
    return ", ".join(parts)


def _call_name(d: Mapping[str, Any]) -> str:
    return _name_call(d["name"], d.get("call"))


def _name_call(name: str, call: int | None) -> str:
    """``attn`` for a module's first call, ``attn #1`` for its second, ``(root)``."""
    return (name or "(root)") + (f" #{call}" if call else "")


def _cut(names: list[str], limit: int = 6) -> str:
    more = f" (+{len(names) - limit})" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _columns(meta: bool, backward: bool = False) -> list[Column]:
    from hookcli.render import fmt_float, fmt_shapes
    from hookcli.report import Column

    cols = [
        Column("name", "Layer"),
        Column("partner", "Partner in B", _partner),
        Column("type", "Type"),
        Column("output_shapes", "Output shape", fmt_shapes),
    ]
    if meta:
        return [*cols, Column("partner_output_shapes", "B output shape", fmt_shapes)]
    grads = [
        Column("grad_input_rel_l2", "Grad in rel L2", fmt_float, "right"),
        Column("param_grad_rel_l2", "Param grad rel L2", fmt_float, "right"),
        Column("local_grad_rel_l2", "Local grad rel L2", fmt_float, "right"),
    ]
    return (
        cols
        + [
            Column("max_abs", "Max |diff|", fmt_float, "right"),
            Column("rel_l2", "Rel L2", fmt_float, "right"),
            Column("cosine", "Cosine", _fmt_cos, "right"),
            Column("sqnr_db", "SQNR dB", _fmt_db, "right"),
            Column("local_rel_l2", "Local rel L2", fmt_float, "right"),
            Column("local_sqnr_db", "Local SQNR dB", _fmt_db, "right"),
        ]
        + (grads if backward else [])
    )


def _partner(v: Any) -> str:
    if v is None:
        return "-"
    return v or "(root)"


def _fmt_cos(v: Any) -> str:
    if v is None:
        return "-"
    return f"{float(v):.6f}" if math.isfinite(float(v)) else str(v)


def _fmt_db(v: Any) -> str:
    if v is None:
        return "-"
    v = float(v)
    return f"{v:.1f}" if math.isfinite(v) else ("inf" if v > 0 else str(v))


# -- the command ----------------------------------------------------------------------------


def cli_command(
    *,
    model: str,
    model_b: str | None,
    vs: list[str] | None,
    kwargs: list[str] | None,
    a_kwargs: list[str] | None,
    b_kwargs: list[str] | None,
    a_kwargs_file: Path | None,
    b_kwargs_file: Path | None,
    weights: Path | None,
    a_weights: Path | None,
    b_weights: Path | None,
    trust_pickle: bool,
    map_rules: list[str] | None,
    map_file: Path | None,
    align: str,
    print_map: bool,
    copy_weights: bool,
    backward: bool,
    loss: str | None,
    input: list[str] | None,
    input_file: Path | None,
    inputs_from: str | None,
    batch_size: int | None,
    device: str,
    dtype: str | None,
    mode: Mode | None,
    format: Format,
    output: Path | None,
    depth: int | None,
    rtol: float | None,
    atol: float | None,
    fail_on: str | None,
    annotate: Any,
    junit: Path | None,
    seed: int,
    debug: bool,
) -> int:
    """The compare command's run (``hookcli compare``): plan, build both, compare, emit."""
    from hookcli.cliopts import (
        ci_options,
        model_options,
        output_options,
        parse_fail_on,
        run_options,
    )
    from hookcli.compare.align import METHODS, check_print_map, parse_rules
    from hookcli.compare.settings import check as check_vs
    from hookcli.compare.settings import parse_vs, side_kwargs
    from hookcli.errors import UsageError
    from hookcli.options import depth_arg, loss_arg

    if (model_b is None) == (not vs):
        raise UsageError(
            "compare needs two models (compare A B) or one model and a setting "
            "(compare MODEL --vs KEY=VALUE)"
            if model_b is None
            else "compare A B compares two models; --vs changes one model: give one of them"
        )
    the_vs = parse_vs(vs or ())
    if align not in METHODS:
        raise UsageError(f"--align must be one of {', '.join(METHODS)}, got {align!r}")
    texts = list(map_rules or ())
    if map_file is not None:
        try:
            texts.append(map_file.read_text(encoding="utf-8"))
        except OSError as err:
            raise UsageError(f"--map-file {map_file}: {err.strerror or err}") from None
    rules = parse_rules(texts)
    gates = parse_fail_on(fail_on, ("divergence",))
    if print_map:
        check_print_map(gates, Format(format).value)
    if (a_weights is not None or b_weights is not None) and weights is not None:
        raise UsageError("--weights gives both sides theirs: use --a-weights/--b-weights instead")
    if the_vs.weights is not None and (b_weights is not None or weights is not None):
        raise UsageError("--vs weights=FILE gives B its weights: drop --weights/--b-weights")
    check_vs(the_vs, dtype=dtype, backward=backward)
    ka = side_kwargs(kwargs, a_kwargs_file, a_kwargs, "--a-kwargs-file")
    kb = side_kwargs(kwargs, b_kwargs_file, b_kwargs, "--b-kwargs-file")
    mopts_a = model_options(model, ka, a_weights or weights, trust_pickle, seed)
    mopts_b = model_options(
        model_b or model, kb, the_vs.weights or b_weights or weights, trust_pickle, seed
    )
    ropts = run_options(
        input, batch_size, device, dtype, mode, Mode.EVAL,
        input_file=input_file, inputs_from=inputs_from,
    )  # fmt: skip
    ci = ci_options(None, False, annotate, junit, rtol, atol)  # (NaN, inf: exit 2)
    out = output_options(format, output, depth, debug, ci)
    plan = Plan(
        rules=rules,
        align=align,
        rtol=rtol,
        atol=atol,
        fail_on_divergence="divergence" in gates,
        copy_weights=copy_weights,
        print_map=print_map,
        backward=backward,
        loss=loss_arg(loss).value if loss is not None else None,
        partial=True,
        depth=depth_arg(depth),
    )
    if loss is not None and not backward:
        raise UsageError("--loss is the loss --backward starts from: add --backward")
    a, b = build_sides(mopts_a, mopts_b, ropts, the_vs, same=model_b is None)
    result = run_compare(a, b, plan, ropts.mode)
    from hookcli.pipeline import emit, write_text

    if isinstance(result, str):
        write_text(result, out)
        return 0
    code = emit(result, out, result.columns, result.table_totals)
    if result.failure is not None:  # the report of the calls that ran is written: exit 4
        raise result.failure
    return code


def build_sides(mopts_a: Any, mopts_b: Any, ropts: Any, vs: Vs, same: bool) -> tuple[Side, Side]:
    """A as ``prepare`` builds it; B built the same way (or, for --vs without weights, a
    copy of A), then changed as --vs says. B draws no inputs: it gets A's."""
    import copy

    from hookcli.compare.settings import caller, transform, weights_named
    from hookcli.inputs.grammar import resolve_device
    from hookcli.pipeline import Prepared, prepare

    pa = prepare(mopts_a, ropts)
    if same and vs.weights is None:
        try:  # the same weights without a second build
            loaded_b = dataclasses.replace(pa.loaded, module=copy.deepcopy(pa.model))
        except Exception:  # a module deepcopy cannot copy: build it again, same seed
            loaded_b = None
        pb = prepare(mopts_b, ropts, need_inputs=False, loaded=loaded_b)
    else:
        with weights_named(vs):
            pb = prepare(mopts_b, ropts, need_inputs=False)
    device_b = resolve_device(vs.device) if vs.device else resolve_device(ropts.device)
    module = transform(pb.model, vs, device_b)
    if module is not pb.model:
        pb = Prepared(dataclasses.replace(pb.loaded, module=module), None, pb.settings)
    settings = dict(pb.settings)
    settings["device"] = str(device_b)
    if vs.dtype:
        settings["dtype"] = vs.dtype
    if vs.amp:
        settings["amp"] = vs.amp
    pb = Prepared(loaded=pb.loaded, inputs=None, settings=settings)
    a = Side("A", pa, pa.model, Vs(), mopts_a.seed)
    b = Side("B", pb, caller(pb.model, vs), vs, mopts_b.seed)
    return a, b
