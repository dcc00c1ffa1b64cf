"""Sizes and counts as people write them: ``24GiB``, ``500MB``, ``4.1G`` (``--max-memory``,
``--max-flops``). Printed back by ``hookcli.render.fmt_bytes`` and ``fmt_count``.

No torch import: option values are parsed before the model is built.
"""

from __future__ import annotations

import re

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
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "pib": 2**50,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
    "p": 2**50,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)(?:[eE](\d+))?\s*([a-zA-Z]*)\s*$")

_COUNT_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15, "e": 10**18}


def parse_size(text: str, option: str = "--max-memory") -> int:
    """``24GiB`` -> 25769803776 bytes: kB/MB/GB/TB are powers of 1000, KiB.. or K/M/G/T of 1024."""
    m = _SIZE.match(text)
    unit = m.group(3).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise UsageError(
            f"{option} {text!r}: expected a size like 24GiB, 512MiB, 500MB or 1073741824 "
            "(units B, kB, MB, GB, TB powers of 1000; KiB, MiB, GiB, TiB or K, M, G, T "
            "powers of 1024)"
        )
    value = float(m.group(1)) * (10 ** int(m.group(2)) if m.group(2) else 1)
    return round(value * _UNITS[unit])


def parse_count(text: str, option: str = "--max-flops") -> int:
    """``4.1G`` -> 4100000000; SI suffixes k, M, G, T, P, E (powers of 1000), or 1e9."""
    t = text.strip().removesuffix("FLOPs").removesuffix("flops").strip()
    m = re.match(r"^(\d+(?:\.\d*)?|\.\d+)(?:[eE]([+]?\d+))?\s*([a-zA-Z]?)$", t)
    unit = m.group(3).lower() if m else ""
    if m is None or unit not in _COUNT_UNITS:
        raise UsageError(
            f"{option} {text!r}: expected a count like 4.1G, 800M, 1.2T or 4.1e9 "
            "(suffixes k, M, G, T, P, E are powers of 1000)"
        )
    value = float(m.group(1)) * (10 ** int(m.group(2)) if m.group(2) else 1)
    return round(value * _COUNT_UNITS[unit])
