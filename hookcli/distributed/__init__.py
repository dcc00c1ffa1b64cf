"""``--ddp`` and ``--fsdp``: a command on every rank of a torchrun or Slurm launch.

    launch.py   the rank's environment, process group and ``DistContext`` (sync, gather,
                compare), DDP wrapping, per-rank inputs
    strategy.py the launch a runner takes: ``Local``, and what ``Ddp``/``Fsdp`` share
                (build on the rank, gather, ``RankFindings``)
    ddp.py      the ``Ddp`` strategy: the session through DistributedDataParallel
    fsdp.py     the ``Fsdp`` strategy: the shard plan, the session through FSDP2
                (``fully_shard``), shard sizes, memory per rank
    dispatch.py which launch a command's options ask for, checked: ``launch_ranks``
    ranks.py    pure functions merging the ranks' rows and checks on rank 0
    options.py  the Typer option types of ``--ddp``/``--fsdp`` (no torch import)

Nothing here is imported by the shared core. The commands' runners (``run_grads``,
``run_inspect``, ``run_stats``, ``run_cost``) take a strategy and build their reports
themselves; they use a strategy's public methods and names only.
Importing this package does not import torch.
"""
