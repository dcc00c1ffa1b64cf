"""``hookcli stats``: the command's run, from the parsed options to the exit status.

On one process it calls ``hookcli.stats.runner``, as ``hookcli.stats`` does; under
torchrun it calls the same runner with a launch strategy from ``hookcli.distributed``.
"""

from __future__ import annotations

from pathlib import Path

from hookcli.options import Annotate, Format, Mode
from hookcli.stats.runner import plan_stats, run_stats


def cli_command(
    *,
    model: str,
    kwargs: list[str] | None,
    weights: Path | None,
    trust_pickle: bool,
    input: list[str] | None,
    input_file: Path | None,
    inputs_from: str | None,
    batch_size: int | None,
    device: str,
    dtype: str | None,
    mode: Mode | None,
    backward: bool,
    loss: str | None,
    hooks: str | None,
    global_hooks: bool,
    fail_on: str | None,
    dead_threshold: float | None,
    depth: int | None,
    format: Format,
    output: Path | None,
    baseline: Path | None,
    update_baseline: bool,
    rtol: float | None,
    atol: float | None,
    annotate: Annotate | None,
    junit: Path | None,
    seed: int,
    debug: bool,
    ddp: bool,
    backend: str | None,
    desync_tol: float,
    dist_timeout: float,
    broadcast_buffers: bool,
    fsdp: bool,
    shard: list[str] | None,
) -> int:
    """``hookcli stats``: plan, build, run on one process or on every rank, emit."""
    from hookcli.cliopts import ci_options, model_options, output_options, run_options
    from hookcli.pipeline import emit, prepare

    plan = plan_stats(
        hooks, backward, loss, fail_on, dead_threshold, depth, global_hooks, ddp=ddp or fsdp
    )
    ci = ci_options(baseline, update_baseline, annotate, junit, rtol, atol)
    mopts = model_options(model, kwargs, weights, trust_pickle, seed)
    ropts = run_options(
        input,
        batch_size,
        device,
        dtype,
        mode,
        Mode.EVAL,
        global_hooks,
        input_file=input_file,
        inputs_from=inputs_from,
    )
    out = output_options(format, output, depth, debug, ci)
    if fsdp or shard:
        from hookcli.distributed.fsdp import Fsdp, launch_fsdp

        return launch_fsdp(
            lambda ctx: Fsdp(ctx, desync_tol, tuple(shard or ())).run(
                mopts, ropts, out, lambda p, launch: run_stats(p, plan, launch)
            ),
            fsdp=fsdp,
            ddp=ddp,
            device=device,
            backend=backend,
            timeout_s=dist_timeout,
            kinds=plan.kinds,
            global_hooks=global_hooks,
        )
    if not broadcast_buffers and not ddp:
        from hookcli.errors import UsageError

        raise UsageError("--no-broadcast-buffers needs --ddp (under torchrun or srun)")
    if ddp or backend is not None:
        from hookcli.distributed.ddp import Ddp, launch_command

        return launch_command(
            lambda ctx: Ddp(ctx, desync_tol, broadcast_buffers).run(
                mopts, ropts, out, lambda p, launch: run_stats(p, plan, launch)
            ),
            ddp=ddp,
            device=device,
            backend=backend,
            timeout_s=dist_timeout,
            kinds=plan.kinds,
            global_hooks=global_hooks,
            need_tensor=False,
        )

    from hookcli.warnsummary import summarised_warnings

    with summarised_warnings(debug) as warned:
        report, error = run_stats(prepare(mopts, ropts), plan)
        warned.keep = error is None  # on failure the error is the one line to read
    code = emit(report, out)
    if error is not None:
        raise error
    return code
