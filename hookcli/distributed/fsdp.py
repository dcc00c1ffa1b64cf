"""``--fsdp``: grads, inspect and stats on every rank through FSDP2 (``fully_shard``).

Each rank builds the model with ``--seed`` (the same weights everywhere), draws its
inputs with ``seed + rank`` (as ``--ddp`` does), applies ``fully_shard`` to every
module of the shard plan (``--shard CLASS``, default: each block of the root's largest
``ModuleList``, else each top-level child with parameters), then to the root, and
runs one forward (and backward) with the command's hooks on the sharded model.

What a rank measures, per parameter:

- the local shard: ``p.to_local()``'s numel and bytes, and the unsharded shape;
- the local gradient before the reduce-scatter: a tensor hook on FSDP's unsharded
  parameter (the leaf autograd accumulates into), registered after forward;
- the gradient of its shard after the reduce-scatter (``p.grad.to_local()``);
- the reduced gradient norm: per parameter from the shards' sums of squares (one
  all-reduce), and in total as ``clip_grad_norm_`` computes it on the full DTensors
  (``torch.nn.utils.get_total_norm``).

Before each FSDP unit's call in forward the ranks agree that every one makes the same
call (``CallAgreement``): a rank-dependent branch that runs a unit on some ranks only
stops every rank there (exit 4), before an all-gather that has no partner. Before
backward the ranks agree on which parameters each one's loss reaches (a walk of the
autograd graph, no compute). When they differ, FSDP2 would pair one rank's
reduce-scatter with another's (a hang, an error, or silently mixed gradients): hookcli
then names the parameters per rank and skips the backward on every rank.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hookcli.errors import HookcliError, RunError, UsageError, first_line
from hookcli.options import HookKind, Loss

if TYPE_CHECKING:
    import torch
    from torch import nn

    from hookcli.distributed.launch import DistContext
    from hookcli.distributed.ranks import Divergence
    from hookcli.grads.checks import GradGates
    from hookcli.options import Mode, ModelOptions, OutputOptions, RunOptions
    from hookcli.pipeline import Prepared
    from hookcli.report import CheckResult, Row
    from hookcli.session import CallRecord, Probe

DESYNC = "desync"
FSDP_CHECKS = ("nan", "inf", "unused", DESYNC)


# -- the shard plan -----------------------------------------------------------------------


def _has_params(m: nn.Module) -> bool:
    return next(m.parameters(), None) is not None


def shard_plan(model: nn.Module, classes: Sequence[str] = ()) -> tuple[str, ...]:
    """The modules ``fully_shard`` wraps before the root, deepest first (names).

    With ``classes``: every module (not the root) whose class name is one of them.
    Else each direct child of the root's largest ``ModuleList`` (by parameter count),
    else each top-level child that holds parameters. The root is always sharded last.
    """
    from torch import nn

    named = list(model.named_modules())
    if classes:
        wanted = set(classes)
        found = {type(m).__name__ for _, m in named}
        missing = [c for c in classes if c not in found]
        if missing:
            known = sorted(found)
            shown = ", ".join(known[:12]) + (", ..." if len(known) > 12 else "")
            raise UsageError(
                f"--shard {missing[0]}: no module of that class in the model (classes: {shown})"
            )
        names = [n for n, m in named if n and type(m).__name__ in wanted and _has_params(m)]
    else:
        lists = [(n, m) for n, m in named if isinstance(m, nn.ModuleList) and _has_params(m)]
        if lists:
            size = {n: sum(p.numel() for p in set(m.parameters())) for n, m in lists}
            best = max(lists, key=lambda nm: size[nm[0]])  # first of the largest
            prefix = f"{best[0]}." if best[0] else ""
            names = [f"{prefix}{c}" for c, m in best[1].named_children() if _has_params(m)]
        else:
            names = [n for n, m in model.named_children() if _has_params(m)]
    order = {n: i for i, (n, _) in enumerate(named)}
    # children before their parents: fully_shard wants the inner units first
    return tuple(sorted(names, key=lambda n: (-n.count("."), order[n])))


def wrap_fsdp(model: nn.Module, ctx: DistContext, classes: Sequence[str]) -> tuple[str, ...]:
    """``fully_shard`` each module of the plan, then the root; the units' names ("" last)."""
    from torch.distributed.device_mesh import init_device_mesh

    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError as err:
        raise UsageError(
            f"--fsdp needs torch.distributed.fsdp.fully_shard (PyTorch 2.6+): {first_line(err)}"
        ) from err
    if not any(p.requires_grad for p in model.parameters()):
        raise UsageError("--fsdp needs a model with trainable parameters")
    units = shard_plan(model, classes)
    device_type = ctx.device.split(":")[0]
    try:
        mesh = init_device_mesh(device_type, (ctx.world_size,))
        for name in units:
            fully_shard(model.get_submodule(name), mesh=mesh)
        fully_shard(model, mesh=mesh)
    except HookcliError:
        raise
    except Exception as err:
        raise RunError(f"fully_shard could not shard the model: {first_line(err)}") from err
    return (*units, "")


def fsdp_params(model: nn.Module) -> list[tuple[str, Any]]:
    """(qualified name, FSDPParam) for every parameter FSDP2 manages in ``model``."""
    from torch.distributed.fsdp import FSDPModule

    by_id = {id(p): n for n, p in model.named_parameters()}
    out: list[tuple[str, Any]] = []
    for m in model.modules():
        if not isinstance(m, FSDPModule):
            continue
        group = m._get_fsdp_state()._fsdp_param_group
        for fp in group.fsdp_params if group is not None else ():
            name = by_id.get(id(fp.sharded_param))
            if name is not None:
                out.append((name, fp))
    return out


