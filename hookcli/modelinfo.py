"""Static facts about a model: parameter and buffer counts, each tensor counted once."""

from __future__ import annotations

import functools
import inspect
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn.parameter import is_lazy as _torch_is_lazy


class ParamCounts(NamedTuple):
    """Parameter elements of one module (``params`` recursive, deduplicated). A named
    tuple: one is made per module on every run, and a frozen dataclass's init costs
    several times more."""

    params: int
    own_params: int
    trainable_params: int


def module_names(model: nn.Module) -> dict[int, str]:
    """id(module) -> its first qualified name in ``named_modules()``; root is ``""``."""
    return {id(m): name for name, m in model.named_modules()}


def param_fields(name: str, p: torch.Tensor) -> dict[str, Any]:
    """What a per-parameter record starts with: ``name``, ``shape``, ``dtype``,
    ``requires_grad``."""
    dtype = str(p.dtype).removeprefix("torch.")
    return {"name": name, "shape": tuple(p.shape), "dtype": dtype, "requires_grad": p.requires_grad}


def depth_of(name: str) -> int:
    """0 for the root ``""``, +1 per dotted level."""
    return 0 if name == "" else name.count(".") + 1


class Held(NamedTuple):
    """One weight tensor a module holds: a parameter, or a quantized module's packed
    weight (a named tuple, made once per tensor on every run)."""

    key: int | tuple[int, str]  # id(parameter), or (id(module), "weight"/"bias") when packed
    numel: int
    trainable: bool
    nbytes: int
    packed: bool = False


