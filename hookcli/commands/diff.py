"""``hookcli diff OLD NEW``: what changed between two JSON reports of one command."""

from typing import Annotated

import typer

from hookcli.cliopts import (
    AnnotateOpt,
    DebugOpt,
    FormatOpt,
    JunitOpt,
    OutputOpt,
)
from hookcli.options import Format

NAME = "diff"

OldArg = Annotated[
    str,
    typer.Argument(
        metavar="OLD",
        help="The expected report (a --format json file, or - for stdin).",
        show_default=False,
    ),
]
NewArg = Annotated[
    str,
    typer.Argument(
        metavar="NEW",
        help="The report to check against it (a file, or - for stdin).",
        show_default=False,
    ),
]
RtolOpt = Annotated[
    float | None,
    typer.Option(
        "--rtol",
        metavar="X",
        min=0.0,
        help="Relative tolerance (default: torch.testing.assert_close's for the reports' dtype: "
        "float32 1.3e-6, float16 1e-3, bfloat16 1.6e-2, float64 1e-7; integers exact).",
        show_default=False,
    ),
]
AtolOpt = Annotated[
    float | None,
    typer.Option(
        "--atol",
        metavar="X",
        min=0.0,
        help="Absolute tolerance (default: float32/float16/bfloat16 1e-5, float64 1e-7; "
        "integers exact).",
        show_default=False,
    ),
]
OnlyOpt = Annotated[
    str | None,
    typer.Option(
        "--only",
        metavar="KEY,...",
        help="Compare only these keys (columns, totals, settings; fnmatch patterns such as "
        "'*_norm').",
        show_default=False,
    ),
]
IgnoreOpt = Annotated[
    str | None,
    typer.Option(
        "--ignore",
        metavar="KEY,...",
        help="Do not compare these keys (e.g. device,seed or 'grad_*').",
        show_default=False,
    ),
]


def command(
    old: OldArg,
    new: NewArg,
    rtol: RtolOpt = None,
    atol: AtolOpt = None,
    only: OnlyOpt = None,
    ignore: IgnoreOpt = None,
    format: FormatOpt = Format.TABLE,
    output: OutputOpt = None,
    annotate: AnnotateOpt = None,
    junit: JunitOpt = None,
    debug: DebugOpt = False,
) -> int:
    """Structural and numeric differences beyond tolerance; exit 1 when they differ."""
    import sys

    from hookcli.cliopts import ci_options, output_options
    from hookcli.diffrun import run_diff

    out = output_options(format, output, None, debug, ci_options(None, False, annotate, junit))
    return run_diff(
        old, new, rtol=rtol, atol=atol, only=only, ignore=ignore, out=out, stdin=sys.stdin
    )
