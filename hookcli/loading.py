"""MODEL string -> ``nn.Module``: torchvision names, ``pkg.mod:attr``, ``file.py:attr``,
``hf:NAME`` and ``timm:NAME``.

torchvision is imported only when the MODEL is a bare name (no ``:``, no ``.``),
which is how a torchvision name is written; transformers and timm only for their
prefixes. Every model is built where it will run (``build_on``): on meta no
parameter memory is ever allocated.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.util
import inspect
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from hookcli.errors import LoadError, ResourceError, UsageError, first_line, is_oom, oom_cause
from hookcli.kwargs import Offer, Tree, bind, plain, to_json, to_text
from hookcli.kwargs import parse_kwargs as parse_kwargs  # re-exported: MODEL's -k items
from hookcli.sources import LoadedModel

if TYPE_CHECKING:
    import torch
    from torch import nn

# torchvision submodules that name a model family; anything else is classification.
TORCHVISION_FAMILIES = ("detection", "segmentation", "video", "optical_flow", "quantization")


def is_torchvision_name(spec: str) -> bool:
    """A bare identifier is a torchvision model name."""
    return ":" not in spec and "." not in spec and "/" not in spec and spec.isidentifier()


def torchvision_names() -> list[str]:
    """Every name ``torchvision.models.list_models()`` knows."""
    import torchvision.models as tvm

    return sorted(tvm.list_models())


def torchvision_family(name: str) -> str:
    """The family of a torchvision model name: classification, detection, video, ..."""
    import torchvision.models as tvm

    for family in TORCHVISION_FAMILIES:
        if name in tvm.list_models(module=getattr(tvm, family)):
            return family
    return "classification"


def _seed(seed: int) -> None:
    import torch

    torch.manual_seed(seed)


def _build_torchvision(name: str, kwargs: dict[str, Any], seed: int) -> LoadedModel:
    try:
        import torchvision.models as tvm
    except Exception as err:  # a broken torchvision install is a load error, not a crash
        raise LoadError(f"cannot import torchvision to build {name!r}: {first_line(err)}") from err
    names = tvm.list_models()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise LoadError(
            f"unknown model {name!r}: not a torchvision model name{hint} "
            "(run `hookcli models` for the list; your own model is pkg.module:attr or file.py:attr)"
        )
    family = torchvision_family(name)
    kwargs = dict(kwargs)
    try:
        params = inspect.signature(tvm.get_model_builder(name)).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    if "weights_backbone" in params:
        kwargs.setdefault("weights_backbone", None)  # hookcli never downloads weights
    _seed(seed)
    try:
        with warnings.catch_warnings():
            # torchvision's notes on init schemes are noise in a report
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", UserWarning)
            module = tvm.get_model(name, weights=None, **kwargs)
    except Exception as err:
        raise LoadError(f"could not build torchvision model {name!r}: {first_line(err)}") from err
    return LoadedModel(module=module, spec=name, family=family, torchvision_name=name)


_FILE_MODULES: dict[str, ModuleType] = {}  # resolved path -> the module it was imported as


def imported_module(path: Path) -> ModuleType | None:
    """The module this run imported from ``path`` (the MODEL file), so that
    ``--inputs-from`` in the same file does not run it twice."""
    try:
        mod = _FILE_MODULES.get(str(path.resolve()))
    except OSError:
        return None
    if mod is not None and sys.modules.get(mod.__name__) is mod:
        return mod
    return None


def _first_on_path(folder: str) -> None:
    """``folder`` first on sys.path (moved there if it is already on it)."""
    while folder in sys.path:
        sys.path.remove(folder)
    sys.path.insert(0, folder)


def package_of(path: Path) -> tuple[Path, str] | None:
    """A file inside a package -> (the folder above the highest package with an
    ``__init__.py``, the file's dotted module name there); None for a loose file."""
    folder = path.resolve().parent
    parts = [] if path.stem == "__init__" else [path.stem]
    while (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    if len(parts) < 2 or not all(p.isidentifier() for p in parts):
        return None
    return folder, ".".join(parts)


def _import_file(path: Path) -> ModuleType:
    """Import a Python file: inside a package as ``pkg.mod`` from the package root (so its
    relative imports work), a loose file as its own name where that is free (so a sibling's
    ``from model import X`` is the same module), with its folder first on sys.path."""
    if not path.is_file():
        raise LoadError(f"model file not found: {path}")
    package = package_of(path)
    if package is not None:
        root, dotted = package
        top = dotted.partition(".")[0]
        held = sys.modules.get(top)
        held_at = [str(Path(p).resolve()) for p in getattr(held, "__path__", None) or []]
        if held is not None and str((root / top).resolve()) not in held_at:
            where = held_at[0] if held_at else getattr(held, "__file__", None) or "built in"
            raise LoadError(
                f"cannot import {path} as {dotted}: another package named {top!r} is already "
                f"imported (from {where})"
            )
        _first_on_path(str(root))
        with _argv(str(path)):
            module = _import_module(dotted, label=str(path))
        _FILE_MODULES[str(path.resolve())] = module
        return module
    directory = str(path.resolve().parent)
    _first_on_path(directory)
    stem = path.stem
    free = (
        stem.isidentifier()
        and stem not in sys.modules
        and stem not in sys.stdlib_module_names
        and not stem.startswith("hookcli")
    )
    mod_name = stem if free else f"hookcli_user_{stem}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise LoadError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        with _argv(str(path)):
            spec.loader.exec_module(module)
    except (Exception, SystemExit) as err:
        sys.modules.pop(mod_name, None)
        raise LoadError(f"error while importing {path}: {_why(err)}") from err
    _FILE_MODULES[str(path.resolve())] = module
    return module


@contextlib.contextmanager
def _argv(argv0: str) -> Iterator[None]:
    """``sys.argv`` is ``[argv0]`` while model code imports or builds (a training script's
    argparse or configurator must not read hookcli's own arguments)."""
    saved = sys.argv
    sys.argv = [argv0]
    try:
        yield
    finally:
        sys.argv = saved


@contextlib.contextmanager
def keep_cwd() -> Iterator[None]:
    """The working folder as it was, whatever model code does with ``os.chdir``: every
    other path of the command line (``-o``, ``--inputs-from``, ``--weights``) is read
    from the folder hookcli was started in."""
    try:
        saved = os.getcwd()
    except OSError:
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            if os.getcwd() != saved:
                os.chdir(saved)


def _import_module(name: str, label: str | None = None) -> ModuleType:
    """Import ``name`` with ``sys.argv`` = [its file], as ``python -m`` would have it."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: the current folder is importable
    shown = label or repr(name)
    if label is None:
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            found = None
        label_argv = (found.origin if found is not None else None) or name
    else:
        label_argv = label
    try:
        with _argv(label_argv):
            return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name and name.startswith(err.name):
            raise LoadError(f"cannot import module {name!r}: no module named {err.name!r}") from err
        raise LoadError(f"error while importing {shown}: {first_line(err)}") from err
    except (Exception, SystemExit) as err:
        raise LoadError(f"error while importing {shown}: {_why(err)}") from err


def _split_dotted(spec: str) -> tuple[ModuleType, str]:
    """``pkg.mod.Attr.build`` -> (imported ``pkg.mod``, ``Attr.build``): longest importable."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    parts = spec.split(".")
    for i in range(len(parts) - 1, 0, -1):
        mod_name = ".".join(parts[:i])
        try:
            found = importlib.util.find_spec(mod_name)
        except (ImportError, ValueError):
            found = None
        if found is not None:
            return _import_module(mod_name), ".".join(parts[i:])
    raise LoadError(
        f"cannot import {spec!r}: no module named {parts[0]!r} "
        "(write pkg.module:attr, pkg.module.attr or path/to/file.py:attr)"
    )


def _module_candidates(module: ModuleType) -> list[str]:
    from torch import nn

    out = []
    for key, value in vars(module).items():
        if key.startswith("_"):
            continue
        is_cls = inspect.isclass(value) and issubclass(value, nn.Module)
        if (is_cls and value.__module__ == module.__name__) or isinstance(value, nn.Module):
            out.append(key)
    return out


def user_function(where: str, attr: str) -> Any:
    """``FILE.py`` or ``pkg.mod``, and a name in it: the object (``--inputs-from``,
    ``--loss fn:``). The MODEL file already imported is not run again; LoadError when
    the file, the module or the name is not there."""
    if where.endswith(".py") or "/" in where:
        path = Path(where)
        module = imported_module(path) or _import_file(path)
        label = where
    else:
        module = _import_module(where)
        label = f"module {where!r}"
    return _resolve_attr(module, attr, label)


def _resolve_attr(module: ModuleType, attr: str, where: str) -> Any:
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise LoadError(f"{where} has no attribute {part!r}{hint}")
        obj = getattr(obj, part)
    return obj


def _why(err: BaseException) -> str:
    """The first line of an error; a SystemExit says the model called sys.exit."""
    if isinstance(err, SystemExit):
        return f"the model called {getattr(err, 'via', 'sys.exit')}({err.code!r})"
    return first_line(err)


def is_factory(obj: Any) -> bool:
    """An ``nn.Module`` subclass, or a function written in Python (a bound method or a
    ``functools.partial`` of one too): the only things a MODEL spec may call.

    Builtins (``os:system``, ``builtins:exec``) and other callables are never called.
    """
    import functools

    from torch import nn

    if inspect.isclass(obj):
        return issubclass(obj, nn.Module)
    if isinstance(obj, functools.partial):
        return is_factory(obj.func)
    if inspect.ismethod(obj):
        return is_factory(obj.__func__)
    return inspect.isfunction(obj) and not is_stdlib(obj)


def is_stdlib(obj: Any) -> bool:
    """A function defined in the standard library or builtins (``os:popen``,
    ``shutil:rmtree``): never a model factory, so ``-k`` cannot make it run."""
    top = str(getattr(obj, "__module__", None) or "").partition(".")[0]
    return top in sys.stdlib_module_names or top in ("builtins", "__builtin__")


def declared_non_module(obj: Any) -> str | None:
    """What a factory function's return annotation says when it rules out an nn.Module
    (``-> None`` as ``torch.save`` has, ``-> dict[str, int]``, a class that is neither an
    nn.Module nor one of its bases), so it is refused before it is called; else None.

    Only a sure no: no annotation, one that cannot be resolved, ``Any``, ``object``, a
    TypeVar, a protocol, or a union with room for a module lets the function run (it is
    trusted code, docs/exit-codes.md).
    """
    import functools
    import typing

    func = obj
    while isinstance(func, functools.partial) or inspect.ismethod(func):
        func = func.func if isinstance(func, functools.partial) else func.__func__
    if not inspect.isfunction(func):
        return None
    try:
        hints = typing.get_type_hints(func)
    except Exception:  # a forward reference that does not resolve: no telling
        return None
    if "return" not in hints or not _rules_out_module(hints["return"]):
        return None
    hint = hints["return"]
    return "None" if hint is type(None) else inspect.formatannotation(hint)


def _rules_out_module(hint: Any) -> bool:
    import types
    import typing

    from torch import nn

    if hint is type(None) or hint is None:
        return True
    if hint is typing.Any or isinstance(hint, typing.TypeVar):  # Any is a class on 3.11+
        return False
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return all(_rules_out_module(arg) for arg in typing.get_args(hint))
    if origin is typing.Annotated:
        return _rules_out_module(typing.get_args(hint)[0])
    if origin is typing.Literal:
        return True
    cls = origin if origin is not None else hint
    if not inspect.isclass(cls) or getattr(cls, "_is_protocol", False):
        return False
    try:  # issubclass(nn.Module, C): object, or an ABC a module satisfies (Callable)
        return not issubclass(cls, nn.Module) and not issubclass(nn.Module, cls)
    except TypeError:
        return False


def _instantiate(
    obj: Any, kwargs: dict[str, Any], spec: str, seed: int, offer: Offer | None = None
) -> nn.Module:
    from torch import nn

    if isinstance(obj, nn.Module):
        if kwargs:
            raise UsageError(f"{spec} is an nn.Module instance: --kwargs cannot be applied to it")
        from hookcli.preserve import keep_as_found

        keep_as_found(obj)  # it outlives the run: put back as found when the command ends
        return obj
    if not callable(obj):
        raise LoadError(f"{spec} is a {type(obj).__name__}, not an nn.Module, class or factory")
    if not is_factory(obj):
        kind = "a class" if inspect.isclass(obj) else f"a {type(obj).__name__}"
        func = getattr(obj, "func", None) or getattr(obj, "__func__", None) or obj
        if not inspect.isclass(obj) and inspect.isfunction(func) and is_stdlib(func):
            kind = f"a function of the standard library ({func.__module__})"
        raise LoadError(
            f"{spec} is {kind}, not a model factory: MODEL must name an nn.Module subclass, "
            "a Python function that returns an nn.Module (not one from the standard "
            "library or builtins), or an nn.Module instance"
        )
    declared = declared_non_module(obj)
    if declared is not None:
        raise LoadError(
            f"{spec} returns {declared} (so its return annotation says), not an nn.Module: "
            "not a model factory, so it was not called"
        )
    # config objects built, non-literals judged
    kwargs = bind(obj, kwargs, spec, offer, user_function)
    _seed(seed)
    try:
        with _argv(_argv0(obj, spec)):
            built = obj(**kwargs)
    except (Exception, SystemExit) as err:
        where = "its constructor" if inspect.isclass(obj) else "the factory"
        if isinstance(err, SystemExit):
            raise LoadError(f"could not build {spec}: {_why(err)} in {where}") from err
        raise LoadError(f"could not build {spec}: {first_line(err)}") from err
    if not isinstance(built, nn.Module):
        raise LoadError(f"{spec} returned a {type(built).__name__}, not an nn.Module")
    return built


def _argv0(obj: Any, spec: str) -> str:
    """What ``sys.argv[0]`` is while the factory runs: the file it is defined in."""
    module = sys.modules.get(getattr(obj, "__module__", "") or "")
    return str(getattr(module, "__file__", None) or spec)


# prefix -> builder(name, kwargs, seed) for the MODEL sources that need an extra
PREFIXES: dict[str, Callable[[str, dict[str, Any], int], LoadedModel]] = {}


_OFFLINE_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")


def force_offline() -> None:
    """Never touch the network, whatever the environment says (``HF_HUB_OFFLINE=0``).

    Sets the offline variables before transformers or huggingface_hub is imported (they
    read them at import), and the hub's constant when it is already imported. In an
    in-process run (``app([...])``) the previous values come back when the command ends.
    """
    saved = {k: os.environ.get(k) for k in _OFFLINE_ENV}
    constants = sys.modules.get("huggingface_hub.constants")
    saved_const = getattr(constants, "HF_HUB_OFFLINE", None)
    for key in _OFFLINE_ENV:
        os.environ[key] = "1"
    if constants is not None:
        setattr(constants, "HF_HUB_OFFLINE", True)  # noqa: B010 (a module mypy cannot see)

    def put_back() -> None:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        hub = sys.modules.get("huggingface_hub.constants")
        if hub is not None and saved_const is not None:
            setattr(hub, "HF_HUB_OFFLINE", saved_const)  # noqa: B010

    from hookcli.preserve import on_scope_end

    on_scope_end(put_back)


def _prefixed(prefix: str) -> Callable[[str, dict[str, Any], int], LoadedModel]:
    force_offline()  # before hookcli.sources.hf imports transformers
    if not PREFIXES:
        from hookcli.sources import hf, timm_models

        PREFIXES.update({"hf": hf.build, "timm": timm_models.build})
    return PREFIXES[prefix]


@contextlib.contextmanager
def build_on(device: torch.device | None) -> Iterator[None]:
    """Construct modules where the run happens.

    On meta nothing is allocated (``hookcli.metavalues.building_on_meta``): every
    factory makes its tensor on meta, an explicit ``device=`` or ``.to(device)`` in
    ``__init__`` included, and small tensors keep CPU shadows so construction code
    that reads values (``linspace(...).tolist()``) still works. On CUDA and other
    devices, torch's device context makes every factory call allocate there. On a
    device that is not CUDA, the model's own CUDA placements (``.cuda()``,
    ``device="cuda"``) go to the run's device, with a note (``hookcli.cudaredirect``).
    """
    if device is not None and device.type == "meta":
        from hookcli.metavalues import building_on_meta

        with building_on_meta():
            yield
        return
    from hookcli.cudaredirect import redirecting_cuda

    with redirecting_cuda(device):  # .cuda() in __init__ on a run that is not CUDA's
        if device is None or device.type == "cpu":
            yield
            return
        with device:
            yield


def _no_dotted(kw: Tree, source: str) -> None:
    if kw.dotted:
        raise UsageError(
            f"-k {kw.dotted[0]}=...: dotted keys build config objects for a Python class or "
            f"factory's parameters; {source} takes its keyword arguments by name (-k KEY=VALUE)"
        )


def _load(spec: str, kw: Tree, seed: int, offer: Offer | None = None) -> LoadedModel:
    prefix, sep, rest = spec.partition(":")
    if sep and prefix in ("hf", "timm"):
        if not rest.strip():
            raise UsageError(f"MODEL {spec!r} names no model after '{prefix}:'")
        _no_dotted(kw, f"{prefix}:")
        # hf: config attributes, which transformers checks itself (a text value included)
        given = {k: to_text(v) for k, v in kw.items()} if prefix == "hf" else plain(kw, spec)
        return _prefixed(prefix)(rest.strip(), given, seed)
    if is_torchvision_name(spec):
        _no_dotted(kw, "a torchvision model")
        return _build_torchvision(spec, plain(kw, spec), seed)
    if ":" in spec:
        left, attr = spec.rsplit(":", 1)
        if not attr:
            raise UsageError(f"MODEL {spec!r} names no attribute after ':'")
        _seed(seed)
        if left.endswith(".py") or "/" in left or os.sep in left:
            module = _import_file(Path(left))
            where = left
        else:
            module = _import_module(left)
            where = f"module {left!r}"
    elif spec.endswith(".py"):
        module = _import_file(Path(spec))
        cands = _module_candidates(module)
        hint = f" (candidates: {', '.join(cands)})" if cands else ""
        raise UsageError(f"name the model inside the file: {spec}:ATTR{hint}")
    else:
        _seed(seed)
        module, attr = _split_dotted(spec)
        where = f"module {module.__name__!r}"
    obj = _resolve_attr(module, attr, where)
    return LoadedModel(module=_instantiate(obj, kw, spec, seed, offer), spec=spec)


def _eager(loaded: LoadedModel) -> LoadedModel:
    """A torch.compile'd model is reported through the eager module it wraps."""
    from hookcli.scripted import eager_module

    module, note = eager_module(loaded.module)
    if note is None:
        return loaded
    print(note, file=sys.stderr, flush=True)
    return replace(loaded, module=module)


def load_model(
    spec: str,
    kwargs: Mapping[str, Any] | None = None,
    *,
    seed: int = 0,
    weights: Path | None = None,
    trust_pickle: bool = False,
    device: torch.device | None = None,
    model_parallel: int | None = None,
    part: str | None = None,
) -> LoadedModel:
    """Build the model a MODEL string names on ``device``, seeded with ``torch.manual_seed``.

    A model whose own construction code needs tensor values cannot be built on
    meta; it is built on the CPU instead and moved (a note on stderr says so).
    ``model_parallel``: the process and model-parallel groups of that size first
    (``hookcli.modelparallel``; torn down when the command's scope ends).
    ``part``: the submodule of that qualified name, taken after ``weights`` are applied.
    Both default to what the command line asked (``requested``).
    """
    kw = kwargs if isinstance(kwargs, Tree) else Tree(kwargs or {})
    spec = spec.strip()
    if not spec:
        raise UsageError("MODEL is empty: give a torchvision name, pkg.module:attr or file.py:attr")
    if model_parallel is None:
        model_parallel = _REQUESTED.get("model_parallel")
    if part is None:
        part = _REQUESTED.get("part")
    if model_parallel is not None:
        from hookcli.modelparallel import set_up
        from hookcli.preserve import on_scope_end

        on_scope_end(set_up(model_parallel))  # outside a scope (the API): the groups stay
    try:
        loaded = _load_checked(spec, kw, seed, weights, trust_pickle, device)
        if model_parallel is not None:
            settings = {**(loaded.settings or {}), "model_parallel": model_parallel}
            loaded = replace(loaded, settings=settings)
        return loaded if part is None else _part(loaded, part)
    except SystemExit as err:  # a source that does not wrap it (hf, timm, torchvision)
        raise LoadError(f"could not build {spec}: {_why(err)}") from err
    except (LoadError, RuntimeError, MemoryError, AssertionError) as err:
        if model_parallel is None:
            from hookcli.modelparallel import refusal

            refused = refusal(spec, err)
            if refused is not None:
                raise refused from err
        if not is_oom(err):
            raise
        cause = oom_cause(err)
        raise ResourceError(f"out of memory while building {spec}: {first_line(cause)}") from err


_REQUESTED: dict[str, Any] = {}  # the command line's --model-parallel and --part


@contextlib.contextmanager
def requested(model_parallel: int | None = None, part: str | None = None) -> Iterator[None]:
    """Hold ``--model-parallel`` and ``--part`` for one command (the CLI), for every
    ``load_model`` of it; cleared after it, whatever happened."""
    _REQUESTED.update(model_parallel=model_parallel, part=part)
    try:
        yield
    finally:
        _REQUESTED.clear()


def _part(loaded: LoadedModel, name: str) -> LoadedModel:
    """``--part NAME``: the built model's submodule ``NAME`` (``named_modules()``'s
    qualified name); an unknown one is exit 2 naming the nearest. The whole model's
    default inputs do not carry over: the part's ``example_input_array``, or ``-i``."""
    from torch import nn

    name = name.strip()
    names = [n for n, _ in loaded.module.named_modules(remove_duplicate=False) if n]
    try:
        module = loaded.module.get_submodule(name) if name else None
    except AttributeError:
        module = None
    if not isinstance(module, nn.Module) or module is loaded.module:
        close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
        if not close:  # nothing alike: the top-level modules, where a name starts
            close = [n for n in names if "." not in n][:8]
        listed = f"; nearest: {', '.join(close)}" if close else " (it has no submodules)"
        raise UsageError(f"--part {name!r}: {loaded.spec} has no such module{listed}")
    return replace(
        loaded,
        module=module,
        family=None,
        torchvision_name=None,
        default_inputs=(),
        input_source="",
        input_values=None,
        settings={**(loaded.settings or {}), "part": name},
    )


def _load_checked(
    spec: str,
    kw: Tree,
    seed: int,
    weights: Path | None,
    trust_pickle: bool,
    device: torch.device | None,
) -> LoadedModel:
    """``load_model`` less the SystemExit and out-of-memory mapping."""
    offer = None
    if weights is not None:
        from hookcli.weights import checkpoint_configs

        path = weights
        offer = Offer(lambda: checkpoint_configs(path, trust_pickle=trust_pickle), str(weights))
    try:
        with build_on(device), keep_cwd():
            loaded = _load(spec, kw, seed, offer)
    except LoadError as err:
        cause = err.__cause__
        if cause is None or device is None or device.type != "meta" or "meta" not in str(cause):
            raise
        print(
            f"hookcli: note: {spec} cannot be built on meta ({first_line(cause)}); "
            "building it on cpu, then moving it to meta",
            file=sys.stderr,
            flush=True,
        )
        with build_on(None), keep_cwd():
            loaded = _load(spec, kw, seed, offer)
    loaded = _eager(loaded)
    recorded: dict[str, Any] = {}
    if kw:
        recorded["kwargs"] = to_json(kw)
    if weights is not None:
        from hookcli.weights import apply_weights, sha256_of

        apply_weights(loaded.module, weights, trust_pickle=trust_pickle)
        record = {"path": str(weights), "sha256": sha256_of(weights)}
        if offer is not None and offer.used:
            record["config"] = offer.used[0]
        recorded["weights"] = record
    return replace(loaded, settings=recorded) if recorded else loaded
