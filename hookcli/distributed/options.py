"""Typer option types of ``--ddp`` (shared by grads, inspect and stats), no torch import.

No ``from __future__ import annotations``: Typer reads these annotations at runtime.
"""

import math

import typer

from hookcli.cliopts import Param, option


def _finite_tolerance(value: float) -> float:
    """``--desync-tol``: a finite number >= 0 (nan would compare false and pass every
    check; inf would let any drift through)."""
    if not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number >= 0")
    return value


def _positive_seconds(value: float) -> float:
    """``--dist-timeout``: a finite number of seconds > 0 (torch would take nan, 0 or a
    negative timeout and fail every collective at once, or never)."""
    if not math.isfinite(value) or value <= 0:
        raise typer.BadParameter(f"{value} is not a finite number of seconds > 0")
    return value


DdpOpt = option(
    bool,
    "--ddp",
    help="Run on every rank of a torchrun/srun launch through DistributedDataParallel; "
    "rank r draws its inputs with seed + r; rank 0 prints the merged report.",
)
BackendOpt = option(
    str | None,
    "--backend",
    metavar="NAME",
    help="Process-group backend with --ddp (default: gloo on cpu, nccl on cuda).",
)
DesyncTolOpt = option(
    float,
    "--desync-tol",
    metavar="X",
    min=0.0,
    callback=_finite_tolerance,
    help="With --ddp: a reduced gradient, parameter or buffer desyncs when "
    "max|x_r - x_0| > X * max|x_0| (0: must be equal exactly).",
)
DistTimeoutOpt = option(
    float,
    "--dist-timeout",
    metavar="SECONDS",
    callback=_positive_seconds,
    help="With --ddp: how long a rank waits for the others in any collective.",
)

BroadcastBuffersOpt = option(
    bool,
    "--broadcast-buffers/--no-broadcast-buffers",
    help="With --ddp: DistributedDataParallel(broadcast_buffers=...). With it (the "
    "default, as in DDP) buffers that drift apart are a note, since DDP overwrites "
    "them with rank 0's at the next forward; without it they fail desync.",
)

FsdpOpt = option(
    bool,
    "--fsdp",
    help="Run on every rank of a torchrun/srun launch with the model sharded by FSDP2 "
    "(fully_shard); per rank: shard sizes, local and reduced grad norms; rank 0 prints.",
)
ShardOpt = option(
    list[str] | None,
    "--shard",
    metavar="CLASS",
    help="With --fsdp: fully_shard every module of this class (repeatable), then the "
    "root (default: each block of the largest ModuleList, else each top-level child).",
)

DDP = Param("ddp", DdpOpt, False)
BACKEND = Param("backend", BackendOpt)
DIST_TIMEOUT = Param("dist_timeout", DistTimeoutOpt, 600.0)
FSDP = (Param("fsdp", FsdpOpt, False), Param("shard", ShardOpt))  # --fsdp and its --shard
# grads and stats: DDP with its checks, and FSDP
DISTRIBUTED = (
    DDP,
    BACKEND,
    Param("desync_tol", DesyncTolOpt, 0.0),
    DIST_TIMEOUT,
    Param("broadcast_buffers", BroadcastBuffersOpt, True),
    *FSDP,
)

__all__ = [
    "BACKEND",
    "DDP",
    "DISTRIBUTED",
    "DIST_TIMEOUT",
    "FSDP",
    "BackendOpt",
    "BroadcastBuffersOpt",
    "DdpOpt",
    "DesyncTolOpt",
    "DistTimeoutOpt",
    "FsdpOpt",
    "ShardOpt",
]
