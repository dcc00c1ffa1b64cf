"""The input grammar (docs/reference.md "Inputs") -> seeded example tensors.

    SPEC  := [NAME=][DTYPE:]DIMS[:LOW..HIGH]     DIMS: 2x16, or scalar / () for 0-d
           | [NAME=]sparse:[DTYPE:]DIMS[:DENSITY]   a sparse COO tensor
           | [NAME=]py:LITERAL                  a Python value; tensor("SPEC") and
                                                tensor(VALUE) inside it are tensors

Inputs are drawn, in the order declared, from one ``torch.Generator`` seeded
with ``--seed``: floating inputs with ``torch.randn(shape, generator=g,
dtype=...)``, integer ones with ``torch.randint(low, high, shape, generator=g)``
(then cast), so a figure can be reproduced with plain torch.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from hookcli.errors import ResourceError, UsageError, first_line, is_oom
from hookcli.fmt import fmt_bytes
from hookcli.options import DTYPES, FLOAT_DTYPES

if TYPE_CHECKING:
    import torch
    from torch import nn

GRAMMAR = (
    "grammar: [NAME=][DTYPE:]DIMS[:LOW..HIGH], DIMS like 1x3x224x224 or 1,3,224,224 (scalar: "
    f"0-d), DTYPE one of {'|'.join(DTYPES)}; or sparse:[DTYPE:]DIMS[:DENSITY]; or py:LITERAL "
    'with tensor("SPEC") inside; e.g. -i 8x3x32x32, -i int64:2x16:0..1000, -i mask=bool:2x16, '
    "-i int64:scalar:0..10, -i sparse:100x100:0.05, -i start_pos=py:0"
)
SCALAR_DIMS = ("scalar", "()")
DEFAULT_DENSITY = 0.1
INT_DTYPES = ("int64", "long", "int32", "bool")
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
# What torch.randint can draw for each integer dtype: [low, high), high exclusive.
_INT_RANGES = {"int64": (INT64_MIN, INT64_MAX), "int32": (-(2**31), 2**31), "bool": (0, 2)}
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4}
DEVICES = "cpu, cuda, cuda:N, mps, meta"

# Per-name overrides of the torchvision family defaults (the family default does not fit).
_NAME_DEFAULTS: dict[str, str] = {
    "inception_v3": "1x3x299x299",
    "quantized_inception_v3": "1x3x299x299",
    "mvit_v1_b": "1x3x16x224x224",
    "mvit_v2_s": "1x3x16x224x224",
    "s3d": "1x3x16x224x224",
}
_FAMILY_DEFAULTS: dict[str, tuple[str, ...]] = {
    "classification": ("1x3x224x224",),
    "quantization": ("1x3x224x224",),
    "segmentation": ("1x3x224x224",),
    "video": ("1x3x16x112x112",),
    "detection": ("3x224x224",),  # one image, passed as a list
    "optical_flow": ("1x3x224x224", "1x3x224x224"),
}


@dataclass(frozen=True)
class InputSpec:
    """One parsed ``--input``."""

    dims: tuple[int, ...]
    dtype: str | None = None  # None: float32, or --dtype
    low: int = 0
    high: int = 2
    name: str | None = None
    as_list: bool = False  # a list of dims[0] tensors (torchvision detection images)
    text: str = ""
    kind: str = "dense"  # "dense", "sparse" (COO, ``density``) or "py" (``value``)
    density: float = DEFAULT_DENSITY
    # kind "py": the literal, with InputSpec (tensor("SPEC")) and Fixed (tensor(VALUE)) in it
    value: Any = field(default=None, compare=False)


@dataclass(frozen=True)
class Fixed:
    """``tensor(VALUE)`` inside a ``py:`` literal: ``torch.tensor(VALUE, dtype=...)``."""

    value: Any
    dtype: str | None = None


@dataclass(frozen=True)
class InputInfo:
    """One input tensor as the report lists it."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


@dataclass(frozen=True)
class Inputs:
    """What ``forward`` is called with, and where it came from."""

    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    infos: tuple[InputInfo, ...]
    source: str


def _bad(text: str, why: str) -> UsageError:
    shown = text if len(text) <= 200 else f"{text[:120]}...{text[-40:]}"  # a line, not a page
    return UsageError(f"bad input spec {shown!r}: {why}; {GRAMMAR}")


