"""One name matcher for every option that picks modules, parameters or models by pattern.

    features/ablate --layer   name_matches(name, p)                       a name or a glob
    params --frozen           name_matches(name, p, subtree=True)         ... or everything under it
    trace --filter            name_matches(name, p, subtree=True, type_name=cls)  ... or a class
    models --filter           name_matches(name, p, fold_case=True)       a glob, any case

A glob (``*``, ``?``, ``[...]``) is matched against the whole name with
``fnmatch.fnmatchcase``, so ``*`` also crosses dots (``layer1.*`` is every module
under ``layer1``). ``""`` and ``(root)`` name the root module. torch is not
imported here: ``select_modules`` only walks ``named_modules()``.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Sequence
from typing import TYPE_CHECKING

from hookcli.errors import UsageError

if TYPE_CHECKING:
    from torch import nn

ROOT_ALIASES = ("", "(root)")
GLOB_CHARS = "*?["


def is_glob(pattern: str) -> bool:
    """Does ``pattern`` hold a glob character?"""
    return any(c in pattern for c in GLOB_CHARS)


def name_matches(
    name: str,
    pattern: str,
    *,
    subtree: bool = False,
    type_name: str | None = None,
    fold_case: bool = False,
) -> bool:
    """Does ``name`` match ``pattern``?

    ``subtree``: a plain name also matches the names under it (``layer1`` matches
    ``layer1.0.conv1``; a trailing dot is ignored). ``type_name``: the pattern may
    also be matched against the class name (a glob, or the whole class name).
    ``fold_case``: compare without regard to case.
    """
    if fold_case:
        name, pattern = name.lower(), pattern.lower()
    if pattern in ROOT_ALIASES:
        return name == ""
    if is_glob(pattern):
        return fnmatch.fnmatchcase(name, pattern) or (
            type_name is not None and fnmatch.fnmatchcase(type_name, pattern)
        )
    if name == pattern or (type_name is not None and type_name == pattern):
        return True
    return subtree and name.startswith(pattern.rstrip(".") + ".")


def select_modules(
    model: nn.Module, patterns: Sequence[str], option: str = "--layer"
) -> list[tuple[str, nn.Module]]:
    """The ``(name, module)`` pairs any pattern matches, in ``named_modules()`` order.

    A pattern is a qualified name (``layer4``; ``""`` or ``(root)`` for the root)
    or a glob (``layer3.*.conv2``); a plain name selects that module alone, not
    its children. A pattern that matches nothing is exit 2, naming the closest
    module names.
    """
    named = list(model.named_modules())
    names = [n for n, _ in named]
    for pattern in patterns:
        if not any(name_matches(n, pattern) for n in names):
            raise UsageError(f"{option} {pattern!r} matches no module; {suggest(pattern, names)}")
    return [(n, m) for n, m in named if any(name_matches(n, p) for p in patterns)]


def suggest(pattern: str, names: Sequence[str]) -> str:
    """Close names for a pattern that matched nothing, else a sample of the names."""
    real = [n for n in names if n]
    stripped = pattern.replace("*", "").replace("?", "").strip(".")
    close = difflib.get_close_matches(pattern, real, n=6, cutoff=0.5)
    close += [n for n in real if stripped and stripped in n and n not in close]
    close = close[:6]
    if close:
        return "close names: " + ", ".join(close)
    shown = ", ".join(real[:8]) + (", ..." if len(real) > 8 else "")
    return f"module names look like: {shown} (hookcli inspect MODEL lists them all)"
