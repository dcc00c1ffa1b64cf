"""Value formatters shared by the text renderers and the html page (no torch, no report).

``hookcli.render`` re-exports them; the html page imports them from here, since
``render`` itself imports the page for ``--format html``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def fmt_int(value: Any) -> str:
    """12,345 (thousands separators); '-' for None."""
    if value is None:
        return "-"
    return f"{int(value):,}"


def fmt_float(value: Any, digits: int = 4) -> str:
    """A short float: 1.234e-05, 0.1235, nan, inf; '-' for None."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    v = float(value)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == 0:
        return "0"
    if 1e-3 <= abs(v) < 1e5:
        return f"{v:.{digits}g}"
    return f"{v:.{max(digits - 1, 1)}e}"


def fmt_pct(value: Any, *, scale: float = 100.0, sign: str = "%") -> str:
    """A share in percent, one decimal: 0.5 -> '50.0%'; '-' for None; nan, inf and
    -inf as they are, without the sign.

    ``scale=1``: the value is a percentage already; ``sign=""``: the column's header
    carries the ``%`` (``profile``'s "Self %")."""
    if value is None:
        return "-"
    v = float(value)
    if not math.isfinite(v):
        return str(v)
    return f"{scale * v:.1f}{sign}"


def fmt_shape(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def fmt_shapes(shapes: Any, limit: int = 3) -> str:
    """'[1, 64, 56, 56]', or several joined; long lists are cut with '(+N)'."""
    if not shapes:
        return "-"
    shown = [fmt_shape(s) for s in shapes[:limit]]
    more = f" (+{len(shapes) - limit})" if len(shapes) > limit else ""
    return ", ".join(shown) + more


def fmt_bool(value: Any) -> str:
    if value is None:
        return "-"
    return "yes" if value else "no"


def fmt_text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) if value else "-"
    return str(value)


def fmt_bytes(n: Any, binary: bool) -> str:
    """Bytes with two decimals; '-' for None.

    ``binary``: 512 B, 12.50 KiB, 97.49 MiB, 1.50 GiB, 2.00 TiB (cost, profile, --fsdp);
    else decimal: kB below a megabyte, MB above (inspect's parameter sizes, features).
    """
    if n is None:
        return "-"
    n = int(n)
    if not binary:
        return f"{n / 1e3:,.2f} kB" if n < 1_000_000 else f"{n / 1e6:,.2f} MB"
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n} B"


def fmt_count(n: Any) -> str:
    """A count with an SI suffix: 950, 12.3 k, 4.09 G, 1.40 T; '-' for None."""
    if n is None:
        return "-"
    n = int(n)
    for unit, scale in (
        ("E", 10**18),
        ("P", 10**15),
        ("T", 10**12),
        ("G", 10**9),
        ("M", 10**6),
        ("k", 10**3),
    ):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return str(n)


def fmt_norm_type(kind: Any) -> str:
    """A clipping call's ``norm_type`` as its label: ``inf``, ``1``, ``3.5`` (the steps
    file holds infinities as strings, other values as numbers)."""
    return kind if isinstance(kind, str) else format(kind, "g")


def fmt_number(value: float | int) -> str:
    """12,345 for integers; four significant digits (1.235e-05, 0.1235) for floats; yes/no
    for booleans (the html page's header and totals cells, its charts' titles)."""
    if isinstance(value, bool):
        return fmt_bool(value)
    if isinstance(value, int):
        return f"{value:,}"
    return fmt_float(value)


def number(value: Any) -> float | None:
    """A figure as a report or steps file holds it, as a float: numbers as they are,
    "nan"/"inf"/"-inf" as such, None for anything else (null and booleans included)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if value in ("nan", "inf", "-inf"):
        return float(value)
    return None
