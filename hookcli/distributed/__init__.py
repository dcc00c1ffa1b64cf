"""``--ddp`` and ``--fsdp``: a command on every rank of a torchrun or Slurm launch.

    launch.py   the rank's environment, process group and ``DistContext`` (sync, gather,
                compare), DDP wrapping, per-rank inputs
    ddp.py      grads, inspect and stats through DistributedDataParallel
    fsdp.py     grads, inspect, stats and cost through FSDP2 (``fully_shard``)
    ranks.py    pure functions merging the ranks' rows and checks on rank 0
    options.py  the Typer option types of ``--ddp``/``--fsdp`` (no torch import)

Nothing here is imported by the shared core; the commands and the API call in.
Importing this package does not import torch.
"""
