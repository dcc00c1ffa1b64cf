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
    from hookcli.distributed.dispatch import launch_ranks
    from hookcli.pipeline import emit_outcome, prepare

    ddp = common["ddp"] or common["fsdp"]
    plan = plan_stats(hooks, backward, loss, fail_on, dead_threshold, depth, global_hooks, ddp=ddp)
    mopts, ropts, out = command_options(common, Mode.EVAL, depth, global_hooks)
    code = launch_ranks(
        lambda p, launch: run_stats(p, plan, launch),
        mopts,
        ropts,
        out,
        common,
        kinds=plan.kinds,
        global_hooks=global_hooks,
        desync_tol=common["desync_tol"],
        broadcast_buffers=common["broadcast_buffers"],
    )
    if code is not None:
        return code

    from hookcli.warnsummary import summarised_warnings

    with summarised_warnings(common["debug"]) as warned:
        report, error = run_stats(prepare(mopts, ropts), plan)
        warned.keep = error is None  # on failure the error is the one line to read
    return emit_outcome(report, error, out)
