"""The buffers probe: every buffer's summary before the run and after it.

``attach`` (the session has saved the model's state and set the mode, no
forward has run) copies every buffer and summarises it; ``finish`` (after the
last step, before the session restores the buffers) summarises them again and
compares. All statistics of one side are stacked on the device and read back
in one transfer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from hookcli.options import Mode
from hookcli.session import Probe

if TYPE_CHECKING:
    from typing import Unpack

    from torch import nn

    from hookcli.commandargs import RunArgs
    from hookcli.pipeline import Prepared, RunOutcome
    from hookcli.report import Report
    from hookcli.session import HookSession

STATS = ("mean", "std", "min", "max")


@dataclass(frozen=True)
class BufferInfo:
    """One buffer as the report lists it.

    ``before``/``after`` are ``{mean, std, min, max}`` (std is the population
    std, 0 for one element) or None for an empty or non-numeric buffer, or one
    absent on that side (created or dropped during the run). ``changed`` is None
    where values cannot be compared (meta device).
    """

    name: str
    module: str
    module_type: str
    shape: tuple[int, ...]
    dtype: str
    persistent: bool
    before: Mapping[str, float] | None
    after: Mapping[str, float] | None
    changed: bool | None


def _numeric(t: torch.Tensor) -> bool:
    return (
        t.numel() > 0
        and not t.is_meta
        and not t.is_complex()
        and t.dtype != torch.bool
        and not t.is_quantized
    )


def _stat_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float32 if t.device.type == "mps" else torch.float64


def summaries(tensors: Mapping[str, torch.Tensor]) -> dict[str, dict[str, float] | None]:
    """``{name: {mean, std, min, max}}`` for every numeric buffer; one device-to-host copy."""
    out: dict[str, dict[str, float] | None] = dict.fromkeys(tensors)
    names = [n for n, t in tensors.items() if _numeric(t)]
    if not names:
        return out
    rows = []
    with torch.no_grad():
        for n in names:
            t = tensors[n].detach()
            x = t.to(_stat_dtype(t)).reshape(-1)
            rows.append(torch.stack([x.mean(), x.std(correction=0), x.min(), x.max()]))
        values = _gather(rows).tolist()
    for n, vals in zip(names, values, strict=True):
        out[n] = dict(zip(STATS, vals, strict=True))
    return out


def _gather(values: list[torch.Tensor]) -> torch.Tensor:
    """Stack small device tensors on the first one's device: one copy back, not one each."""
    device = values[0].device
    return torch.stack([v.to(device) for v in values])


def _owner(name: str) -> str:
    return name.rpartition(".")[0]


class BufferProbe(Probe):
    """Buffers before and after the run."""

    def __init__(self) -> None:
        self._before: dict[str, torch.Tensor] = {}
        self._before_stats: dict[str, dict[str, float] | None] = {}
        self.buffers: tuple[BufferInfo, ...] = ()

    def attach(self, session: HookSession) -> None:
        with torch.no_grad():
            self._before = {n: b.detach().clone() for n, b in session.model.named_buffers()}
        self._before_stats = summaries(self._before)

    def finish(self, session: HookSession) -> None:
        model = session.model
        modules = dict(model.named_modules())
        now = dict(model.named_buffers())
        after_stats = summaries(now)
        names = list(self._before) + [n for n in now if n not in self._before]
        changed = _changed(self._before, now)
        infos = []
        for n in names:
            tensor = now.get(n, self._before.get(n))
            assert tensor is not None
            owner = _owner(n)
            module = modules.get(owner)
            infos.append(
                BufferInfo(
                    name=n,
                    module=owner,
                    module_type=type(module).__name__ if module is not None else "?",
                    shape=tuple(tensor.shape),
                    dtype=str(tensor.dtype).removeprefix("torch."),
                    persistent=_persistent(module, n.rpartition(".")[2]),
                    before=self._before_stats.get(n),
                    after=after_stats.get(n),
                    changed=changed.get(n),
                )
            )
        self.buffers = tuple(infos)
        self._before = {}


def _persistent(module: nn.Module | None, leaf: str) -> bool:
    return module is not None and leaf not in module._non_persistent_buffers_set


def _changed(
    before: Mapping[str, torch.Tensor], after: Mapping[str, torch.Tensor]
) -> dict[str, bool | None]:
    """name -> does any element differ (NaN equals NaN); computed on device, read once."""
    out: dict[str, bool | None] = {}
    flags = []
    names = []
    with torch.no_grad():
        for n in set(before) | set(after):
            a, b = before.get(n), after.get(n)
            if a is None or b is None or a.shape != b.shape or a.dtype != b.dtype:
                out[n] = True
            elif a.is_meta or b.is_meta:
                out[n] = None
            elif a.numel() == 0:
                out[n] = False
            else:
                b = b.detach().to(a.device)
                diff = a != b
                if a.is_floating_point() or a.is_complex():
                    diff &= ~(a.isnan() & b.isnan())
                flags.append(diff.any())
                names.append(n)
    if names:
        for n, flag in zip(names, _gather(flags).tolist(), strict=True):
            out[n] = bool(flag)
    return out