def parse_spec(text: str) -> InputSpec:
    """Parse one SPEC; a malformed one raises UsageError showing the grammar."""
    raw = text.strip()
    name: str | None = None
    body = raw
    if "=" in raw and not raw.startswith(("py:", "sparse:")):  # a literal may hold '='
        name, _, body = raw.partition("=")
        name = name.strip()
        if not name.isidentifier():
            raise _bad(text, f"keyword name {name!r} is not a Python identifier")
        body = body.strip()
    if body.startswith("py:"):
        return InputSpec(dims=(), name=name, text=text, kind="py", value=_py(body[3:], text))
    sparse = body.startswith("sparse:")
    parts = body.split(":")[1 if sparse else 0 :]
    dtype: str | None = None
    if parts and parts[0] in DTYPES:
        dtype = "int64" if parts[0] == "long" else parts[0]
        parts = parts[1:]
    elif parts and parts[0] and parts[0][0].isalpha() and parts[0] not in SCALAR_DIMS:
        raise _bad(text, f"unknown dtype {parts[0]!r}")
    if not parts or not parts[0]:
        raise _bad(text, "no DIMS")
    if len(parts) > 2:
        raise _bad(text, "too many ':'-separated parts")
    dims = _dims(parts[0], text)
    if sparse:
        return _sparse(dims, dtype, parts[1:], name, text)
    check_size(dims, dtype, text)
    low, high = 0, 2
    if len(parts) == 2:
        if dtype not in INT_DTYPES:
            raise _bad(text, "LOW..HIGH is for integer inputs: give an integer DTYPE (int64:...)")
        lo, sep, hi = parts[1].partition("..")
        try:
            low, high = int(lo), int(hi)
        except ValueError:
            raise _bad(text, "the range must be LOW..HIGH with whole numbers") from None
        if not sep or low >= high:
            raise _bad(text, "the range must be LOW..HIGH with LOW < HIGH (HIGH exclusive)")
        assert dtype is not None
        lowest, highest = _INT_RANGES[dtype]
        if low < lowest or high > highest:
            raise _bad(
                text, f"LOW..HIGH must lie within {lowest}..{highest} for {dtype} (HIGH exclusive)"
            )
    return InputSpec(dims=dims, dtype=dtype, low=low, high=high, name=name, text=text)


def _dims(text: str, spec: str) -> tuple[int, ...]:
    """``2x16`` / ``2,16`` -> (2, 16); ``scalar`` or ``()`` -> () (a 0-d tensor)."""
    if text in SCALAR_DIMS:
        return ()
    try:
        dims = tuple(int(d) for d in text.replace(",", "x").split("x"))
    except ValueError:
        raise _bad(spec, "DIMS must be whole numbers joined by 'x' or ','") from None
    if any(d < 1 for d in dims):
        raise _bad(spec, "every dimension must be at least 1")
    return dims


def _sparse(
    dims: tuple[int, ...], dtype: str | None, rest: list[str], name: str | None, text: str
) -> InputSpec:
    """``sparse:[DTYPE:]DIMS[:DENSITY]``: floating values, DENSITY in (0, 1]."""
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise _bad(
            text, f"a sparse input's values are drawn with randn: DTYPE {dtype} is not floating"
        )
    if not dims:
        raise _bad(text, "a sparse input needs at least one dimension")
    density = DEFAULT_DENSITY
    if rest:
        try:
            density = float(rest[0])
        except ValueError:
            density = -1.0
        if not 0 < density <= 1:
            raise _bad(text, f"DENSITY must be a number in (0, 1], got {rest[0]!r}")
    numel = 1
    for d in dims:
        numel *= d
    if numel > INT64_MAX:
        raise _bad(text, f"DIMS hold {numel:.3g} elements, more than int64 indices address")
    check_size((_nnz(numel, density),), dtype, text)
    return InputSpec(dims=dims, dtype=dtype, name=name, text=text, kind="sparse", density=density)


def _nnz(numel: int, density: float) -> int:
    """How many positions a sparse input draws: ``round(density * numel)``, at least 1."""
    return max(1, round(density * numel))


_PY_FORMS = (
    "py: takes a Python literal (numbers, strings, True/False/None, lists, tuples, dicts) "
    'whose tensors are written tensor("SPEC") (drawn) or tensor(VALUE) (as torch.tensor)'
)


