"""Real inputs: ``--input-file FILE`` (saved tensors) and ``--inputs-from SPEC`` (a callable).

``--input-file`` reads, without running any code from the file:

- ``.pt`` / ``.pth``: ``torch.load(FILE, weights_only=True)``: tensors, lists, tuples,
  dicts, numbers, strings, None;
- ``.safetensors``: a flat name -> tensor mapping;
- ``.npz``: a name -> array mapping (``allow_pickle=False``); ``.npy``: one array.

What the file holds becomes forward's arguments: a tensor is the one positional
input, a list or tuple the positional inputs, a dict the keyword inputs. In a
``.safetensors`` / ``.npz`` mapping, names ``0``, ``1``, ... are positional inputs and
the other names keyword inputs (the two mix: ``0`` and ``mask`` give
``forward(x, mask=...)``), and dotted names (``batch.x``) become nested dicts
(``batch={"x": ...}``). Nested structures pass as they are, at any depth.

``--inputs-from FILE.py:fn`` / ``pkg.mod:fn`` calls a Python function (trusted code,
like a model factory) right after ``torch.manual_seed(--seed)``; it returns ``args``
(a plain tuple or list), ``(args, kwargs)``, a dict (keyword inputs), or one value
(the single positional input).

Tensors move to ``--device``; floating tensors are cast to ``--dtype`` when it is given,
every other tensor keeps its dtype.
"""

from __future__ import annotations

import dataclasses
import stat
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hookcli.errors import LoadError, ResourceError, UsageError, first_line, is_oom
from hookcli.options import split_function_spec

if TYPE_CHECKING:
    import torch
    from torch import nn

    from hookcli.inputs.grammar import InputInfo, Inputs

SUFFIXES = (".pt", ".pth", ".safetensors", ".npz", ".npy")
_FORMATS = ".pt/.pth (torch.save), .safetensors, .npz or .npy"


@dataclasses.dataclass(frozen=True)
class FileInputs:
    """The inputs of a ``.safetensors`` / ``.npz`` mapping, already split: its numbered
    names are ``args``, the others ``kwargs``."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def check_input_file(path: Path) -> None:
    """A regular file with a known suffix, else exit 2 (before the model is built)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise UsageError(f"--input-file {path}: no such file") from None
    except OSError as err:
        raise UsageError(f"--input-file {path}: cannot read it: {first_line(err)}") from None
    if not stat.S_ISREG(st.st_mode):
        what = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise UsageError(f"--input-file {path}: {what}; give a {_FORMATS} file")
    if path.suffix.lower() not in SUFFIXES:
        raise UsageError(
            f"--input-file {path}: unknown format {path.suffix or '(no suffix)'!r}; "
            f"give a {_FORMATS} file"
        )


def read_input_file(path: Path) -> Any:
    """The structure saved in ``path``, tensors on the CPU (exit 2 when it cannot be read)."""
    check_input_file(path)
    suffix = path.suffix.lower()
    try:
        if suffix in (".pt", ".pth"):
            return _read_torch(path)
        if suffix == ".safetensors":
            return _mapping(_read_safetensors(path), path)
        return _read_numpy(path, suffix)
    except (RuntimeError, MemoryError) as err:
        if is_oom(err):
            raise ResourceError(f"out of memory reading --input-file {path}") from err
        raise


def _read_torch(path: Path) -> Any:
    import pickle

    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        import re

        full = str(err)
        found = re.search(r"GLOBAL ([\w.]+)", full) or re.search(r"global:? ([\w.]+)", full)
        if found:
            raise UsageError(
                f"--input-file {path}: holds a Python object ({found.group(1)}) that "
                "torch.load(weights_only=True) refuses to unpickle (only tensors, lists, tuples, "
                "dicts, numbers, strings and None are read); save plain structures, or build "
                "the inputs in Python with --inputs-from FILE.py:fn"
            ) from None
        m = re.search(r"WeightsUnpickler error:\s*(.+)", full)
        text = m.group(1).strip() if m else first_line(err)
        raise UsageError(f"--input-file {path}: not a torch.save file: {text}") from None
    except (RuntimeError, EOFError, ValueError, OSError, AttributeError, KeyError) as err:
        if isinstance(err, RuntimeError) and is_oom(err):
            raise
        raise UsageError(f"--input-file {path}: not a torch.save file: {first_line(err)}") from None


