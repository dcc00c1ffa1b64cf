"""Probes: the hooks of one kind plus the columns they fill (see ``hookcli.session.Probe``).

One file per probe. ``for_kinds`` maps the ``--hooks`` kinds of a command to
probe instances; forward-pre and forward shapes are kept by the session itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from hookcli.options import HookKind

if TYPE_CHECKING:
    from hookcli.session import Probe


def backward_probes(kinds: Sequence[HookKind]) -> list[Probe]:
    """The gradient probes for the backward kinds among ``kinds`` (may be empty)."""
    wanted = [k for k in kinds if k.is_backward]
    if not wanted:
        return []
    from hookcli.probes.grads import GradProbe

    return [GradProbe(frozenset(wanted))]
