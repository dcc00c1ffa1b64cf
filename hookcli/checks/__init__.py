"""CI gates: pure functions from a command's findings to ``CheckResult``s.

One module per family of checks (``grads``, ``stats``); this package holds the
pieces they share. Any failed check makes the exit status 1 (``pipeline.emit``).
"""

from __future__ import annotations

from collections.abc import Iterable

from hookcli.report import CheckResult


def make_check(name: str, failing: Iterable[str], ok: str, bad: str) -> CheckResult:
    """A check that fails when ``failing`` (layer names) is not empty.

    ``bad`` may use ``{n}`` for the number of failing layers.
    """
    layers = tuple(dict.fromkeys(failing))  # unique, in order
    if layers:
        return CheckResult(name, False, bad.format(n=len(layers)), layers)
    return CheckResult(name, True, ok, ())


def layer_label(name: str, call: int = 0) -> str:
    """``layer1.0.conv1``, ``(root)`` for the root, ``#N`` for a repeated call."""
    label = name or "(root)"
    return f"{label}#{call}" if call else label