def _read_safetensors(path: Path) -> dict[str, Any]:
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise UsageError(
            f"--input-file {path}: reading .safetensors needs safetensors: "
            "pip install 'hookcli[safetensors]'"
        ) from None
    try:
        return dict(load_file(str(path), device="cpu"))
    except Exception as err:
        if is_oom(err):
            raise
        raise UsageError(
            f"--input-file {path}: not a safetensors file: {first_line(err)}"
        ) from None


def _read_numpy(path: Path, suffix: str) -> Any:
    import numpy as np
    import torch

    def tensor(array: Any, name: str) -> torch.Tensor:
        if not isinstance(array, np.ndarray):  # an .npz member that is not an .npy
            raise UsageError(f"--input-file {path}: {name} is not a NumPy array")
        if array.dtype.hasobject:
            raise UsageError(f"--input-file {path}: {name} holds Python objects, not numbers")
        try:
            if not array.dtype.isnative:  # saved big-endian: torch takes native order only
                array = array.astype(array.dtype.newbyteorder("="))
            # ascontiguousarray gives at least one dimension: a 0-d array stays 0-d
            return torch.from_numpy(np.ascontiguousarray(array).reshape(array.shape))
        except (TypeError, ValueError) as err:
            raise UsageError(f"--input-file {path}: {name}: {first_line(err)}") from None

    _check_numpy_sizes(path, suffix)
    with _numpy_errors(path, "not a NumPy file: "):
        loaded = np.load(path, allow_pickle=False)
    if suffix == ".npy":
        if not isinstance(loaded, np.ndarray):
            raise UsageError(f"--input-file {path}: a .npy file holding no array")
        return tensor(loaded, "the array")
    if not hasattr(loaded, "files"):
        raise UsageError(f"--input-file {path}: not an .npz archive (np.savez)")
    with _numpy_errors(path), loaded:  # OSError, EOFError: a truncated or corrupt member
        arrays = {name: tensor(loaded[name], repr(name)) for name in loaded.files}
    return _mapping(arrays, path)


@contextmanager
def _numpy_errors(path: Path, what: str = "") -> Iterator[None]:
    """NumPy's errors reading ``path`` as one line (exit 2): pickled objects refused, another
    ValueError after ``what``, a file NumPy cannot read as "not a NumPy file"."""
    try:
        yield
    except ValueError as err:
        if "pickle" in str(err).lower():
            raise UsageError(
                f"--input-file {path}: holds pickled Python objects, which hookcli does not "
                "unpickle; save numeric arrays, or use --inputs-from FILE.py:fn"
            ) from None
        raise UsageError(f"--input-file {path}: {what}{first_line(err)}") from None
    except (OSError, EOFError) as err:
        raise UsageError(f"--input-file {path}: not a NumPy file: {first_line(err)}") from None


def _read_header_3_0(fp: Any, npformat: Any) -> tuple[tuple[int, ...], Any]:
    """The shape and dtype of a version 3.0 ``.npy`` header (numpy writes it when a
    structured dtype's field names are not latin-1): a little-endian 4-byte length, then
    a utf-8 Python literal dict with ``descr``, ``fortran_order`` and ``shape``."""
    import ast
    import struct

    raw = fp.read(4)
    if len(raw) != 4:
        raise EOFError("truncated header length")
    (length,) = struct.unpack("<I", raw)
    text = fp.read(length)
    if len(text) != length:
        raise EOFError("truncated header")
    header = ast.literal_eval(text.decode("utf-8"))
    if not isinstance(header, dict) or not isinstance(header.get("shape"), tuple):
        raise ValueError("not an .npy header")
    shape = header["shape"]
    if not all(isinstance(d, int) for d in shape):
        raise ValueError("not an .npy shape")
    return shape, npformat.descr_to_dtype(header["descr"])


