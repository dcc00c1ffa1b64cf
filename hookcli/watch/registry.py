"""Which model owns which parameters: the registration hooks that see models and
optimizers being built, and the one scan of the process's objects when they were not."""

from __future__ import annotations

import gc
import sys
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from hookcli.watch.frames import hide


class Registry:
    """Who owns which parameter, and which module holds which, as models are built: the
    global parameter and module registration hooks (they fire in ``__setattr__``,
    ``register_parameter`` and ``add_module`` only, never per call), and the optimizers
    made (``Optimizer.__init__`` wrapped, calling the original unchanged)."""

    def __init__(self) -> None:
        self.owner: dict[int, tuple[weakref.ref[Any], weakref.ref[nn.Module]]] = {}
        self.parent: dict[int, tuple[weakref.ref[nn.Module], weakref.ref[nn.Module]]] = {}
        self.optimizers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._handles: list[Any] = []
        self._init: Any = None
        self._real_init: Any = None

    def install(self) -> Registry:
        from torch.nn.modules import module as mod

        self._handles.append(mod.register_module_parameter_registration_hook(self._param))
        self._handles.append(mod.register_module_module_registration_hook(self._module))
        real = torch.optim.Optimizer.__init__
        optimizers = self.optimizers

        def __init__(opt: Any, *args: Any, **kwargs: Any) -> None:
            try:
                real(opt, *args, **kwargs)
            except BaseException as err:
                hide(err)
                raise
            optimizers.add(opt)

        __init__.__wrapped__ = real  # type: ignore[attr-defined]
        __init__.__doc__ = real.__doc__
        torch.optim.Optimizer.__init__ = __init__  # type: ignore[method-assign,assignment]
        self._init, self._real_init = __init__, real
        return self

    def uninstall(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if torch.optim.Optimizer.__init__ is self._init:
            torch.optim.Optimizer.__init__ = self._real_init  # type: ignore[method-assign]

    def _param(self, module: nn.Module, name: str, param: Any) -> None:
        if param is not None:
            self.owner[id(param)] = (weakref.ref(param), weakref.ref(module))

    def _module(self, module: nn.Module, name: str, child: Any) -> None:
        if isinstance(child, nn.Module):
            self.parent[id(child)] = (weakref.ref(child), weakref.ref(module))

    def top(self, m: nn.Module) -> nn.Module:
        seen = {id(m)}
        while True:
            entry = self.parent.get(id(m))
            if entry is None or entry[0]() is not m:
                return m
            up = entry[1]()
            if up is None or id(up) in seen or m not in up._modules.values():
                return m
            seen.add(id(up))
            m = up

    def roots(self, params: list[torch.Tensor]) -> list[nn.Module] | None:
        """The outermost modules holding ``params``; None when one of them was not seen
        being registered (a model unpickled whole, built before the monitor)."""
        tops: dict[int, nn.Module] = {}
        memo: dict[int, nn.Module] = {}
        for p in params:
            entry = self.owner.get(id(p))
            owner = entry[1]() if entry is not None and entry[0]() is p else None
            if owner is None or not any(q is p for q in owner._parameters.values()):
                return None
            top = memo.get(id(owner))
            if top is None:
                top = memo[id(owner)] = self.top(owner)
            tops.setdefault(id(top), top)
        return list(tops.values())

    def tops(self) -> list[nn.Module] | None:
        """Every outermost module seen (None: none seen)."""
        found: dict[int, nn.Module] = {}
        for _, owner_ref in self.owner.values():
            owner = owner_ref()
            if owner is not None:
                top = self.top(owner)
                found.setdefault(id(top), top)
        return list(found.values()) or None


def _objects(kind: type) -> Iterator[Any]:
    """Every object of ``kind`` the garbage collector tracks (looked up by type, not
    ``isinstance``: a proxy's ``__class__`` would warn or import)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            if issubclass(type(obj), kind):
                yield obj


def _modules() -> list[nn.Module]:
    return list(_objects(nn.Module))


def _tops(modules: list[nn.Module]) -> list[nn.Module]:
    """The modules that are no other module's child."""
    children = {id(c) for m in modules for c in m._modules.values() if c is not None}
    return [m for m in modules if id(m) not in children]


def _roots(modules: list[nn.Module], stepped: set[int]) -> list[nn.Module]:
    """The models that own the stepped parameters: the outermost modules holding them
    (a DDP or ``torch.compile`` wrapper included: names are as ``named_modules()`` of
    what the training calls), the one holding most first, until every stepped
    parameter that a module holds is covered."""
    remaining = set(stepped)
    found: list[nn.Module] = []
    covers = []
    for m in _tops(modules):
        own = {id(p) for p in m.parameters()} & remaining
        if own:
            covers.append((len(own), m, own))
    covers.sort(key=lambda c: -c[0])
    for _, m, own in covers:
        if own & remaining:
            remaining -= own
            found.append(m)
    return found


def _compiling_in_use() -> bool:
    """Whether torch.compile has compiled anything in this process (torch.optim alone
    imports torch._dynamo, so that import says nothing)."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    if dynamo is None:
        return False
    try:
        return bool(dynamo.counters["frames"]["ok"]) or bool(dynamo.counters["frames"]["total"])
    except Exception:  # another torch's counters: assume it is, to be safe
        return True