def packed_tensors(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """``(attr, tensor)`` for the weight and bias a quantized module keeps packed.

    ``torch.ao.nn.quantized`` Linear, Conv and Embedding modules hold their weights
    in ``_packed_params`` (a C++ object), not in parameters; their ``weight()`` and
    ``bias()`` methods unpack them.
    """
    # a submodule (quantized Linear) or a plain attribute (quantized Conv); looked up
    # in the dicts, since hasattr() costs an AttributeError on every other module
    if "_packed_params" not in module._modules and "_packed_params" not in module.__dict__:
        return []
    out = []
    for attr in ("weight", "bias"):
        if not inspect.isfunction(getattr(type(module), attr, None)):
            continue  # LinearPackedParams itself, or an attribute that is not the method
        try:
            value = getattr(module, attr)()
        except Exception:  # an exotic packed module: count what can be read
            continue
        if isinstance(value, torch.Tensor):
            out.append((attr, value))
    return out


def numel(t: torch.Tensor) -> int:
    """Elements of ``t``; 0 for a lazy module's uninitialized parameter or buffer.

    ``nn.LazyLinear`` and friends hold ``UninitializedParameter``s until their first
    forward; asking their shape raises.
    """
    if is_lazy(t):
        return 0
    return t.numel()


def is_lazy(t: torch.Tensor) -> bool:
    """An ``UninitializedParameter`` / ``UninitializedBuffer`` (a lazy module before forward)."""
    return bool(_torch_is_lazy(t))


def own_tensors(module: nn.Module) -> list[Held]:
    """The module's direct parameters and packed weights, each once."""
    out: list[Held] = []
    seen: set[int] = set()
    for p in module._parameters.values():  # parameters(recurse=False), without its walk
        if p is not None and id(p) not in seen:
            seen.add(id(p))
            n = numel(p)
            out.append(Held(id(p), n, p.requires_grad, n * p.dtype.itemsize))
    for attr, t in packed_tensors(module):
        out.append(Held((id(module), attr), t.numel(), False, t.numel() * t.element_size(), True))
    return out


class TensorIndex:
    """Every module's own tensors, read once (packed weights are unpacked once)."""

    def __init__(self, model: nn.Module) -> None:
        self.root = model
        # one walk: each module under its first name (``dict(model.named_modules())``),
        # then every module's own tensors, in ``model.modules()``'s order
        self.by_name: dict[str, nn.Module] = dict(model.named_modules())
        walks_its_own = type(model).modules is not nn.Module.modules
        modules = list(model.modules()) if walks_its_own else self.by_name.values()
        self.own = {id(m): own_tensors(m) for m in modules}

    def modules_by_name(self, model: nn.Module) -> dict[str, nn.Module]:
        """``dict(model.named_modules())``, from the index where it is ``model``'s."""
        return self.by_name if model is self.root else dict(model.named_modules())

    @functools.cached_property
    def nothing_shared(self) -> bool:
        """No module twice in the tree and no tensor held by two modules (then no
        parameter has a second name elsewhere, and a subtree's count is its own plus its
        children's). Found from the index: a tree of n modules has n - 1 child links."""
        links = sum(1 for m in self.by_name.values() for c in m._modules.values() if c is not None)
        if links != len(self.own) - 1:
            return False
        seen: set[int | tuple[int, str]] = set()
        for held in self.own.values():
            for h in held:
                if h.key in seen:
                    return False
                seen.add(h.key)
        return True

    def held(self, module: nn.Module, recurse: bool = True) -> list[Held]:
        """The module's tensors (its subtree's with ``recurse``), each once."""
        if not recurse:
            return list(self.own.get(id(module), ()))
        out: list[Held] = []
        seen: set[int | tuple[int, str]] = set()
        # the root's subtree is every module indexed: no second walk of the tree
        owners = (
            self.own.values()
            if module is self.root
            else (self.own.get(id(m), ()) for m in module.modules())
        )
        for held in owners:
            for h in held:
                if h.key not in seen:
                    seen.add(h.key)
                    out.append(h)
        return out


def tied_parameters(model: nn.Module, index: TensorIndex | None = None) -> dict[int, list[str]]:
    """id(module) -> the qualified names, elsewhere in the model, of parameters that are
    one of the module's own (tied weights: ``lm_head.weight is embed.weight``); empty
    when no parameter has two names (known without a walk where ``index`` says that no
    module and no tensor appears twice)."""
    if index is not None and index.root is model and index.nothing_shared:
        return {}
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    if all(len(n) == 1 for n in names.values()):
        return {}
    out: dict[int, list[str]] = {}
    for prefix, m in model.named_modules():
        others = [
            n
            for p in m._parameters.values()
            if p is not None and len(names[id(p)]) > 1
            for n in names[id(p)]
            if n.rpartition(".")[0] != prefix
        ]
        if others:
            out[id(m)] = list(dict.fromkeys(others))
    return out


def param_counts(module: nn.Module, index: TensorIndex | None = None) -> ParamCounts:
    """Counts for one module: its subtree's tensors once each, and its own."""
    index = index or TensorIndex(module)
    subtree = index.held(module)
    return ParamCounts(
        params=sum(h.numel for h in subtree),
        own_params=sum(h.numel for h in index.held(module, recurse=False)),
        trainable_params=sum(h.numel for h in subtree if h.trainable),
    )


def all_param_counts(model: nn.Module, index: TensorIndex | None = None) -> dict[int, ParamCounts]:
    """id(module) -> ParamCounts for every module of the model.

    One bottom-up pass when no module and no tensor appears twice in the tree
    (then a subtree's count is its own plus its children's); the exact,
    deduplicating count per module otherwise.
    """
    index = index or TensorIndex(model)
    if index.nothing_shared:
        counts: dict[int, ParamCounts] = {}
        _fill_counts(model, index, counts)
        return counts
    return {id(m): param_counts(m, index) for m in model.modules()}


def _fill_counts(
    module: nn.Module, index: TensorIndex, counts: dict[int, ParamCounts]
) -> ParamCounts:
    """Counts of ``module`` and (into ``counts``) of every descendant; nothing shared."""
    own = trainable = 0
    for h in index.own.get(id(module), ()):
        own += h.numel
        if h.trainable:
            trainable += h.numel
    total = own
    for child in module._modules.values():
        if child is not None:
            sub = _fill_counts(child, index, counts)
            total += sub.params
            trainable += sub.trainable_params
    result = ParamCounts(params=total, own_params=own, trainable_params=trainable)
    counts[id(module)] = result
    return result


def totals(model: nn.Module, index: TensorIndex | None = None) -> dict[str, int]:
    """The ``totals`` of ``inspect``: params, trainable, non-trainable, bytes, buffers.

    Quantized modules' packed weights count as (non-trainable) params; a model
    that has them also gets ``packed_params``.
    """
    held = (index or TensorIndex(model)).held(model)
    seen: set[int] = set()
    buffers = []
    for b in model.buffers():
        if id(b) not in seen:
            seen.add(id(b))
            buffers.append(b)
    n = sum(h.numel for h in held)
    trainable = sum(h.numel for h in held if h.trainable)
    out = {
        "params": n,
        "trainable_params": trainable,
        "non_trainable_params": n - trainable,
        "param_bytes": sum(h.nbytes for h in held),
        "buffers": sum(numel(b) for b in buffers),
        "buffer_bytes": sum(numel(b) * b.dtype.itemsize for b in buffers),
    }
    packed = sum(h.numel for h in held if h.packed)
    if packed:
        out["packed_params"] = packed
    return out


def attribute_tensors(model: nn.Module) -> list[tuple[str, str, torch.Tensor]]:
    """(module name, attribute, tensor) for every tensor a module holds in a plain
    attribute (``self.cache_k``), directly or in a list, tuple or dict one level down;
    parameters, buffers and ``example_input_array`` (inputs) are not among them."""
    out: list[tuple[str, str, torch.Tensor]] = []
    for name, module in model.named_modules():
        for attr, value in vars(module).items():
            if attr.startswith("_") or attr == "example_input_array":
                continue
            if isinstance(value, torch.Tensor):
                if not isinstance(value, nn.Parameter):
                    out.append((name, attr, value))
            elif isinstance(value, (list, tuple)):
                for i, v in enumerate(value[:1024]):
                    if isinstance(v, torch.Tensor) and not isinstance(v, nn.Parameter):
                        out.append((name, f"{attr}[{i}]", v))
            elif isinstance(value, dict) and len(value) <= 1024:
                for k, v in value.items():
                    if isinstance(v, torch.Tensor) and not isinstance(v, nn.Parameter):
                        out.append((name, f"{attr}[{k!r}]", v))
    return out
