"""``grads``: gradient flow per module call, and the CI checks on it.

    probe.py    ``GradProbe``: backward hooks and parameter-gradient tensor hooks
    checks.py   ``--fail-on``, ``--max-grad-norm``, ``--min-grad-norm``
    runner.py   ``plan_grads`` and ``run_grads`` (``hookcli grads`` and ``hookcli.grads``)
    plot.py     the gradient-flow PNG (``--plot``)

Importing this package does not import torch.
"""
