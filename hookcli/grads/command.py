"""``hookcli grads``: the parsed options to ``hookcli.grads.runner`` and the exit status."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from hookcli.errors import UsageError
from hookcli.grads.runner import plan_grads, run_grads
from hookcli.options import Format, Mode

if TYPE_CHECKING:
    from typing import Unpack

    from hookcli.commandargs import RunDesyncArgs


def cli_command(
    *,
    loss: str | None,
    depth: int | None,
    hooks: str | None,
    global_hooks: bool,
    per_param: bool,
    fail_on: str | None,
    max_grad_norm: float | None,
    min_grad_norm: float | None,
    plot: Path | None,
    **common: Unpack[RunDesyncArgs],
) -> int:
    """``hookcli grads``: plan, build, run on one process or on every rank, emit."""
    import dataclasses

    from hookcli.commandargs import command_options
    from hookcli.pipeline import prepare

    device, ddp, backend, shard = (
        common["device"],
        common["ddp"],
        common["backend"],
        common["shard"],
    )
    desync_tol, broadcast_buffers = common["desync_tol"], common["broadcast_buffers"]
    plan = plan_grads(
        hooks,
        loss,
        per_param,
        fail_on,
        max_grad_norm,
        min_grad_norm,
        plot,
        depth,
        global_hooks,
        device=device,
        ddp=ddp or common["fsdp"],
    )
    plan = dataclasses.replace(plan, wide=common["format"] in (Format.CSV, Format.MARKDOWN))
    mopts, ropts, out = command_options(common, Mode.TRAIN, depth, global_hooks)
    # what no wrapped launch takes, the first one given named in the error
    refused = ["--per-param"] if per_param else ["--plot"] if plot is not None else []
    if common["fsdp"]:
        from hookcli.distributed.fsdp import Fsdp, check_fsdp_options, check_fsdp_torch
        from hookcli.distributed.launch import launch

        check_fsdp_options(
            plan.kinds,
            global_hooks,
            ddp=ddp,
            refused=refused,
            fail_on=plan.gates.fail_on,
            bounds=max_grad_norm is not None or min_grad_norm is not None,
        )
        check_fsdp_torch(device)
        return launch(
            lambda ctx: Fsdp(ctx, desync_tol, tuple(shard or ())).run(
                mopts, ropts, out, lambda p, on: run_grads(p, plan, on)
            ),
            device=device,
            backend=backend,
            timeout_s=common["dist_timeout"],
            flag="--fsdp",
        )
    if shard:
        raise UsageError("--shard needs --fsdp (under torchrun or srun)")
    if backend is not None and not ddp:
        raise UsageError("--backend needs --ddp (under torchrun or srun)")
    if not broadcast_buffers and not ddp:
        raise UsageError("--no-broadcast-buffers needs --ddp (under torchrun or srun)")
    if ddp:
        from hookcli.distributed.ddp import Ddp, check_ddp_options
        from hookcli.distributed.launch import launch

        check_ddp_options(plan.kinds, global_hooks, refused=refused)
        return launch(
            lambda ctx: Ddp(ctx, desync_tol, broadcast_buffers).run(
                mopts, ropts, out, lambda p, on: run_grads(p, plan, on)
            ),
            device=device,
            backend=backend,
            timeout_s=common["dist_timeout"],
        )

    from hookcli.warnsummary import summarised_warnings

    with summarised_warnings(common["debug"]) as warned:
        report, error = run_grads(prepare(mopts, ropts), plan)
        warned.keep = error is None  # on failure the error is the one line to read
    if out.format is Format.TABLE and "params" in report.lists:
        from hookcli.grads.probe import render_table_with_params
        from hookcli.pipeline import conclude, write_text

        write_text(render_table_with_params(report), out)
        code = conclude(report, out)
    else:
        from hookcli.pipeline import emit

        code = emit(report, out)
    if error is not None:
        raise error
    return code
