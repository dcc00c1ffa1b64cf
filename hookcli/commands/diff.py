"""``hookcli diff OLD NEW``: what changed between two JSON reports of one command."""

from pathlib import Path
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

    from hookcli.ci import conclude
    from hookcli.cliopts import ci_options, output_options
    from hookcli.diff import (
        diff_reports,
        load_report,
        parse_keys,
        read_stdin,
        render_markdown,
        table_columns,
        to_report,
    )
    from hookcli.errors import UsageError
    from hookcli.pipeline import write_text
    from hookcli.render import render

    if old == "-" and new == "-":
        raise UsageError("OLD and NEW cannot both be - (stdin holds one report)")
    stdin = read_stdin(sys.stdin) if "-" in (old, new) else None
    old_report = load_report(old, stdin)
    new_report = load_report(new, stdin)
    result = diff_reports(
        old_report,
        new_report,
        rtol=rtol,
        atol=atol,
        only=parse_keys(only),
        ignore=parse_keys(ignore),
        labels=(_label(old), _label(new)),
    )
    report = to_report(result, _label(old), _label(new))
    out = output_options(format, output, None, debug, ci_options(None, False, annotate, junit))
    if format is Format.MARKDOWN:
        text = render_markdown(report)  # with the summary lines, as the table has them
    else:
        text = render(report, format, table_columns(), ())
    write_text(text, out)
    return conclude(report, out, result)


def _label(source: str) -> str:
    return "stdin" if source == "-" else str(Path(source))