def _graph_leaves(roots: Sequence[torch.Tensor]) -> set[int]:
    """ids of the leaf tensors autograd accumulates into from ``roots`` (no compute)."""
    found: set[int] = set()
    seen: set[Any] = set()
    stack: list[Any] = [t.grad_fn for t in roots if t.grad_fn is not None]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        var = getattr(fn, "variable", None)
        if var is not None:
            found.add(id(var))
        stack.extend(nxt for nxt, _ in fn.next_functions)
    return found


# -- one rank's run -----------------------------------------------------------------------


@dataclass(frozen=True)
class ParamShard:
    """One parameter on one rank."""

    name: str
    shape: tuple[int, ...]  # unsharded
    dtype: str
    requires_grad: bool
    shard_numel: int
    shard_bytes: int
    local_grad_norm: float | None = None  # this rank's gradient before the reduce-scatter
    local_nonfinite: tuple[bool, bool] = (False, False)  # (NaN, Inf) in that gradient
    shard_grad_norm: float | None = None  # ||p.grad.to_local()|| after the reduce-scatter
    reduced_grad_norm: float | None = None  # ||full reduced grad|| (the same on every rank)


@dataclass(frozen=True)
class FsdpRun:
    """What one rank's session saw, on the host."""

    records: tuple[CallRecord, ...]
    loss: float | None
    params: tuple[ParamShard, ...]
    units: tuple[str, ...]
    unused: tuple[str, ...]  # trainable parameters this rank's loss does not reach
    unused_per_rank: tuple[tuple[str, ...], ...]  # every rank's (agreed before backward)
    skipped: str | None  # why the backward did not run (rank-dependent parameters)
    reduced_total: float | None  # clip_grad_norm_'s total on the full DTensors
    divergences: tuple[Divergence, ...]
    types: Mapping[str, str]  # module name -> its class before fully_shard renamed it
    model_class: str

    # the fields ``ddp``'s inspect and stats read off a run
    @property
    def buffers_resynced(self) -> bool:
        return False  # FSDP2 never broadcasts buffers


def _plain_types(err: HookcliError, types: Mapping[str, str]) -> HookcliError:
    """The message names a module's own class, not the FSDP subclass fully_shard made."""
    for name in set(types.values()):
        err.message = err.message.replace(f"(FSDP{name})", f"({name})")
    err.args = (err.message,)
    return err


def _norm(t: torch.Tensor) -> torch.Tensor:
    import torch

    return torch.linalg.vector_norm(t.detach().double() if t.is_floating_point() else t.double())


def run_fsdp_session(
    ctx: DistContext,
    prepared: Prepared,
    probes: Sequence[Probe],
    *,
    mode: Mode,
    backward: bool,
    loss_fn: Callable[[Any], torch.Tensor],
    compare: bool,
    classes: Sequence[str] = (),
) -> FsdpRun:
    """fully_shard, then one forward (and backward) with the probes' hooks on the model.

    The ranks agree after sharding, before each unit's call in forward, after forward
    (with the parameters each rank's loss reaches), and after backward, so a failing
    rank never leaves the others inside an FSDP collective.
    """
    import torch
    import torch.distributed as dist

    from hookcli.distributed.launch import CallAgreement
    from hookcli.session import HookSession

    model = prepared.model
    assert prepared.inputs is not None
    args, kwargs = prepared.inputs.args, dict(prepared.inputs.kwargs)
    types = {n: type(m).__name__ for n, m in model.named_modules()}
    model_class = type(model).__name__
    units = ctx.step("sharding the model with fully_shard", lambda: wrap_fsdp(model, ctx, classes))
    managed = fsdp_params(model)
    handles: list[Any] = []
    local: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    with HookSession(model, probes, mode=mode, backward=backward) as session:
        error: HookcliError | None = None
        loss: torch.Tensor | None = None
        used: set[int] = set()
        # every rank must call the same units in the same order: checked before each call
        agreement = CallAgreement(ctx, [model.get_submodule(u) for u in units], units)
        try:
            output = session.forward(args, kwargs)
            if session.backward_needed:
                loss = loss_fn(output)
                used = _graph_leaves([loss])
        except HookcliError as err:
            error = _plain_types(err, types)
        except Exception as err:
            error = RunError(f"the loss could not be computed: {first_line(err)}")
        finally:
            agreement.close()
        if agreement.settle(error):
            error = None  # another rank failed first: sync names its error
        ctx.sync("forward", error)
        trainable = [(n, fp) for n, fp in managed if fp.sharded_param.requires_grad]
        unused: list[str] = []
        unused_all: list[Any] = [()] * ctx.world_size
        skipped: str | None = None
        loss_value: float | None = None
        if loss is not None:
            loss_value = float(loss.detach())
            unused = [
                n for n, fp in trainable if id(getattr(fp, "_unsharded_param", None)) not in used
            ]
            ctx._collective(
                "agreeing on the parameters backward reaches",
                lambda: dist.all_gather_object(unused_all, tuple(unused)),
            )
            if len({tuple(u) for u in unused_all}) > 1:
                # the units agree (CallAgreement), the parameters each loss reaches do not
                skipped = (
                    "the backward was skipped: the ranks' losses reach different parameters "
                    "(see unused), so FSDP2 would pair one rank's reduce-scatter with "
                    "another's (a hang, an error or silently mixed gradients)"
                )
            else:
                for n, fp in trainable:
                    unsharded = getattr(fp, "_unsharded_param", None)
                    if unsharded is None or id(unsharded) not in used:
                        continue

                    def hook(grad: torch.Tensor, n: str = n) -> None:
                        g = grad.detach()
                        local[n] = (
                            _norm(g),
                            torch.stack([torch.isnan(g).any(), torch.isinf(g).any()]),
                        )

                    handles.append(unsharded.register_hook(hook))
                try:
                    session.backward(loss)
                except HookcliError as err:
                    error = _plain_types(err, types)
                finally:
                    for h in handles:
                        h.remove()
                ctx.sync("backward", error)
        session.finish()
        params, total = _param_figures(
            ctx, model, managed, local, skipped is None and loss is not None
        )
        found: list[Divergence] = []
        if compare:
            found += ctx.compare(list(model.named_buffers()), "buffer")
            if total is not None:
                mine = torch.tensor(total, dtype=torch.float64, device=ctx.device)
                found += ctx.compare([("clip_grad_norm_ total", mine)], "grad")
        records = session.records
    return FsdpRun(
        records=records,
        loss=loss_value,
        params=params,
        units=units,
        unused=tuple(unused),
        unused_per_rank=tuple(tuple(u) for u in unused_all),
        skipped=skipped,
        reduced_total=total,
        divergences=tuple(found),
        types=types,
        model_class=model_class,
    )


