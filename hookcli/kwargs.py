"""``-k KEY=VALUE`` and ``--kwargs-file FILE`` -> the keyword arguments a model is built with.

Parsing knows no target: ``parse_kwargs`` turns the items into a tree (dotted keys
``config.n_layer=2`` nest, ``config={"n_layer": 2}`` is the same tree) whose leaves are
Python literals, or ``Raw`` for a VALUE that is not one. Binding knows the target:
``bind`` reads the signature of the class or factory MODEL names and

- builds a config object for a parameter annotated with a dataclass, a NamedTuple, a
  pydantic model or a class whose constructor takes keywords (or, unannotated, whose
  default is such an object), from the dict the tree holds for it, recursively;
- lets a ``Raw`` value through as a string only where the parameter takes one (annotated
  ``str``, a ``Literal`` of strings, a path or an enum member's name; unannotated with a
  string default); anywhere else it is exit 2 naming the key, never a silent string;
- fills config parameters (and plain ones) from a config a ``--weights`` checkpoint holds
  (``model_args``, ``dims``, ``config``, ``hyper_parameters``) where ``-k`` leaves them,
  with ``-k`` values winning.

No torch import here.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import difflib
import enum
import inspect
import os
import pathlib
import sys
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from hookcli.errors import LoadError, UsageError, first_line

# checkpoint keys that hold a model's config, most specific first (nanoGPT's model_args,
# whisper's dims, the config many trainers save, Lightning's hyper_parameters)
CHECKPOINT_CONFIG_KEYS = ("model_args", "dims", "config", "hyper_parameters")


class Item(str):
    """One ``KEY=VALUE`` item with where it came from (``-k`` or ``--kwargs-file FILE``)."""

    source: str = "-k"

    @staticmethod
    def of(text: str, source: str) -> Item:
        item = Item(text)
        item.source = source
        return item


class Tree(dict[str, Any]):
    """The parsed items; ``dotted``: the keys given with dots (``config.n_layer``)."""

    dotted: tuple[str, ...] = ()


class Raw(str):
    """A VALUE that is not a Python literal: a string only where the parameter takes one."""

    where: str = ""  # "-k config.act=gelu": how the message names it


def _where(item: str, key: str) -> str:
    source = getattr(item, "source", "-k")
    if source == "-k":
        return f"-k {item}"
    return f"{source}: {key}"


def parse_kwargs(items: tuple[str, ...] | list[str]) -> Tree:
    """``KEY=VALUE`` items -> a tree of values: dotted keys nest, a later item wins, dicts
    merge; a VALUE that is not a Python literal is kept as ``Raw`` for ``bind`` to judge."""
    tree = Tree()
    dotted: list[str] = []
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        parts = key.split(".")
        if not sep or not all(p.isidentifier() for p in parts):
            raise UsageError(
                f"bad --kwargs {item!r}: expected KEY=VALUE with KEY a Python identifier or "
                "a dotted path of them (e.g. -k num_classes=10, -k config.n_layer=2)"
            )
        value: Any
        try:
            value = ast.literal_eval(text.strip() if text.strip() else text)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            value = Raw(text)
            value.where = _where(item, key)
        _put(tree, parts, value, _where(item, key))
        if len(parts) > 1:
            dotted.append(key)
    tree.dotted = tuple(dotted)
    return tree


def _put(tree: dict[str, Any], parts: list[str], value: Any, where: str) -> None:
    node = tree
    for i, part in enumerate(parts[:-1]):
        inner = node.get(part)
        if inner is None:
            inner = node[part] = {}
        elif not isinstance(inner, dict):
            raise UsageError(
                f"{where}: {'.'.join(parts[: i + 1])} is already set to {inner!r}, not to a "
                "config: give its fields as dotted keys or as one dict"
            )
        node = inner
    last = parts[-1]
    if isinstance(value, dict) and isinstance(node.get(last), dict):
        _merge(node[last], value)
    else:
        node[last] = value


def _merge(into: dict[Any, Any], new: Mapping[Any, Any]) -> None:
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


def plain(tree: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The tree for a source that takes no config objects (torchvision, timm): a VALUE
    that is not a literal is exit 2 naming the key."""
    for value in _leaves(tree):
        if isinstance(value, Raw):
            raise UsageError(_not_literal(value, None, where))
    return dict(tree)


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    else:
        yield value


