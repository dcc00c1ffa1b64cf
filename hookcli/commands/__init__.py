"""The commands: one module each, exposing ``NAME`` and ``command(**options) -> int``.

Each module declares the command's own options and names all of its options, shared
groups included (``hookcli.cliopts.forwards``); what Typer parsed goes by name to its
capability (``hookcli.grads.command``, ``hookcli.cost.command``, ``hookcli.ablate.runner``,
...), where the work is done. Modules are discovered here so that adding a command is
adding a file; none imports torch at import time (the ``--help`` path).
"""

import importlib
import pkgutil
from collections.abc import Callable

# The order commands are listed in --help; any other module comes after, by name.
_ORDER = (
    "inspect",
    "grads",
    "buffers",
    "params",
    "registrations",
    "trace",
    "stats",
    "features",
    "cost",
    "profile",
    "ablate",
    "compare",
    "watch",
    "diff",
    "models",
)


def _discover() -> list[tuple[str, Callable[..., int]]]:
    found = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(mod, "NAME") and hasattr(mod, "command"):
            found[mod.NAME] = mod.command
    rank = {name: i for i, name in enumerate(_ORDER)}
    return [(n, found[n]) for n in sorted(found, key=lambda n: (rank.get(n, len(rank)), n))]


COMMANDS = _discover()
