"""``hookcli cost MODEL``: FLOPs, MACs and memory per layer; training and inference peaks."""

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
    LossOpt,
    ModelArg,
    ModeOpt,
    OutputOpt,
    RtolOpt,
    SeedOpt,
    TrustPickleOpt,
    UpdateBaselineOpt,
    WeightsOpt,
)
from hookcli.cost.runner import MemoryTotal, Optimizer, ZeroGrad
from hookcli.distributed.options import BackendOpt, DistTimeoutOpt, FsdpOpt, ShardOpt
from hookcli.options import Format

NAME = "cost"

BackwardOpt = Annotated[
    bool,
    typer.Option(
        "--backward",
        help="Also run backward (loss from --loss) and count backward_flops.",
    ),
]
OptimizerOpt = Annotated[
    Optimizer,
    typer.Option(
        "--optimizer",
        help="The optimizer of the training step (its state, and its step's temporaries "
        "with the implementation torch picks on the device: for-loop or foreach).",
    ),
]
ZeroGradOpt = Annotated[
    ZeroGrad | None,
    typer.Option(
        "--zero-grad",
        help="The step's zero_grad: none (set_to_none, the default) or zeros (grads kept). "
        "Turns --backward on.",
        show_default=False,
    ),
]
CheckpointOpt = Annotated[
    str | None,
    typer.Option(
        "--checkpoint",
        metavar="CLASS",
        help="torch.utils.checkpoint around every module of class CLASS. Turns --backward on.",
        show_default=False,
    ),
]
ForeachOpt = Annotated[
    bool | None,
    typer.Option(
        "--foreach/--no-foreach",
        help="The optimizer's foreach implementation on or off (default: torch's choice: "
        "for-loop on cpu and meta, foreach on cuda). Turns --backward on.",
        show_default=False,
    ),
]
FitOpt = Annotated[
    str | None,
    typer.Option(
        "--fit",
        metavar="SIZE",
        help="The largest batch size whose training-step peak fits in SIZE (80GiB), "
        "searched on meta whatever --device says. Turns --backward on.",
        show_default=False,
    ),
]
MaxMemoryOpt = Annotated[
    str | None,
    typer.Option(
        "--max-memory",
        metavar="SIZE",
        help="Exit 5 when the memory peak chosen by --memory-for is above SIZE (24GiB, "
        "512MiB, 500MB; K/M/G/T/P/E and KiB..EiB are powers of 1024, kB..EB of 1000).",
        show_default=False,
    ),
]
MemoryForOpt = Annotated[
    MemoryTotal,
    typer.Option(
        "--memory-for",
        help="The peak --max-memory checks: a training step's or inference's.",
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
    loss: LossOpt = None,
    optimizer: OptimizerOpt = Optimizer.ADAM,
    zero_grad: ZeroGradOpt = None,
    checkpoint: CheckpointOpt = None,
    fit: FitOpt = None,
    foreach: ForeachOpt = None,
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
    """Per-layer FLOPs, MACs, param/output/saved-for-backward bytes; the training-step and
    inference memory peaks; ops without a FLOP formula listed. Works on --device meta."""
    from hookcli.cost.command import cli_command

    return cli_command(
        model=model,
        kwargs=kwargs,
        weights=weights,
        trust_pickle=trust_pickle,
        input=input,
        input_file=input_file,
        inputs_from=inputs_from,
        batch_size=batch_size,
        device=device,
        dtype=dtype,
        mode=mode,
        backward=backward,
        loss=loss,
        optimizer=optimizer,
        zero_grad=zero_grad,
        checkpoint=checkpoint,
        fit=fit,
        foreach=foreach,
        max_memory=max_memory,
        memory_for=memory_for,
        max_flops=max_flops,
        depth=depth,
        global_hooks=global_hooks,
        format=format,
        output=output,
        baseline=baseline,
        update_baseline=update_baseline,
        rtol=rtol,
        atol=atol,
        annotate=annotate,
        junit=junit,
        seed=seed,
        debug=debug,
        fsdp=fsdp,
        shard=shard,
        backend=backend,
        dist_timeout=dist_timeout,
    )
