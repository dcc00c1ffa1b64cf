"""``--ddp``: the ``Ddp`` strategy, a command on every rank through DistributedDataParallel.

Each rank builds the model with ``--seed`` (the same weights everywhere), draws its
inputs from a Generator seeded with ``seed + rank``, wraps the model in
``DistributedDataParallel`` and runs one forward (and backward) with the
command's hooks on the wrapped module. The ranks agree after every stage
(``DistContext.sync``), compare their reduced gradients and buffers with rank
0's, and send their findings to rank 0, where the command's runner merges them and
alone writes the report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hookcli.distributed.strategy import Ranks, check_wrapped_options, forward_loss
from hookcli.errors import HookcliError, UsageError
from hookcli.options import HookKind

if TYPE_CHECKING:
    from typing import Unpack

    from torch import nn

    from hookcli.distributed.launch import DistContext
    from hookcli.distributed.ranks import Divergence
    from hookcli.distributed.strategy import SessionHow
    from hookcli.pipeline import Prepared
    from hookcli.report import CheckResult
    from hookcli.session import CallRecord, Probe


def check_ddp_options(
    kinds: Sequence[HookKind],
    global_hooks: bool,
    *,
    refused: Sequence[str] = (),
    need_tensor: bool = True,
) -> None:
    """Options that do not combine with --ddp (``check_wrapped_options``): exit 2 before
    any rank starts its group."""
    check_wrapped_options("--ddp", "DDP", global_hooks, refused)
    if need_tensor and HookKind.TENSOR not in kinds:
        raise UsageError(
            "--ddp reads each rank's gradients with tensor hooks: add tensor to --hooks"
        )


@dataclass(frozen=True)
class DdpRun:
    """What one rank's session saw, on the host."""

    records: tuple[CallRecord, ...]
    loss: float | None
    reduced: Mapping[str, float | None]  # parameter -> norm of .grad after DDP's all-reduce
    divergences: tuple[Divergence, ...]  # this rank's tensors that differ from rank 0's
    buffers_resynced: bool = True  # DDP(broadcast_buffers=True): rank 0's at every forward
    error: None = None  # a failing rank stops every rank (``DistContext.sync``)
    skipped: None = None  # DDP always runs the backward it was asked for


