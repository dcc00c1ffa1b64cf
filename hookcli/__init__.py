"""hookcli: a command-line inspector for PyTorch models, built on PyTorch's hooks.

The Python API mirrors the commands on a live model (``hookcli.api``)::

    import hookcli

    report = hookcli.grads(model, x, fail_on="unused")
    assert report.passed

    with hookcli.watch(model, optimizer) as w:   # a training loop, watched
        train()
    print(w.report().render())

The CLI is ``hookcli.cli.app``; errors are ``hookcli.errors``; report records
are ``hookcli.report``. Importing hookcli does not import torch.
"""

__version__ = "0.1.0"

# The module hookcli.diff and the packages named like the API functions are loaded
# first, so that the names below are the API functions: a later `import hookcli.cost.runner`
# finds the package in sys.modules and does not rebind the attribute.
from hookcli import cost as _cost_package  # noqa: F401
from hookcli import diff as _diff_module  # noqa: F401
from hookcli import grads as _grads_package  # noqa: F401
from hookcli import inspect as _inspect_package  # noqa: F401
from hookcli import profile as _profile_package  # noqa: F401
from hookcli import render as _render_module  # noqa: F401  (hands Report.render its renderer)
from hookcli import stats as _stats_package  # noqa: F401
from hookcli import watch as _watch_package  # noqa: F401
from hookcli.api import cost, diff, grads, inspect, profile, stats
from hookcli.report import Report
from hookcli.watch.session import watch

__all__ = [
    "Report",
    "__version__",
    "cost",
    "diff",
    "grads",
    "inspect",
    "profile",
    "stats",
    "watch",
]