def _py(source: str, text: str) -> Any:
    """A ``py:`` literal parsed (never evaluated): ``tensor(...)`` calls become InputSpec /
    Fixed placeholders, drawn later in the order they are written."""
    import ast

    try:
        tree = ast.parse(source.strip(), mode="eval")
        return _literal(tree.body, text)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        if isinstance(err, UsageError):
            raise
        raise _bad(text, f"not a Python literal ({first_line(err)}); {_PY_FORMS}") from None


def _literal(node: Any, text: str) -> Any:
    import ast

    if isinstance(node, ast.Constant):
        return node.value
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, (ast.USub, ast.UAdd))
        and isinstance(node.operand, ast.Constant)
        and type(node.operand.value) in (int, float, complex)
    ):
        value: Any = node.operand.value
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, (ast.List, ast.Tuple)) and not any(
        isinstance(e, ast.Starred) for e in node.elts
    ):
        items = [_literal(e, text) for e in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.Dict) and None not in node.keys:
        out = {}
        for k, v in zip(node.keys, node.values, strict=True):
            assert k is not None  # (no ** unpacking: refused above)
            key = _literal(k, text)
            if _holds_tensor(key):
                raise _bad(text, "a dict key cannot be a tensor")
            try:
                if key in out:
                    raise _bad(text, f"dict key {ast.unparse(k)} is given twice")
                out[key] = _literal(v, text)
            except TypeError:  # an unhashable key ([1])
                raise _bad(text, f"dict key {ast.unparse(k)} is not hashable") from None
        return out
    if isinstance(node, ast.Call) and _is_tensor_call(node.func):
        return _tensor_call(node, text)
    shown = ast.unparse(node)
    raise _bad(text, f"{shown[:60]!r} is neither a literal nor tensor(...); {_PY_FORMS}")


def _is_tensor_call(func: Any) -> bool:
    import ast

    if isinstance(func, ast.Name):
        return func.id == "tensor"
    return (
        isinstance(func, ast.Attribute)
        and func.attr == "tensor"
        and isinstance(func.value, ast.Name)
        and func.value.id == "torch"
    )


def _tensor_call(node: Any, text: str) -> InputSpec | Fixed:
    """``tensor("SPEC")`` -> the SPEC (drawn); ``tensor(VALUE[, dtype="int32"])`` -> Fixed."""
    import ast

    keywords = {k.arg: k.value for k in node.keywords}
    if len(node.args) != 1 or any(k not in ("dtype",) for k in keywords):
        raise _bad(
            text, 'tensor(...) takes one argument: tensor("SPEC") or tensor(VALUE[, dtype=...])'
        )
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        if keywords:
            raise _bad(text, 'tensor("SPEC") takes its dtype inside the SPEC ("int64:2x16")')
        inner = parse_spec(arg.value)
        if inner.kind == "py" or inner.name is not None:
            raise _bad(
                text, f"tensor({arg.value!r}): the SPEC is [DTYPE:]DIMS[:LOW..HIGH] or sparse:..."
            )
        return inner
    value = _literal(arg, text)
    if _holds_tensor(value) or not _numeric(value):
        raise _bad(text, "tensor(VALUE) takes a number, a bool or nested lists of them")
    dtype = None
    if "dtype" in keywords:
        given = keywords["dtype"]
        name = given.value if isinstance(given, ast.Constant) else None
        if name not in DTYPES:
            raise _bad(text, f"tensor(..., dtype=...) must be one of {'|'.join(DTYPES)} (a string)")
        dtype = "int64" if name == "long" else name
    return Fixed(value, dtype)


