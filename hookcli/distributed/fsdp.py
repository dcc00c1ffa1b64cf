"""``--fsdp``: the ``Fsdp`` strategy, a command on every rank through FSDP2 (``fully_shard``).

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

import itertools
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hookcli.distributed.strategy import DESYNC, Ranks, check_wrapped_options, forward_loss
from hookcli.errors import HookcliError, RunError, UsageError, first_line
from hookcli.options import HookKind

if TYPE_CHECKING:
    from typing import Unpack

    import torch
    from torch import nn

    from hookcli.distributed.launch import DistContext
    from hookcli.distributed.ranks import Divergence
    from hookcli.distributed.strategy import SessionHow
    from hookcli.pipeline import Prepared
    from hookcli.report import Column, Row
    from hookcli.session import CallRecord, Probe

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

    @property
    def buffers_resynced(self) -> bool:
        return False  # FSDP2 never broadcasts buffers

    @property
    def error(self) -> None:
        return None  # a failing rank stops every rank (``DistContext.sync``)


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
    classes: Sequence[str] = (),
    **how: Unpack[SessionHow],
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
    types = {n: type(m).__name__ for n, m in model.named_modules()}
    model_class = type(model).__name__
    units = ctx.step("sharding the model with fully_shard", lambda: wrap_fsdp(model, ctx, classes))
    managed = fsdp_params(model)
    handles: list[Any] = []
    local: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    with HookSession(model, probes, mode=how["mode"], backward=how["backward"]) as session:
        # every rank must call the same units in the same order: checked before each call
        agreement = CallAgreement(ctx, [model.get_submodule(u) for u in units], units)
        try:
            loss, error = forward_loss(
                session, prepared, how["loss_fn"], lambda err: _plain_types(err, types)
            )
            used = _graph_leaves([loss]) if loss is not None else set()
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
        if how["compare"]:
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

    from hookcli.modelinfo import param_fields

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
                **param_fields(name, p),
                shard_numel=s.numel(),
                shard_bytes=s.numel() * s.element_size(),
                local_grad_norm=norm,
                local_nonfinite=(flags[0], flags[1]),
                shard_grad_norm=shard_norms[i],
                reduced_grad_norm=reduced[i],
            )
        )
    return tuple(out), total


# -- the options, settings and notes of --fsdp ----------------------------------------------


def check_fsdp_options(
    kinds: Sequence[HookKind],
    global_hooks: bool,
    *,
    ddp: bool = False,
    refused: Sequence[str] = (),
    fail_on: Sequence[str] = (),
    bounds: bool = False,
) -> None:
    """Options that do not combine with --fsdp: exit 2 before any rank starts its group."""
    if ddp:
        raise UsageError("--fsdp and --ddp are two ways to wrap the model: choose one")
    check_wrapped_options("--fsdp", "FSDP", global_hooks, refused)
    other = [n for n in fail_on if n not in FSDP_CHECKS]
    if other:
        raise UsageError(
            f"--fail-on {other[0]} does not combine with --fsdp yet (with --fsdp: "
            f"{', '.join(FSDP_CHECKS)})"
        )
    if bounds:
        raise UsageError("--max-grad-norm/--min-grad-norm do not combine with --fsdp yet")


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
    settings: Mapping[str, Any], units: Sequence[str], classes: Sequence[str]
) -> dict[str, Any]:
    """A report's settings under --fsdp: the shard plan in place of ``ddp``."""
    out = {k: v for k, v in settings.items() if k != "ddp"}
    out.update(
        {
            "fsdp": True,
            "shard": list(classes) if classes else "default",
            "fsdp_units": [u or "(root)" for u in units],
        }
    )
    return out


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


def own_params(model: nn.Module) -> dict[str, tuple[str, ...]]:
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


def _sum(values: Sequence[int]) -> int:
    return int(sum(values))


