"""Leave the caller's process as found after a CLI command run in-process (``app([...])``).

A MODEL that names an ``nn.Module`` instance (``pkg.mod:MODEL``) is an object that
outlives the run: ``--dtype``, ``--device``, ``--weights`` and ``params --frozen``
would change it in place. ``keep_as_found`` records what the run may change (each
module's parameter and buffer slots, the tensors' data, grads and ``requires_grad``,
training flags, hook dicts); ``scope`` puts it back when the command ends, also when
it failed or was refused. Values are copied only before a write into the tensors
themselves (``--weights``: ``before_values_change``). The global random number
generators (torch's, CUDA's, ``random``'s, NumPy's) are put back too, as the Python API
does. ``TensorAttributes`` keeps a module tree's plain tensor attributes (a KV cache)
as found from pass to pass; ``training_flags`` each module's own ``training`` flag. No
torch import at module level here.
"""

from __future__ import annotations

import contextlib
import random
import sys
from collections.abc import Callable, Iterator
from typing import Any

_SCOPES: list[list[Callable[[], None]]] = []
_KEPT: dict[int, Any] = {}  # id(module) -> its snapshot, while a scope is open

_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)


class _Snapshot:
    """What a run may change on one module tree, taken without copying tensor memory."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.modules = []
        for m in root.modules():
            hooks = {name: dict(getattr(m, name)) for name in _HOOK_DICTS if hasattr(m, name)}
            self.modules.append((m, dict(m._parameters), dict(m._buffers), m.training, hooks))
        self.tensors: list[tuple[Any, Any, Any, Any, bool]] = []
        seen: set[int] = set()
        for _, params, buffers, _, _ in self.modules:
            for t in (*params.values(), *buffers.values()):
                if t is None or id(t) in seen:
                    continue
                seen.add(id(t))
                grad = t.grad if t.requires_grad or t.grad is not None else None
                self.tensors.append(
                    (t, t.data, grad, grad.data if grad is not None else None, t.requires_grad)
                )
        self.values: list[tuple[Any, Any]] | None = None

    def copy_values(self) -> None:
        """Copy every tensor's values, before something writes into them in place."""
        if self.values is None:
            self.values = [(data, data.clone()) for _, data, _, _, _ in self.tensors]

    def restore(self) -> None:
        import torch

        with torch.no_grad():
            for t, data, grad, grad_data, requires_grad in self.tensors:
                with contextlib.suppress(Exception):
                    t.data = data
                with contextlib.suppress(Exception):
                    if grad is not None and grad_data is not None:
                        grad.data = grad_data
                    t.grad = grad
                with contextlib.suppress(Exception):
                    t.requires_grad_(requires_grad)
            for data, saved in self.values or ():
                with contextlib.suppress(Exception):
                    data.copy_(saved)
        for m, params, buffers, training, hooks in self.modules:
            m._parameters.clear()
            m._parameters.update(params)
            m._buffers.clear()
            m._buffers.update(buffers)
            m.training = training
            for name, saved_hooks in hooks.items():
                live = getattr(m, name)
                live.clear()
                live.update(saved_hooks)


def keep_as_found(module: Any) -> None:
    """Record an existing ``nn.Module`` instance, to be restored when the scope ends."""
    if not _SCOPES or id(module) in _KEPT:
        return
    snap = _Snapshot(module)
    _KEPT[id(module)] = snap
    _SCOPES[-1].append(snap.restore)


def on_scope_end(fn: Callable[[], None]) -> None:
    """Run ``fn`` when the innermost scope ends (at once never: outside a scope, nothing)."""
    if _SCOPES:
        _SCOPES[-1].append(fn)


def before_values_change(module: Any) -> None:
    """Called before the tensors of ``module`` are written in place (``--weights``)."""
    snap = _KEPT.get(id(module))
    if snap is not None:
        snap.copy_values()


