"""``hookcli cost``: the parsed options to ``hookcli.cost.runner`` and the exit status."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hookcli.cost.runner import over_memory, plan_cost, run_cost
from hookcli.options import Mode

if TYPE_CHECKING:
    from typing import Unpack

    from hookcli.commandargs import RunFsdpArgs


def cli_command(
    *,
    backward: bool,
    loss: str | None,
    optimizer: Any,
    zero_grad: Any,
    checkpoint: str | None,
    fit: str | None,
    foreach: bool | None,
    max_memory: str | None,
    memory_for: Any,
    max_flops: str | None,
    depth: int | None,
    global_hooks: bool,
    **common: Unpack[RunFsdpArgs],
) -> int:
    """``hookcli cost``: plan, build, measure on one process or on every rank, emit."""
    from hookcli.commandargs import command_options
    from hookcli.distributed.dispatch import on_ranks_or_here
    from hookcli.errors import ResourceError

    plan = plan_cost(
        backward,
        optimizer,
        max_memory,
        memory_for,
        max_flops,
        depth,
        global_hooks,
        loss,
        zero_grad,
        checkpoint,
        fit,
        foreach,
    )
    options = command_options(common, Mode.EVAL, depth, global_hooks)

    def over(report: Any) -> None:
        """After the report is written: --max-memory's verdict (exit 3)."""
        found = over_memory(report)
        if found is not None:
            raise ResourceError(f"over --max-memory: {found.detail}")

    from hookcli.amp import meta_allowed

    with meta_allowed():  # --amp on meta: emulated (hookcli.memory.autocast), on every rank
        return on_ranks_or_here(
            run_cost,
            plan,
            options,
            common,
            kinds=(),
            global_hooks=global_hooks,
            after=over,
            allow_meta=True,
        )
