"""``hookcli cost MODEL``: FLOPs, MACs and memory per layer; training and inference peaks."""

from typing import Annotated

import typer

from hookcli import cliopts as opts
from hookcli.cost.runner import MemoryTotal, Optimizer, ZeroGrad
from hookcli.distributed import options as dist

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


@opts.forwards(
    "hookcli.cost.command:cli_command",
    (opts.MODEL, *opts.FORWARD, opts.Param("backward", BackwardOpt, False), opts.LOSS),
    opts.Param("optimizer", OptimizerOpt, Optimizer.ADAM),
    (opts.Param("zero_grad", ZeroGradOpt), opts.Param("checkpoint", CheckpointOpt)),
    (opts.Param("fit", FitOpt), opts.Param("foreach", ForeachOpt)),
    opts.Param("max_memory", MaxMemoryOpt),
    opts.Param("memory_for", MemoryForOpt, MemoryTotal.TRAIN),
    (opts.Param("max_flops", MaxFlopsOpt), opts.DEPTH, opts.GLOBAL_HOOKS, *opts.REPORT),
    (*dist.FSDP, dist.BACKEND, dist.DIST_TIMEOUT),
)
def command() -> None:
    """Per-layer FLOPs, MACs, param/output/saved-for-backward bytes; the training-step and
    inference memory peaks; ops without a FLOP formula listed. Works on --device meta."""