def _check_numpy_sizes(path: Path, suffix: str) -> None:
    """Each array's header against the bytes behind it, before anything is allocated:
    a header claiming more data than the file holds is a corrupt file (exit 2), not an
    out-of-memory error from allocating what it claims."""
    import zipfile

    from numpy.lib import format as npformat

    def check(fp: Any, available: int, what: str) -> None:
        try:
            version = npformat.read_magic(fp)
            if version == (1, 0):
                shape, _, dtype = npformat.read_array_header_1_0(fp)
            elif version == (2, 0):
                shape, _, dtype = npformat.read_array_header_2_0(fp)
            elif version == (3, 0):  # 2.0's layout with a utf-8 header: no public reader
                shape, dtype = _read_header_3_0(fp, npformat)
            else:
                return  # np.load says what is wrong with the version
        except (ValueError, OSError, EOFError, SyntaxError, TypeError):
            return  # np.load says what is wrong with the header
        if dtype.hasobject:
            return  # pickled objects: refused by np.load (allow_pickle=False)
        if any(d < 0 for d in shape):
            raise UsageError(
                f"--input-file {path}: corrupt file: {what}header claims shape {list(shape)}"
            )
        need = dtype.itemsize
        for d in shape:
            need *= d
        have = available - fp.tell()
        if need > have:
            raise UsageError(
                f"--input-file {path}: corrupt file: {what}header claims shape "
                f"{list(shape)} {dtype} ({need:,} bytes), but only {max(have, 0):,} bytes of "
                "data follow it"
            )

    try:
        if suffix == ".npy":
            with open(path, "rb") as fp:
                check(fp, path.stat().st_size, "")
            return
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.filename.endswith(".npy"):
                    with archive.open(info) as member:
                        check(member, info.file_size, f"{info.filename[:-4]!r}: ")
    except (OSError, EOFError, zipfile.BadZipFile, ValueError, RuntimeError):
        return  # np.load reports what it finds


def _mapping(flat: dict[str, Any], path: Path) -> FileInputs:
    """A flat name -> tensor mapping: ``0``, ``1``... are positional, other names are
    keywords (the two may mix); ``a.b`` nests, also under a number (``0.a``)."""
    if not flat:
        raise UsageError(f"--input-file {path}: holds no tensors")

    def numbered(name: str) -> bool:
        return name.isascii() and name.isdigit()

    for key in flat:
        head = key.split(".")[0]
        if not (numbered(head) or head.isidentifier()):
            raise UsageError(
                f"--input-file {path}: name {key!r} is neither a number 0, 1, ... (a "
                "positional input) nor a Python identifier (a keyword input)"
            )
    nested = _nest(flat, path)
    order = sorted((k for k in nested if numbered(k)), key=int)
    if [int(k) for k in order] != list(range(len(order))):
        raise UsageError(
            f"--input-file {path}: numbered names must be 0, 1, ... without gaps, got "
            f"{', '.join(order)}"
        )
    args = tuple(nested[k] for k in order)
    kwargs = {k: v for k, v in nested.items() if not numbered(k)}
    return FileInputs(args, kwargs)


def _nest(flat: dict[str, Any], path: Path) -> dict[str, Any]:
    """``{"a.b": t}`` -> ``{"a": {"b": t}}``."""
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        parts = key.split(".")
        node = nested
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise UsageError(f"--input-file {path}: {key!r} nests under the tensor {part!r}")
            node = child
        if parts[-1] in node:
            raise UsageError(f"--input-file {path}: {key!r} is both a tensor and a group")
        node[parts[-1]] = value
    return nested


