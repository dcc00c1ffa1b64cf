"""``--vs KEY=VALUE``: the one thing the B side of ``compare MODEL --vs ...`` changes.

amp=bf16|fp16      B's forwards under torch.autocast on its device
dtype=NAME         B cast to float32|float16|bfloat16|float64 (floating inputs too)
device=DEV         B (and its copy of the inputs) on DEV (cuda, cuda:1, cpu, mps)
weights=FILE       B loads FILE (as --weights does)
compile[=BACKEND]  B called through torch.compile (backend: inductor by default)
quantize=dynamic   B's nn.Linear quantized to int8 (torch.ao.quantization.quantize_dynamic)
threads=N          B's forwards with torch.set_num_threads(N)
deterministic      B's forwards with torch.use_deterministic_algorithms(True)
seed=N             B's forwards after torch.manual_seed(N) (A's: after --seed)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hookcli.errors import LoadError, UsageError

if TYPE_CHECKING:
    from torch import nn

KEYS = (
    "amp",
    "dtype",
    "device",
    "weights",
    "compile",
    "quantize",
    "threads",
    "deterministic",
    "seed",
)
_FLAGS = ("compile", "deterministic")


@dataclass(frozen=True)
class Vs:
    """The B side's changes (all None/False: none)."""

    texts: tuple[str, ...] = ()
    amp: str | None = None
    dtype: str | None = None
    device: str | None = None
    weights: Path | None = None
    compile: str | None = None  # the backend
    quantize: str | None = None
    threads: int | None = None
    deterministic: bool = False
    seed: int | None = None

    @property
    def given(self) -> bool:
        return bool(self.texts)


def _int(key: str, value: str, low: int) -> int:
    try:
        n = int(value)
    except ValueError:
        raise UsageError(f"--vs {key}={value}: {key} takes an integer") from None
    if n < low:
        raise UsageError(f"--vs {key}={value}: {key} must be >= {low}")
    return n


def parse_vs(texts: Sequence[str]) -> Vs:
    """``["amp=bf16", "threads=1"]`` -> Vs; an unknown key or a bad value is exit 2."""
    from hookcli.amp import CHOICES
    from hookcli.options import FLOAT_DTYPES

    found: dict[str, Any] = {}
    for text in texts:
        key, sep, value = text.strip().partition("=")
        key, value = key.strip(), value.strip()
        if key not in KEYS:
            raise UsageError(
                f"--vs {text!r}: unknown setting {key!r}; choose from {', '.join(KEYS)}"
            )
        if key in found:
            raise UsageError(f"--vs {key} is given twice")
        if key == "deterministic" and sep:
            raise UsageError(f"--vs {text!r}: deterministic takes no value")
        if key == "compile" and sep and not value:
            raise UsageError(f"--vs {text!r}: write compile or compile=BACKEND")
        if key not in _FLAGS and not value:
            raise UsageError(f"--vs {text!r}: write {key}=VALUE")
        if key == "amp":
            if value not in CHOICES:
                raise UsageError(f"--vs amp={value}: amp must be one of {', '.join(CHOICES)}")
            found[key] = value
        elif key == "dtype":
            if value not in FLOAT_DTYPES:
                raise UsageError(
                    f"--vs dtype={value}: dtype must be one of {', '.join(FLOAT_DTYPES)}"
                )
            found[key] = value
        elif key == "device":
            from hookcli.inputs.grammar import resolve_device

            with _named("--device", f"--vs device={value}", value):
                resolve_device(value)  # a bad device: exit 2 before any build
            found[key] = value
        elif key == "weights":
            path = Path(value)
            if not path.exists():  # a bad weights file is a build error, as --weights's
                raise LoadError(f"--vs weights={value}: weights file not found")
            found[key] = path
        elif key == "compile":
            found[key] = _backend(value or "inductor")
        elif key == "quantize":
            if value != "dynamic":
                raise UsageError(f"--vs quantize={value}: only quantize=dynamic (int8 nn.Linear)")
            found[key] = value
        elif key == "threads":
            found[key] = _int(key, value, 1)
        elif key == "seed":
            found[key] = _int(key, value, 0)
        else:
            found[key] = True
    return Vs(texts=tuple(t.strip() for t in texts), **found)


def _backend(name: str) -> str:
    """A torch.compile backend by name; an unknown one is exit 2 listing those there are."""
    import torch._dynamo

    known = torch._dynamo.list_backends(exclude_tags=())
    if name not in known:
        raise UsageError(
            f"--vs compile={name}: torch.compile has no backend {name!r}; "
            f"its backends: {', '.join(torch._dynamo.list_backends())} (and the debug ones: "
            "eager, aot_eager, ...)"
        )
    return name


@contextlib.contextmanager
def _named(flag: str, written: str, value: str) -> Iterator[None]:
    """A shared check's UsageError naming ``flag`` (``--device cuda: ...``) re-raised
    naming what the user wrote (``--vs device=cuda: ...``)."""
    try:
        yield
    except UsageError as err:
        text = str(err)
        heads = (f"bad {flag} {value!r}", f"{flag} {value}", flag) if value else (flag,)
        for head in heads:
            if text.startswith(head):
                raise UsageError(written + text[len(head) :]) from None
        raise


@contextlib.contextmanager
def weights_named(vs: Vs) -> Iterator[None]:
    """B's build with ``--vs weights=FILE``: a build error about the file names the option
    written (``--vs weights=FILE: cannot read weights FILE: ...``), exit 3 as --weights's."""
    try:
        yield
    except LoadError as err:
        if vs.weights is None or str(vs.weights) not in str(err):
            raise
        raise LoadError(f"--vs weights={vs.weights}: {err}") from None