def _holds_tensor(value: Any) -> bool:
    if isinstance(value, (InputSpec, Fixed)):
        return True
    if isinstance(value, (list, tuple)):
        return any(_holds_tensor(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_tensor(v) for v in value.values())
    return False


def _numeric(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_numeric(v) for v in value)
    return type(value) in (int, float, bool, complex)


def check_size(dims: Sequence[int], dtype: str | None, text: str) -> None:
    """Dims whose element count or byte size overflows int64 are a usage error (exit 2).

    A size that fits but exceeds the memory is left to the allocator (exit 5).
    """
    numel = 1
    for d in dims:
        numel *= d
    itemsize = _ITEMSIZE.get(dtype or "", 8)  # no dtype yet: --dtype may make it float64
    if numel * itemsize > INT64_MAX:
        raise _bad(
            text,
            f"DIMS hold {numel:.3g} elements, more than a tensor can address (2**63 bytes)",
        )


def parse_device(text: str) -> tuple[str, int | None]:
    """``--device`` -> (type, index), without torch: cpu, cuda, cuda:N, mps or meta.

    Anything else (``CPU``, ``tpu``, ``cpu:5``) is exit 2 listing hookcli's devices.
    """
    kind, sep, index = text.partition(":")
    if kind in ("cpu", "mps", "meta") and not sep:
        return kind, None
    if kind == "cuda" and not sep:
        return kind, None
    if kind == "cuda" and index.isascii() and index.isdigit():
        return kind, int(index)
    why = "not a device hookcli runs on"
    if kind in ("cpu", "mps", "meta"):
        why = f"{kind} takes no device index"
    elif kind == "cuda":
        why = "the CUDA index must be a whole number (cuda:0)"
    elif kind.strip().lower() in ("cpu", "cuda", "mps", "meta"):
        why = f"device names are lower case ({kind.strip().lower()}{sep}{index})"
    raise UsageError(f"bad --device {text!r}: {why}; hookcli's devices: {DEVICES}")


def torch_dtype(name: str) -> torch.dtype:
    """``float16`` -> ``torch.float16``; ``long`` is int64."""
    import torch

    return {
        "float32": torch.float32,
        "float16": torch.float16,
        "bfloat16": torch.bfloat16,
        "float64": torch.float64,
        "int64": torch.int64,
        "long": torch.int64,
        "int32": torch.int32,
        "bool": torch.bool,
    }[name]


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``float32``."""
    return str(dtype).removeprefix("torch.")


def _draw(
    spec: InputSpec, g: torch.Generator, default_float: str, device: torch.device | None = None
) -> torch.Tensor:
    import torch

    dtype = spec.dtype or default_float
    if spec.kind == "sparse":
        return _draw_sparse(spec, g, dtype)
    if device is not None and device.type == "meta":
        if dtype in FLOAT_DTYPES:  # no values: nothing is drawn
            return torch.empty(spec.dims, dtype=torch_dtype(dtype), device=device)
        # integer inputs (token ids, masks) are drawn as on the cpu and kept as the meta
        # tensor's shadow, so ops on them have values (hookcli.metavalues)
        drawn = torch.randint(spec.low, spec.high, spec.dims, generator=g)
        return meta_with_values(drawn.to(torch_dtype(dtype)))
    if dtype in FLOAT_DTYPES:
        return torch.randn(spec.dims, generator=g, dtype=torch_dtype(dtype))
    values = torch.randint(spec.low, spec.high, spec.dims, generator=g)
    return values.to(torch_dtype(dtype))


def _draw_sparse(spec: InputSpec, g: torch.Generator, dtype: str) -> torch.Tensor:
    """``round(density * numel)`` positions drawn with ``randint`` (a position drawn twice
    counts once), their values with ``randn``: a coalesced COO tensor."""
    import torch

    numel = 1
    for d in spec.dims:
        numel *= d
    flat = torch.randint(0, numel, (_nnz(numel, spec.density),), generator=g).unique()
    values = torch.randn(flat.numel(), generator=g, dtype=torch_dtype(dtype))
    indices = torch.stack(torch.unravel_index(flat, spec.dims))
    return torch.sparse_coo_tensor(indices, values, spec.dims, check_invariants=False).coalesce()


def _materialize(
    value: Any, g: torch.Generator, default_float: str, device: torch.device | None
) -> Any:
    """A ``py:`` literal with its tensors made, in the order they are written."""
    import torch

    if isinstance(value, InputSpec):
        return _draw(value, g, default_float, device)
    if isinstance(value, Fixed):
        made = torch.tensor(value.value, dtype=torch_dtype(value.dtype) if value.dtype else None)
        if value.dtype is None and made.is_floating_point():
            made = made.to(torch_dtype(default_float))  # --dtype, as for drawn inputs
        return meta_with_values(made) if device is not None and device.type == "meta" else made
    if isinstance(value, list):
        return [_materialize(v, g, default_float, device) for v in value]
    if isinstance(value, tuple):
        return tuple(_materialize(v, g, default_float, device) for v in value)
    if isinstance(value, dict):
        return {k: _materialize(v, g, default_float, device) for k, v in value.items()}
    return value


def meta_with_values(values: torch.Tensor) -> torch.Tensor:
    """A meta tensor shaped like ``values`` that keeps them as its shadow (small ones)."""
    from hookcli.metavalues import KNOWN, _too_big

    meta = values.to("meta")
    if not _too_big(values):
        KNOWN[meta] = values
    return meta


def positional_names(model: nn.Module) -> list[str]:
    """Names of forward's positional parameters (``x``, ``images``...)."""
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in sig.parameters.values() if p.kind in kinds]