def _fmt_change(
    before: Mapping[str, float] | None, after: Mapping[str, float] | None, key: str
) -> str:
    """'0.1 -> 0.2', or one value when it did not change; '-' without values."""
    from hookcli.render import fmt_float

    a = None if before is None else before[key]
    b = None if after is None else after[key]
    if a is None and b is None:
        return "-"
    if a == b:
        return fmt_float(a)
    return f"{fmt_float(a)} -> {fmt_float(b)}"


def _fmt_range(stats: Mapping[str, float] | None) -> str:
    from hookcli.render import fmt_float

    if stats is None:
        return "-"
    return f"[{fmt_float(stats['min'])}, {fmt_float(stats['max'])}]"


def buffers_report(
    prepared: Prepared, probe: BufferProbe, outcome: RunOutcome, *, steps: int, depth: int | None
) -> Report:
    """The buffer rows (owners at depth <= ``depth``), totals and table layout."""
    from hookcli.modelinfo import depth_of
    from hookcli.render import fmt_bool, fmt_int, fmt_shape
    from hookcli.report import Column, Row

    rows = []
    for b in probe.buffers:
        if depth is not None and depth_of(b.module) > depth:
            continue
        data = {
            "name": b.name,
            "module": b.module,
            "shape": list(b.shape),
            "dtype": b.dtype,
            "persistent": b.persistent,
            "before": None if b.before is None else dict(b.before),
            "after": None if b.after is None else dict(b.after),
            "changed": b.changed,
        }
        display = {
            "owner": b.module_type,
            "mean": _fmt_change(b.before, b.after, "mean"),
            "std": _fmt_change(b.before, b.after, "std"),
            "range": _fmt_range(b.after if b.after is not None else b.before),
        }
        rows.append(Row.of(data, display))

    seen: set[int] = set()
    elements = nbytes = 0
    for buf in prepared.model.buffers():
        if id(buf) not in seen:
            seen.add(id(buf))
            elements += buf.numel()
            nbytes += buf.numel() * buf.element_size()
    infos = probe.buffers
    changed = [b.name for b in infos if b.changed]
    unknown = sum(1 for b in infos if b.changed is None)
    totals = {
        "buffers": len(infos),
        "persistent": sum(1 for b in infos if b.persistent),
        "non_persistent": sum(1 for b in infos if not b.persistent),
        "changed": len(changed),
        "elements": elements,
        "bytes": nbytes,
        "steps": steps,
    }
    mode = prepared.settings["mode"]
    runs = f"{steps} forward pass{'es' if steps != 1 else ''} in {mode} mode"
    kinds = (
        f"{totals['non_persistent']} non-persistent, not saved in state_dict"
        if totals["non_persistent"]
        else "all persistent"
    )
    count = f"{len(infos)} ({kinds})" if infos else "0"
    table_totals = [
        ("Buffers", count),
        (
            "Changed",
            f"{len(changed)} of {len(infos)} after {runs}"
            + (f" ({unknown} unknown: no values on the meta device)" if unknown else ""),
        ),
        ("Size", f"{fmt_int(elements)} elements, {fmt_int(nbytes)} bytes"),
    ]
    return prepared.report(
        "buffers",
        {**prepared.settings, "steps": steps},
        totals=totals,
        lists={"buffers": tuple(rows)},
        primary="buffers",
        error=outcome.error.message if outcome.error else None,
        columns=(
            Column("name", "Buffer"),
            Column("owner", "Owner"),
            Column("shape", "Shape", fmt_shape),
            Column("dtype", "Dtype"),
            Column("persistent", "Persistent", fmt_bool),
            Column("mean", "Mean (before -> after)"),
            Column("std", "Std"),
            Column("range", "Range after"),
            Column("changed", "Changed", fmt_bool),
        ),
        table_totals=tuple(table_totals),
    )


def cli_command(
    *,
    steps: int,
    depth: int | None,
    **common: Unpack[RunArgs],
) -> int:
    """The buffers command's run (``hookcli buffers``): build, run N steps, emit."""
    from hookcli.commandargs import command_options
    from hookcli.pipeline import emit_outcome, prepare, run_session

    mopts, ropts, out = command_options(common, Mode.TRAIN, depth)

    prepared = prepare(mopts, ropts)
    probe = BufferProbe()
    outcome = run_session(prepared, [probe], mode=ropts.mode, steps=steps)
    report = buffers_report(prepared, probe, outcome, steps=steps, depth=out.depth)
    return emit_outcome(report, outcome.error, out)
