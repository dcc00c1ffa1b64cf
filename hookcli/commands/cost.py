"""``hookcli cost MODEL``: FLOPs, MACs and memory per layer; training and inference totals."""

from typing import Annotated

import typer

from hookcli.cliopts import (
    AnnotateOpt,
    AtolOpt,
    BaselineOpt,
    BatchOpt,
    DebugOpt,
    DepthOpt,
    DeviceOpt,
    DtypeOpt,
    FormatOpt,
    GlobalHooksOpt,
    InputFileOpt,
    InputOpt,
    InputsFromOpt,
    JunitOpt,
    KwargsOpt,
    ModelArg,
    ModeOpt,
    OutputOpt,
    RtolOpt,
    SeedOpt,
    TrustPickleOpt,
    UpdateBaselineOpt,
    WeightsOpt,
    ci_options,
    model_options,
    output_options,
    run_options,
)
from hookcli.costing import MemoryTotal, Optimizer
from hookcli.ddpopts import BackendOpt, DistTimeoutOpt, FsdpOpt, ShardOpt
from hookcli.options import Format, Mode

NAME = "cost"


BackwardOpt = Annotated[
    bool,
    typer.Option(
        "--backward",
        help="Also run backward (loss: the sum of the outputs) and count backward_flops.",
    ),
]
OptimizerOpt = Annotated[
    Optimizer,
    typer.Option("--optimizer", help="Optimizer state in the training-step memory total."),
]
MaxMemoryOpt = Annotated[
    str | None,
    typer.Option(
        "--max-memory",
        metavar="SIZE",
        help="Exit 5 when the memory total chosen by --memory-for is above SIZE (24GiB, "
        "512MiB, 500MB; K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024, kB/MB/GB/TB of 1000).",
        show_default=False,
    ),
]
MemoryForOpt = Annotated[
    MemoryTotal,
    typer.Option(
        "--memory-for",
        help="The total --max-memory checks: a training step or inference.",
    ),
]
MaxFlopsOpt = Annotated[
    str | None,
    typer.Option(
        "--max-flops",
        metavar="N",
        help="Fail (exit 1) when the forward FLOPs are above N (4.1G, 800M, 1.2T, 4.1e9).",
        show_default=False,
    ),
]


def command(
    model: ModelArg,
    kwargs: KwargsOpt = None,
    weights: WeightsOpt = None,
    trust_pickle: TrustPickleOpt = False,
    input: InputOpt = None,
    input_file: InputFileOpt = None,
    inputs_from: InputsFromOpt = None,
    batch_size: BatchOpt = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = None,
    mode: ModeOpt = None,
    backward: BackwardOpt = False,
    optimizer: OptimizerOpt = Optimizer.ADAM,
    max_memory: MaxMemoryOpt = None,
    memory_for: MemoryForOpt = MemoryTotal.TRAIN,
    max_flops: MaxFlopsOpt = None,
    depth: DepthOpt = None,
    global_hooks: GlobalHooksOpt = False,
    format: FormatOpt = Format.TABLE,
    output: OutputOpt = None,
    baseline: BaselineOpt = None,
    update_baseline: UpdateBaselineOpt = False,
    rtol: RtolOpt = None,
    atol: AtolOpt = None,
    annotate: AnnotateOpt = None,
    junit: JunitOpt = None,
    seed: SeedOpt = 0,
    debug: DebugOpt = False,
    fsdp: FsdpOpt = False,
    shard: ShardOpt = None,
    backend: BackendOpt = None,
    dist_timeout: DistTimeoutOpt = 600.0,
) -> int:
    """Per-layer FLOPs, MACs, param/output/saved-for-backward bytes; training and inference
    memory totals; ops without a FLOP formula listed. Works on --device meta."""
    from hookcli.costing import over_memory, plan_cost, run_cost
    from hookcli.errors import ResourceError, UsageError
    from hookcli.pipeline import emit, prepare

    plan = plan_cost(backward, optimizer, max_memory, memory_for, max_flops, depth, global_hooks)
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
    if fsdp or shard or backend is not None:
        from hookcli.fsdp import launch_fsdp
        from hookcli.fsdp import run_cost as run_cost_fsdp

        if backend is not None and not fsdp:
            raise UsageError("--backend needs --fsdp on cost (under torchrun or srun)")
        return launch_fsdp(
            lambda ctx: run_cost_fsdp(ctx, mopts, ropts, out, plan, tuple(shard or ())),
            fsdp=fsdp,
            ddp=False,
            device=device,
            backend=backend,
            timeout_s=dist_timeout,
            kinds=(),
            global_hooks=global_hooks,
        )
    report, error = run_cost(prepare(mopts, ropts), plan)
    code = emit(report, out)
    if error is not None:
        raise error
    over = over_memory(report)
    if over is not None:
        raise ResourceError(f"over --max-memory: {over.detail}")
    return code
