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
- for a parameter with no annotation and no default (nanoGPT's and minGPT's ``def
  __init__(self, config):``), picks the config (``Binder.makers``): ``--config-class
  [PARAM=]CLASS`` where given; else a ``get_default_config()``-style class or static method
  of the model class, whose result is the start the fields are set on; else the one config
  class of the model's module whose fields hold the keys (``-k``'s and the checkpoint
  config's); several: exit 2 naming them; none: the dict as given;
- fills config parameters (and plain ones) from a config a ``--weights`` checkpoint holds
  (``model_args``, ``dims``, ``config``, ``hyper_parameters``) where ``-k`` leaves them,
  with ``-k`` values winning.

Hostile input is exit 2 in one short line: keys and values nested past ``MAX_DEPTH``, an
integer over Python's digit limit, fields given to a plain value, a key a JSON or YAML file
gives twice, YAML aliases that expand past ``ALIAS_BUDGET`` (counted on the composed nodes,
before anything is built); messages show long items clipped (``clip``).

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
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from hookcli.errors import LoadError, UsageError, clip, first_line

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
    """The parsed items; ``dotted``: the keys given with dots (``config.n_layer``);
    ``classes``: ``--config-class [PARAM=]CLASS`` as {PARAM or "": CLASS}."""

    dotted: tuple[str, ...] = ()
    classes: dict[str, str] = {}  # noqa: RUF012 (replaced per instance, never mutated)


class Raw(str):
    """A VALUE that is not a Python literal: a string only where the parameter takes one."""

    where: str = ""  # "-k config.act=gelu": how the message names it


# how deep a -k key and its value may nest (config.a.b... and {"a": {"b": ...}}), together
MAX_DEPTH = 64
CONFIG_CLASS = "--config-class"


def _where(item: str, key: str) -> str:
    source = getattr(item, "source", "-k")
    if source == "-k":
        return f"-k {clip(item)}"
    return f"{source}: {clip(key)}"


def config_class_items(values: list[str] | tuple[str, ...] | None) -> list[Item]:
    """``--config-class [PARAM=]CLASS`` values as items ``parse_kwargs`` reads (after the
    ``-k`` ones), so they travel with MODEL's keyword arguments."""
    return [Item.of(v, CONFIG_CLASS) for v in values or ()]


def _config_class_option(item: str, classes: dict[str, str]) -> None:
    param, sep, name = item.rpartition("=")
    param, name = param.strip(), name.strip()
    where, _, attr = name.rpartition(":")
    ok = all(p.isidentifier() for p in attr.split(".")) and (where.strip() != "" or ":" not in name)
    if not name or (sep and not param.isidentifier()) or not ok:
        raise UsageError(
            f"bad {CONFIG_CLASS} {clip(item)!r}: expected [PARAM=]CLASS, CLASS a name in the "
            "model's module (GPTConfig, GPT.get_default_config), pkg.mod:Name or file.py:Name"
        )
    classes[param] = name


def _depth(value: Any) -> int:
    """How deep containers nest in ``value`` (a scalar: 0); stops counting past MAX_DEPTH."""
    deepest = 0
    stack = [(value, 0)]
    while stack and deepest <= MAX_DEPTH:
        v, d = stack.pop()
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in (*v.keys(), *v.values()))
        elif isinstance(v, (list, tuple, set, frozenset)):
            stack.extend((x, d + 1) for x in v)
        else:
            continue
        deepest = max(deepest, d + 1)
    return deepest


def _too_deep(where: str, levels: int) -> UsageError:
    return UsageError(
        f"{where}: nested {'more than ' if levels > MAX_DEPTH else ''}{min(levels, MAX_DEPTH + 1)} "
        f"levels deep; hookcli takes configs nested at most {MAX_DEPTH} levels"
    )