def default_specs(family: str | None, name: str | None) -> list[InputSpec] | None:
    """The torchvision family default inputs, or None for a model of no known family."""
    if family is None:
        return None
    texts = (_NAME_DEFAULTS[name],) if name in _NAME_DEFAULTS else _FAMILY_DEFAULTS[family]
    specs = [parse_spec(t) for t in texts]
    if family == "detection":
        specs = [replace(specs[0], dims=(1, *specs[0].dims), as_list=True)]
    return specs


def _with_batch(spec: InputSpec, batch_size: int | None, dtype: str | None = None) -> InputSpec:
    if batch_size is None or spec.kind != "dense" or not spec.dims:
        return spec  # a 0-d, sparse or py: input has no batch dimension to replace
    dims = (batch_size, *spec.dims[1:])
    check_size(
        dims, spec.dtype or dtype, f"{spec.text or 'x'.join(map(str, spec.dims))} -b {batch_size}"
    )
    return replace(spec, dims=dims)


def _plain_signature(sig: inspect.Signature) -> str:
    """``(x, mask=None, *, labels=None)``: forward's parameters without annotations."""
    params = []
    for p in sig.parameters.values():
        default = p.default
        if default is not p.empty and len(repr(default)) > 24:
            default = ...  # a long default (a tensor, a config) only hides the names
        params.append(p.replace(annotation=p.empty, default=default))
    return str(sig.replace(parameters=params, return_annotation=sig.empty))


def check_order(specs: Sequence[InputSpec]) -> None:
    """Positional inputs first, each keyword once (exit 2); no torch needed."""
    seen: set[str] = set()
    for spec in specs:
        if spec.name is None and seen:
            raise UsageError("positional --input after a keyword one (NAME=SPEC): put it first")
        if spec.name is not None:
            if spec.name in seen:
                raise UsageError(f"keyword input {spec.name!r} given twice")
            seen.add(spec.name)


def check_against_forward(model: nn.Module, specs: Sequence[InputSpec]) -> None:
    """More ``-i`` than forward takes, or ``-i NAME=`` it does not accept: exit 2 with
    forward's signature (a model whose forward takes ``*args``/``**kwargs`` accepts all)."""
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return
    params = sig.parameters
    kinds = [p.kind for p in params.values()]
    P = inspect.Parameter
    positional = [
        p.name for p in params.values() if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)
    ]
    shown = f"{type(model).__name__}.forward{_plain_signature(sig)}"
    given = [s for s in specs if s.name is None]
    if len(given) > len(positional) and P.VAR_POSITIONAL not in kinds:
        raise UsageError(
            f"{len(given)} positional --input given, but forward takes {len(positional)}: {shown}"
        )
    for spec in specs:
        if spec.name is None:
            continue
        param = params.get(spec.name)
        if param is None or param.kind in (P.POSITIONAL_ONLY, P.VAR_POSITIONAL, P.VAR_KEYWORD):
            if P.VAR_KEYWORD in kinds and (param is None or param.kind is P.VAR_KEYWORD):
                continue
            raise UsageError(
                f"--input {spec.name}=...: forward takes no keyword input {spec.name!r}: {shown}"
            )
        if spec.name in positional[: len(given)]:
            raise UsageError(
                f"--input {spec.name}=... is also given positionally (forward's input "
                f"{positional.index(spec.name) + 1}): {shown}"
            )
    if specs:  # one forward needs and no -i gives: exit 2, not the model's TypeError
        try:
            sig.bind(*given, **{s.name: s for s in specs if s.name is not None})
        except TypeError as err:
            raise UsageError(f"--input: {err}: {shown}") from None


