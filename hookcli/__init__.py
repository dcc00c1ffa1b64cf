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

import importlib as _importlib
import sys as _sys
import types as _types
from typing import TYPE_CHECKING
from typing import Any as _Any

# The API's names and the modules they come from. They load on first use, so that
# ``import hookcli`` (every start of the CLI, the guarding parent, ``hookcli watch``
# before COMMAND starts) costs the package and nothing else.
_API = {
    "compare": "hookcli.api",
    "cost": "hookcli.api",
    "diff": "hookcli.api",
    "grads": "hookcli.api",
    "inspect": "hookcli.api",
    "profile": "hookcli.api",
    "stats": "hookcli.api",
    "Report": "hookcli.report",
    "watch": "hookcli.watch.session",
}

if TYPE_CHECKING:
    from hookcli.api import compare, cost, diff, grads, inspect, profile, stats
    from hookcli.report import Report
    from hookcli.watch.session import watch

del TYPE_CHECKING


def __getattr__(name: str) -> _Any:
    if name in _API:
        value = getattr(_importlib.import_module(_API[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'hookcli' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))


class _Package(_types.ModuleType):
    """The package's module type. Importing ``hookcli.X`` binds module X as an
    attribute of the package, which this type sees:

    - several API names are also the names of subpackages and modules (``hookcli.cost``,
      ``hookcli.diff``, ``hookcli.watch``, ...): that binding is left out, so
      ``hookcli.cost`` stays the function (the module is in ``sys.modules``);
    - once ``hookcli.report`` is in, ``hookcli.render`` is loaded, which hands
      ``Report.render`` its renderer (report cannot import render: render imports it).
    """

    def __setattr__(self, name: str, value: _Any) -> None:
        if name in _API and isinstance(value, _types.ModuleType):
            return
        super().__setattr__(name, value)
        if name == "report" and isinstance(value, _types.ModuleType):
            import hookcli.render  # noqa: F401


_sys.modules[__name__].__class__ = _Package

__all__ = [
    "Report",
    "__version__",
    "compare",
    "cost",
    "diff",
    "grads",
    "inspect",
    "profile",
    "stats",
    "watch",
]
