"""Typer option types of ``--ddp`` (shared by grads, inspect and stats), no torch import.

No ``from __future__ import annotations``: Typer reads these annotations at runtime.
"""

from typing import Annotated

import typer

DdpOpt = Annotated[
    bool,
    typer.Option(
        "--ddp",
        help="Run on every rank of a torchrun/srun launch through DistributedDataParallel; "
        "rank r draws its inputs with seed + r; rank 0 prints the merged report.",
    ),
]
BackendOpt = Annotated[
    str | None,
    typer.Option(
        "--backend",
        metavar="NAME",
        help="Process-group backend with --ddp (default: gloo on cpu, nccl on cuda).",
        show_default=False,
    ),
]
DesyncTolOpt = Annotated[
    float,
    typer.Option(
        "--desync-tol",
        metavar="X",
        min=0.0,
        help="With --ddp: a reduced gradient, parameter or buffer desyncs when "
        "max|x_r - x_0| > X * max|x_0| (0: must be equal exactly).",
    ),
]
DistTimeoutOpt = Annotated[
    float,
    typer.Option(
        "--dist-timeout",
        metavar="SECONDS",
        help="With --ddp: how long a rank waits for the others in any collective.",
    ),
]

BroadcastBuffersOpt = Annotated[
    bool,
    typer.Option(
        "--broadcast-buffers/--no-broadcast-buffers",
        help="With --ddp: DistributedDataParallel(broadcast_buffers=...). With it (the "
        "default, as in DDP) buffers that drift apart are a note, since DDP overwrites "
        "them with rank 0's at the next forward; without it they fail desync.",
    ),
]

__all__ = ["BackendOpt", "BroadcastBuffersOpt", "DdpOpt", "DesyncTolOpt", "DistTimeoutOpt"]
