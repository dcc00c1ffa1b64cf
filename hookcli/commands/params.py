"""``hookcli params MODEL``: every parameter, its tied names, trainable and frozen totals."""

from hookcli import cliopts as opts

NAME = "params"

FrozenOpt = opts.patterns(
    "--frozen",
    "Set requires_grad=False first on parameters whose qualified name matches a glob "
    "(backbone.*, *.bias) or lies under a module name (layer1). Repeatable.",
)


@opts.forwards(
    "hookcli.parameters:cli_command",
    (opts.MODEL, *opts.BUILD, opts.DEVICE, opts.DTYPE, opts.Param("frozen", FrozenOpt), opts.DEPTH),
    opts.REPORT,
)
def command() -> None:
    """Every parameter: shape, dtype, device, requires_grad, numel, tied/shared names; no hooks."""
