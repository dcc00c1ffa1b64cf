"""``hookcli stats``: the parsed options to ``hookcli.stats.runner`` and the exit status."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hookcli.options import Mode
from hookcli.stats.runner import plan_stats, run_stats

if TYPE_CHECKING:
    from typing import Unpack

    from hookcli.commandargs import RunDesyncArgs


def cli_command(
    *,
    backward: bool,
    loss: str | None,
    hooks: str | None,
    global_hooks: bool,
    fail_on: str | None,
    dead_threshold: float | None,
    depth: int | None,
    **common: Unpack[RunDesyncArgs],
) -> int:
    """``hookcli stats``: plan, build, run on one process or on every rank, emit."""
    from hookcli.commandargs import command_options
    from hookcli.distributed.dispatch import on_ranks_or_here

    ddp = common["ddp"] or common["fsdp"]
    plan = plan_stats(hooks, backward, loss, fail_on, dead_threshold, depth, global_hooks, ddp=ddp)
    options = command_options(common, Mode.EVAL, depth, global_hooks)
    return on_ranks_or_here(
        run_stats,
        plan,
        options,
        common,
        kinds=plan.kinds,
        global_hooks=global_hooks,
        summarise_warnings=True,
        desync_tol=common["desync_tol"],
        broadcast_buffers=common["broadcast_buffers"],
    )
