"""``hookcli diff OLD NEW``: what changed between two JSON reports of one command."""

from pathlib import Path
from typing import Annotated, Any

import typer

from hookcli import cliopts as opts
from hookcli.options import Annotate, Format

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
RtolOpt = opts.threshold(
    "--rtol",
    "Relative tolerance (default: torch.testing.assert_close's for the reports' dtype: "
    "float32 1.3e-6, float16 1e-3, bfloat16 1.6e-2, float64 1e-7; integers exact).",
)
AtolOpt = opts.threshold(
    "--atol",
    "Absolute tolerance (default: float32/float16/bfloat16 1e-5, float64 1e-7; integers exact).",
)
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


def _diff(
    format: Format,
    output: Path | None,
    annotate: Annotate | None,
    junit: Path | None,
    debug: bool,
    **compared: Any,
) -> int:
    """``run_diff`` of OLD and NEW (and how they are compared), written as the options say."""
    import sys

    from hookcli.diffrun import run_diff

    ci = opts.ci_options(None, False, annotate, junit)
    out = opts.output_options(format, output, None, debug, ci)
    return run_diff(**compared, out=out, stdin=sys.stdin)


@opts.forwards(
    _diff,
    (opts.Param("old", OldArg, opts.REQUIRED), opts.Param("new", NewArg, opts.REQUIRED)),
    (opts.Param("rtol", RtolOpt), opts.Param("atol", AtolOpt), opts.Param("only", OnlyOpt)),
    (opts.Param("ignore", IgnoreOpt), opts.FORMAT, opts.OUTPUT, opts.ANNOTATE, opts.JUNIT),
    opts.DEBUG,
)
def command() -> None:
    """Structural and numeric differences beyond tolerance; exit 1 when they differ."""
