"""hookcli: a command-line inspector for PyTorch models, built on PyTorch's hooks.

The Python API mirrors the commands on a live model (``hookcli.api``)::

    import hookcli

    report = hookcli.grads(model, x, fail_on="unused")
    assert report.passed

The CLI is ``hookcli.cli.app``; errors are ``hookcli.errors``; report records
are ``hookcli.report``. Importing hookcli does not import torch.
"""

__version__ = "0.1.0"

# The submodule hookcli.diff is loaded first, so that the name below is the API
# function: a later `import hookcli.diff` finds the module in sys.modules and
# does not rebind the attribute (`from hookcli.diff import ...` works as usual).
from hookcli import diff as _diff_module  # noqa: F401
from hookcli.api import cost, diff, grads, inspect, stats
from hookcli.report import Report

__all__ = ["Report", "__version__", "cost", "diff", "grads", "inspect", "stats"]