def _literal(text: str, where: str) -> Any:
    """``text`` as a Python literal, ``Raw`` where it is none; exit 2 for one Python cannot
    read (an integer over its digit limit, nesting deeper than its parser's)."""
    try:
        return ast.literal_eval(text.strip() if text.strip() else text)
    except (ValueError, TypeError, SyntaxError) as err:
        if "digits" in str(err) and "limit" in str(err):
            limit = sys.get_int_max_str_digits()
            raise UsageError(
                f"{where}: an integer longer than Python reads ({limit} digits; "
                "PYTHONINTMAXSTRDIGITS raises the limit)"
            ) from None
    except (MemoryError, RecursionError):
        raise _too_deep(where, MAX_DEPTH + 1) from None
    raw = Raw(text)
    raw.where = where
    return raw


def parse_kwargs(items: tuple[str, ...] | list[str]) -> Tree:
    """``KEY=VALUE`` items -> a tree of values: dotted keys nest, a later item wins, dicts
    merge; a VALUE that is not a Python literal is kept as ``Raw`` for ``bind`` to judge.
    ``--config-class`` items (``config_class_items``) go to ``Tree.classes``."""
    tree = Tree()
    dotted: list[str] = []
    classes: dict[str, str] = {}
    for item in items:
        if getattr(item, "source", "") == CONFIG_CLASS:
            _config_class_option(item, classes)
            continue
        key, sep, text = item.partition("=")
        key = key.strip()
        parts = key.split(".")
        if not sep or not all(p.isidentifier() for p in parts):
            raise UsageError(
                f"bad --kwargs {clip(item)!r}: expected KEY=VALUE with KEY a Python identifier "
                "or a dotted path of them (e.g. -k num_classes=10, -k config.n_layer=2)"
            )
        where = _where(item, key)
        if len(parts) > MAX_DEPTH:
            raise _too_deep(where, len(parts))
        value = _literal(text, where)
        levels = len(parts) + _depth(value)
        if levels > MAX_DEPTH:
            raise _too_deep(where, levels)
        _put(tree, parts, value, where)
        if len(parts) > 1:
            dotted.append(key)
    tree.dotted = tuple(dotted)
    tree.classes = classes
    return tree


