"""``hookcli profile MODEL``: where the time goes, per module, forward and backward."""

from pathlib import Path
from typing import Annotated

import typer

from hookcli import cliopts as opts
from hookcli.profile.plan import SortKey

NAME = "profile"

BackwardOpt = opts.backward(
    "Also time backward (loss from --loss) per module, from full backward-pre and backward hooks."
)
WarmupOpt = Annotated[
    int, typer.Option("--warmup", min=0, metavar="N", help="Untimed passes first.")
]
RepeatOpt = Annotated[
    int,
    typer.Option(
        "--repeat", min=1, metavar="N", help="Timed passes: rows show the median and the IQR."
    ),
]
SortOpt = Annotated[
    SortKey,
    typer.Option(
        "--sort",
        help="Row order, most first: self time, inclusive time, calls, or FLOPs.",
    ),
]
TraceOutOpt = Annotated[
    Path | None,
    typer.Option(
        "--trace-out",
        metavar="FILE",
        help="Write the timed passes as Chrome trace-event JSON (Perfetto, chrome://tracing).",
        show_default=False,
    ),
]
PlotOpt = opts.plot("A bar chart of the 20 modules with the most self time (needs matplotlib).")
MaxMsOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--max-ms",
        metavar="GLOB:MS",
        help="Fail (exit 1) when a matching module's median forward time (inclusive) is "
        "over MS milliseconds. GLOB: a name or class glob, or (root). Repeatable.",
        show_default=False,
    ),
]
SyncOpt = Annotated[
    bool,
    typer.Option(
        "--sync",
        help="On cuda: synchronize and read the wall clock in every hook instead of "
        "recording CUDA events (includes launch overhead; the pass runs slower).",
    ),
]


@opts.forwards(
    "hookcli.profile.runner:cli_command",
    (opts.MODEL, *opts.FORWARD, opts.Param("backward", BackwardOpt, False), opts.LOSS),
    (opts.Param("warmup", WarmupOpt, 2), opts.Param("repeat", RepeatOpt, 10)),
    (opts.Param("sync", SyncOpt, False), opts.Param("sort", SortOpt, SortKey.SELF), opts.DEPTH),
    (opts.Param("trace_out", TraceOutOpt), opts.Param("plot", PlotOpt)),
    (opts.Param("max_ms", MaxMsOpt), *opts.REPORT),
)
def command() -> None:
    """Time per module: forward (and backward) median and IQR over repeats, inclusive and
    self, % of the root, achieved FLOP/s; the overhead against a bare forward; a trace."""