def _not_literal(raw: Raw, hint: Any, target: str) -> str:
    key = raw.where.removeprefix("-k ").split("=", 1)[0]
    name = key.rsplit(": ", 1)[-1]
    takes = f" ({target} takes {_hint_text(hint)})" if hint is not None else ""
    if config_kind(_config_class(hint)) is not None:
        fix = f"give its fields: -k {name}.FIELD=VALUE, or -k '{name}={{\"FIELD\": VALUE}}'"
    else:
        fix = f"quote a string: -k '{name}=\"{raw}\"'"
    return f"{raw.where}: {str(raw)!r} is not a Python literal{takes}; {fix}"


def _hint_text(hint: Any) -> str:
    if inspect.isclass(hint):
        return hint.__name__
    return inspect.formatannotation(hint)


def to_text(value: Any) -> Any:
    """A ``Raw`` value as the plain string it is, at any depth (for a source that takes text
    and checks it itself: hf's config attributes)."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, dict):
        return {k: to_text(v) for k, v in value.items()}
    return value


def to_json(tree: Any) -> Any:
    """The tree as JSON values for ``settings.kwargs``: tuples and sets as lists, other
    literals (bytes, complex) as their repr."""
    if isinstance(tree, Mapping):
        return {str(k): to_json(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [to_json(v) for v in tree]
    if isinstance(tree, (set, frozenset)):
        return [to_json(v) for v in sorted(tree, key=repr)]
    if isinstance(tree, Raw):
        return str(tree)
    if tree is None or isinstance(tree, (str, bool, int, float)):
        return tree
    return repr(tree)


# -- --kwargs-file ------------------------------------------------------------------------


def read_file(path: Path) -> list[Item]:
    """``--kwargs-file FILE`` (.json, .yaml/.yml, .toml) -> ``-k`` items, nested tables as
    dicts; exit 2 for a file that cannot be read or is not a table of names."""
    where = f"--kwargs-file {path}"
    if not path.is_file():
        raise UsageError(f"{where}: no such file" if not path.exists() else f"{where}: not a file")
    suffix = path.suffix.lower()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"{where}: cannot read it: {first_line(err)}") from None
    data: Any
    if suffix == ".json":
        import json

        try:
            data = json.loads(text)
        except ValueError as err:
            raise UsageError(f"{where}: not JSON: {err}") from None
    elif suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise UsageError(f"{where}: reading YAML needs PyYAML (pip install pyyaml)") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise UsageError(f"{where}: not YAML: {' '.join(str(err).split())}") from None
    elif suffix == ".toml":
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover - Python 3.10
            try:
                import tomli as tomllib
            except ImportError:
                raise UsageError(f"{where}: reading TOML needs tomli on Python 3.10") from None
        try:
            data = tomllib.loads(text)
        except ValueError as err:
            raise UsageError(f"{where}: not TOML: {err}") from None
    else:
        raise UsageError(f"{where}: give a .json, .yaml, .yml or .toml file")
    if data is None:
        return []
    if not isinstance(data, dict):
        raise UsageError(
            f"{where}: expected a table of keyword arguments (name: value), got a "
            f"{type(data).__name__}"
        )
    from hookcli.config import kwargs_items

    return [Item.of(text, where) for text in kwargs_items(data, where)]


def with_file(items: list[str] | None, path: Path | None) -> list[str] | None:
    """The ``-k`` items with the file's first, so the command line wins."""
    if path is None:
        return items
    return [*read_file(path), *(items or [])]


# -- binding to the target's signature ------------------------------------------------


@dataclasses.dataclass
class Offer:
    """The configs a ``--weights`` checkpoint holds, read once when first asked for."""

    read: Callable[[], list[tuple[str, dict[str, Any]]]]
    path: str = ""
    used: list[str] = dataclasses.field(default_factory=list)
    _cache: list[tuple[str, dict[str, Any]]] | None = None

    def configs(self) -> list[tuple[str, dict[str, Any]]]:
        if self._cache is None:
            self._cache = self.read()
        return self._cache


@dataclasses.dataclass(frozen=True)
class _Field:
    hint: Any  # None: unknown
    required: bool
    default: Any = None


@dataclasses.dataclass(frozen=True)
class _Fields:
    fields: dict[str, _Field]
    any_key: bool  # **kwargs: every name is taken