def _param_figures(
    ctx: DistContext,
    model: nn.Module,
    managed: Sequence[tuple[str, Any]],
    local: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
    with_grads: bool,
) -> tuple[tuple[ParamShard, ...], float | None]:
    """Every managed parameter's shard and gradient figures, and clip_grad_norm_'s total."""
    import torch
    import torch.distributed as dist

    params = [fp.sharded_param for _, fp in managed]
    shards = [p.to_local() for p in params]
    reduced: list[float | None] = [None] * len(params)
    shard_norms: list[float | None] = [None] * len(params)
    total: float | None = None
    with torch.no_grad():
        if with_grads:
            has = [p.grad is not None for p in params]
            sq = torch.zeros(len(params), dtype=torch.float64, device=ctx.device)
            norms: list[Any] = []
            for i, p in enumerate(params):
                if has[i]:
                    n = _norm(p.grad.to_local())
                    norms.append(n)
                    sq[i] = n.to(sq.device) ** 2
                else:
                    norms.append(None)
            ctx._collective("reducing the gradient norms", lambda: dist.all_reduce(sq))
            host = sq.sqrt().tolist()
            shard_norms = [None if n is None else float(n) for n in norms]
            reduced = [v if h else None for v, h in zip(host, has, strict=True)]
            grads = [p.grad for p in params if p.grad is not None]
            if grads:

                def total_norm() -> Any:
                    return torch.nn.utils.get_total_norm(grads, 2.0)

                value = ctx._collective("clip_grad_norm_'s total norm", total_norm)
                full = value.full_tensor() if hasattr(value, "full_tensor") else value
                total = float(full)
        local_host = {
            n: (float(v[0]), tuple(bool(x) for x in v[1].tolist())) for n, v in local.items()
        }
    out = []
    for i, ((name, _), p, s) in enumerate(zip(managed, params, shards, strict=True)):
        norm, flags = local_host.get(name, (None, (False, False)))
        out.append(
            ParamShard(
                name=name,
                shape=tuple(p.shape),
                dtype=str(p.dtype).removeprefix("torch."),
                requires_grad=p.requires_grad,
                shard_numel=s.numel(),
                shard_bytes=s.numel() * s.element_size(),
                local_grad_norm=norm,
                local_nonfinite=(flags[0], flags[1]),
                shard_grad_norm=shard_norms[i],
                reduced_grad_norm=reduced[i],
            )
        )
    return tuple(out), total


# -- pieces the --fsdp commands share -------------------------------------------------------


def check_fsdp_options(
    kinds: Sequence[HookKind],
    global_hooks: bool,
    *,
    ddp: bool = False,
    per_param: bool = False,
    plot: object = None,
    fail_on: Sequence[str] = (),
    bounds: bool = False,
) -> None:
    """Options that do not combine with --fsdp: exit 2 before any rank starts its group."""
    if ddp:
        raise UsageError("--fsdp and --ddp are two ways to wrap the model: choose one")
    if global_hooks:
        raise UsageError("--global-hooks does not combine with --fsdp (it would hook FSDP itself)")
    if per_param or plot is not None:
        raise UsageError(f"{'--per-param' if per_param else '--plot'} does not combine with --fsdp")
    other = [n for n in fail_on if n not in FSDP_CHECKS]
    if other:
        raise UsageError(
            f"--fail-on {other[0]} does not combine with --fsdp yet (with --fsdp: "
            f"{', '.join(FSDP_CHECKS)})"
        )
    if bounds:
        raise UsageError("--max-grad-norm/--min-grad-norm do not combine with --fsdp yet")


def launch_fsdp(
    body: Callable[[DistContext], int],
    *,
    fsdp: bool,
    ddp: bool,
    device: str,
    backend: str | None,
    timeout_s: float,
    kinds: Sequence[HookKind],
    global_hooks: bool,
) -> int:
    """Check the --fsdp options, then run ``body`` on this rank (``distributed.launch``)."""
    from hookcli.distributed.launch import launch

    if not fsdp:
        raise UsageError("--shard needs --fsdp (under torchrun or srun)")
    check_fsdp_options(kinds, global_hooks, ddp=ddp)
    check_fsdp_torch(device)
    return launch(body, device=device, backend=backend, timeout_s=timeout_s, flag="--fsdp")


def check_fsdp_torch(device: str) -> None:
    """Under a distributed launch, refuse --fsdp on the CPU where this torch cannot run it."""
    env = os.environ
    launched = ("RANK" in env and "WORLD_SIZE" in env) or "SLURM_PROCID" in env
    if launched and not device.startswith(("cuda", "meta")) and not cpu_fsdp_supported():
        import torch

        raise UsageError(
            f"--fsdp on the CPU needs a newer torch than {torch.__version__}: its CPU "
            "stream cannot record events, which FSDP2 uses; run on cuda, or upgrade torch"
        )


def cpu_fsdp_supported() -> bool:
    """Whether this torch runs FSDP2 on the CPU (torch 2.6's CPU stream has no
    ``record_event``, and ``fully_shard`` fails there in the first forward)."""
    import torch

    return hasattr(torch.cpu.current_stream(), "record_event")


