"""``hookcli inspect MODEL``: the per-layer table of shapes and parameters."""

from hookcli import cliopts as opts
from hookcli.distributed import options as dist

NAME = "inspect"


@opts.forwards(
    "hookcli.inspect.command:cli_command",
    (opts.MODEL, *opts.FORWARD, opts.DEPTH, opts.HOOKS, opts.LOSS, opts.GLOBAL_HOOKS),
    (opts.Param("no_forward", opts.NoForwardOpt, False), opts.Param("columns", opts.ColumnsOpt)),
    (*opts.REPORT, dist.DDP, dist.BACKEND, dist.DIST_TIMEOUT, *dist.FSDP),
)
def command() -> None:
    """Per-layer table: name, type, input and output shapes, params, trainable; totals."""
