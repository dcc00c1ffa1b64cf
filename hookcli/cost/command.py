"""``hookcli cost``: the command's run, from the parsed options to the exit status.

On one process it calls ``hookcli.cost.runner``, as ``hookcli.cost`` does; under
torchrun it calls the same runner with a launch strategy from ``hookcli.distributed``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hookcli.cost.runner import over_memory, plan_cost, run_cost
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
    backward: bool,
    loss: str | None,
    optimizer: Any,
    zero_grad: Any,
    checkpoint: str | None,
    fit: str | None,
    foreach: bool | None,
    max_memory: str | None,
    memory_for: Any,
    max_flops: str | None,
    depth: int | None,
    global_hooks: bool,
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
    fsdp: bool,
    shard: list[str] | None,
    backend: str | None,
    dist_timeout: float,
) -> int:
    """``hookcli cost``: plan, build, measure on one process or on every rank, emit."""
    from hookcli.cliopts import ci_options, model_options, output_options, run_options
    from hookcli.errors import ResourceError, UsageError
    from hookcli.pipeline import emit, prepare

    plan = plan_cost(
        backward,
        optimizer,
        max_memory,
        memory_for,
        max_flops,
        depth,
        global_hooks,
        loss,
        zero_grad,
        checkpoint,
        fit,
        foreach,
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

    def over(report: Any) -> None:
        """After the report is written: --max-memory's verdict (exit 3)."""
        found = over_memory(report)
        if found is not None:
            raise ResourceError(f"over --max-memory: {found.detail}")

    from hookcli.amp import meta_allowed

    if fsdp or shard or backend is not None:
        from hookcli.distributed.fsdp import Fsdp, launch_fsdp

        if backend is not None and not fsdp:
            raise UsageError("--backend needs --fsdp on cost (under torchrun or srun)")
        with meta_allowed():  # --amp on meta: emulated, on every rank
            return launch_fsdp(
                lambda ctx: Fsdp(ctx, 0.0, tuple(shard or ())).run(
                    mopts, ropts, out, lambda p, launch: run_cost(p, plan, launch), over, True
                ),
                fsdp=fsdp,
                ddp=False,
                device=device,
                backend=backend,
                timeout_s=dist_timeout,
                kinds=(),
                global_hooks=global_hooks,
            )

    with meta_allowed():  # --amp on meta: emulated (hookcli.memory.autocast)
        report, error = run_cost(prepare(mopts, ropts), plan)
    code = emit(report, out)
    if error is not None:
        raise error
    over(report)
    return code