def fsdp_settings(
    prepared: Prepared, units: Sequence[str], classes: Sequence[str]
) -> dict[str, Any]:
    settings = {k: v for k, v in prepared.settings.items() if k != "ddp"}
    settings.update(
        {
            "fsdp": True,
            "shard": list(classes) if classes else "default",
            "fsdp_units": [u or "(root)" for u in units],
        }
    )
    return settings


def fsdp_notes(
    ctx: DistContext, units: Sequence[str], skipped: str | None = None
) -> tuple[str, ...]:
    shown = ", ".join(u or "(root)" for u in units[:6]) + (", ..." if len(units) > 6 else "")
    notes = [
        f"distributed: {ctx.world_size} ranks ({ctx.backend}, {ctx.env.source}); FSDP2 "
        f"fully_shard on {len(units)} unit(s): {shown}; rank r draws its inputs with seed + r"
    ]
    if skipped:
        notes.append(f"note: {skipped}")
    return tuple(notes)


def _own(model: nn.Module) -> dict[str, tuple[str, ...]]:
    """module name -> qualified names of its own parameters (each tensor once)."""
    seen: set[int] = set()
    out: dict[str, tuple[str, ...]] = {}
    for mname, m in model.named_modules():
        names = []
        for n, p in m.named_parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                names.append(f"{mname}.{n}" if mname else n)
        out[mname] = tuple(names)
    return out


