"""``hookcli watch``: from the parsed options to the exit status."""

from __future__ import annotations

from pathlib import Path

from hookcli.options import Format


def cli_command(
    *,
    cmd: list[str] | None,
    every: int,
    nan_origin: bool,
    fail_on: str | None,
    stop_on: str | None,
    min_grad_norm: float | None,
    max_grad_norm: float | None,
    max_update_ratio: float | None,
    out: Path | None,
    plot: Path | None,
    tensorboard: Path | None,
    format: Format,
    output: Path | None,
    debug: bool,
) -> int:
    """Check the options, run COMMAND watched, write the report; the exit status."""
    from hookcli.cliopts import output_options, parse_fail_on
    from hookcli.errors import UsageError
    from hookcli.pipeline import write_text
    from hookcli.render import render
    from hookcli.watch.checks import WatchGates
    from hookcli.watch.config import FAIL_ON, STOP_ON
    from hookcli.watch.runner import WatchRun, command_line, watch_command

    gates = WatchGates(
        fail_on=parse_fail_on(fail_on, FAIL_ON),
        min_grad_norm=min_grad_norm,
        max_grad_norm=max_grad_norm,
        max_update_ratio=max_update_ratio,
    )
    stops: tuple[str, ...] = ()
    if stop_on is not None:
        stops = tuple(dict.fromkeys(p.strip() for p in stop_on.split(",") if p.strip()))
        bad = [s for s in stops if s not in STOP_ON]
        if bad or not stops:
            raise UsageError(f"--stop-on takes {','.join(STOP_ON)}, got {stop_on!r}")
    run = WatchRun(
        command=command_line(cmd or []),
        every=every,
        gates=gates,
        stop_on=stops,
        nan_origin=nan_origin,
        out=out,
        plot=plot,
        tensorboard=tensorboard,
    )
    report, code, _ = watch_command(run)
    out_opts = output_options(format, output, None, debug)
    write_text(render(report, out_opts.format, report.columns, report.table_totals), out_opts)
    return code