def _unwrap(obj: Any) -> Any:
    import functools

    while isinstance(obj, functools.partial) or inspect.ismethod(obj):
        obj = obj.func if isinstance(obj, functools.partial) else obj.__func__
    return obj


def _hints(func: Any) -> dict[str, Any]:
    """Resolved annotations of a function or class; per name where some do not resolve."""
    try:
        return typing.get_type_hints(func)
    except Exception:
        pass
    raw = getattr(func, "__annotations__", None) or {}
    module = sys.modules.get(getattr(func, "__module__", "") or "")
    scope = dict(vars(module)) if module is not None else {}
    out = {}
    for name, ann in dict(raw).items():
        if isinstance(ann, str):
            try:
                ann = eval(ann, scope)  # the model's own annotation text, in its module
            except Exception:
                continue
        out[name] = ann
    return out


def _call_fields(target: Any) -> _Fields:
    """The keyword parameters of a class's constructor or a function, with their hints."""
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return _Fields({}, True)
    base = _unwrap(target)
    hints = _hints(base.__init__ if inspect.isclass(base) else base)
    fields = {}
    any_key = False
    for name, p in sig.parameters.items():
        if p.kind is p.VAR_KEYWORD:
            any_key = True
            continue
        if p.kind in (p.VAR_POSITIONAL, p.POSITIONAL_ONLY):
            continue
        hint = hints.get(name)
        if hint is None and p.annotation is not p.empty and not isinstance(p.annotation, str):
            hint = p.annotation
        default = None if p.default is p.empty else p.default
        fields[name] = _Field(hint, p.default is p.empty, default)
    return _Fields(fields, any_key)


_NOT_CONFIG_MODULES = ("builtins", "typing", "collections", "pathlib", "enum", "torch", "numpy")


def config_kind(cls: Any) -> str | None:
    """dataclass, namedtuple, pydantic or keywords (a class built from keywords); else None."""
    try:
        return _config_kind(cls)
    except TypeError:  # a generic alias that passes for a class (Python 3.10)
        return None


def _config_kind(cls: Any) -> str | None:
    if not inspect.isclass(cls) or typing.get_origin(cls) is not None:
        return None
    if dataclasses.is_dataclass(cls):
        return "dataclass"
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return "namedtuple"
    if hasattr(cls, "model_fields") and hasattr(cls, "model_validate"):
        return "pydantic"
    if hasattr(cls, "__fields__") and hasattr(cls, "parse_obj"):
        return "pydantic"
    top = (cls.__module__ or "").partition(".")[0]
    if top in _NOT_CONFIG_MODULES or top in sys.stdlib_module_names:
        return None
    if issubclass(cls, (enum.Enum, type, os.PathLike, Mapping)) or cls.__init__ is object.__init__:
        return None
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY, p.VAR_KEYWORD) for p in params):
        return "keywords"
    return None


def _args(hint: Any) -> tuple[Any, ...]:
    """A union's members (Optional's None left out), Annotated unwrapped; else (hint,)."""
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        return _args(typing.get_args(hint)[0])
    if origin in (typing.Union, types.UnionType):
        return tuple(a for arg in typing.get_args(hint) for a in _args(arg) if a is not type(None))
    return (hint,)


def _config_class(hint: Any) -> Any:
    """The one config class a hint names (``GPTConfig``, ``Optional[GPTConfig]``); None where
    it names none, or where it also takes a plain dict."""
    if hint is None:
        return None
    members = _args(hint)
    if any((typing.get_origin(m) or m) in (dict, Mapping, typing.Any) for m in members):
        return None
    found = [m for m in members if config_kind(m) is not None]
    return found[0] if len(found) == 1 else None


def _fields_of(cls: Any, kind: str) -> _Fields:
    if kind == "dataclass":
        hints = _hints(cls)
        out = {}
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            missing = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            default = None if f.default is dataclasses.MISSING else f.default
            out[f.name] = _Field(hints.get(f.name), missing, default)
        return _Fields(out, False)
    if kind == "namedtuple":
        hints = _hints(cls)
        defaults = getattr(cls, "_field_defaults", {})
        return _Fields(
            {n: _Field(hints.get(n), n not in defaults, defaults.get(n)) for n in cls._fields},
            False,
        )
    if kind == "pydantic":
        model_fields = getattr(cls, "model_fields", None)
        if model_fields is not None:  # pydantic 2
            return _Fields(
                {
                    n: _Field(f.annotation, bool(f.is_required()), f.default)
                    for n, f in model_fields.items()
                },
                getattr(cls, "model_config", {}).get("extra") == "allow",
            )
        return _Fields(  # pydantic 1
            {
                n: _Field(f.outer_type_, bool(f.required), f.default)
                for n, f in cls.__fields__.items()
            },
            False,
        )
    return _call_fields(cls)