def _l2(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return math.sqrt(math.fsum(v * v for v in vals)) if vals else None


def _sum(values: Sequence[int]) -> int:
    return int(sum(values))


def _nonfinite_check(name: str, run: FsdpRun, findings: Any) -> CheckResult:
    """NaN (Inf) in this rank's loss, its local gradients before the reduce-scatter, or outputs."""
    from hookcli.checks import layer_label
    from hookcli.report import CheckResult

    k = 0 if name == "nan" else 1
    what = "NaN" if name == "nan" else "Inf"
    bad = [p.name for p in run.params if p.local_nonfinite[k]]
    outs: list[str] = []
    if findings is not None and findings.watched_forward:
        for r in run.records:
            call = findings.calls.get(r.index)
            if call is not None and (call.output_nan if k == 0 else call.output_inf):
                outs.append(layer_label(r.name, r.call))
    loss_bad = run.loss is not None and (math.isnan(run.loss) if k == 0 else math.isinf(run.loss))
    if not bad and not outs and not loss_bad:
        return CheckResult(name, True, f"no {what} in any gradient or output; the loss is finite")
    parts = []
    if outs:
        parts.append(f"{what} first in the output of {outs[0]}")
    if bad:
        parts.append(f"{what} in the local gradients of {', '.join(bad[:3])}")
    if loss_bad:
        parts.append(f"the loss is {run.loss}")
    return CheckResult(name, False, "; ".join(parts), tuple(dict.fromkeys([*outs, *bad])))


def _call_grad_probe() -> Any:
    """GradProbe without its per-parameter figures (a DTensor's norm is a collective)."""
    from hookcli.grads.probe import GradProbe

    class CallGradProbe(GradProbe):
        def attach(self, session: Any) -> None:
            super().attach(session)
            self._params = []  # the shards' figures come from run_fsdp_session

    return CallGradProbe


@dataclass(frozen=True)
class FsdpGradsRank:
    """What rank r sends to rank 0 in ``grads --fsdp``."""

    rank: int
    loss: float | None
    rows: Any  # RankRows
    checks: tuple[CheckResult, ...]
    params: tuple[ParamShard, ...]
    unused: tuple[str, ...]
    unused_indices: tuple[int, ...]
    grad_norm: float | None  # this rank's local total, before the reduce-scatter
    shard_grad_norm: float | None  # its shard's total, after it
    reduced_grad_norm: float | None
    divergences: tuple[Divergence, ...]


def run_grads(
    ctx: DistContext,
    mopts: ModelOptions,
    ropts: RunOptions,
    out: OutputOptions,
    kinds: tuple[HookKind, ...],
    loss_kind: Loss,
    gates: GradGates,
    desync_tol: float,
    classes: Sequence[str] = (),
) -> int:
    """``grads --fsdp`` on this rank; rank 0 writes the merged report. The exit status."""
    from hookcli.distributed.ddp import _rank_rows, prepare_rank
    from hookcli.layers import layer_rows
    from hookcli.losses import reduce_output

    prepared = ctx.step("building the model", lambda: prepare_rank(ctx, mopts, ropts))
    probe = _call_grad_probe()(
        frozenset(k for k in kinds if k is not HookKind.TENSOR),
        output_hooks=False,
        watch_forward=bool({"nan", "inf"} & set(gates.fail_on)),
        flag_inf="inf" in gates.fail_on,
    )
    run = run_fsdp_session(
        ctx,
        prepared,
        [probe],
        mode=ropts.mode,
        backward=True,
        loss_fn=lambda output: reduce_output(output, loss_kind),
        compare=True,
        classes=classes,
    )
    checks = tuple(
        _nonfinite_check(n, run, probe.findings) for n in gates.fail_on if n in ("nan", "inf")
    )
    model = prepared.model
    own = _own(model)
    by_name = {p.name: p for p in run.params}
    units = set(run.units)

    def extra(row: Row) -> dict[str, Any]:
        name = str(row.data["name"])
        mine = [by_name[n] for n in own.get(name, ()) if n in by_name]
        return {
            "type": run.types.get(name, row.data.get("type")),
            "fsdp_unit": name in units,
            "unsharded_shapes": [list(p.shape) for p in mine],
        }

    rows, _ = layer_rows(run.records, model, depth=out.depth, kinds=kinds, probes=[probe])
    # DDP's indices: positions among the model's trainable parameters, in model order
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    mine = FsdpGradsRank(
        rank=ctx.rank,
        loss=run.loss,
        rows=_rank_rows(ctx.rank, rows, extra),
        checks=checks,
        params=run.params,
        unused=run.unused,
        unused_indices=tuple(trainable.index(n) for n in run.unused),
        grad_norm=_l2([p.local_grad_norm for p in run.params]),
        shard_grad_norm=_l2([p.shard_grad_norm for p in run.params]),
        reduced_grad_norm=run.reduced_total,
        divergences=run.divergences,
    )
    gathered = ctx.gather(mine)
    if gathered is None:
        return 0
    return _report_grads(
        ctx, prepared, run, kinds, out, gates, desync_tol, loss_kind, gathered, classes
    )


def _report_grads(
    ctx: DistContext,
    prepared: Prepared,
    run: FsdpRun,
    kinds: tuple[HookKind, ...],
    out: OutputOptions,
    gates: GradGates,
    desync_tol: float,
    loss_kind: Loss,
    ranks: Sequence[FsdpGradsRank],
    classes: Sequence[str],
) -> int:
    from hookcli.distributed.ddp import _fmt_per_rank, _fmt_ranks, _fmt_unused_per_rank
    from hookcli.distributed.ranks import (
        desync_check,
        merge_checks,
        merge_rows,
        spread,
        unused_check,
    )
    from hookcli.layers import PARAM_COLUMNS, shape_columns
    from hookcli.modelinfo import totals
    from hookcli.pipeline import emit
    from hookcli.render import fmt_bytes, fmt_float, fmt_int
    from hookcli.report import Column, Report, Row

    merged = merge_rows([r.rows for r in ranks])
    own = _own(prepared.model)
    params = [{p.name: p for p in r.params} for r in ranks]
    unused = [set(r.unused) for r in ranks]
    rows = []
    for row in merged:
        # each rank's figures for the module's own parameters, also where it did not run
        data = dict(row.data)
        names = [n for n in own.get(str(data["name"]), ()) if n in params[0]]
        mine = [[ps[n] for n in names] for ps in params]
        if names:
            data["shard_numel_per_rank"] = [_sum([p.shard_numel for p in m]) for m in mine]
            data["shard_bytes_per_rank"] = [_sum([p.shard_bytes for p in m]) for m in mine]
            data["grad_norm_per_rank"] = [_l2([p.local_grad_norm for p in m]) for m in mine]
            data["shard_grad_norm_per_rank"] = [_l2([p.shard_grad_norm for p in m]) for m in mine]
            data["reduced_grad_norm"] = _l2([p.reduced_grad_norm for p in mine[0]])
        else:
            data["shard_numel_per_rank"] = data["shard_bytes_per_rank"] = [0] * len(ranks)
            data["grad_norm_per_rank"] = data["shard_grad_norm_per_rank"] = [None] * len(ranks)
            data["reduced_grad_norm"] = None
        data["grad_norm_spread"] = spread(data["grad_norm_per_rank"])
        data["unused_params_per_rank"] = [[n for n in names if n in u] for u in unused]
        data["unused_params"] = [n for n in names if any(n in u for u in unused)]
        rows.append(Row.of(data, row.display))
    by_name = {c.name: c for c in merge_checks([r.checks for r in ranks])}
    divergences = [d for r in ranks for d in r.divergences]
    ordered: list[CheckResult] = []
    for name in gates.fail_on:
        if name == "unused":
            ordered.append(
                unused_check(
                    [r.unused for r in ranks],
                    [r.unused_indices for r in ranks],
                    why="FSDP2 pairs the ranks' reduce-scatters by order: it would hang, "
                    "fail or mix gradients"
                    if run.skipped
                    else "every rank agrees, so FSDP2 reduces the others",
                )
            )
        elif name == DESYNC:
            ordered.append(
                desync_check(divergences, desync_tol, "buffers and clip_grad_norm_'s total")
            )
        elif name in by_name:
            ordered.append(by_name.pop(name))
    model_totals: dict[str, Any] = dict(totals(prepared.model))
    unused_any: list[str] = []
    for r in ranks:
        unused_any.extend(n for n in r.unused if n not in unused_any)
    shard_params = [_sum([p.shard_numel for p in r.params]) for r in ranks]
    shard_bytes = [_sum([p.shard_bytes for p in r.params]) for r in ranks]
    model_totals.update(
        {
            "loss": ranks[0].loss,
            "loss_per_rank": [r.loss for r in ranks],
            "grad_norm": ranks[0].grad_norm,
            "grad_norm_per_rank": [r.grad_norm for r in ranks],
            "grad_norm_spread": spread([r.grad_norm for r in ranks]),
            "shard_grad_norm_per_rank": [r.shard_grad_norm for r in ranks],
            "reduced_grad_norm": ranks[0].reduced_grad_norm,
            "shard_params_per_rank": shard_params,
            "shard_param_bytes_per_rank": shard_bytes,
            "unused_params": unused_any,
            "unused_params_per_rank": [list(r.unused) for r in ranks],
            "backward_skipped": run.skipped,
            "desync": [d.to_dict() for d in divergences if d.relative > desync_tol],
        }
    )
    shards = tuple(
        Row.of(
            {
                "name": p.name,
                "shape": list(p.shape),
                "dtype": p.dtype,
                "shard_numel_per_rank": [r.params[i].shard_numel for r in ranks],
                "shard_bytes_per_rank": [r.params[i].shard_bytes for r in ranks],
                "grad_norm_per_rank": [r.params[i].local_grad_norm for r in ranks],
                "shard_grad_norm_per_rank": [r.params[i].shard_grad_norm for r in ranks],
                "reduced_grad_norm": p.reduced_grad_norm,
                "unused_ranks": [r.rank for r in ranks if p.name in r.unused],
            }
        )
        for i, p in enumerate(ranks[0].params)
    )
    report = Report(
        command="grads",
        model={**prepared.model_info(), "class": run.model_class},
        settings={
            **fsdp_settings(prepared, run.units, classes),
            "loss": loss_kind.value,
            "desync_tolerance": desync_tol,
        },
        inputs=prepared.input_dicts(),
        layers=tuple(rows),
        totals=model_totals,
        checks=tuple(ordered),
        lists={"shards": shards},
        notes=fsdp_notes(ctx, run.units, run.skipped),
    )
    per_rank = _fmt_per_rank(fmt_float)
    columns: list[Column] = [
        *[c for c in shape_columns(kinds) if c.key != "input_shapes"],
        Column("ranks", "Ranks", _fmt_ranks),
        Column("shard_numel_per_rank", "Shard params per rank", _fmt_per_rank(fmt_int), "right"),
        Column("grad_norm_per_rank", "Local grad norm per rank", per_rank, "right"),
        Column("shard_grad_norm_per_rank", "Shard grad norm per rank", per_rank, "right"),
        Column("reduced_grad_norm", "Reduced grad norm", fmt_float, "right"),
        Column("unused_params_per_rank", "Unused (per rank)", _fmt_unused_per_rank),
        PARAM_COLUMNS[0],
    ]
    table_totals = [
        ("Total params (unsharded)", fmt_int(model_totals["params"])),
        (
            "Shard params per rank",
            " | ".join(
                f"{fmt_int(n)} ({fmt_bytes(b, binary=True)})"
                for n, b in zip(shard_params, shard_bytes, strict=True)
            ),
        ),
        ("Loss per rank", per_rank(model_totals["loss_per_rank"])),
        ("Local grad norm per rank", per_rank(model_totals["grad_norm_per_rank"])),
        ("Shard grad norm per rank", per_rank(model_totals["shard_grad_norm_per_rank"])),
        ("Reduced grad norm", fmt_float(model_totals["reduced_grad_norm"])),
    ]
    for rank, names in enumerate(model_totals["unused_params_per_rank"]):
        if names:
            table_totals.append((f"No grad on rank {rank}", ", ".join(names)))
    return emit(report, out, columns, table_totals)


# -- inspect and stats ----------------------------------------------------------------------


@dataclass(frozen=True)
class FsdpRowsRank:
    """What rank r sends to rank 0 in ``inspect --fsdp`` and ``stats --fsdp``."""

    rank: int
    loss: float | None
    rows: Any  # RankRows
    params: tuple[ParamShard, ...]
    checks: tuple[CheckResult, ...] = ()
    totals: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    divergences: tuple[Divergence, ...] = ()


def _with_shards(rows: Sequence[Row], model: nn.Module, ranks: Sequence[Any]) -> tuple[Row, ...]:
    """Each row gets its own parameters' shard sizes on every rank and their unsharded shapes."""
    from hookcli.report import Row

    own = _own(model)
    params = [{p.name: p for p in r.params} for r in ranks]
    out = []
    for row in rows:
        data = dict(row.data)
        names = [n for n in own.get(str(data["name"]), ()) if n in params[0]]
        data["unsharded_shapes"] = [list(params[0][n].shape) for n in names]
        data["shard_numel_per_rank"] = [_sum([ps[n].shard_numel for n in names]) for ps in params]
        data["shard_bytes_per_rank"] = [_sum([ps[n].shard_bytes for n in names]) for ps in params]
        out.append(Row.of(data, row.display))
    return tuple(out)


def _shard_totals(ranks: Sequence[Any]) -> dict[str, Any]:
    return {
        "shard_params_per_rank": [_sum([p.shard_numel for p in r.params]) for r in ranks],
        "shard_param_bytes_per_rank": [_sum([p.shard_bytes for p in r.params]) for r in ranks],
    }


def _type_fix(run: FsdpRun) -> Callable[[Row], dict[str, Any]]:
    def extra(row: Row) -> dict[str, Any]:
        name = str(row.data["name"])
        return {"type": run.types.get(name, row.data.get("type")), "fsdp_unit": name in run.units}

    return extra


def run_inspect(
    ctx: DistContext,
    mopts: ModelOptions,
    ropts: RunOptions,
    out: OutputOptions,
    kinds: tuple[HookKind, ...],
    classes: Sequence[str] = (),
) -> int:
    """``inspect --fsdp``: every rank's calls on the sharded model, with shard sizes."""
    from hookcli.distributed.ddp import _fmt_per_rank, _fmt_ranks, _rank_rows, prepare_rank
    from hookcli.distributed.ranks import merge_rows
    from hookcli.grads.probe import backward_probes
    from hookcli.layers import PARAM_COLUMNS, inspect_totals, layer_rows, shape_columns
    from hookcli.losses import reduce_output
    from hookcli.pipeline import emit
    from hookcli.render import fmt_int
    from hookcli.report import Column, Report

    prepared = ctx.step("building the model", lambda: prepare_rank(ctx, mopts, ropts))
    probes = backward_probes(kinds)
    run = run_fsdp_session(
        ctx,
        prepared,
        probes,
        mode=ropts.mode,
        backward=False,
        loss_fn=lambda o: reduce_output(o, "sum"),
        compare=False,
        classes=classes,
    )
    rows, _ = layer_rows(run.records, prepared.model, depth=out.depth, kinds=kinds, probes=probes)
    mine = FsdpRowsRank(ctx.rank, run.loss, _rank_rows(ctx.rank, rows, _type_fix(run)), run.params)
    gathered = ctx.gather(mine)
    if gathered is None:
        return 0
    keys = ["output_shapes"] if HookKind.FORWARD in kinds else []
    merged = _with_shards(
        merge_rows([g.rows for g in gathered], per_rank_keys=keys), prepared.model, gathered
    )
    model_totals, extra_cols = inspect_totals(prepared.model, probes)
    model_totals.update(_shard_totals(gathered))
    report = Report(
        command="inspect",
        model={**prepared.model_info(), "class": run.model_class},
        settings=fsdp_settings(prepared, run.units, classes),
        inputs=prepared.input_dicts(),
        layers=merged,
        totals=model_totals,
        notes=fsdp_notes(ctx, run.units),
    )
    columns = [
        *shape_columns(kinds),
        Column("ranks", "Ranks", _fmt_ranks),
        Column("shard_numel_per_rank", "Shard params per rank", _fmt_per_rank(fmt_int), "right"),
        *extra_cols,
        *PARAM_COLUMNS,
    ]
    from hookcli.layers import param_totals

    shown = sum(int(r.display.get("shown_params", 0)) for r in merged)
    unshown = max(int(model_totals["params"]) - shown, 0)
    per_rank = " | ".join(fmt_int(n) for n in model_totals["shard_params_per_rank"])
    return emit(
        report,
        out,
        columns,
        [*param_totals(model_totals, unshown), ("Shard params per rank", per_rank)],
    )


def run_stats(
    ctx: DistContext,
    mopts: ModelOptions,
    ropts: RunOptions,
    out: OutputOptions,
    kinds: tuple[HookKind, ...],
    loss_kind: Loss,
    checks_asked: tuple[str, ...],
    dead_threshold: float | None,
    run_backward: bool,
    desync_tol: float,
    classes: Sequence[str] = (),
) -> int:
    """``stats --fsdp``: per-rank statistics of every call of the sharded model."""
    from hookcli.checks import layer_label
    from hookcli.distributed.ddp import (
        STATS_PER_RANK,
        _fmt_per_rank,
        _fmt_ranks,
        _rank_rows,
        prepare_rank,
    )
    from hookcli.distributed.ranks import desync_check, merge_checks, merge_rows
    from hookcli.layers import layer_rows, shape_columns
    from hookcli.losses import reduce_output
    from hookcli.pipeline import emit
    from hookcli.render import fmt_float, fmt_int
    from hookcli.report import Column, Report
    from hookcli.stats.checks import CallStats, stats_checks
    from hookcli.stats.probe import StatsProbe

    prepared = ctx.step("building the model", lambda: prepare_rank(ctx, mopts, ropts))
    probe = StatsProbe(kinds)
    run = run_fsdp_session(
        ctx,
        prepared,
        [probe],
        mode=ropts.mode,
        backward=run_backward,
        loss_fn=lambda o: reduce_output(o, loss_kind),
        compare=True,
        classes=classes,
    )
    rows, _ = layer_rows(run.records, prepared.model, depth=out.depth, kinds=kinds, probes=[probe])
    calls = [
        CallStats(
            label=layer_label(r.name, r.call),
            output=probe.forward_stats(r.index),
            grads=probe.grad_stats(r),
        )
        for r in run.records
    ]
    origin = probe.origin.label if probe.origin else None
    local = stats_checks(
        calls,
        [c for c in checks_asked if c != DESYNC],
        origin=origin,
        dead_threshold=dead_threshold,
        with_grads=run_backward and run.skipped is None,
    )
    mine = FsdpRowsRank(
        ctx.rank,
        run.loss,
        _rank_rows(ctx.rank, rows, _type_fix(run)),
        run.params,
        local,
        dict(probe.totals()),
        run.divergences,
    )
    gathered = ctx.gather(mine)
    if gathered is None:
        return 0
    keys = [k for k in STATS_PER_RANK if HookKind.FORWARD in kinds]
    merged = _with_shards(
        merge_rows([g.rows for g in gathered], per_rank_keys=keys), prepared.model, gathered
    )
    by_name = {c.name: c for c in merge_checks([g.checks for g in gathered])}
    divergences = [d for g in gathered for d in g.divergences]
    ordered = []
    for name in checks_asked:
        if name == DESYNC:
            what = "buffers and clip_grad_norm_'s total" if run.reduced_total else "buffers"
            ordered.append(desync_check(divergences, desync_tol, what))
        elif name in by_name:
            ordered.append(by_name[name])
    stats_totals: dict[str, Any] = dict(gathered[0].totals)
    for key in ("nonfinite_origin", "nonfinite_calls"):
        if key in stats_totals:
            stats_totals[f"{key}_per_rank"] = [g.totals.get(key) for g in gathered]
    if run.loss is not None:
        stats_totals["loss"] = gathered[0].loss
        stats_totals["loss_per_rank"] = [g.loss for g in gathered]
    stats_totals.update(_shard_totals(gathered))
    stats_totals["backward_skipped"] = run.skipped
    stats_totals["desync"] = [d.to_dict() for d in divergences if d.relative > desync_tol]
    report = Report(
        command="stats",
        model={**prepared.model_info(), "class": run.model_class},
        settings={**fsdp_settings(prepared, run.units, classes), "desync_tolerance": desync_tol},
        inputs=prepared.input_dicts(),
        layers=merged,
        totals=stats_totals,
        checks=tuple(ordered),
        notes=fsdp_notes(ctx, run.units, run.skipped),
    )
    columns = [
        *shape_columns(kinds),
        Column("ranks", "Ranks", _fmt_ranks),
        Column("shard_numel_per_rank", "Shard params per rank", _fmt_per_rank(fmt_int), "right"),
        *probe.table_columns,
    ]
    if HookKind.FORWARD in kinds:
        columns += [
            Column("mean_per_rank", "Mean per rank", _fmt_per_rank(fmt_float), "right"),
            Column("nan_per_rank", "NaN per rank", _fmt_per_rank(fmt_int), "right"),
        ]
    return emit(report, out, columns)


# -- cost: memory per rank ------------------------------------------------------------------


def shard_rows(dim0: int, world: int, rank: int) -> int:
    """Rows of dim 0 that ``rank`` holds: FSDP2 splits like ``torch.chunk(world)``."""
    if dim0 <= 0:
        return 0
    chunk = -(-dim0 // world)
    return max(0, min(dim0, (rank + 1) * chunk) - rank * chunk)


def unit_params(model: nn.Module, units: Sequence[str]) -> dict[str, list[Any]]:
    """unit -> the parameters it manages: its subtree's, less those of units inside it."""
    taken: set[int] = set()
    out: dict[str, list[Any]] = {}
    for name in units:  # deepest first, the root ("") last
        m = model.get_submodule(name) if name else model
        mine = [p for p in m.parameters() if id(p) not in taken]
        taken.update(id(p) for p in mine)
        out[name] = mine
    return out


def memory_per_rank(
    model: nn.Module,
    units: Sequence[str],
    order: Sequence[str],
    world: int,
    rank: int,
    state_copies: int,
) -> dict[str, Any]:
    """This rank's FSDP2 memory in bytes (params, grads, optimizer state, all-gather peak).

    ``order``: the units in the order forward first calls them. The all-gather peak is
    the root's unsharded parameters (FSDP2 keeps the root's from forward to backward)
    plus the largest pair of consecutive units (one computing, the next prefetched).
    """
    managed = unit_params(model, units)
    params = grads = 0
    for ps in managed.values():
        for p in ps:
            shape = tuple(p.shape) or (1,)
            rest = math.prod(shape[1:])
            n = shard_rows(shape[0], world, rank) * rest if shape else 0
            b = n * p.element_size()
            params += b
            grads += b if p.requires_grad else 0
    full = {u: sum(p.numel() * p.element_size() for p in ps) for u, ps in managed.items()}
    seq = [u for u in order if u in full and u != ""] or [u for u in units if u]
    pairs = [full[a] + full[b] for a, b in itertools.pairwise(seq)]
    if not pairs:
        pairs = [full[u] for u in seq] or [0]
    best = max(range(len(pairs)), key=lambda i: pairs[i])
    blocks = seq[best : best + 2] if len(seq) > 1 else seq
    return {
        "rank": rank,
        "param_bytes": params,
        "grad_bytes": grads,
        "optimizer_state_bytes": state_copies * grads,
        "all_gather_peak_bytes": full.get("", 0) + pairs[best],
        "all_gather_peak_units": ["(root)", *blocks],
    }


def run_cost(
    ctx: DistContext,
    mopts: ModelOptions,
    ropts: RunOptions,
    out: OutputOptions,
    plan: Any,
    classes: Sequence[str] = (),
) -> int:
    """``cost --fsdp``: the cost report, plus memory per rank under FSDP2 and under DDP."""
    from hookcli.cost.runner import STATE_COPIES, over_memory
    from hookcli.cost.runner import run_cost as cost_once
    from hookcli.distributed.ddp import prepare_rank
    from hookcli.errors import ResourceError
    from hookcli.pipeline import emit
    from hookcli.render import fmt_bytes
    from hookcli.report import Row

    prepared = ctx.step(
        "building the model", lambda: prepare_rank(ctx, mopts, ropts, allow_meta=True)
    )
    model = prepared.model
    units = ctx.step("planning the shards", lambda: (*shard_plan(model, classes), ""))

    def measure() -> tuple[Any, Any, dict[str, Any]]:
        report, error = cost_once(prepared, plan)
        seen: list[str] = []
        for row in report.layers:
            name = str(row.data["name"])
            if name in units and name not in seen:
                seen.append(name)
        copies = STATE_COPIES[plan.optimizer]
        mem = memory_per_rank(model, units, seen, ctx.world_size, ctx.rank, copies)
        return report, error, mem

    report, error, mem = ctx.step("measuring", measure)
    gathered = ctx.gather(mem)
    if gathered is None:
        return 0
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
    ddp_total = sum(ddp.values()) + buffers + saved
    fsdp_totals = [sum(int(g[k]) for _, k in parts) + buffers + saved for g in gathered]
    rows.append(
        Row.of(
            {
                "component": "training step",
                "ddp_bytes": ddp_total,
                "fsdp_bytes_per_rank": fsdp_totals,
            }
        )
    )
    totals = {
        **t,
        "ddp_train_step_bytes_per_rank": ddp_total,
        "fsdp_train_step_bytes_per_rank": fsdp_totals,
        "all_gather_peak_units": gathered[0]["all_gather_peak_units"],
    }
    lines = list(report.table_totals)
    lines.append(("Memory per rank", f"DDP | FSDP2 on {ctx.world_size} ranks (rank 0, 1, ...)"))
    for row in rows:
        d = row.data
        fsdp = ", ".join(fmt_bytes(v, binary=True) for v in d["fsdp_bytes_per_rank"])
        lines.append((f"  {d['component']}", f"{fmt_bytes(d['ddp_bytes'], binary=True)} | {fsdp}"))
    peak_units = " + ".join(gathered[0]["all_gather_peak_units"])
    lines.append(("  all-gather peak is", f"{peak_units}, unsharded"))
    final = dataclasses.replace(
        report,
        model={**report.model, "class": type(model).__name__},
        settings={
            **{k: v for k, v in report.settings.items() if k != "ddp"},
            "fsdp": True,
            "shard": list(classes) if classes else "default",
            "fsdp_units": [u or "(root)" for u in units],
        },
        totals=totals,
        lists={**report.lists, "memory_per_rank": tuple(rows)},
        notes=(
            f"distributed: {ctx.world_size} ranks ({ctx.backend}, {ctx.env.source}); FSDP2 "
            f"memory from the shard plan ({len(units)} units); DDP: every rank holds it all",
        ),
        table_totals=tuple(lines),
    )
    code = emit(final, out)
    if error is not None:
        raise error
    over = over_memory(final)
    if over is not None:
        raise ResourceError(f"over --max-memory: {over.detail}")
    return code
