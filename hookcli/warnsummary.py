"""PyTorch's warnings during a run, summed up in one line on stderr (all of them with --debug).

A model run under hooks makes torch warn about things the user did not write
(a full backward hook firing on a module whose inputs need no grad, a
deprecated call inside a library). Each would print two lines of source
location; the report is what matters, so they become one note. ``--debug``
shows them as Python would.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator

_MAX_TEXT = 160


def summary_line(caught: list[warnings.WarningMessage]) -> str | None:
    """'hookcli: note: PyTorch warned 3 times (2 kinds) ...', or None when nothing warned."""
    if not caught:
        return None
    kinds: dict[tuple[str, str], int] = {}
    for w in caught:
        text = " ".join(str(w.message).split())
        key = (w.category.__name__, text)
        kinds[key] = kinds.get(key, 0) + 1
    (category, text), count = next(iter(kinds.items()))
    if len(text) > _MAX_TEXT:
        text = text[: _MAX_TEXT - 3] + "..."
    times = f"{len(caught)} time{'s' if len(caught) != 1 else ''}"
    first = f"{category}: {text}" + (f" (x{count})" if count > 1 else "")
    others = f" and {len(kinds) - 1} other warning(s)" if len(kinds) > 1 else ""
    return f"hookcli: note: warned {times} during the run: {first}{others}; --debug shows them all"


class Warned:
    """What ``summarised_warnings`` yields: set ``keep = False`` to drop the summary."""

    def __init__(self) -> None:
        self.keep = True


@contextlib.contextmanager
def summarised_warnings(debug: bool) -> Iterator[Warned]:
    """Collect the warnings raised inside; at the end, one line on stderr for them all.

    When the block raises, or sets ``keep = False`` (the run failed), the error line
    is what the user reads: the warnings are dropped (``--debug`` prints them). The
    warning filters in force are kept, so a warning Python would not show is not
    counted either.
    """
    warned = Warned()
    if debug:
        yield warned
        return
    with warnings.catch_warnings(record=True) as caught:
        yield warned
    line = summary_line(caught)
    if line is not None and warned.keep:
        print(line, file=sys.stderr, flush=True)
