"""``watch``: a real training run, watched from outside with global hooks.

    bootstrap/   the ``sitecustomize`` that ``hookcli watch`` puts first on PYTHONPATH
    boot.py      what it calls once torch is imported: installs the monitor
    config.py    the options passed through the environment; defaults
    monitor.py   the in-process monitor: global optimizer step hooks, per-step figures
    merge.py     reading the steps files of every process (rank)
    summary.py   the ``watch`` Report; checks.py its CI gates
    runner.py    ``hookcli watch -- COMMAND``: process group, signals, live status
    plot.py      ``--plot``; session.py the Python twin ``hookcli.watch(model)``

Importing this package does not import torch.
"""
