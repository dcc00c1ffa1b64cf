"""Static facts about a model: parameter and buffer counts, each tensor counted once."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class ParamCounts:
    """Parameter elements of one module (``params`` recursive, deduplicated)."""

    params: int
    own_params: int
    trainable_params: int


def module_names(model: nn.Module) -> dict[int, str]:
    """id(module) -> its first qualified name in ``named_modules()``; root is ``""``."""
    return {id(m): name for name, m in model.named_modules()}


def depth_of(name: str) -> int:
    """0 for the root ``""``, +1 per dotted level."""
    return 0 if name == "" else name.count(".") + 1


def _unique(params: list[nn.Parameter]) -> list[nn.Parameter]:
    seen: set[int] = set()
    out = []
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def param_counts(module: nn.Module) -> ParamCounts:
    """Counts for one module: its subtree's tensors once each, and its own."""
    subtree = _unique(list(module.parameters()))
    own = _unique(list(module.parameters(recurse=False)))
    return ParamCounts(
        params=sum(p.numel() for p in subtree),
        own_params=sum(p.numel() for p in own),
        trainable_params=sum(p.numel() for p in subtree if p.requires_grad),
    )


def all_param_counts(model: nn.Module) -> dict[int, ParamCounts]:
    """id(module) -> ParamCounts for every module of the model.

    One bottom-up pass when no module and no parameter appears twice in the tree
    (then a subtree's count is its own plus its children's); the exact,
    deduplicating count per module otherwise.
    """
    if _nothing_shared(model):
        counts: dict[int, ParamCounts] = {}
        _fill_counts(model, counts)
        return counts
    return {id(m): param_counts(m) for m in model.modules()}


def _nothing_shared(model: nn.Module) -> bool:
    modules = list(model.modules())
    if len(modules) != sum(1 for _ in model.named_modules(remove_duplicate=False)):
        return False
    seen: set[int] = set()
    for m in modules:
        for p in m._parameters.values():
            if p is not None:
                if id(p) in seen:
                    return False
                seen.add(id(p))
    return True


def _fill_counts(module: nn.Module, counts: dict[int, ParamCounts]) -> ParamCounts:
    """Counts of ``module`` and (into ``counts``) of every descendant; nothing shared."""
    own = trainable = 0
    for p in module._parameters.values():
        if p is not None:
            own += p.numel()
            trainable += p.numel() if p.requires_grad else 0
    total = own
    for child in module._modules.values():
        if child is not None:
            sub = _fill_counts(child, counts)
            total += sub.params
            trainable += sub.trainable_params
    result = ParamCounts(params=total, own_params=own, trainable_params=trainable)
    counts[id(module)] = result
    return result


def totals(model: nn.Module) -> dict[str, int]:
    """The ``totals`` of ``inspect``: params, trainable, non-trainable, bytes, buffers."""
    params = _unique(list(model.parameters()))
    seen: set[int] = set()
    buffers = []
    for b in model.buffers():
        if id(b) not in seen:
            seen.add(id(b))
            buffers.append(b)
    n = sum(p.numel() for p in params)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    return {
        "params": n,
        "trainable_params": trainable,
        "non_trainable_params": n - trainable,
        "param_bytes": sum(p.numel() * p.element_size() for p in params),
        "buffers": sum(b.numel() for b in buffers),
        "buffer_bytes": sum(b.numel() * b.element_size() for b in buffers),
    }
