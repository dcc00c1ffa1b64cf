"""Which launch a command's options ask for: ``--fsdp`` (or ``--shard``), ``--ddp`` (or
``--backend``), or one process; the options checked before any rank starts its group.
``on_ranks_or_here`` is the whole of a command's run: the launch, or this process alone.

    code = launch_ranks(runner, mopts, ropts, out, launch_args, device=..., kinds=...)
    if code is not None: return code   # this rank's exit status under torchrun or srun
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from hookcli.errors import UsageError

if TYPE_CHECKING:
    from hookcli.commandargs import LaunchArgs
    from hookcli.distributed.strategy import Launch, Runner
    from hookcli.options import HookKind, ModelOptions, OutputOptions, RunOptions
    from hookcli.pipeline import Outcome, Prepared
    from hookcli.report import Report

P = TypeVar("P")  # a command's plan


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


def on_ranks_or_here(
    run: Callable[[Prepared, P, Launch | None], Outcome | None],
    plan: P,
    options: tuple[ModelOptions, RunOptions, OutputOptions],
    args: LaunchArgs,
    *,
    kinds: Sequence[HookKind],
    global_hooks: bool,
    summarise_warnings: bool = False,
    after: Callable[[Report], None] | None = None,
    **launch_options: Any,
) -> int:
    """``run(prepared, plan, launch)`` on every rank of the launch the options ask for
    (``launch_ranks``), or on this process alone: the model built, run, its report written
    (``after`` then sees it, as on rank 0 of a launch); the exit status.

    ``summarise_warnings``: the run's warnings in one line before the report, dropped when
    the run fails (``--debug`` shows them as they come).
    """
    import contextlib

    from hookcli.pipeline import emit_outcome, prepare
    from hookcli.warnsummary import Warned, summarised_warnings

    mopts, ropts, out = options
    code = launch_ranks(
        lambda prepared, launch: run(prepared, plan, launch),
        mopts,
        ropts,
        out,
        args,
        kinds=kinds,
        global_hooks=global_hooks,
        after=after,
        **launch_options,
    )
    if code is not None:
        return code
    summary = (
        summarised_warnings(out.debug) if summarise_warnings else contextlib.nullcontext(Warned())
    )
    with summary as warned:
        outcome = run(prepare(mopts, ropts), plan, None)
        assert outcome is not None  # one process: always a report
        report, error = outcome
        warned.keep = error is None  # on failure the error is the one line to read
    code = emit_outcome(report, error, out)
    if after is not None:
        after(report)
    return code