def _check_device(device: str) -> torch.device:
    kind, index = parse_device(device)
    import torch

    def unavailable(why: str) -> UsageError:
        here = ", ".join(_available_devices())
        return UsageError(
            f"--device {device}: {why}; hookcli's devices: {DEVICES} (on this machine: {here})"
        )

    if kind == "cuda" and not torch.cuda.is_available():
        raise unavailable("CUDA is not available on this machine")
    if kind == "cuda" and index is not None and index >= torch.cuda.device_count():
        raise unavailable(f"this machine has {torch.cuda.device_count()} CUDA device(s)")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise unavailable("MPS is not available on this machine")
    return torch.device(kind if index is None else f"{kind}:{index}")


def _available_devices() -> list[str]:
    import torch

    found = ["cpu"]
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    found += [f"cuda:{i}" for i in range(count)]
    if torch.backends.mps.is_available():
        found.append("mps")
    return [*found, "meta"]


def resolve_device(device: str) -> torch.device:
    """Validate ``--device`` (exit 2 when it is not there)."""
    return _check_device(device)


def _move(value: Any, device: torch.device, float_dtype: torch.dtype | None) -> Any:
    """Tensors at any depth moved (floating ones cast), by ``move_tensors``' one rule for
    every source of inputs: no recursion, so a 1000-deep list is no RecursionError."""
    from hookcli.structures import move_tensors

    return move_tensors(value, device, float_dtype)


def _redraw_like(t: torch.Tensor, batch: int, g: torch.Generator) -> torch.Tensor:
    import torch

    shape = (batch, *t.shape[1:])
    if t.is_floating_point():
        return torch.randn(shape, generator=g, dtype=t.dtype)
    values = t
    if t.is_meta:  # built under torch.device("meta"): its values, where hookcli kept them
        from hookcli.metavalues import KNOWN

        values = KNOWN.get(t, torch.zeros(0, dtype=t.dtype))
    low = int(values.min()) if values.numel() else 0
    high = int(values.max()) + 1 if values.numel() else 2
    return torch.randint(low, max(high, low + 1), shape, generator=g).to(t.dtype)


def _infos_of(name: str, value: Any) -> list[InputInfo]:
    """One InputInfo per tensor in lists, tuples and mappings, at any depth (no
    recursion): ``name[i]`` for items, ``name.key`` for mapping values."""
    from hookcli.structures import iter_named_tensors

    def kids(v: Any) -> Iterable[tuple[str, Any]] | None:
        if isinstance(v, (list, tuple)):
            return ((f"[{i}]", x) for i, x in enumerate(v))
        if isinstance(v, Mapping):
            return ((f".{k}", x) for k, x in v.items())
        return None

    return [
        InputInfo(path, tuple(t.shape), dtype_name(t.dtype))
        for path, t in iter_named_tensors(value, name, kids)
    ]


NO_INPUT = (
    "no input known for this model: pass --input (e.g. -i 1x3x224x224), --input-file FILE "
    "or --inputs-from FILE.py:FN, or give the model an example_input_array attribute"
)
NO_FORWARD_HINT = "; or --no-forward for the module tree without running the model"


