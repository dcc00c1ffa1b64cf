"""``hookcli inspect``: the command's run, from the parsed options to the exit status.

On one process it calls ``hookcli.inspect.runner``, as ``hookcli.inspect`` does; under
torchrun it calls the same runner with a launch strategy from ``hookcli.distributed``.
"""

from __future__ import annotations

from pathlib import Path

from hookcli.inspect.runner import check_no_forward, plan_inspect, run_inspect, tree_report
from hookcli.options import Annotate, Format, Mode


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
    depth: int | None,
    hooks: str | None,
    loss: str | None,
    global_hooks: bool,
    no_forward: bool,
    columns: str | None,
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
    dist_timeout: float,
    fsdp: bool,
    shard: list[str] | None,
) -> int:
    """``hookcli inspect``: plan, build, run on one process or on every rank, emit."""
    from hookcli.cliopts import ci_options, model_options, output_options, run_options
    from hookcli.pipeline import emit, prepare

    plan = plan_inspect(hooks, depth, global_hooks, columns, loss)
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
        offer_no_forward=True,
    )
    out = output_options(format, output, depth, debug, ci)
    if no_forward:
        distributed = ddp or fsdp or bool(shard) or backend is not None
        check_no_forward(hooks, global_hooks, distributed, ropts, plan.columns)
        return emit(tree_report(prepare(mopts, ropts, need_inputs=False), depth, plan.columns), out)
    if plan.columns and (ddp or fsdp or shard or backend is not None):
        from hookcli.errors import UsageError

        raise UsageError("--columns is not available with --ddp or --fsdp")
    if fsdp or shard:
        from hookcli.distributed.fsdp import Fsdp, launch_fsdp

        return launch_fsdp(
            lambda ctx: Fsdp(ctx, 0.0, tuple(shard or ())).run(
                mopts, ropts, out, lambda p, launch: run_inspect(p, plan, launch)
            ),
            fsdp=fsdp,
            ddp=ddp,
            device=device,
            backend=backend,
            timeout_s=dist_timeout,
            kinds=plan.kinds,
            global_hooks=global_hooks,
        )
    if ddp or backend is not None:
        from hookcli.distributed.ddp import Ddp, launch_command

        return launch_command(
            lambda ctx: Ddp(ctx, 0.0).run(
                mopts, ropts, out, lambda p, launch: run_inspect(p, plan, launch)
            ),
            ddp=ddp,
            device=device,
            backend=backend,
            timeout_s=dist_timeout,
            kinds=plan.kinds,
            global_hooks=global_hooks,
            need_tensor=False,
        )

    report, error = run_inspect(prepare(mopts, ropts), plan)
    code = emit(report, out)
    if error is not None:
        raise error
    return code