def _unique_params(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    seen: set[int] = set()
    out = []
    for name, p in model.named_parameters():
        if id(p) not in seen:
            seen.add(id(p))
            out.append((name, p))
    return out


def run_ddp_session(
    ctx: DistContext,
    prepared: Prepared,
    probes: Sequence[Probe],
    broadcast_buffers: bool = True,
    **how: Unpack[SessionHow],
) -> DdpRun:
    """One forward (and backward) of DDP(model) with the probes' hooks on the model.

    The ranks agree after the forward and after the backward, so a rank that
    failed stops the others before they wait for it inside DDP's all-reduce.
    """
    import torch

    from hookcli.distributed.launch import wrap_ddp
    from hookcli.grads.probe import tensor_norm
    from hookcli.session import HookSession

    model = prepared.model
    mode, backward = how["mode"], how["backward"]
    ddp = ctx.step(
        "wrapping the model in DistributedDataParallel",
        lambda: wrap_ddp(model, ctx, broadcast_buffers),
    )
    try:
        with HookSession(model, probes, mode=mode, backward=backward, call=ddp) as session:
            loss, error = forward_loss(session, prepared, how["loss_fn"])
            ctx.sync("forward", error)
            loss_value: float | None = None
            if loss is not None:
                loss_value = float(loss.detach())
                try:
                    session.backward(loss)
                except HookcliError as err:
                    error = err
                ctx.sync("backward", error)
            session.finish()
            params = _unique_params(model)
            reduced: dict[str, float | None] = {}
            if session.backward_needed:
                with torch.no_grad():
                    have = [(n, p.grad) for n, p in params if p.grad is not None]
                    norms = (
                        torch.stack([tensor_norm(g).double().cpu() for _, g in have]).tolist()
                        if have
                        else []
                    )
                reduced = {n: None for n, _ in params}
                reduced.update({n: v for (n, _), v in zip(have, norms, strict=True)})
            found: list[Divergence] = []
            if how["compare"]:
                if session.backward_needed:
                    grads = [(n, p.grad) for n, p in params if p.requires_grad]
                    found += ctx.compare(grads, "grad")
                # DDP syncs parameters only when it wraps the model: one that a forward
                # changed on some rank stays different (as after an optimizer step).
                found += ctx.compare([(n, p.detach()) for n, p in params], "param")
                found += ctx.compare(list(model.named_buffers()), "buffer")
            records = session.records
            resynced = bool(getattr(ddp, "broadcast_buffers", broadcast_buffers))
    finally:
        del ddp  # the reducer and its hooks on the gradient accumulators go with it
    return DdpRun(records, loss_value, reduced, tuple(found), resynced)


class Ddp(Ranks):
    """``--ddp``: the model wrapped in DistributedDataParallel on every rank."""

    name = "ddp"

    def __init__(self, ctx: DistContext, desync_tol: float, broadcast_buffers: bool = True):
        super().__init__(ctx, desync_tol)
        self.broadcast_buffers = broadcast_buffers

    def session(
        self, prepared: Prepared, probes: Sequence[Probe], **how: Unpack[SessionHow]
    ) -> DdpRun:
        return run_ddp_session(
            self.ctx, prepared, probes, broadcast_buffers=self.broadcast_buffers, **how
        )

    def desync_check(
        self, divergences: Sequence[Divergence], run: DdpRun, backward: bool | None
    ) -> CheckResult:
        """``backward`` None: the command always compares the gradients (grads)."""
        from hookcli.distributed.ranks import desync_check

        compared = "parameters and buffers"
        if backward or backward is None:
            compared = "reduced gradients, " + compared
        return desync_check(divergences, self.desync_tol, compared, run.buffers_resynced)

    def desync_totals(self, divergences: Sequence[Divergence], run: DdpRun) -> dict[str, Any]:
        return desync_totals(divergences, self.desync_tol, run.buffers_resynced)

    def base_settings(self, prepared: Prepared, run: DdpRun) -> dict[str, Any]:
        return dict(prepared.settings)

    def desync_settings(self, run: DdpRun) -> dict[str, Any]:
        return {"broadcast_buffers": run.buffers_resynced}

    def notes(self, run: DdpRun, totals: Mapping[str, Any]) -> tuple[str, ...]:
        resynced = run.buffers_resynced
        flags = "find_unused_parameters=True" + ("" if resynced else ", broadcast_buffers=False")
        ctx = self.ctx
        notes = [
            f"distributed: {ctx.world_size} ranks ({ctx.backend}, {ctx.env.source}); "
            f"DistributedDataParallel({flags}); rank r draws its inputs with seed + r"
        ]
        names = list(dict.fromkeys(str(d["name"]) for d in totals.get("buffer_drift", ())))
        if names:
            notes.append(
                f"note: {len(names)} buffer(s) differ across ranks after the step (first: "
                f"{names[0]}); DDP overwrites them with rank 0's at the next forward "
                "(broadcast_buffers=True), so this is not a desync"
            )
        return tuple(notes)


def desync_totals(
    divergences: Sequence[Divergence], tol: float, resynced: bool
) -> dict[str, list[dict[str, Any]]]:
    """``desync``: what differs beyond ``tol`` and DDP leaves so; ``buffer_drift``: the rest."""
    over = [d for d in divergences if d.relative > tol or d.why != "values"]
    drift = [d for d in over if resynced and d.kind == "buffer"]
    return {
        "desync": [d.to_dict() for d in over if d not in drift],
        "buffer_drift": [d.to_dict() for d in drift],
    }