def build_inputs(
    model: nn.Module,
    texts: Sequence[str],
    *,
    seed: int = 0,
    batch_size: int | None = None,
    dtype: str | None = None,
    device: str = "cpu",
    family: str | None = None,
    torchvision_name: str | None = None,
    defaults: Sequence[str] = (),
    defaults_source: str = "",
    values: Mapping[str, Any] | None = None,
    offer_no_forward: bool = False,
) -> Inputs:
    """Draw the inputs: ``--input`` specs, else ``example_input_array``, else the defaults
    of the model's source (``hf:``/``timm:`` config, torchvision family); none of them:
    exit 2 naming every way to give inputs (and ``--no-forward`` with
    ``offer_no_forward``, for ``inspect``).

    On meta, inputs are created on meta (no values, nothing allocated); elsewhere they
    are drawn on the CPU from the seeded generator and moved, so every device sees
    the same values. ``values`` (name -> CPU tensor, from the model's source) are used
    as given for the default inputs of that name and shape (token ids that carry
    image tokens, ``image_grid_thw``); on meta they are kept as shadows.
    """
    import torch

    if batch_size is not None and batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, got {batch_size}")
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise UsageError(
            f"--dtype must be a floating type ({', '.join(FLOAT_DTYPES)}), got {dtype}"
        )
    dev = _check_device(device)
    float_dtype = torch_dtype(dtype) if dtype else None
    g = torch.Generator().manual_seed(seed)
    names = positional_names(model)

    if texts:
        specs = [parse_spec(t) for t in texts]
        source = "--input"
    else:
        example = getattr(model, "example_input_array", None)
        if example is not None:
            return _from_example(example, names, g, batch_size, dev, float_dtype)
        specs_or_none = (
            [parse_spec(t) for t in defaults]
            if defaults
            else default_specs(family, torchvision_name)
        )
        if specs_or_none is None:
            raise UsageError(NO_INPUT + (NO_FORWARD_HINT if offer_no_forward else ""))
        specs = specs_or_none
        source = defaults_source if defaults else f"torchvision {family} default"

    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    infos: list[InputInfo] = []
    for spec in specs:
        spec = _with_batch(spec, batch_size, dtype)
        default_float = dtype or "float32"
        try:
            given = (values or {}).get(spec.name or "") if not texts else None
            if given is not None and tuple(given.shape) == tuple(spec.dims):
                value: Any = meta_with_values(given) if dev.type == "meta" else given.clone()
            elif spec.kind == "py":
                value = _materialize(spec.value, g, default_float, dev)
            elif spec.as_list:
                item = replace(spec, dims=spec.dims[1:], as_list=False)
                value = [_draw(item, g, default_float, dev) for _ in range(spec.dims[0])]
            else:
                value = _draw(spec, g, default_float, dev)
            value = _move(value, dev, None)
        except (RuntimeError, MemoryError) as err:
            if not is_oom(err):
                raise
            raise _out_of_memory(spec, spec.dtype or default_float, dev, err) from err
        if spec.name is not None:
            if spec.name in kwargs:
                raise UsageError(f"keyword input {spec.name!r} given twice")
            kwargs[spec.name] = value
            infos.extend(_infos_of(spec.name, value))
        else:
            if kwargs:
                raise UsageError("positional --input after a keyword one (NAME=SPEC): put it first")
            pos = len(args)
            args.append(value)
            infos.extend(_infos_of(names[pos] if pos < len(names) else f"input{pos}", value))
    return Inputs(tuple(args), kwargs, tuple(infos), source)


def _out_of_memory(
    spec: InputSpec, dtype: str, dev: torch.device, err: BaseException
) -> ResourceError:
    numel = 1
    for d in spec.dims:
        numel *= d
    size = numel * _ITEMSIZE.get(dtype, 1)
    shape = "x".join(str(d) for d in spec.dims)
    return ResourceError(
        f"out of memory drawing input {shape} {dtype} ({fmt_bytes(size, binary=True)} on {dev}): "
        f"{first_line(err)}"
    )


def _from_example(
    example: Any,
    names: list[str],
    g: torch.Generator,
    batch_size: int | None,
    dev: torch.device,
    float_dtype: torch.dtype | None,
) -> Inputs:
    import torch

    def prep(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and batch_size is not None and value.dim() > 0:
            shape = (batch_size, *value.shape[1:])
            check_size(shape, dtype_name(value.dtype), f"example_input_array -b {batch_size}")
            value = _redraw_like(value, batch_size, g)
        return _move(value, dev, float_dtype)

    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = {}
    try:
        if isinstance(example, Mapping):
            kwargs = {str(k): prep(v) for k, v in example.items()}
        else:
            items = list(example) if isinstance(example, (tuple, list)) else [example]
            args = tuple(prep(v) for v in items)
    except (RuntimeError, MemoryError) as err:
        if not is_oom(err):
            raise
        raise ResourceError(
            f"out of memory preparing example_input_array: {first_line(err)}"
        ) from err
    infos = [i for k, v in kwargs.items() for i in _infos_of(k, v)]
    for pos, v in enumerate(args):
        infos.extend(_infos_of(names[pos] if pos < len(names) else f"input{pos}", v))
    return Inputs(args, kwargs, tuple(infos), "example_input_array")
