"""The ``params`` report: every parameter (and packed quantized weight), tied names, totals.

No hooks: the model's ``named_parameters`` are read as they are, after ``--frozen``
sets ``requires_grad=False`` on the names it matches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hookcli.errors import UsageError
from hookcli.globs import name_matches
from hookcli.options import Mode

if TYPE_CHECKING:
    from typing import Unpack

    from torch import nn

    from hookcli.commandargs import BuildArgs
    from hookcli.pipeline import Prepared
    from hookcli.report import Report


def freeze(model: nn.Module, patterns: list[str]) -> list[str]:
    """requires_grad=False on every parameter a pattern matches (a glob, or a module name
    and everything under it); the names matched. A pattern matching nothing is exit 2:
    it is almost always a typo."""
    named = list(model.named_parameters(remove_duplicate=False))
    hit: list[str] = []
    for pattern in patterns:
        found = [n for n, _ in named if name_matches(n, pattern, subtree=True)]
        if not found:
            if not named:
                raise UsageError(f"--frozen {pattern!r}: the model has no parameters")
            sample = ", ".join(n for n, _ in named[:5])
            more = ", ..." if len(named) > 5 else ""
            raise UsageError(
                f"--frozen {pattern!r} matches no parameter (names look like: {sample}{more})"
            )
        hit.extend(n for n in found if n not in hit)
    for n, p in named:
        if n in hit:
            p.requires_grad_(False)
    return hit


def _trainable(t: Any, packed: bool) -> bool:
    """Packed weights are never trained: quantized ops carry no gradient."""
    return not packed and bool(t.requires_grad)


def _entries(model: nn.Module) -> list[tuple[str, Any, Any, bool]]:
    """``(name, tensor, identity, packed)`` for every parameter name and packed weight."""
    from hookcli.modelinfo import packed_tensors

    out: list[tuple[str, Any, Any, bool]] = [
        (n, p, id(p), False) for n, p in model.named_parameters(remove_duplicate=False)
    ]
    for owner, m in model.named_modules():
        for attr, t in packed_tensors(m):
            name = f"{owner}.{attr}" if owner else attr
            out.append((name, t, (id(m), attr), True))
    return out


def params_report(
    prepared: Prepared, depth: int | None, frozen: list[str], frozen_names: list[str]
) -> Report:
    """The rows (a shared tensor's Numel counted at its first name), totals and table layout."""
    from hookcli.modelinfo import depth_of, is_lazy, numel
    from hookcli.render import fmt_bool, fmt_int, fmt_shape
    from hookcli.report import Column, Row

    entries = _entries(prepared.model)
    any_packed = any(packed for *_, packed in entries)
    names_of: dict[Any, list[str]] = {}
    for n, _, key, _ in entries:
        names_of.setdefault(key, []).append(n)

    rows = []
    first_seen: set[Any] = set()
    hidden = hidden_numel = 0
    lazy_names: list[str] = []
    for n, t, key, packed in entries:
        counted = key not in first_seen
        first_seen.add(key)
        lazy = is_lazy(t)
        if lazy:
            lazy_names.append(n)
        owner = n.rpartition(".")[0]
        if depth is not None and depth_of(owner) > depth:
            hidden += 1
            hidden_numel += numel(t) if counted else 0
            continue
        data = {
            "name": n,
            "shape": None if lazy else list(t.shape),
            "dtype": str(t.dtype).removeprefix("torch."),
            "device": str(t.device),
            "requires_grad": _trainable(t, packed),
            "numel": numel(t),
            "shared_with": [o for o in names_of[key] if o != n],
        }
        if any_packed:
            data["packed"] = packed
        if lazy:
            data["uninitialized"] = True
        # The table's Numel column counts a shared tensor at its first name only,
        # so the column sums to the total.
        display: dict[str, Any] = {"counted": numel(t) if counted else None}
        if not counted:
            display["mark"] = "(tied)"
        elif packed:
            display["mark"] = "(packed)"
        elif lazy:
            display["mark"] = "(uninitialized)"
        rows.append(Row.of(data, display))

    by_key = {key: (t, _trainable(t, packed)) for _, t, key, packed in entries}
    unique = [t for t, _ in by_key.values()]
    packed_numel = sum(t.numel() for _, t, _, packed in entries if packed)
    total = sum(numel(t) for t in unique)
    trainable = sum(numel(t) for t, grad in by_key.values() if grad)
    groups = [ns for ns in names_of.values() if len(ns) > 1]
    totals: dict[str, Any] = {
        "params": total,
        "trainable_params": trainable,
        "frozen_params": total - trainable,
        "tensors": len(unique),
        "names": len(entries),
        "trainable_tensors": sum(1 for _, grad in by_key.values() if grad),
        "param_bytes": sum(numel(t) * t.dtype.itemsize for t in unique),
        "shared_groups": [list(g) for g in groups],
        "frozen_by_option": frozen_names,
    }
    if any_packed:
        totals["packed_params"] = packed_numel
    if lazy_names:
        totals["uninitialized_params"] = lazy_names
    pruned = pruned_counts(prepared.model)
    if pruned is not None:
        totals.update(pruned)
    settings = {k: v for k, v in prepared.settings.items() if k != "mode"}
    notes = []
    if frozen:
        settings["frozen"] = list(frozen)
        notes.append(
            f"--frozen {' '.join(frozen)}: requires_grad=False set on "
            f"{len(frozen_names)} parameter name(s)"
        )

    if lazy_names:
        notes.append(
            f"{len(lazy_names)} parameter(s) of lazy modules (nn.LazyLinear, ...) are not "
            "initialized yet: counted as 0 until a forward sets their shapes "
            "(hookcli inspect runs one and reports their real size)"
        )

    def pct(n: int) -> str:
        return f" ({100 * n / total:.1f}%)" if total else ""

    table_totals = [
        ("Total params", f"{fmt_int(total)} in {len(unique)} tensors"),
        ("Trainable", fmt_int(trainable) + pct(trainable)),
        ("Frozen", fmt_int(total - trainable) + pct(total - trainable)),
    ]
    if any_packed:
        table_totals.append(
            ("Packed (quantized)", f"{fmt_int(packed_numel)}, read with weight() / bias()")
        )
    if pruned is not None:
        table_totals.append(("After pruning", pruned_line(pruned)))
    if groups:
        table_totals.append(
            ("Shared", "; ".join(" = ".join(g) for g in groups) + " (each counted once)")
        )
    if hidden:
        table_totals.append(
            (f"Not shown (--depth {depth})", f"{fmt_int(hidden_numel)} in {hidden} names")
        )
    return prepared.report(  # no inputs: no forward
        "params",
        settings,
        totals=totals,
        lists={"params": tuple(rows)},
        primary="params",
        notes=tuple(notes),
        columns=(
            Column("name", "Parameter"),
            Column("shape", "Shape", lambda s: "-" if s is None else fmt_shape(s)),
            Column("dtype", "Dtype"),
            Column("device", "Device"),
            Column("requires_grad", "Grad", fmt_bool),
            Column("counted", "Numel", fmt_int, "right"),
            Column("shared_with", "Shared with"),
        ),
        table_totals=tuple(table_totals),
    )


def prune_masks(model: nn.Module) -> list[tuple[nn.Module, str]]:
    """``(module, name)`` for every ``torch.nn.utils.prune`` mask: the module keeps
    ``name_orig`` (the parameter) and ``name_mask`` (a buffer), and a forward-pre hook
    (a ``BasePruningMethod``) that sets ``name = name_orig * name_mask``."""
    from torch.nn.utils import prune

    out: list[tuple[nn.Module, str]] = []
    for m in model.modules():
        for hook in m._forward_pre_hooks.values():
            if isinstance(hook, prune.BasePruningMethod):
                name = getattr(hook, "_tensor_name", None)
                if name and f"{name}_mask" in m._buffers and f"{name}_orig" in m._parameters:
                    out.append((m, name))
    return out


def pruned_counts(model: nn.Module) -> dict[str, Any] | None:
    """``pruned_params`` (every parameter element less those a prune mask zeroes, what
    torchinfo counts) and ``masked_params``; None when the model has no prune mask, or
    when the masks have no values (``--device meta``)."""
    import torch

    from hookcli.modelinfo import numel

    masks = prune_masks(model)
    if not masks:
        return None
    masked = 0
    seen: set[int] = set()
    for m, name in masks:
        mask = m._buffers[f"{name}_mask"]
        orig = m._parameters[f"{name}_orig"]
        if mask is None or orig is None or id(orig) in seen:
            continue
        seen.add(id(orig))
        if mask.is_meta:
            return None
        with torch.no_grad():
            masked += int(mask.numel() - torch.count_nonzero(mask).item())
    total = sum(numel(p) for p in {id(p): p for p in model.parameters()}.values())
    return {"pruned_params": total - masked, "masked_params": masked}


def pruned_line(counts: dict[str, Any]) -> str:
    """The table's totals line for a pruned model."""
    from hookcli.render import fmt_int

    return (
        f"{fmt_int(counts['pruned_params'])} ({fmt_int(counts['masked_params'])} parameter "
        "elements zeroed by torch.nn.utils.prune masks not counted)"
    )


def cli_command(
    *,
    device: str,
    dtype: str | None,
    frozen: list[str] | None,
    depth: int | None,
    **common: Unpack[BuildArgs],
) -> int:
    """The params command's run (``hookcli params``): build, freeze, emit."""
    from hookcli.cliopts import run_options
    from hookcli.commandargs import model_part, output_part
    from hookcli.pipeline import emit, prepare

    mopts, out = model_part(common), output_part(common, depth)
    ropts = run_options(None, None, device, dtype, None, Mode.EVAL)  # no inputs: no forward
    prepared = prepare(mopts, ropts, need_inputs=False)
    frozen_names = freeze(prepared.model, list(frozen or ()))
    return emit(params_report(prepared, out.depth, list(frozen or ()), frozen_names), out)