def _put(tree: dict[str, Any], parts: list[str], value: Any, where: str) -> None:
    node = tree
    for i, part in enumerate(parts[:-1]):
        inner = node.get(part)
        if inner is None:
            inner = node[part] = {}
        elif not isinstance(inner, dict):
            raise UsageError(
                f"{where}: {'.'.join(parts[: i + 1])} is already set to {clip(repr(inner))}, "
                "not to a config: give its fields as dotted keys or as one dict"
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
    if getattr(tree, "classes", None):
        raise UsageError(
            f"{CONFIG_CLASS}: {where} takes its keyword arguments by name; config classes are "
            "for a Python class or factory's parameters"
        )
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


_SCALARS = (bool, int, float, complex, str, bytes, list, tuple, set, frozenset)


def _takes_no_dict(hint: Any, default: Any) -> str | None:
    """What a parameter or field takes where that is a plain value, never a dict of fields
    (``n: int``; unannotated with a default of 4); None where a dict may be it."""
    if hint is None:
        if default is not None and isinstance(default, _SCALARS):
            return f"a {type(default).__name__} (its default is {clip(repr(default), 40)})"
        return None
    for member in _args(hint):
        origin = typing.get_origin(member) or member
        if origin is typing.Literal:
            continue
        if not inspect.isclass(origin) or hasattr(origin, "_fields"):
            return None
        if not issubclass(origin, (*_SCALARS, enum.Enum, pathlib.PurePath)):
            return None
    return _hint_text(hint)


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
    try:
        data = _load_table(text, suffix, where)
    except RecursionError:
        raise _too_deep(where, MAX_DEPTH + 1) from None
    except _Duplicate as dup:
        raise UsageError(
            f"{where}: the key {clip(repr(dup.key))} is given twice{dup.at}; give each key once"
        ) from None
    if data is None:
        return []
    if not isinstance(data, dict):
        raise UsageError(
            f"{where}: expected a table of keyword arguments (name: value), got a "
            f"{type(data).__name__}"
        )
    levels = _depth(data)
    if levels > MAX_DEPTH:
        raise _too_deep(where, levels)
    from hookcli.config import kwargs_items

    return [Item.of(text, where) for text in kwargs_items(data, where)]


class _Duplicate(Exception):
    """A key a JSON or YAML table gives twice (the later would win silently)."""

    def __init__(self, key: Any, at: str = "") -> None:
        super().__init__(key)
        self.key = key
        self.at = at


# how many values YAML aliases (``*name``) may add to what the file writes out: a few
# shared values are fine; a "billion laughs" (aliases of aliases) is refused before it grows
ALIAS_BUDGET = 1000


def _load_table(text: str, suffix: str, where: str) -> Any:
    """The file's text as data: exit 2 for a file that is not what its suffix says, a YAML
    file whose aliases expand past ALIAS_BUDGET, a key given twice."""
    if suffix == ".json":
        import json

        def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
            out: dict[str, Any] = {}
            for key, value in items:
                if key in out:
                    raise _Duplicate(key)
                out[key] = value
            return out

        try:
            return json.loads(text, object_pairs_hook=pairs)
        except ValueError as err:
            raise UsageError(f"{where}: not JSON: {err}") from None
    if suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise UsageError(f"{where}: reading YAML needs PyYAML (pip install pyyaml)") from None
        try:
            return yaml.load(text, Loader=_yaml_loader(where))
        except (yaml.YAMLError, ValueError) as err:  # ValueError: an int over Python's limit
            raise UsageError(
                f"{where}: not YAML: {clip(' '.join(str(err).split()), 300)}"
            ) from None
    if suffix == ".toml":
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover - Python 3.10
            try:
                import tomli as tomllib
            except ImportError:
                raise UsageError(f"{where}: reading TOML needs tomli on Python 3.10") from None
        try:
            return tomllib.loads(text)
        except ValueError as err:
            raise UsageError(f"{where}: not TOML: {err}") from None
    raise UsageError(f"{where}: give a .json, .yaml, .yml or .toml file")


def _yaml_loader(where: str) -> Any:
    """PyYAML's SafeLoader that refuses a key given twice in one mapping and aliases that
    expand past ALIAS_BUDGET (or into themselves), counted on the composed nodes before
    any value is built."""
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_document(self, node: Any) -> Any:
            _check_aliases(node, where)
            return super().construct_document(node)

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if isinstance(node, yaml.MappingNode):
                seen: set[Any] = set()
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue  # <<: *base may be overridden key by key
                    key = self.construct_object(key_node, deep=True)
                    with contextlib.suppress(TypeError):  # unhashable: PyYAML says so
                        if key in seen:
                            raise _Duplicate(key, f" (line {key_node.start_mark.line + 1})")
                        seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return Loader


def _check_aliases(root: Any, where: str) -> None:
    import yaml

    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: Any) -> int:  # the values this node stands for, aliases expanded
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise UsageError(f"{where}: an alias refers to the value that holds it (a cycle)")
        active.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(n) for n in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        active.discard(key)
        sizes[key] = total
        return total

    expanded = size(root)
    if expanded > len(sizes) + ALIAS_BUDGET:
        raise UsageError(
            f"{where}: its aliases (*name) expand {len(sizes):,} written values into "
            f"{expanded:,}; hookcli takes at most {ALIAS_BUDGET:,} more than the file writes "
            "(write the values out)"
        )


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


# a classmethod or staticmethod on the model class that returns its default config
# (minGPT's GPT.get_default_config())
_DEFAULT_CONFIG = re.compile(r"(get_)?default_?(config|cfg|conf|args|hparams|params)")
# names a config class is likely to have, where several classes fit the keys
_CONFIG_NAME = re.compile(r"(config|cfg|conf|args|arguments|hparams|params|dims|options)$", re.I)