def check(vs: Vs, *, dtype: str | None, backward: bool) -> None:
    """What --vs cannot do with the run's other options: exit 2 before any build."""
    if vs.quantize == "dynamic":
        cast = vs.dtype or dtype
        if cast not in (None, "float32"):
            raise UsageError(
                f"--vs quantize=dynamic needs float32 (torch.ao's dynamic int8 Linear takes "
                f"float32 inputs): drop {'--vs dtype=' if vs.dtype else '--dtype '}{cast}"
            )
        if backward:
            raise UsageError(
                "--vs quantize=dynamic has no backward (torch.ao's dynamic int8 Linear has "
                "no autograd): drop --backward"
            )


def side_kwargs(
    items: Sequence[str] | None, path: Any, own: Sequence[str] | None, flag: str
) -> list[Any]:
    """One side's ``-k`` items: the shared ones, then ``flag``'s file, then its own; a bad
    file is exit 2 naming ``flag`` (``--b-kwargs-file``)."""
    from hookcli.kwargs import with_file

    with _named("--kwargs-file", flag, ""):
        shared = with_file(list(items or ()), path) or ()
    return [*shared, *(own or ())]


def transform(model: nn.Module, vs: Vs, device: Any) -> nn.Module:
    """B's module: cast, moved and quantized as ``vs`` says (the module is B's own copy)."""
    import torch

    if vs.dtype is not None:
        model.to(getattr(torch, vs.dtype))
    if vs.device is not None:
        model.to(device)
    if vs.quantize == "dynamic":
        if device.type != "cpu":
            raise UsageError("--vs quantize=dynamic runs on the CPU (torch.ao's int8 kernels)")
        held = {str(p.dtype).removeprefix("torch.") for p in model.parameters()}
        if held & {"float16", "bfloat16", "float64"}:  # a model built in half, say
            raise UsageError(
                f"--vs quantize=dynamic needs float32 (torch.ao's dynamic int8 Linear takes "
                f"float32 inputs): the model's parameters are {', '.join(sorted(held))}"
            )
        if not any(isinstance(m, torch.nn.Linear) for m in model.modules()):
            raise UsageError(
                "--vs quantize=dynamic: the model has no nn.Linear to quantize (torch.ao "
                "dynamic int8 quantizes nn.Linear only; transformers' Conv1D is not one)"
            )
        with _quiet():
            model = torch.ao.quantization.quantize_dynamic(
                model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True
            )
    return model


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's deprecation notice
        yield


def caller(model: nn.Module, vs: Vs) -> Any:
    """What B's forward calls: ``torch.compile(model)`` for compile, else the model."""
    if vs.compile is None:
        return model
    import torch

    return torch.compile(model, backend=vs.compile)


@contextlib.contextmanager
def running(vs: Vs, device: Any) -> Iterator[None]:
    """The process settings of B's forwards (threads, determinism, autocast), put back after."""
    import torch

    from hookcli import amp as autocast

    threads = torch.get_num_threads()
    det = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    saved_amp = autocast._active
    try:
        if vs.threads is not None:
            torch.set_num_threads(vs.threads)
        if vs.deterministic:
            torch.use_deterministic_algorithms(True)
        if vs.amp is not None:
            with _named("--amp", f"--vs amp={vs.amp}", vs.amp):
                checked = autocast.check(vs.amp, device)
            autocast.activate(checked, device)
        yield
    finally:
        autocast._active = saved_amp
        if vs.deterministic:
            torch.use_deterministic_algorithms(det, warn_only=warn_only)
        if vs.threads is not None:
            torch.set_num_threads(threads)


def idle_notes(
    vs: Vs, model_a: Any, inputs: Any, train: bool, seed_a: int | None, device_a: Any = None
) -> list[str]:
    """Notes for a --vs setting that changes nothing in this run (B is then A again)."""
    from hookcli.inputs.grammar import resolve_device
    from hookcli.structures import iter_tensors

    notes = []
    if vs.device is not None and device_a is not None:
        d_b, d_a = resolve_device(vs.device), resolve_device(str(device_a))
        if d_b.type == d_a.type and (d_b.index or 0) == (d_a.index or 0):  # cuda is cuda:0
            notes.append(
                f"--vs device={vs.device} changes nothing here: A runs on {device_a} already"
            )
    if vs.dtype is not None:
        held = [*model_a.parameters(), *model_a.buffers()]
        if inputs is not None:
            held += list(iter_tensors((inputs.args, dict(inputs.kwargs))))
        floats = {str(t.dtype).removeprefix("torch.") for t in held if t.is_floating_point()}
        if floats <= {vs.dtype}:
            notes.append(
                f"--vs dtype={vs.dtype} changes nothing here: A's parameters and inputs are "
                f"{vs.dtype} already"
            )
    if vs.seed is not None:
        if seed_a is not None and vs.seed == seed_a:
            notes.append(f"--vs seed={vs.seed} changes nothing here: A runs with seed {seed_a}")
        elif not train:
            notes.append(
                f"--vs seed={vs.seed} changes nothing here unless the model draws random "
                "numbers itself: in eval mode no dropout is active (add --mode train)"
            )
    return notes


def words(vs: Vs) -> str:
    return ", ".join(vs.texts)