def check_inputs_from(spec: str) -> tuple[str, str]:
    """``FILE.py:fn`` / ``pkg.mod:fn`` -> (where, attr); malformed is exit 2."""
    where, attr = split_function_spec(spec, f"--inputs-from {spec!r}")
    if where.endswith(".py") or "/" in where:
        path = Path(where)
        if not path.is_file():
            raise UsageError(f"--inputs-from {spec!r}: no such file {where}")
    return where, attr


def call_inputs_from(spec: str, seed: int) -> Any:
    """Import the function and call it right after ``torch.manual_seed(seed)``.

    A failure to import or in the function itself is exit 2 (the inputs could not be
    made), with its first line.
    """
    import inspect

    import torch

    from hookcli.loading import _why, user_function

    where, attr = check_inputs_from(spec)
    try:
        fn = user_function(where, attr)
    except LoadError as err:
        raise UsageError(f"--inputs-from {spec}: {err.message}") from err
    if not (inspect.isfunction(fn) or inspect.ismethod(fn)):
        raise UsageError(
            f"--inputs-from {spec}: {attr} is a {type(fn).__name__}, not a Python function"
        )
    torch.manual_seed(seed)
    try:
        return fn()
    except (Exception, SystemExit) as err:
        if isinstance(err, (RuntimeError, MemoryError)) and is_oom(err):
            raise ResourceError(f"out of memory in --inputs-from {spec}") from err
        raise UsageError(f"--inputs-from {spec} raised: {_why(err)}") from err


