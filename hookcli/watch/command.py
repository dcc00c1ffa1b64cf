"""``hookcli watch``: from the parsed options to the exit status."""

from __future__ import annotations

from pathlib import Path

from hookcli.formats import Format


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
    out: Path | str | None,
    plot: Path | str | None,
    tensorboard: Path | str | None,
    format: Format,
    output: Path | str | None,
    debug: bool,
) -> int:
    """Check the options, run COMMAND watched, write the report; the exit status."""
    # No typer here: the fast path (hookcli/watch/fastpath.py) calls this too.
    from hookcli.atomic import is_stdout
    from hookcli.errors import UsageError
    from hookcli.validate import check_number, comma_names
    from hookcli.watch.config import FAIL_ON, STOP_ON, WatchGates
    from hookcli.watch.runner import WatchRun, command_line, path_option, watch_command

    # a NaN or infinite threshold is a gate that can never fail (as grads and ablate refuse)
    gates = WatchGates(
        fail_on=comma_names(fail_on, FAIL_ON, "check", "--fail-on"),
        min_grad_norm=check_number(min_grad_norm, "--min-grad-norm"),
        max_grad_norm=check_number(max_grad_norm, "--max-grad-norm"),
        max_update_ratio=check_number(max_update_ratio, "--max-update-ratio"),
    )
    stops = comma_names(stop_on, STOP_ON, "value", "--stop-on")
    if stop_on is not None and not stops:
        raise UsageError(f"--stop-on takes {','.join(STOP_ON)}, got {stop_on!r}")
    # -o as typed: '-' (or none) is stdout, '' is refused by name
    output = None if is_stdout(output) else path_option(output, "--output")
    run = WatchRun(
        command=command_line(cmd or []),
        every=every,
        gates=gates,
        stop_on=stops,
        nan_origin=nan_origin,
        out=path_option(out, "--out"),
        plot=path_option(plot, "--plot"),
        tensorboard=path_option(tensorboard, "--tensorboard"),
        output=output,
    )
    report, code, _ = watch_command(run)
    from hookcli.options import OutputOptions, format_for
    from hookcli.pipeline import write_text
    from hookcli.render import render

    # -o FILE.html: the html page, as on every command
    target = OutputOptions(format=format_for(format, output), output=output, debug=debug)
    write_text(render(report, target.format, report.columns, report.table_totals), target)
    return code
