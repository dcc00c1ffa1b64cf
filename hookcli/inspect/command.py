"""``hookcli inspect``: the parsed options to ``hookcli.inspect.runner`` and the exit status."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hookcli.inspect.runner import check_no_forward, plan_inspect, run_inspect, tree_report
from hookcli.options import Mode

if TYPE_CHECKING:
    from typing import Unpack

    from hookcli.commandargs import RunDdpArgs


def cli_command(
    *,
    depth: int | None,
    hooks: str | None,
    loss: str | None,
    global_hooks: bool,
    no_forward: bool,
    columns: str | None,
    **common: Unpack[RunDdpArgs],
) -> int:
    """``hookcli inspect``: plan, build, run on one process or on every rank, emit."""
    from hookcli.commandargs import command_options
    from hookcli.distributed.dispatch import on_ranks_or_here
    from hookcli.pipeline import emit, prepare

    plan = plan_inspect(hooks, depth, global_hooks, columns, loss)
    mopts, ropts, out = options = command_options(
        common, Mode.EVAL, depth, global_hooks, offer_no_forward=True
    )
    distributed = common["ddp"] or common["fsdp"] or bool(common["shard"])
    distributed = distributed or common["backend"] is not None
    if no_forward:
        check_no_forward(hooks, global_hooks, distributed, ropts, plan.columns)
        return emit(tree_report(prepare(mopts, ropts, need_inputs=False), depth, plan.columns), out)
    if plan.columns and distributed:
        from hookcli.errors import UsageError

        raise UsageError("--columns is not available with --ddp or --fsdp")
    return on_ranks_or_here(
        run_inspect, plan, options, common, kinds=plan.kinds, global_hooks=global_hooks
    )