@dataclasses.dataclass(frozen=True)
class Maker:
    """How a config parameter's object is made: a config class (on top of ``base``, a
    default instance, where there is one), or a function returning the start to set the
    fields on (``start``: minGPT's ``GPT.get_default_config``)."""

    label: str
    cls: Any = None
    base: Any = None
    start: Callable[[], Any] | None = None
    plain: bool = False  # --config-class dict: the dict itself

    def field_names(self) -> set[str] | None:
        """The names it takes; None: any."""
        if self.plain:
            return None
        if self.start is not None:
            obj = self.start()
            kind = config_kind(type(obj))
            if kind in ("dataclass", "namedtuple", "pydantic"):
                return (
                    None
                    if _fields_of(type(obj), kind).any_key
                    else set(_fields_of(type(obj), kind).fields)
                )
            return (
                {k for k in vars(obj) if not k.startswith("_")}
                if hasattr(obj, "__dict__")
                else None
            )
        kind = config_kind(self.cls)
        assert kind is not None
        fields = _fields_of(self.cls, kind)
        return None if fields.any_key else set(fields.fields)


def _takes_config(field: _Field) -> bool:
    """An unannotated parameter with no default (or None): its config class is inferred."""
    return field.hint is None and field.default is None


def _nn_module() -> Any:
    nn = sys.modules.get("torch.nn")
    return getattr(nn, "Module", None)


def _model_modules(target: Any) -> list[types.ModuleType]:
    """The module that defines MODEL (and the one defining its ``__init__``, if another)."""
    base = _unwrap(target)
    owners = [base, getattr(base, "__init__", None) if inspect.isclass(base) else None]
    out: list[types.ModuleType] = []
    for owner in owners:
        module = sys.modules.get(getattr(owner, "__module__", None) or "")
        if module is not None and module not in out:
            out.append(module)
    return out


def _default_starts(target: Any) -> list[Maker]:
    """``get_default_config()``-style class or static methods of the model class that take
    no argument."""
    cls = _unwrap(target)
    if not inspect.isclass(cls):
        return []
    out = []
    for name in dir(cls):
        if not _DEFAULT_CONFIG.fullmatch(name):
            continue
        raw = inspect.getattr_static(cls, name, None)
        if not isinstance(raw, (staticmethod, classmethod)):
            continue
        func = getattr(cls, name)
        try:
            params = inspect.signature(func).parameters.values()
        except (TypeError, ValueError):
            continue
        if all(
            p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params
        ):
            out.append(Maker(f"{cls.__name__}.{name}()", start=func))
    return out


def _module_configs(target: Any) -> list[tuple[Any, bool]]:
    """(class, defined there) for the config classes MODEL's module holds."""
    module_cls = _nn_module()
    model = _unwrap(target)
    out: list[tuple[Any, bool]] = []
    for module in _model_modules(target):
        for obj in list(vars(module).values()):
            if not inspect.isclass(obj) or obj is model or any(obj is c for c, _ in out):
                continue
            if issubclass(obj, BaseException) or (
                module_cls is not None and issubclass(obj, module_cls)
            ):
                continue
            if config_kind(obj) is None:
                continue
            out.append((obj, obj.__module__ == module.__name__))
    return out


def _covering(target: Any, keys: set[str]) -> list[Any]:
    """The config classes of MODEL's module that take these keys, best first by tier:
    classes with named fields that hold every key (defined there, then imported there);
    else those whose fields hold the most keys or names close to them (a typo is then
    named by the build); else classes that take any keyword (defined there, then
    imported). The first tier with any is returned; among several, those named like a
    config (``...Config``, ``...Args``) where that narrows it."""
    tiers: list[list[Any]] = [[], [], [], [], []]
    near: dict[Any, tuple[int, bool]] = {}
    for cls, local in _module_configs(target):
        kind = config_kind(cls)
        assert kind is not None
        fields = _fields_of(cls, kind)
        if fields.any_key:
            tiers[3 if local else 4].append(cls)
        elif keys <= set(fields.fields):
            tiers[0 if local else 1].append(cls)
        else:
            names = list(fields.fields)
            score = sum(
                1 for k in keys if k in names or difflib.get_close_matches(k, names, 1, 0.6)
            )
            if score:
                near[cls] = (score, local)
    if near:
        best = max(near.values())
        tiers[2] = [cls for cls, rank in near.items() if rank == best]
    model = getattr(_unwrap(target), "__name__", "")
    for tier in tiers:
        if tier:
            named = [c for c in tier if _CONFIG_NAME.search(c.__name__)]
            own = [c for c in named if model and c.__name__.startswith(model)]  # GPTConfig
            return own if len(own) == 1 else named if len(named) == 1 else tier
    return []