class TensorAttributes:
    """A module tree's plain tensor attributes (in ``module.__dict__``: neither parameters
    nor buffers), such as Llama's KV cache ``self.cache_k = torch.zeros(...)`` that forward
    writes in place at ``start_pos``. ``reset()`` puts each back as it was found (the same
    object, its values, no autograd history; a tensor attribute that a pass added is
    dropped, one it replaced is set back), so that every forward starts where the first
    did and no backward reaches into an earlier pass's graph, as buffers are put back.
    Values are copied only where they are not all zeros (a fresh cache costs nothing).
    The modules of ``torch.nn`` itself are not looked at: they keep no such attribute."""

    def __init__(self, modules: Any) -> None:
        import torch

        tensor = torch.Tensor
        # [module, name, original, copy (None: all zeros), version, had history]
        self.kept: list[list[Any]] = []
        # each module's attributes, where its forward is not torch's own (torch.nn's
        # modules neither keep nor add tensor attributes: they are not looked at, which
        # keeps this cheap on a large tree); a tensor attribute added is dropped
        self.before: list[tuple[Any, dict[str, Any]]] = []
        with torch.no_grad():
            for m in modules:
                if type(m).__module__.startswith(_TORCH_NN):
                    continue
                d = m.__dict__
                self.before.append((m, d.copy()))
                for name in _tensor_names(d, tensor):
                    t = d[name]
                    try:
                        copy = _saved(t)
                    except Exception:  # a tensor no copy can be made of: left alone
                        continue
                    self.kept.append([m, name, t, copy, _version(t), t.grad_fn is not None])

    def reset(self) -> None:
        """Every attribute as found; any tensor attribute added since dropped."""
        import torch

        tensor = torch.Tensor
        with torch.no_grad():
            for entry in self.kept:
                m, name, original, copy, version, history = entry
                if m.__dict__.get(name) is not original:
                    m.__dict__[name] = original
                if original.grad_fn is not None and not history:
                    try:
                        original.detach_()  # the history an in-place write gave it
                    except RuntimeError:  # a view: the attribute becomes a fresh copy
                        m.__dict__[name] = original = entry[2] = original.detach().clone()
                if version is None or _version(original) != version:
                    try:
                        original.zero_() if copy is None else original.copy_(copy)
                    except RuntimeError:  # (an inference tensor, outside inference mode)
                        fresh = torch.zeros_like(original) if copy is None else copy.clone()
                        m.__dict__[name] = entry[2] = fresh
                    entry[4] = _version(entry[2])
            for m, before in self.before:
                added = [
                    k
                    for k in _tensor_names(m.__dict__, tensor)
                    if not isinstance(before.get(k), tensor)
                ]
                for k in added:
                    if k in before:
                        m.__dict__[k] = before[k]
                    else:
                        del m.__dict__[k]


_TORCH_NN = "torch.nn.modules."
_TENSOR_TYPES: dict[type, bool] = {}  # type -> whether it is a tensor type


def _tensor_names(attributes: dict[str, Any], tensor: type) -> list[str]:
    """The names of the tensors among ``attributes``: the types are looked at first (a
    set made in C), the names only where one is a tensor type, as in few modules."""
    for tp in set(map(type, attributes.values())):
        hit = _TENSOR_TYPES.get(tp)
        if hit is None:
            hit = _TENSOR_TYPES[tp] = issubclass(tp, tensor)
        if hit:
            return [k for k, v in attributes.items() if isinstance(v, tensor)]
    return []


def _saved(t: Any) -> Any:
    """A copy of ``t``'s values; None where they are all zeros (no copy needed)."""
    import torch

    with contextlib.suppress(Exception):
        if t.layout is torch.strided and t.device.type != "meta" and not bool(t.any()):
            return None
    return t.detach().clone()


def _version(t: Any) -> int | None:
    """The tensor's version counter (None where it has none: an inference tensor)."""
    try:
        return int(t._version)
    except Exception:
        return None


@contextlib.contextmanager
def kept_attributes(model: Any) -> Iterator[TensorAttributes]:
    """``TensorAttributes`` of ``model``'s tree, put back when the block ends."""
    attrs = TensorAttributes(model.modules())
    try:
        yield attrs
    finally:
        attrs.reset()


@contextlib.contextmanager
def training_flags(model: Any) -> Iterator[None]:
    """Each module's own ``training`` flag put back exactly (``model.train(mode)`` would
    set a frozen BatchNorm under a training root to train)."""
    flags = [(m, m.training) for m in model.modules()]
    try:
        yield
    finally:
        for m, flag in flags:
            if m.training is not flag:
                m.training = flag


def _rng_states() -> Callable[[], None]:
    """Save the global RNGs that are loaded now; the function puts them back."""
    py_state = random.getstate()
    np_random = getattr(sys.modules.get("numpy"), "random", None)
    np_state = np_random.get_state() if np_random is not None else None
    torch = sys.modules.get("torch")
    cpu_state = cuda_states = None
    if torch is not None and hasattr(torch, "get_rng_state"):
        cpu_state = torch.get_rng_state()
        if torch.cuda.is_initialized():
            cuda_states = torch.cuda.get_rng_state_all()

    def put_back() -> None:
        random.setstate(py_state)
        if np_random is not None and np_state is not None:
            np_random.set_state(np_state)
        if torch is not None and cpu_state is not None:
            torch.set_rng_state(cpu_state)
            if cuda_states is not None:
                torch.cuda.set_rng_state_all(cuda_states)

    return put_back


@contextlib.contextmanager
def scope() -> Iterator[None]:
    """Everything ``keep_as_found`` recorded inside, and the global RNGs, restored at the end."""
    rng = _rng_states()
    restores: list[Callable[[], None]] = []
    _SCOPES.append(restores)
    try:
        yield
    finally:
        _SCOPES.pop()
        try:
            for fn in reversed(restores):
                fn()
        finally:
            if not _SCOPES:
                _KEPT.clear()
            rng()


__all__ = [
    "TensorAttributes",
    "before_values_change",
    "keep_as_found",
    "kept_attributes",
    "on_scope_end",
    "scope",
    "training_flags",
]