class Fsdp(Ranks):
    """``--fsdp``: the model sharded with FSDP2's ``fully_shard`` on every rank."""

    name = "fsdp"

    def __init__(self, ctx: DistContext, desync_tol: float, classes: Sequence[str] = ()):
        super().__init__(ctx, desync_tol)
        self.classes = tuple(classes)

    def session(
        self, prepared: Prepared, probes: Sequence[Probe], **how: Unpack[SessionHow]
    ) -> FsdpRun:
        return run_fsdp_session(self.ctx, prepared, probes, classes=self.classes, **how)

    def row_fix(self, run: FsdpRun) -> Callable[[Row], dict[str, Any]]:
        """A row names its module's own class (not FSDP's subclass) and whether it is a unit."""

        def extra(row: Row) -> dict[str, Any]:
            name = str(row.data["name"])
            return {
                "type": run.types.get(name, row.data.get("type")),
                "fsdp_unit": name in run.units,
            }

        return extra

    def merge_rows(
        self, gathered: Sequence[Any], model: Any, per_rank_keys: Sequence[str] = ()
    ) -> tuple[Row, ...]:
        """Each row also gets its own parameters' unsharded shapes and shard sizes per rank."""
        from hookcli.report import Row

        own = own_params(model)
        params = [{p.name: p for p in r.shards} for r in gathered]
        out = []
        for row in super().merge_rows(gathered, model, per_rank_keys):
            data = dict(row.data)
            names = [n for n in own.get(str(data["name"]), ()) if n in params[0]]
            data["unsharded_shapes"] = [list(params[0][n].shape) for n in names]
            data["shard_numel_per_rank"] = [
                _sum([ps[n].shard_numel for n in names]) for ps in params
            ]
            data["shard_bytes_per_rank"] = [
                _sum([ps[n].shard_bytes for n in names]) for ps in params
            ]
            out.append(Row.of(data, row.display))
        return tuple(out)

    def shards(self, run: FsdpRun) -> tuple[ParamShard, ...]:
        return run.params

    def shard_totals(self, gathered: Sequence[Any]) -> dict[str, Any]:
        return {
            "shard_params_per_rank": [_sum([p.shard_numel for p in r.shards]) for r in gathered],
            "shard_param_bytes_per_rank": [
                _sum([p.shard_bytes for p in r.shards]) for r in gathered
            ],
        }

    def columns(self) -> list[Column]:
        from hookcli.distributed.ranks import fmt_per_rank
        from hookcli.render import fmt_int
        from hookcli.report import Column

        shard = Column(
            "shard_numel_per_rank", "Shard params per rank", fmt_per_rank(fmt_int), "right"
        )
        return [*super().columns(), shard]

    def model_info(self, prepared: Prepared, run: FsdpRun) -> dict[str, Any]:
        return {**prepared.model_info(), "class": run.model_class}

    def desync_check(
        self, divergences: Sequence[Divergence], run: FsdpRun, backward: bool | None
    ) -> Any:
        """``backward`` None: the command always compares the gradients (grads)."""
        from hookcli.distributed.ranks import desync_check

        compared = run.reduced_total or backward is None
        what = "buffers and clip_grad_norm_'s total" if compared else "buffers"
        return desync_check(divergences, self.desync_tol, what)

    def desync_totals(self, divergences: Sequence[Divergence], run: FsdpRun) -> dict[str, Any]:
        return {
            "backward_skipped": run.skipped,
            "desync": [d.to_dict() for d in divergences if d.relative > self.desync_tol],
        }

    def base_settings(self, prepared: Prepared, run: FsdpRun) -> dict[str, Any]:
        return self.unit_settings(prepared.settings, run.units)

    def unit_settings(self, settings: Mapping[str, Any], units: Sequence[str]) -> dict[str, Any]:
        return fsdp_settings(settings, units, self.classes)

    def notes(self, run: FsdpRun, totals: Mapping[str, Any]) -> tuple[str, ...]:
        return fsdp_notes(self.ctx, run.units, run.skipped)

    # -- cost: memory per rank from the shard plan, without a session
    def plan_units(self, model: nn.Module) -> tuple[str, ...]:
        """The units ``fully_shard`` would make, the root ("") last."""
        return tuple(
            self.ctx.step("planning the shards", lambda: (*shard_plan(model, self.classes), ""))
        )

    def memory(
        self, model: nn.Module, units: Sequence[str], order: Sequence[str], state_copies: int
    ) -> dict[str, Any]:
        """This rank's FSDP2 memory (``memory_per_rank``)."""
        ctx = self.ctx
        return memory_per_rank(model, units, order, ctx.world_size, ctx.rank, state_copies)

    def memory_note(self, units: Sequence[str]) -> str:
        ctx = self.ctx
        return (
            f"distributed: {ctx.world_size} ranks ({ctx.backend}, {ctx.env.source}); each "
            f"rank's step tracked as FSDP2 runs it ({len(units)} units)"
        )


# -- cost: memory per rank ------------------------------------------------------------------


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
    from hookcli.memory.fsdp import shard_rows, unit_params

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
