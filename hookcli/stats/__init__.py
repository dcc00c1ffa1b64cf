"""``stats``: activation statistics per module call, and the CI checks on them.

    probe.py    ``StatsProbe``: forward hooks computing the figures on the device
    checks.py   ``--fail-on`` and the thresholds
    runner.py   ``plan_stats`` and ``run_stats`` (``hookcli stats`` and ``hookcli.stats``)

Importing this package does not import torch.
"""
