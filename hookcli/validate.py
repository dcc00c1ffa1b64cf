"""Option checks shared by the CLI (``cli.preflight``) and the Python API (``hookcli.api``).

Each raises ``UsageError`` naming the option and, for a choice, every allowed value,
so ``hookcli.cost(model, x, optimizer="lion")`` and ``hookcli cost --optimizer lion``
say the same thing. No torch import here.
"""

from __future__ import annotations

import enum
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from hookcli.errors import UsageError

SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.manual_seed takes

E = TypeVar("E", bound=enum.Enum)


def check_seed(seed: Any, option: str = "--seed") -> int | None:
    """A whole number torch.manual_seed takes (None: no seeding)."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise UsageError(f"{option} must be a whole number, got {seed!r}")
    if not SEED_MIN <= seed <= SEED_MAX:
        raise UsageError(
            f"{option} {seed} is out of range: a seed is a whole number from 0 to "
            f"{SEED_MAX} (2**64 - 1; negatives down to -2**63 are accepted as torch does)"
        )
    return seed


def check_depth(depth: Any, option: str = "depth") -> int | None:
    """None or a whole number >= 0."""
    if depth is None:
        return None
    if isinstance(depth, bool) or not isinstance(depth, int):
        raise UsageError(f"{option} must be a whole number >= 0, got {depth!r}")
    if depth < 0:
        raise UsageError(f"{option} must be >= 0, got {depth}")
    return depth


def check_count(value: Any, option: str, low: int = 0) -> int:
    """A whole number >= ``low`` (``warmup``, ``repeat``)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{option} must be a whole number >= {low}, got {value!r}")
    if value < low:
        raise UsageError(f"{option} must be >= {low}, got {value}")
    return value


def check_path(value: Any, option: str) -> str | os.PathLike[str] | None:
    """None, or a file path given as a string or a path object."""
    if value is None or isinstance(value, (str, os.PathLike)):
        return value
    raise UsageError(f"{option} must be a file path (a string or a Path), got {value!r}")


def check_strings(value: Any, option: str) -> str | list[str] | None:
    """None, a string, or a list of strings (a repeatable option: ``max_ms``)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        return list(value)
    raise UsageError(f"{option} must be a string or a list of strings, got {value!r}")


def check_flag(value: Any, option: str) -> bool:
    """True or False, nothing else (a string "no" is truthy)."""
    if not isinstance(value, bool):
        raise UsageError(f"{option} must be True or False, got {value!r}")
    return value


def check_number(value: Any, option: str, *, low: float | None = 0.0) -> float | None:
    """None or a finite real number (>= ``low`` when given)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):
        raise UsageError(f"{option} must be a finite number, got {value!r:.60}")
    if low is not None and value < low:
        raise UsageError(f"{option} must be >= {low:g}, got {value!r}")
    return value


def _finite(value: float) -> bool:
    """Finite as a float: an int too large for one (``10**400``) is not."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def choice(value: Any, kind: type[E], option: str) -> E:
    """An enum member from its value; anything else lists every choice."""
    if isinstance(value, kind):
        return value
    try:
        return kind(value)
    except (ValueError, TypeError):
        allowed = ", ".join(str(m.value) for m in kind)
        raise UsageError(f"{option} must be one of {allowed}; got {value!r}") from None


def check_mapping(value: Any, option: str) -> Mapping[str, Any] | None:
    """None or a mapping with string keys."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise UsageError(f"{option} must be a dict of keyword inputs, got {type(value).__name__}")
    return value


def check_size(value: Any, option: str, parse: Any, top: int | None = None) -> int | None:
    """None, a whole number from 0 to ``top``, or a text ``parse`` reads (``24GiB``, ``4.1G``)."""
    if value is None:
        return None
    if isinstance(value, str):
        return int(parse(value, option))
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UsageError(
            f"{option} must be a whole number >= 0 or a text such as '4G', got {value!r}"
        )
    if top is not None and value > top:
        raise UsageError(f"{option} is too large: at most {top} ({top:.3g})")
    return value


__all__ = [
    "SEED_MAX",
    "SEED_MIN",
    "check_count",
    "check_depth",
    "check_flag",
    "check_mapping",
    "check_number",
    "check_path",
    "check_seed",
    "check_size",
    "check_strings",
    "choice",
]


def comma_names(text: str | None, allowed: Sequence[str], what: str, flag: str) -> tuple[str, ...]:
    """``a,b,a`` -> ('a', 'b'): the names of a comma list, each once, in the order given;
    one not in ``allowed`` is ``unknown WHAT 'x' in FLAG; choose from ...`` (exit 2)."""
    names: list[str] = []
    for part in (p.strip() for p in (text or "").split(",")):
        if not part:
            continue
        if part not in allowed:
            raise UsageError(f"unknown {what} {part!r} in {flag}; choose from {','.join(allowed)}")
        if part not in names:
            names.append(part)
    return tuple(names)


def given_flags(*options: tuple[str, Any]) -> list[str]:
    """The flags of the options given (a true value), in the order named:
    ``given_flags(("--input", inputs), ("--input-file", None))`` -> ``["--input"]``."""
    return [flag for flag, value in options if value]
