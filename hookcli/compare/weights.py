"""``--copy-weights``: A's parameters (and same-named buffers) into B through the alignment.

Per aligned module pair, each of A's own parameters goes to B's own parameter of the
same local name, else (both modules holding the same number) to the one in the same
position. Shapes must agree; a 2-D weight whose shape is the other's transposed is
copied transposed, and said; between an ``nn.Linear`` (weight (out, in)) and
transformers' ``Conv1D`` (weight (in, out)) always, also where the weight is square.
A B parameter that no pair fills, or a pair whose shapes do not fit, is listed and B
is refused (exit 2): B is never compared on random weights.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from hookcli.errors import UsageError


@dataclass(frozen=True)
class Copied:
    """What was copied: (A param, B param, how) and the notes of the copy."""

    pairs: tuple[tuple[str, str, str], ...]
    transposed: tuple[str, ...]


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def copy_weights(
    model_a: nn.Module,
    model_b: nn.Module,
    modules: Sequence[tuple[str, str]],
    unrun: Collection[str] = (),
) -> Copied:
    """Copy through the module pairs (A name, B name); UsageError listing what cannot be.
    ``unrun``: B's parameters that may stay as built (after a model failed: those of
    modules none of whose calls returned)."""
    mods_a = dict(model_a.named_modules())
    mods_b = dict(model_b.named_modules())
    done: list[tuple[str, str, str]] = []
    transposed: list[str] = []
    problems: list[str] = []
    filled: set[int] = set()
    plan: list[tuple[torch.Tensor, torch.Tensor, bool]] = []
    for name_a, name_b in modules:
        ma, mb = mods_a.get(name_a), mods_b.get(name_b)
        if ma is None or mb is None:
            continue
        own_a = list(ma.named_parameters(recurse=False))
        own_b = dict(mb.named_parameters(recurse=False))
        if not own_a:
            continue
        # transformers' Conv1D keeps its weight as (in, out), nn.Linear as (out, in): a
        # square one has the same shape either way, so the types decide
        crossed = {type(ma).__name__, type(mb).__name__} == {"Linear", "Conv1D"}
        by_position = len(own_a) == len(own_b) and not all(n in own_b for n, _ in own_a)
        for pos, (pname, pa) in enumerate(own_a):
            if pname in own_b:
                bname, pb = pname, own_b[pname]
            elif by_position:
                bname, pb = list(own_b.items())[pos]
            else:
                problems.append(f"{_join(name_a, pname)} (no {pname} in B's {name_b or '(root)'})")
                continue
            qa, qb = _join(name_a, pname), _join(name_b, bname)
            if id(pb) in filled:
                continue  # a tied parameter, filled through its other name
            if crossed and pa.dim() == 2 and tuple(pa.shape) == tuple(reversed(pb.shape)):
                plan.append((pa, pb, True))
                done.append((qa, qb, "transposed"))
                transposed.append(f"{qa} -> {qb}")
            elif tuple(pa.shape) == tuple(pb.shape):
                plan.append((pa, pb, False))
                done.append((qa, qb, "copied"))
            elif pa.dim() == 2 and tuple(pa.shape) == tuple(reversed(pb.shape)):
                plan.append((pa, pb, True))
                done.append((qa, qb, "transposed"))
                transposed.append(f"{qa} -> {qb}")
            else:
                problems.append(f"{qa} {list(pa.shape)} does not fit {qb} {list(pb.shape)}")
                continue
            filled.add(id(pb))
        own_bufs_b = dict(mb.named_buffers(recurse=False))
        for bname, ba in ma.named_buffers(recurse=False):
            bb = own_bufs_b.get(bname)
            if bb is not None and tuple(ba.shape) == tuple(bb.shape):
                plan.append((ba, bb, False))
    skip = set(unrun)
    left = [n for n, p in model_b.named_parameters() if id(p) not in filled and n not in skip]
    if left:
        problems.append(f"B's {', '.join(_cut(left))} (no aligned module of A gives it)")
    if problems:
        raise UsageError("--copy-weights cannot fill B: " + "; ".join(_cut(problems, 4)))
    with torch.no_grad():
        for src, dst, t in plan:
            value = src.detach().t() if t else src.detach()
            dst.copy_(value.to(device=dst.device, dtype=dst.dtype))
    return Copied(tuple(done), tuple(transposed))


def _cut(items: Sequence[str], limit: int = 6) -> list[str]:
    more = [f"(+{len(items) - limit} more)"] if len(items) > limit else []
    return list(items[:limit]) + more