def _module_label(target: Any) -> str:
    modules = _model_modules(target)
    if not modules:
        return "the model's module"
    module = modules[0]
    path = getattr(module, "__file__", None)
    if not path:
        return module.__name__
    with contextlib.suppress(ValueError):
        inside = os.path.relpath(path)
        if not inside.startswith(".."):
            return inside
    return path


class Binder:
    """Binds one tree to one target, naming keys as the user wrote them."""

    def __init__(
        self, spec: str, offer: Offer | None, resolve: Callable[[str, str], Any] | None = None
    ) -> None:
        self.spec = spec
        self.offer = offer
        self.resolve = resolve  # FILE.py or pkg.mod, and a name -> the object (loading's)

    def bind(self, target: Any, tree: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments to call ``target`` with."""
        sig = _call_fields(target)
        classes = getattr(tree, "classes", None) or {}
        makers = self.makers(target, sig, tree, classes)
        out: dict[str, Any] = {}
        if self.offer is not None and sig.fields:
            self.fill_from_checkpoint(sig, makers, tree, out)
        for name, value in tree.items():
            if name in out:
                continue  # built from the checkpoint's config with these values on top
            field = sig.fields.get(name)
            maker = makers.get(name)
            if maker is not None and not maker.plain:
                if isinstance(value, Raw):
                    raise UsageError(_not_literal(value, maker.cls or object, self.spec))
                if isinstance(value, dict):
                    out[name] = self.make(maker, value, name)
                    continue
            if field is None:  # not a parameter: the call names it (exit 3), as before
                out[name] = self.value(value, None, None, name, self.spec)
            else:
                out[name] = self.value(value, field.hint, field.default, name, self.spec)
        for name, maker in makers.items():  # a required config no -k names: its defaults
            if (
                name not in out
                and name not in tree
                and sig.fields[name].required
                and not maker.plain
            ):
                out[name] = self.make(maker, {}, name)
        return out

    # -- which config each parameter takes ---------------------------------------------

    def makers(
        self, target: Any, sig: _Fields, tree: Mapping[str, Any], classes: Mapping[str, str]
    ) -> dict[str, Maker]:
        """For each parameter with no annotation that names its config (``def __init__(self,
        config)``): how its config is made, from ``--config-class`` or inferred from the
        model's module (the keys -k gives and the checkpoint's config)."""
        out: dict[str, Maker] = {}
        for param, name in self.named_classes(target, sig, tree, classes).items():
            out[param] = self.resolve_class(target, param, name)
        for param, field in sig.fields.items():
            if param in out or not _takes_config(field):
                continue
            given = tree.get(param)
            if isinstance(given, Raw):  # for the message: give its fields
                with contextlib.suppress(UsageError):
                    found = self.infer(target, sig, param, [set()], quiet=True)
                    if found is not None:
                        out[param] = found
                continue
            keysets: list[set[str]] = []
            given_keys = set(given) if isinstance(given, dict) else set()
            if self.offer is not None and (
                isinstance(given, dict) or (given is None and field.required)
            ):
                keysets += [set(data) | given_keys for _, data in self.offer.configs()]
            if isinstance(given, dict) or (given is None and field.required):
                keysets.append(given_keys)  # none given: the class's defaults, if one fits
            if keysets:
                found = self.infer(target, sig, param, keysets)
                if found is not None:
                    out[param] = found
        return out

    def named_classes(
        self, target: Any, sig: _Fields, tree: Mapping[str, Any], classes: Mapping[str, str]
    ) -> dict[str, str]:
        """``--config-class`` as {parameter: CLASS}; a CLASS with no PARAM goes to the one
        parameter with no annotation that -k gives fields for (or that has no default)."""
        out: dict[str, str] = {}
        for param, name in classes.items():
            if param:
                if param not in sig.fields:
                    raise UsageError(
                        f"{CONFIG_CLASS} {param}={name}: {self.spec} has no parameter "
                        f"{param!r} (parameters: {', '.join(sig.fields) or 'none'})"
                    )
                out[param] = name
                continue
            bare = [p for p, f in sig.fields.items() if _takes_config(f)]
            given = [p for p in bare if isinstance(tree.get(p), dict)]
            required = [p for p in bare if sig.fields[p].required]
            pick = given if len(given) == 1 else required if len(required) == 1 else bare
            if len(pick) != 1:
                shown = ", ".join(pick or list(sig.fields)) or "none"
                raise UsageError(
                    f"{CONFIG_CLASS} {name}: say which parameter of {self.spec} takes it: "
                    f"{CONFIG_CLASS} PARAM={name} (parameters: {shown})"
                )
            out[pick[0]] = name
        return out

    def resolve_class(self, target: Any, param: str, name: str) -> Maker:
        """``--config-class PARAM=CLASS``: a config class, or a function returning the
        config to start from, in the model's module or at ``pkg.mod:Name``/``file.py:Name``;
        ``dict``: the dict itself."""
        option = f"{CONFIG_CLASS} {param}={name}"
        if name == "dict":
            return Maker("dict", plain=True)
        where, sep, attr = name.rpartition(":")
        obj: Any
        if sep:
            if self.resolve is None:
                raise UsageError(f"{option}: a class by path is not available here")
            try:
                obj = self.resolve(where, attr)
            except LoadError as err:
                raise UsageError(f"{option}: {err}") from None
        else:
            modules = _model_modules(target)
            obj = None
            for module in modules:
                obj = module
                for part in attr.split("."):
                    obj = getattr(obj, part, None)
                if obj is not None:
                    break
            if obj is None:
                known = ", ".join(c.__name__ for c, _ in _module_configs(target))
                starts = ", ".join(m.label.removesuffix("()") for m in _default_starts(target))
                have = ", ".join(x for x in (known, starts) if x) or "none"
                raise UsageError(
                    f"{option}: no {attr!r} in {_module_label(target)} (config classes "
                    f"there: {have}); or give pkg.mod:Name or file.py:Name"
                )
        if inspect.isclass(obj) and config_kind(obj) is not None:
            return Maker(obj.__name__, cls=obj)
        if callable(obj) and not inspect.isclass(obj):
            label = getattr(obj, "__qualname__", None) or name
            return Maker(f"{label}()", start=obj)
        raise UsageError(
            f"{option}: {name} is not a config class (a dataclass, NamedTuple, pydantic model "
            "or class built from keywords) nor a function returning a config"
        )

    def infer(
        self, target: Any, sig: _Fields, param: str, keysets: list[set[str]], quiet: bool = False
    ) -> Maker | None:
        """The config of an unannotated parameter: the model class's ``get_default_config()``
        where it has one (the fields set on top of what it returns), else the one class of
        the model's module whose fields hold the keys (the first key set that picks one).
        Several: exit 2 naming them and ``--config-class``; none: None (a plain dict)."""
        bare = [p for p, f in sig.fields.items() if _takes_config(f)]
        starts = _default_starts(target)
        if starts and (
            len(bare) == 1 or any(s in param for s in ("config", "cfg", "conf", "args"))
        ):
            return starts[0]
        first: list[Any] = []
        for keys in keysets:
            found = _covering(target, keys)
            if len(found) == 1:
                return Maker(found[0].__name__, cls=found[0])
            first = first or found
        if len(first) > 1 and not quiet:
            names = [c.__name__ for c in first]
            head = f"-k {param}.FIELD=...: " if any(keysets) else ""
            fit = "take these fields" if any(keysets) else "could be its config"
            raise UsageError(
                f"{head}{param} of {self.spec} has no annotation, and {len(names)} classes "
                f"in {_module_label(target)} {fit} ({', '.join(names)}): name one, e.g. "
                f"{CONFIG_CLASS} {param}={names[0]}"
            )
        return None

    # -- building ----------------------------------------------------------------------

    def maker_of(self, name: str, field: _Field, makers: Mapping[str, Maker]) -> Maker | None:
        """How the config parameter ``name`` is made, where it takes one."""
        if name in makers:
            return None if makers[name].plain else makers[name]
        cls = _config_class(field.hint)
        if cls is not None:
            return Maker(cls.__name__, cls=cls)
        if field.hint is None and config_kind(type(field.default)) is not None:
            return Maker(type(field.default).__name__, cls=type(field.default), base=field.default)
        return None

    def make(self, maker: Maker, values: Mapping[Any, Any], key: str) -> Any:
        """The config object ``maker`` makes with ``values`` set on it."""
        if maker.start is None:
            return self.build(maker.cls, values, maker.base, key)
        try:
            obj = maker.start()
        except Exception as err:
            raise LoadError(
                f"could not build {self.spec}: {maker.label} for {key} raised {first_line(err)}"
            ) from err
        kind = config_kind(type(obj))
        if kind in ("dataclass", "namedtuple", "pydantic"):
            return self.build(type(obj), values, obj, key)
        if not hasattr(obj, "__dict__"):
            raise LoadError(
                f"could not build {self.spec}: {maker.label} returned a {type(obj).__name__}, "
                "which takes no fields"
            )
        where = f"{key} ({maker.label})"
        fields = [k for k in vars(obj) if not k.startswith("_")]
        for name, value in values.items():
            if not isinstance(name, str) or name not in fields:
                close = difflib.get_close_matches(str(name), fields, n=3, cutoff=0.6)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                raise UsageError(
                    f"-k {key}.{name}: {maker.label} has no field {name!r}{hint} (fields: "
                    f"{', '.join(fields) or 'none'})"
                )
            setattr(obj, name, self.value(value, None, getattr(obj, name), f"{key}.{name}", where))
        return obj

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
            takes = _takes_no_dict(hint, default)
            if takes is not None:
                first = next(iter(value), "FIELD")
                raise UsageError(
                    f"-k {key}.{first}=...: {key} takes {takes}, not a config's fields: "
                    f"give it one value, -k {key}=VALUE"
                )
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
        self,
        sig: _Fields,
        makers: Mapping[str, Maker],
        tree: Mapping[str, Any],
        out: dict[str, Any],
    ) -> None:
        """A config the checkpoint holds fills the config parameter ``-k`` leaves (as the
        start its fields are applied to), or the plain parameters ``-k`` leaves."""
        assert self.offer is not None
        configs = None
        for name, field in sig.fields.items():
            maker = self.maker_of(name, field, makers)
            given = tree.get(name)
            if maker is None or isinstance(given, Raw):
                continue
            if given is not None and not isinstance(given, dict):
                continue  # set whole by -k
            configs = self.offer.configs() if configs is None else configs
            names = maker.field_names()
            for ckey, data in configs:
                if names is None or set(data) <= names:
                    out[name] = self.make(maker, {**data, **(given or {})}, name)
                    self.used(ckey, data, f"{name} ({maker.label})")
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


def bind(
    target: Any,
    tree: Mapping[str, Any],
    spec: str,
    offer: Offer | None = None,
    resolve: Callable[[str, str], Any] | None = None,
) -> dict:
    """The keyword arguments to call ``target`` (MODEL's class or factory) with; ``resolve``
    finds ``--config-class FILE.py:Name`` / ``pkg.mod:Name`` (the loader's importer)."""
    return Binder(spec, offer, resolve).bind(target, tree)
