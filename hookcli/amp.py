"""``--amp bf16|fp16``: the model's forward runs under ``torch.autocast``, as it trains.

The CLI takes ``--amp`` on every command that runs the model (``cli.command`` adds it
next to ``--dtype``) and holds the choice for the command (``requested``).
``pipeline.prepare`` checks it against the run's device, before the model is built
(``check``), and then turns it on for the run (``activate``, recorded in
``settings.amp``); every forward the model runs is under ``autocast()``: the session's
(``HookSession.forward``) and profile's timed passes. Backward and hookcli's own
reductions of the output (the loss) run outside it, as torch's autocast recipe has
them. Parameters stay in their dtype: autocast casts per op (a matmul's operands to
the autocast dtype, softmax and norms kept in float32), so what cost counts (outputs,
saved tensors, the live peak) is what autocast really makes.

torch.autocast has no meta device: on meta, ``cost`` (inside ``meta_allowed()``)
emulates it with the CUDA policy (``META_POLICY``; ``hookcli.memory.autocast``), the
casts a CUDA GPU would make, which is what a memory plan on meta is for. Elsewhere
``--amp`` on meta is refused.

No torch import at module level: the ``--help`` path reads ``CHOICES``.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

# --amp VALUE -> the torch dtype's name
CHOICES = {"bf16": "bfloat16", "fp16": "float16"}

# whose autocast policy (op lists) --amp follows on meta
META_POLICY = "cuda"

_requested: str | None = None  # the CLI's --amp, for the command under way
_active: tuple[str, Any] | None = None  # (device type, torch dtype) while a run uses it
_meta_allowed = False  # the command emulates autocast on meta (cost)


@contextlib.contextmanager
def meta_allowed() -> Iterator[None]:
    """``--amp`` on meta, emulated with ``META_POLICY``, for the run inside (cost)."""
    global _meta_allowed
    before, _meta_allowed = _meta_allowed, True
    try:
        yield
    finally:
        _meta_allowed = before


@contextlib.contextmanager
def requested(value: str | None) -> Iterator[None]:
    """Hold ``--amp`` for one command (the CLI); off again after it, whatever happened."""
    global _requested, _active
    _requested, _active = value, None
    try:
        yield
    finally:
        _requested, _active = None, None


def current() -> str | None:
    """The ``--amp`` the command was given (None: no autocast)."""
    return _requested


def check(value: str | None, device: Any) -> str | None:
    """``value`` checked for ``device`` (a ``torch.device``): UsageError (exit 2) where
    autocast cannot run it, naming why; the value, or None."""
    if value is None:
        return None
    from hookcli.errors import UsageError

    if value not in CHOICES:
        raise UsageError(f"--amp must be one of {', '.join(CHOICES)}, got {value!r}")
    import torch

    kind = device.type
    if kind == "meta":
        if _meta_allowed:
            return value  # emulated (hookcli.memory.autocast)
        raise UsageError(
            "--amp: torch.autocast has no meta device (it casts per device: cpu, cuda, "
            "mps, xpu); cost emulates it there, other commands need --device cpu (or a "
            "cast model: --dtype)"
        )
    available = getattr(torch.amp.autocast_mode, "is_autocast_available", None)
    if available is not None and not available(kind):
        raise UsageError(f"--amp: torch {torch.__version__} has no autocast for {kind}")
    dtype = getattr(torch, CHOICES[value])
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.autocast(kind, dtype=dtype):
                pass
    except (RuntimeError, ValueError) as err:
        from hookcli.errors import first_line

        raise UsageError(f"--amp {value} on {kind}: {first_line(err)}") from None
    for w in caught:
        text = str(w.message)
        if "disabling autocast" in text.lower():
            first = text.splitlines()[-1] if "\n" in text else text
            raise UsageError(
                f"--amp {value}: torch {torch.__version__} cannot autocast {kind} to "
                f"{CHOICES[value]} ({first.strip()})"
            )
    return value


def activate(value: str | None, device: Any) -> str | None:
    """Turn autocast on for the run's forwards (``pipeline.prepare``, after ``check``)."""
    global _active
    if value is None:
        _active = None
        return None
    import torch

    _active = (device.type, getattr(torch, CHOICES[value]))
    return value


def autocast() -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` for a forward of the run (on meta, its emulation), or nothing
    without ``--amp``."""
    if _active is None:
        return contextlib.nullcontext()
    if _active[0] == "meta":
        from hookcli.memory.autocast import emulated

        return emulated(META_POLICY, _active[1])
    import torch

    return torch.autocast(_active[0], dtype=_active[1])


def recompute() -> contextlib.AbstractContextManager[Any]:
    """What a checkpointed forward's recomputation in backward runs in: the emulation on
    meta (torch.utils.checkpoint re-enters a real autocast by itself, not that one)."""
    if _active is not None and _active[0] == "meta":
        return autocast()
    return contextlib.nullcontext()


def emulated_policy() -> str | None:
    """The device whose autocast policy the run emulates (on meta), else None."""
    return META_POLICY if _active is not None and _active[0] == "meta" else None