def _values_of(obj: Any, kind: str, fields: _Fields) -> dict[str, Any]:
    """A config object's field values (a default instance, to start from)."""
    if kind == "dataclass":
        return {n: getattr(obj, n) for n in fields.fields if hasattr(obj, n)}
    if kind == "namedtuple":
        return dict(obj._asdict())
    if kind == "pydantic":
        dump = getattr(obj, "model_dump", None) or obj.dict
        return dict(dump())
    out = {n: getattr(obj, n) for n in fields.fields if hasattr(obj, n)}
    if fields.any_key:
        out.update({k: v for k, v in vars(obj).items() if not k.startswith("_")})
    return out


def as_mapping(value: Any) -> dict[str, Any] | None:
    """A config a checkpoint holds as a dict of names (or, unpickled, an object)."""
    if isinstance(value, Mapping):
        data = dict(value)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        data = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    elif hasattr(value, "_asdict"):
        data = dict(value._asdict())
    elif hasattr(value, "__dict__") and not inspect.isclass(value):
        data = dict(vars(value))
    else:
        return None
    if not data or not all(isinstance(k, str) and k.isidentifier() for k in data):
        return None
    return data


class Binder:
    """Binds one tree to one target, naming keys as the user wrote them."""

    def __init__(self, spec: str, offer: Offer | None) -> None:
        self.spec = spec
        self.offer = offer

    def bind(self, target: Any, tree: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments to call ``target`` with."""
        sig = _call_fields(target)
        out: dict[str, Any] = {}
        for name, value in tree.items():
            field = sig.fields.get(name)
            if field is None:  # not a parameter: the call names it (exit 3), as before
                out[name] = self.value(value, None, None, name, self.spec)
            else:
                out[name] = self.value(value, field.hint, field.default, name, self.spec)
        if self.offer is not None and sig.fields:
            self.fill_from_checkpoint(sig, tree, out)
        return out

    def value(self, value: Any, hint: Any, default: Any, key: str, target: str) -> Any:
        """One value for a parameter or field with this hint and default."""
        cls = _config_class(hint)
        if cls is None and hint is None and config_kind(type(default)) is not None:
            cls = type(default)
        if isinstance(value, Raw):
            return self.raw(value, hint, default, target)
        if cls is not None and isinstance(value, dict):
            base = default if isinstance(default, cls) else None
            return self.build(cls, value, base, key)
        if (
            cls is not None
            and config_kind(cls) == "namedtuple"
            and isinstance(value, (list, tuple))
            and not isinstance(value, cls)
        ):
            return self.build(cls, dict(zip(cls._fields, value, strict=False)), None, key)
        if isinstance(value, dict):  # a plain dict parameter: Raw leaves still judged
            return {k: self.value(v, None, None, f"{key}.{k}", target) for k, v in value.items()}
        return value

    def raw(self, raw: Raw, hint: Any, default: Any, target: str) -> Any:
        """A VALUE that is not a literal: what a parameter that takes text makes of it."""
        text = str(raw)
        if hint is None:
            if isinstance(default, str):
                return text
            raise UsageError(_not_literal(raw, None, target))
        for member in _args(hint):
            origin = typing.get_origin(member)
            if member is str:
                return text
            if origin is typing.Literal and text in typing.get_args(member):
                return text
            if inspect.isclass(member) and issubclass(member, pathlib.PurePath):
                return member(text)
            if member is os.PathLike:
                return Path(text)
            if inspect.isclass(member) and issubclass(member, enum.Enum):
                if text in member.__members__:
                    return member[text]
                with contextlib.suppress(ValueError):
                    return member(text)
        raise UsageError(_not_literal(raw, hint, target))

    def build(self, cls: Any, values: Mapping[Any, Any], base: Any, key: str) -> Any:
        """``cls`` built from ``values`` (on top of ``base``'s, where there is one)."""
        kind = config_kind(cls)
        assert kind is not None
        fields = _fields_of(cls, kind)
        where = f"{key} ({cls.__name__})"
        given: dict[str, Any] = {}
        for name, value in values.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise UsageError(f"-k {key}: {name!r} is not a field name of {cls.__name__}")
            field = fields.fields.get(name)
            if field is None and not fields.any_key:
                close = difflib.get_close_matches(name, list(fields.fields), n=3, cutoff=0.6)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                raise UsageError(
                    f"-k {key}.{name}: {cls.__name__} has no field {name!r}{hint} (fields: "
                    f"{', '.join(fields.fields) or 'none'})"
                )
            if field is None:
                given[name] = self.value(value, None, None, f"{key}.{name}", where)
            else:
                given[name] = self.value(value, field.hint, field.default, f"{key}.{name}", where)
        start = _values_of(base, kind, fields) if base is not None else {}
        merged = {**start, **given}
        missing = [n for n, f in fields.fields.items() if f.required and n not in merged]
        if missing:
            raise UsageError(
                f"-k {key}: {cls.__name__} needs {', '.join(missing)}: give "
                + ", ".join(f"-k {key}.{n}=VALUE" for n in missing[:3])
                + (" ..." if len(missing) > 3 else "")
                + " (or --kwargs-file)"
            )
        try:
            if kind == "dataclass" and base is not None:
                return dataclasses.replace(base, **given)
            return cls(**merged)
        except Exception as err:
            raise LoadError(
                f"could not build {self.spec}: building {cls.__name__} for {key} raised "
                f"{first_line(err)}"
            ) from err

    def fill_from_checkpoint(
        self, sig: _Fields, tree: Mapping[str, Any], out: dict[str, Any]
    ) -> None:
        """A config the checkpoint holds fills the config parameter ``-k`` leaves (as the
        start its fields are applied to), or the plain parameters ``-k`` leaves."""
        assert self.offer is not None
        configs = None
        for name, field in sig.fields.items():
            cls = _config_class(field.hint)
            if cls is None and field.hint is None and field.default is not None:
                cls = type(field.default) if config_kind(type(field.default)) else None
            if cls is None or isinstance(tree.get(name), Raw):
                continue
            given = tree.get(name)
            if given is not None and not isinstance(given, dict):
                continue  # set whole by -k
            configs = self.offer.configs() if configs is None else configs
            kind = config_kind(cls)
            assert kind is not None
            fields = _fields_of(cls, kind)
            for ckey, data in configs:
                if fields.any_key or set(data) <= set(fields.fields):
                    values = {**data, **(given or {})}
                    out[name] = self.build(cls, values, None, name)
                    self.used(ckey, data, f"{name} ({cls.__name__})")
                    return
        configs = self.offer.configs() if configs is None else configs
        for ckey, data in configs:
            if set(data) <= set(sig.fields) and not set(data) <= set(tree):
                for name, value in data.items():
                    if name not in tree:
                        field = sig.fields[name]
                        out[name] = self.value(value, field.hint, field.default, name, self.spec)
                self.used(ckey, data, "the parameters -k leaves")
                return
        if configs:
            keys = ", ".join(repr(k) for k, _ in configs)
            print(
                f"hookcli: note: --weights {self.offer.path} holds a config under {keys}, but "
                f"its names fit no parameter of {self.spec} (nor the fields of a config "
                "parameter): not used",
                file=sys.stderr,
                flush=True,
            )

    def used(self, ckey: str, data: Mapping[str, Any], what: str) -> None:
        assert self.offer is not None
        self.offer.used.append(ckey)
        shown = ", ".join(f"{k}={v!r}" for k, v in list(data.items())[:8])
        more = ", ..." if len(data) > 8 else ""
        print(
            f"hookcli: note: --weights {self.offer.path} holds a config under {ckey!r} "
            f"({shown}{more}); it fills {what}; -k values win",
            file=sys.stderr,
            flush=True,
        )


def bind(target: Any, tree: Mapping[str, Any], spec: str, offer: Offer | None = None) -> dict:
    """The keyword arguments to call ``target`` (MODEL's class or factory) with."""
    return Binder(spec, offer).bind(target, tree)
