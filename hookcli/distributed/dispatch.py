"""Which launch a command's options ask for: ``--fsdp`` (or ``--shard``), ``--ddp`` (or
``--backend``), or one process; the options checked before any rank starts its group.

    code = launch_ranks(runner, mopts, ropts, out, launch_args, device=..., kinds=...)
    if code is not None: return code   # this rank's exit status under torchrun or srun
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from hookcli.errors import UsageError

if TYPE_CHECKING:
    from hookcli.commandargs import LaunchArgs
    from hookcli.distributed.strategy import Runner
    from hookcli.options import HookKind, ModelOptions, OutputOptions, RunOptions
    from hookcli.report import Report


def launch_ranks(
    runner: Runner,
    mopts: ModelOptions,
    ropts: RunOptions,
    out: OutputOptions,
    args: LaunchArgs,
    *,
    kinds: Sequence[HookKind],
    global_hooks: bool,
    desync_tol: float = 0.0,
    broadcast_buffers: bool = True,
    after: Callable[[Report], None] | None = None,
    allow_meta: bool = False,
) -> int | None:
    """``runner`` on this rank under the launch the options ask for (``distributed.launch``),
    its exit status; None where they ask for none (one process).

    ``args`` without ``ddp`` (cost): ``--backend`` goes with ``--fsdp``.
    """
    from hookcli.distributed.launch import launch

    fsdp, backend, device = args["fsdp"], args["backend"], ropts.device
    shard = tuple(args["shard"] or ())
    ddp = args.get("ddp")
    if ddp is None and backend is not None and not fsdp:
        raise UsageError("--backend needs --fsdp on cost (under torchrun or srun)")
    if fsdp or shard or (ddp is None and backend is not None):
        from hookcli.distributed.fsdp import Fsdp, check_fsdp_options, check_fsdp_torch

        if not fsdp:
            raise UsageError("--shard needs --fsdp (under torchrun or srun)")
        check_fsdp_options(kinds, global_hooks, ddp=bool(ddp))
        check_fsdp_torch(device)
        return launch(
            lambda ctx: Fsdp(ctx, desync_tol, shard).run(
                mopts, ropts, out, runner, after, allow_meta
            ),
            device=device,
            backend=backend,
            timeout_s=args["dist_timeout"],
            flag="--fsdp",
        )
    if not broadcast_buffers and not ddp:
        raise UsageError("--no-broadcast-buffers needs --ddp (under torchrun or srun)")
    if ddp or backend is not None:
        from hookcli.distributed.ddp import Ddp, check_ddp_options

        if not ddp:
            raise UsageError("--backend needs --ddp (under torchrun or srun)")
        check_ddp_options(kinds, global_hooks, need_tensor=False)
        return launch(
            lambda ctx: Ddp(ctx, desync_tol, broadcast_buffers).run(mopts, ropts, out, runner),
            device=device,
            backend=backend,
            timeout_s=args["dist_timeout"],
        )
    return None
