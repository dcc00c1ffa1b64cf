"""Sizes and counts as people write them: ``24GiB``, ``500MB``, ``4.1G`` (``--max-memory``,
``--max-flops``). Printed back by ``hookcli.render.fmt_bytes`` and ``fmt_count``.

Values are read exactly (as fractions, never as floats), then given as whole bytes or
FLOPs: a fraction of a unit (``4.1GiB``) becomes the whole number below it, which
gives every ``total > limit`` verdict the exact value would (totals are whole
numbers). A fraction of the base unit itself (``0.5B``, ``1.5``), a value above
zero but under one, or one beyond ``MAX_SIZE``/``MAX_COUNT`` is refused.

No torch import: option values are parsed before the model is built.
"""

from __future__ import annotations

import re
from fractions import Fraction

from hookcli.errors import UsageError

# Decimal SI units are powers of 1000, binary IEC units powers of 1024; a bare
# K/M/G/T is binary, as `free -h`, `ulimit` and Docker's `--memory` read it.
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "pb": 10**15,
    "eb": 10**18,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "pib": 2**50,
    "eib": 2**60,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
    "p": 2**50,
    "e": 2**60,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)(?:[eE]([+]?\d+))?\s*([a-zA-Z]*)\s*$")
_COUNT = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)(?:[eE]([+]?\d+))?\s*([a-zA-Z]?)$")

_COUNT_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15, "e": 10**18}

# The largest values taken: a size fits a signed 64-bit byte count (8 EiB, what
# torch's memory statistics hold); a count is at most 1e24 FLOPs (a million E,
# far above any one forward pass). Both print as floats without overflow.
MAX_SIZE = 2**63 - 1
_LONGEST = 100  # characters: longer texts are refused before any arithmetic
MAX_COUNT = 10**24


def _whole(
    digits: str, exponent: str | None, scale: int, text: str, option: str, kind: str, top: int
) -> int:
    """The exact value ``digits`` x 10**``exponent`` x ``scale`` as a whole number of ``kind``."""
    whole_part, _, fraction = digits.partition(".")
    significant = (whole_part + fraction).lstrip("0")
    if not significant:
        return 0
    power = int(exponent or 0) - len(fraction)
    # value >= 10**(len(significant) - 1 + power): past 10**40 it is over any limit, and
    # the exact value below is never computed for an exponent such as 1e99999999.
    if (
        len(significant) - 1 + power > 40
        or (value := Fraction(int(significant)) * Fraction(10) ** power * scale) > top
    ):
        raise UsageError(f"{option} {_shown(text)} is too large: at most {_top_text(kind, top)}")
    whole = int(value)  # toward zero: the whole number at or below it
    if whole != value and (scale == 1 or whole == 0):
        unit = "byte" if kind == "bytes" else "FLOP"
        raise UsageError(
            f"{option} {_shown(text)} is a fraction of a {unit} ({float(value):g} {kind}): "
            f"give a whole number of {kind}"
        )
    return whole


def _top_text(kind: str, top: int) -> str:
    return "8 EiB - 1 byte (2**63 - 1 bytes)" if kind == "bytes" else f"1e{len(str(top)) - 1} FLOPs"


def _shown(text: str) -> str:
    """The value as typed, quoted, cut short where it is long (one-line messages)."""
    return repr(text if len(text) <= 40 else text[:37] + "...")


def parse_size(text: str, option: str = "--max-memory") -> int:
    """``24GiB`` -> 25769803776 bytes: kB/MB/GB/TB/PB/EB are powers of 1000, KiB.. or
    K/M/G/T/P/E of 1024. ``option`` names the option in the errors (``--fit``...)."""
    m = _SIZE.match(text) if len(text) <= _LONGEST else None
    unit = m.group(3).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise UsageError(
            f"{option} {_shown(text)}: expected a size like 24GiB, 512MiB, 500MB or 1073741824 "
            "(units B, kB, MB, GB, TB, PB, EB powers of 1000; KiB, MiB, GiB, TiB, PiB, EiB "
            "or K, M, G, T, P, E powers of 1024)"
        )
    return _whole(m.group(1), m.group(2), _UNITS[unit], text, option, "bytes", MAX_SIZE)


def parse_count(text: str, option: str = "--max-flops") -> int:
    """``4.1G`` -> 4100000000; SI suffixes k, M, G, T, P, E (powers of 1000), or 1e9."""
    t = text.strip().removesuffix("FLOPs").removesuffix("flops").strip()
    m = _COUNT.match(t) if len(t) <= _LONGEST else None
    unit = m.group(3).lower() if m else ""
    if m is None or unit not in _COUNT_UNITS:
        raise UsageError(
            f"{option} {_shown(text)}: expected a count like 4.1G, 800M, 1.2T or 4.1e9 "
            "(suffixes k, M, G, T, P, E are powers of 1000)"
        )
    return _whole(m.group(1), m.group(2), _COUNT_UNITS[unit], text, option, "FLOPs", MAX_COUNT)
