"""The shared cell formatters of hookcli/render.py, against literal strings."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from hookcli.render import fmt_pct


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "-"),
        (0, "0.0%"),
        (0.0, "0.0%"),
        (1, "100.0%"),
        (0.5, "50.0%"),
        (0.47712, "47.7%"),
        (1e-9, "0.0%"),  # tiny: rounds to zero, keeps the sign it had
        (-1e-9, "-0.0%"),
        (0.0006, "0.1%"),
        (-0.25, "-25.0%"),
        (12.345, "1234.5%"),
        (1e20, "10000000000000000000000.0%"),  # huge: written out, never 1e+22%
        (math.nan, "nan"),  # not finite: the word alone, without the sign
        (math.inf, "inf"),
        (-math.inf, "-inf"),
        (torch.tensor(0.125), "12.5%"),  # a 0-dim tensor, as probes may hand one over
    ],
)
def test_fmt_pct_of_a_fraction(value: Any, expected: str) -> None:
    assert fmt_pct(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "-"),
        (0, "0.0"),
        (100, "100.0"),
        (12.345, "12.3"),
        (0.04, "0.0"),
        (-3.25, "-3.2"),  # 3.25 is exact in binary: round half to even
        (math.nan, "nan"),
        (-math.inf, "-inf"),
    ],
)
def test_fmt_pct_of_a_percentage_without_the_sign(value: Any, expected: str) -> None:
    """``profile``'s "Self %" and "% root": the rows hold percentages, the header says %."""
    assert fmt_pct(value, scale=1, sign="") == expected
