"""Tensors inside nested inputs/outputs, flattened in order.

Tuples, lists, namedtuples, dicts (values in the dict's own key order),
dataclasses, and plain objects holding tensors in attributes (torchvision's
``ImageList``; attribute order) are walked at any depth; None and other leaves
are skipped. A structure that contains itself (an object whose attribute points
back to it, a list holding itself) is walked once per path: the cycle guard skips
a container already open above it, so a tensor reached twice through different
branches is still listed twice, like ``(x, x)``.
"""

from __future__ import annotations

import copy
import dataclasses
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch


def _is_record(obj: Any) -> bool:
    """A plain object holding data in attributes (torchvision's ImageList, say)."""
    return (
        hasattr(obj, "__dict__")
        and not isinstance(obj, (torch.nn.Module, type, types.ModuleType))
        and not callable(obj)
        and not isinstance(obj, (str, bytes))
    )


def children(obj: Any) -> Iterable[tuple[str, Any]] | None:
    """``(suffix, value)`` for the items of a container, or None for a leaf.

    The suffix is how the item is reached: ``[i]``, ``[key]`` or ``.attr``.
    """
    if isinstance(obj, Mapping):
        return ((f"[{k}]", v) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return ((f"[{i}]", v) for i, v in enumerate(obj))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return ((f".{f.name}", getattr(obj, f.name, None)) for f in dataclasses.fields(obj))
    if _is_record(obj):
        return ((f".{k}", v) for k, v in list(vars(obj).items()))
    return None


def iter_named_tensors(
    obj: Any,
    prefix: str = "",
    kids: Callable[[Any], Iterable[tuple[str, Any]] | None] = children,
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(path, tensor)`` for every tensor in ``obj``, depth first, in order.

    No depth limit (an explicit stack, not recursion); a container already open on
    the current path is skipped (the cycle guard). ``kids`` says what a container
    holds and how each item is named (``children`` by default).
    """
    if obj is None:
        return
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
        return
    first = kids(obj)
    if first is None:
        return
    open_ids = {id(obj)}
    stack: list[tuple[Iterator[tuple[str, Any]], int, str]] = [(iter(first), id(obj), prefix)]
    while stack:
        items, oid, path = stack[-1]
        for suffix, value in items:
            if value is None:
                continue
            if isinstance(value, torch.Tensor):
                yield path + suffix, value
                continue
            if id(value) in open_ids:
                continue  # a cycle: this container is being walked above us
            sub = kids(value)
            if sub is not None:
                open_ids.add(id(value))
                stack.append((iter(sub), id(value), path + suffix))
                break
        else:
            stack.pop()
            open_ids.discard(oid)


Parts = Callable[[Any], tuple[list[Any], Callable[[list[Any]], Any]] | None]


def rebuild(obj: Any, leaf: Callable[[Any], Any], parts: Parts) -> Any:
    """``obj`` with every leaf ``x`` replaced by ``leaf(x)`` and the containers around
    them rebuilt, at any depth (an explicit stack, not recursion).

    ``parts(v)`` is ``(items, assemble)`` for a container (``assemble`` makes the new
    container from the new items) and None for a leaf. A container already open on
    the current path (a cycle) is kept as it is.
    """
    top = parts(obj)
    if top is None:
        return leaf(obj)
    open_ids = {id(obj)}
    stack: list[tuple[Any, list[Any], Callable[[list[Any]], Any], list[Any]]] = [
        (obj, top[0], top[1], [])
    ]
    while True:
        container, items, assemble, done = stack[-1]
        if len(done) < len(items):
            item = items[len(done)]
            if id(item) in open_ids:
                done.append(item)
                continue
            sub = parts(item)
            if sub is None:
                done.append(leaf(item))
            else:
                open_ids.add(id(item))
                stack.append((item, sub[0], sub[1], []))
            continue
        stack.pop()
        open_ids.discard(id(container))
        new = assemble(done)
        if not stack:
            return new
        stack[-1][3].append(new)


def _values(obj: Any) -> Iterable[Any] | None:
    """The items of a container (as ``children``, without their names), or None."""
    if isinstance(obj, (list, tuple)):
        return obj
    if type(obj) is dict:  # before the Mapping ABC check, which is slow
        return obj.values()
    if isinstance(obj, Mapping):
        return obj.values()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [getattr(obj, f.name, None) for f in dataclasses.fields(obj)]
    if _is_record(obj):
        return list(vars(obj).values())
    return None


def iter_tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor in ``obj``, depth first, in order (``iter_named_tensors`` without
    the names: this one runs on every module call)."""
    if isinstance(obj, torch.Tensor):
        yield obj
        return
    first = None if obj is None else _values(obj)
    if first is None:
        return
    open_ids = {id(obj)}
    stack: list[tuple[Iterator[Any], int]] = [(iter(first), id(obj))]
    tensor = torch.Tensor
    while stack:
        items, oid = stack[-1]
        for value in items:
            if value is None:
                continue
            if isinstance(value, tensor):
                yield value
                continue
            if id(value) in open_ids:
                continue
            sub = _values(value)
            if sub is not None:
                open_ids.add(id(value))
                stack.append((iter(sub), id(value)))
                break
        else:
            stack.pop()
            open_ids.discard(oid)


def shapes_of(*objs: Any) -> tuple[tuple[int, ...], ...]:
    """Shapes of every tensor in ``objs``."""
    out = []
    for obj in objs:
        # the common cases, once per module call: a tensor, a tuple of tensors, no kwargs
        if type(obj) is torch.Tensor or isinstance(obj, torch.Tensor):
            out.append(tuple(obj.shape))
        elif type(obj) is tuple and all(type(t) is torch.Tensor for t in obj):
            out.extend(tuple(t.shape) for t in obj)
        elif obj is None or (type(obj) is dict and not obj):
            continue
        else:
            out.extend(tuple(t.shape) for t in iter_tensors(obj))
    return tuple(out)


def move_tensors(value: Any, device: torch.device, float_dtype: torch.dtype | None) -> Any:
    """Every tensor at any depth moved to ``device`` (floating ones cast to ``float_dtype``),
    the structures around them rebuilt, other objects kept as they are; no recursion, so
    inputs nested 1000 deep move like any others.

    One rule for every source of inputs (drawn, ``example_input_array``, ``--input-file``,
    ``--inputs-from``): a list, tuple or dict, a subclass of one, a namedtuple or a
    dataclass comes back as its own type holding the moved items. Lists and dicts
    (subclasses too) are shallow copies with their items replaced, so a ``defaultdict``
    keeps its factory and a subclass its attributes, and no constructor of the user's runs;
    a tuple subclass whose constructor does not take the items becomes a plain tuple; a
    dataclass goes through ``dataclasses.replace``, or a copy with its fields set where
    ``replace`` cannot (``init=False`` fields). Other objects are kept as they are.
    """

    def leaf(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            if float_dtype is not None and v.is_floating_point():
                v = v.to(float_dtype)
            return v.to(device)
        return v

    return rebuild(value, leaf, _rebuildable)


def _rebuildable(v: Any) -> tuple[list[Any], Callable[[list[Any]], Any]] | None:
    """``rebuild``'s ``parts`` for ``move_tensors``: the items, and how to make the new one."""
    if isinstance(v, torch.Tensor):
        return None
    if isinstance(v, tuple):
        if hasattr(v, "_fields"):
            return list(v), lambda items: type(v)(*items)
        if type(v) is tuple:
            return list(v), tuple

        def tuple_like(items: list[Any]) -> Any:
            try:
                return type(v)(items)
            except Exception:
                return tuple(items)

        return list(v), tuple_like
    if isinstance(v, list):
        if type(v) is list:
            return list(v), list

        def list_like(items: list[Any]) -> Any:
            new = copy.copy(v)
            new[:] = items
            return new

        return list(v), list_like
    if isinstance(v, dict):
        keys = list(v)
        if type(v) is dict:
            return [v[k] for k in keys], lambda items: dict(zip(keys, items, strict=True))

        def dict_like(items: list[Any]) -> Any:
            new = copy.copy(v)
            new.clear()
            new.update(zip(keys, items, strict=True))
            return new

        return [dict.__getitem__(v, k) for k in keys], dict_like
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        names = [f.name for f in dataclasses.fields(v)]

        def assemble(items: list[Any]) -> Any:
            values = dict(zip(names, items, strict=True))
            try:
                return dataclasses.replace(v, **values)
            except (TypeError, ValueError):
                new = copy.copy(v)
                for name, item in values.items():
                    object.__setattr__(new, name, item)  # frozen dataclasses too
                return new

        return [getattr(v, n) for n in names], assemble
    return None