def split_args(
    value: Any, *, from_call: bool, source: str = ""
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """What the file holds (or the function returned) -> (args, kwargs).

    A dict is keyword inputs; a plain tuple or list the positional ones; anything else
    (a tensor, a namedtuple, a number) the one positional input. A function may also
    return ``(args, kwargs)``: a 2-tuple of a plain tuple/list and a dict. A
    ``FileInputs`` (a ``.safetensors`` / ``.npz`` mapping) is already split.
    ``source`` (``--input-file F``, ``--inputs-from S``) starts the error messages.
    """
    if isinstance(value, FileInputs):
        return value.args, dict(value.kwargs)
    if from_call and type(value) is tuple and len(value) == 2:
        first, second = value
        if type(first) in (tuple, list) and isinstance(second, Mapping):
            return tuple(first), _kwargs(second, from_call, source)
    if isinstance(value, Mapping):
        return (), _kwargs(value, from_call, source)
    if type(value) in (tuple, list):
        return tuple(value), {}
    return (value,), {}


def _kwargs(mapping: Mapping[Any, Any], from_call: bool, source: str) -> dict[str, Any]:
    bad = [k for k in mapping if not isinstance(k, str) or not k.isidentifier()]
    if bad:
        if from_call:
            hint = "return [dict] to pass it as one positional input"
        else:  # a torch.save file: a mapping file never gets here (FileInputs)
            hint = "save [dict] to pass it as one positional input"
        raise UsageError(
            f"{source + ': ' if source else ''}keyword inputs must be named by Python "
            f"identifiers, got {bad[0]!r} (a dict is forward's keyword inputs: {hint})"
        )
    return dict(mapping)


def infos_of(names: list[str], args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[InputInfo]:
    """One InputInfo per tensor anywhere in the inputs, named by its path."""
    from hookcli.inputs.grammar import InputInfo, dtype_name
    from hookcli.structures import iter_named_tensors

    out: list[InputInfo] = []
    labelled = [(names[i] if i < len(names) else f"input{i}", v) for i, v in enumerate(args)]
    labelled += list(kwargs.items())
    for label, value in labelled:
        for path, t in iter_named_tensors(value, label):
            out.append(InputInfo(path, tuple(t.shape), dtype_name(t.dtype)))
    return out


def move(value: Any, device: torch.device, float_dtype: torch.dtype | None) -> Any:
    """Every tensor at any depth moved to ``device`` (floating ones cast to ``float_dtype``),
    by ``move_tensors``' one rule for every source of inputs."""
    from hookcli.structures import move_tensors

    return move_tensors(value, device, float_dtype)


def real_inputs(
    model: nn.Module,
    *,
    input_file: Path | None,
    inputs_from: str | None,
    preloaded: Any = None,
    seed: int,
    dtype: str | None,
    device: torch.device,
) -> Inputs:
    """The Inputs of ``--input-file`` (``preloaded``: what it holds, read before the build)
    or of ``--inputs-from``, moved and cast."""
    from hookcli.inputs.grammar import Inputs, positional_names, torch_dtype

    if input_file is not None:
        value = preloaded if preloaded is not None else read_input_file(input_file)
        source = f"--input-file {input_file}"
        args, kwargs = split_args(value, from_call=False, source=source)
    else:
        assert inputs_from is not None
        value = call_inputs_from(inputs_from, seed)
        source = f"--inputs-from {inputs_from}"
        args, kwargs = split_args(value, from_call=True, source=source)
    float_dtype = torch_dtype(dtype) if dtype else None
    try:
        args = tuple(move(a, device, float_dtype) for a in args)
        kwargs = {k: move(v, device, float_dtype) for k, v in kwargs.items()}
    except (RuntimeError, MemoryError) as err:
        if is_oom(err):
            raise ResourceError(f"out of memory moving the inputs to {device}") from err
        raise UsageError(
            f"{source}: cannot move the inputs to {device}: {first_line(err)}"
        ) from err
    _check_signature(model, args, kwargs, source)
    infos = infos_of(positional_names(model), args, kwargs)
    return Inputs(args, kwargs, tuple(infos), source)


def _check_signature(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], source: str
) -> None:
    """Arguments forward cannot take are exit 2, with forward's signature."""
    import inspect

    from hookcli.inputs.grammar import _plain_signature

    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return
    shown = f"{type(model).__name__}.forward{_plain_signature(sig)}"
    P = inspect.Parameter
    params = sig.parameters
    if not any(p.kind is P.VAR_KEYWORD for p in params.values()):
        for key in kwargs:
            if key not in params or params[key].kind in (P.POSITIONAL_ONLY, P.VAR_POSITIONAL):
                raise UsageError(f"{source}: forward takes no keyword input {key!r}: {shown}")
    try:
        sig.bind(*args, **kwargs)
    except TypeError as err:
        raise UsageError(f"{source}: {err}: {shown}") from None


def initialize_lazy(model: nn.Module, inputs: Inputs) -> None:
    """Give lazy modules (``nn.LazyLinear``, ...) their real parameters before any hook
    goes on: one plain forward in eval mode under ``no_grad``, the RNG state and the
    training flags restored after. Without it, hooks on uninitialized parameters (the
    tensor hooks of ``grads``, the storages ``cost`` follows) fail. A note on stderr
    says so; nothing happens for a model without lazy parameters.
    """
    import torch

    from hookcli.errors import RunError
    from hookcli.modelinfo import is_lazy

    lazy = [n for n, p in model.named_parameters() if is_lazy(p)]
    lazy += [n for n, b in model.named_buffers() if is_lazy(b)]
    if not lazy:
        return
    print(
        f"hookcli: note: {len(lazy)} parameter(s)/buffer(s) of lazy modules are not "
        "initialized: one forward in eval mode (no hooks, no grad) initializes them first",
        file=sys.stderr,
        flush=True,
    )
    modes = {m: m.training for m in model.modules()}
    rng = torch.get_rng_state()
    try:
        model.eval()
        with torch.no_grad():
            model(*inputs.args, **dict(inputs.kwargs))
    except Exception as err:
        if is_oom(err):
            raise ResourceError(
                f"out of memory initializing lazy modules: {first_line(err)}"
            ) from err
        raise RunError(
            f"forward failed while initializing lazy modules: {first_line(err)}"
        ) from err
    finally:
        torch.set_rng_state(rng)
        for m, training in modes.items():
            m.training = training
