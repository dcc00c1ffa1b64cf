"""Record every module, parameter and buffer registration while a model is built.

``RegistrationRecorder`` installs the three global registration hooks of
``torch.nn.modules.module`` (``register_module_module_registration_hook``,
``..._parameter_...``, ``..._buffer_...``) on enter and removes them on exit,
whatever happens (also a constructor that raises, or Ctrl-C). The hooks only
look: they return None, so the registered values are never replaced.

The registering modules are kept alive until ``resolve`` so that no ``id`` is
reused during the build; ``resolve(model)`` then names each one by its
qualified name in the built model (None for a module that did not end up in it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types import TracebackType

    from torch import nn
    from torch.utils.hooks import RemovableHandle

MODULE = "module"
PARAMETER = "parameter"
BUFFER = "buffer"
KINDS = (MODULE, PARAMETER, BUFFER)


@dataclass(frozen=True)
class Registration:
    """One registration, in the order it happened.

    ``parent`` is the class of the registering module, ``module`` its qualified
    name in the built model (``""`` for the root, None when it is not in the
    model's tree). ``type`` is the registered submodule's class (kind
    ``module``; ``"None"`` when None is assigned), ``shape``/``dtype`` describe a
    parameter or buffer (None when the value is None, shape None for a lazy
    parameter). ``persistent`` is for buffers only. ``overwrites``: the parent
    already held a value under that name (registered earlier in this build, or
    present when the hook fired).
    """

    seq: int
    parent: str
    module: str | None
    parent_id: int
    kind: str
    name: str
    type: str | None
    shape: tuple[int, ...] | None
    dtype: str | None
    persistent: bool | None
    overwrites: bool


def _describe(value: Any) -> tuple[tuple[int, ...] | None, str | None]:
    """(shape, dtype) of a parameter or buffer; shape None when it has none yet (lazy)."""
    if value is None:
        return None, None
    from torch.nn.parameter import is_lazy

    dtype = str(getattr(value, "dtype", "")).removeprefix("torch.") or None
    if is_lazy(value):
        return None, dtype
    try:
        return tuple(int(d) for d in value.shape), dtype
    except Exception:  # an exotic tensor subclass without a plain shape
        return None, dtype


def _holds(parent: nn.Module, name: str) -> bool:
    for attr in ("_modules", "_parameters", "_buffers"):
        held = parent.__dict__.get(attr)
        if held is not None and held.get(name) is not None:
            return True
    return False


class RegistrationRecorder:
    """Context manager: the global registration hooks, installed for the ``with`` body."""

    def __init__(self) -> None:
        self._raw: list[dict[str, Any]] = []
        self._parents: dict[int, nn.Module] = {}  # strong refs: ids stay unique
        self._seen: set[tuple[int, str]] = set()
        self._pending: dict[str, Any] | None = None  # a buffer whose persistence is not set yet
        self._handles: list[RemovableHandle] = []

    # -- hooks -------------------------------------------------------------------
    def _settle(self) -> None:
        # register_buffer updates _non_persistent_buffers_set right after its hooks
        # return, so the flag is read at the next registration (or on exit).
        pending, self._pending = self._pending, None
        if pending is not None:
            parent = self._parents[pending["parent_id"]]
            nonpersistent = parent.__dict__.get("_non_persistent_buffers_set", set())
            pending["persistent"] = pending["name"] not in nonpersistent

    def _record(self, kind: str, parent: nn.Module, name: str, value: Any) -> dict[str, Any]:
        self._settle()
        key = (id(parent), name)
        self._parents[id(parent)] = parent
        raw: dict[str, Any] = {
            "kind": kind,
            "parent_id": id(parent),
            "parent": type(parent).__name__,
            "name": name,
            "type": None,
            "shape": None,
            "dtype": None,
            "persistent": None,
            "overwrites": key in self._seen or _holds(parent, name),
        }
        self._seen.add(key)
        if kind == MODULE:
            raw["type"] = type(value).__name__
        else:
            raw["shape"], raw["dtype"] = _describe(value)
        self._raw.append(raw)
        return raw

    def _on_module(self, parent: nn.Module, name: str, value: Any) -> None:
        self._record(MODULE, parent, name, value)

    def _on_parameter(self, parent: nn.Module, name: str, value: Any) -> None:
        self._record(PARAMETER, parent, name, value)

    def _on_buffer(self, parent: nn.Module, name: str, value: Any) -> None:
        self._pending = self._record(BUFFER, parent, name, value)

    # -- context -------------------------------------------------------------------
    def __enter__(self) -> RegistrationRecorder:
        from torch.nn.modules import module as module_mod

        try:
            self._handles.append(
                module_mod.register_module_module_registration_hook(self._on_module)
            )
            self._handles.append(
                module_mod.register_module_parameter_registration_hook(self._on_parameter)
            )
            self._handles.append(
                module_mod.register_module_buffer_registration_hook(self._on_buffer)
            )
        except BaseException:
            self._remove()
            raise
        return self

    def _remove(self) -> None:
        while self._handles:
            self._handles.pop().remove()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self._settle()
        finally:
            self._remove()

    # -- results -------------------------------------------------------------------
    def resolve(self, model: nn.Module | None) -> tuple[Registration, ...]:
        """Frozen rows, each parent named by its qualified name in ``model``."""
        names: dict[int, str] = {}
        if model is not None:
            for qualified, m in model.named_modules(remove_duplicate=True):
                names.setdefault(id(m), qualified)
        rows = tuple(
            Registration(
                seq=seq,
                parent=raw["parent"],
                module=names.get(raw["parent_id"]),
                parent_id=raw["parent_id"],
                kind=raw["kind"],
                name=raw["name"],
                type=raw["type"],
                shape=raw["shape"],
                dtype=raw["dtype"],
                persistent=raw["persistent"],
                overwrites=raw["overwrites"],
            )
            for seq, raw in enumerate(self._raw)
        )
        return rows

    def release(self) -> None:
        """Drop the references to the registering modules."""
        self._parents.clear()
