"""``hookcli registrations MODEL``: every module/parameter/buffer registration while building."""

from hookcli import cliopts as opts

NAME = "registrations"


@opts.forwards(
    "hookcli.registrations:cli_command",
    (opts.MODEL, *opts.BUILD, opts.DEVICE, opts.DEPTH, *opts.REPORT),
)
def command() -> None:
    """Every registration while the model is built, in order: parent, kind, name, shape."""
