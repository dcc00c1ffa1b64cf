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
    from typing import Unpack

    from torch import nn
    from torch.utils.hooks import RemovableHandle

    from hookcli.commandargs import BuildArgs
    from hookcli.report import Report
    from hookcli.sources import LoadedModel

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


TOP_PARENTS = 3


def _fmt_module(value: Any) -> str:
    if value is None:
        return "(not in model)"
    return value or "(root)"


def _what(r: Registration) -> str:
    """The Type / shape cell: a submodule's class, or a tensor's shape and dtype."""
    from hookcli.render import fmt_shape

    if r.kind == MODULE:
        return str(r.type)
    if r.dtype is None:
        return "None"
    shape = "(lazy)" if r.shape is None else fmt_shape(r.shape)
    return f"{shape} {r.dtype}"


def registrations_report(
    loaded: LoadedModel, regs: tuple[Registration, ...], *, seed: int, depth: int | None
) -> Report:
    """The registration rows (owners at depth <= ``depth``), totals and table layout."""
    from collections import Counter

    from hookcli.modelinfo import depth_of
    from hookcli.render import fmt_bool
    from hookcli.report import Column, Report, Row

    rows = []
    for r in regs:
        if depth is not None and (r.module is None or depth_of(r.module) > depth):
            continue
        data: dict[str, Any] = {
            "seq": r.seq,
            "parent": r.parent,
            "module": r.module,
            "kind": r.kind,
            "name": r.name,
            "type": r.type,
            "shape": None if r.shape is None else list(r.shape),
            "dtype": r.dtype,
            "persistent": r.persistent,
            "overwrites": r.overwrites,
        }
        display: dict[str, Any] = {"what": _what(r)}
        if r.overwrites:
            display["mark"] = "(again)"
        rows.append(Row.of(data, display))

    per_kind = Counter(r.kind for r in regs)
    per_parent = Counter(r.parent_id for r in regs)
    first: dict[int, Registration] = {}
    for r in regs:
        first.setdefault(r.parent_id, r)
    top = [
        {"module": first[pid].module, "parent": first[pid].parent, "count": n}
        for pid, n in per_parent.most_common(TOP_PARENTS)
    ]
    overwrites = sum(1 for r in regs if r.overwrites)
    outside = sum(1 for r in regs if r.module is None)
    totals = {
        "registrations": len(regs),
        **{kind: per_kind.get(kind, 0) for kind in KINDS},
        "overwrites": overwrites,
        "outside_model": outside,
        "top_parents": top,
    }
    notes = []
    from hookcli.scripted import is_scripted

    if is_scripted(loaded.module):
        notes.append(
            "the model is a TorchScript module: the registrations were made by the eager "
            "modules it was scripted or traced from, which are not in it"
        )
    if not regs:
        notes.append(
            "no registration was seen: the model registers nothing, or it was built before "
            "hookcli could watch (an nn.Module instance in a module imported earlier)"
        )
    summary = ", ".join(f"{per_kind.get(k, 0)} {k}s" for k in KINDS)
    busiest = ", ".join(f"{_fmt_module(t['module'])} ({t['parent']}) {t['count']}" for t in top)
    table_totals = [("Registrations", f"{len(regs)}: {summary}, {overwrites} overwrites")]
    if busiest:
        table_totals.append(("Busiest parents", busiest))
    if outside:
        table_totals.append(("Not in the built model", f"{outside} registrations"))
    return Report(
        command="registrations",
        model={"spec": loaded.spec, "class": type(loaded.module).__name__},
        settings={"seed": seed, **dict(loaded.settings or {})},  # kwargs, weights
        totals=totals,
        lists={"registrations": tuple(rows)},
        primary="registrations",
        notes=tuple(notes),
        columns=(
            Column("seq", "Seq", str, "right"),
            Column("module", "Module", _fmt_module),
            Column("parent", "Parent"),
            Column("kind", "Kind"),
            Column("name", "Name"),
            Column("what", "Type / shape"),
            Column("persistent", "Persistent", fmt_bool),
        ),
        table_totals=tuple(table_totals),
    )


def cli_command(
    *,
    device: str,
    depth: int | None,
    **common: Unpack[BuildArgs],
) -> int:
    """The registrations command's run (``hookcli registrations``): record the build, emit."""
    from hookcli.commandargs import model_part, output_part
    from hookcli.inputs.grammar import resolve_device
    from hookcli.loading import is_torchvision_name
    from hookcli.pipeline import build_model, emit

    mopts, out = model_part(common), output_part(common, depth)
    if is_torchvision_name(mopts.spec.strip()):
        # Import torchvision before the hooks go in: only the model's own build is recorded.
        import torchvision.models  # noqa: F401

    recorder = RegistrationRecorder()
    with recorder:
        loaded = build_model(mopts, resolve_device(device))
    regs = recorder.resolve(loaded.module)
    recorder.release()
    return emit(registrations_report(loaded, regs, seed=mopts.seed, depth=out.depth), out)
