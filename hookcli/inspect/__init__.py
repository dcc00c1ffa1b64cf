"""``inspect``: shapes and parameters per module call, or the module tree (--no-forward).

    runner.py   ``plan_inspect`` and ``run_inspect`` (``hookcli inspect`` and
                ``hookcli.inspect``), ``tree_report``, the ``--columns`` extras

The rows themselves are ``hookcli.layers``, shared with grads and stats.
Importing this package does not import torch.
"""
