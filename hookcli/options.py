"""Option values as the user types them, parsed once by the CLI into plain objects.

No torch import here: this module is on the ``--help`` path.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# defined apart, for the paths that need it alone (watch's start); used from here
from hookcli.formats import Format as Format


class Mode(str, enum.Enum):
    """Module mode for the run (``--mode``)."""

    TRAIN = "train"
    EVAL = "eval"


class Annotate(str, enum.Enum):
    """CI annotation style (``--annotate``); github is on by itself under GitHub Actions."""

    GITHUB = "github"
    NONE = "none"


class HookKind(str, enum.Enum):
    """Per-module hook kinds a command can attach (``--hooks``)."""

    PRE = "pre"
    FORWARD = "forward"
    BACKWARD_PRE = "backward-pre"
    BACKWARD = "backward"
    TENSOR = "tensor"

    @property
    def is_backward(self) -> bool:
        return self in (HookKind.BACKWARD_PRE, HookKind.BACKWARD, HookKind.TENSOR)


class LossKind(str, enum.Enum):
    """How the output structure is reduced to a scalar loss (``--loss``)."""

    SUM = "sum"
    MEAN = "mean"
    RANDOM = "random"
    OUTPUT = "output"  # output:KEY
    FN = "fn"  # fn:FILE.py:fn


@dataclass(frozen=True)
class Loss:
    """``--loss`` parsed: the kind, its argument (``KEY``, ``FILE.py:fn``), and whether the
    user chose it (a default ``sum`` may point at the model's own loss)."""

    kind: LossKind = LossKind.SUM
    arg: str | None = None
    explicit: bool = False

    @property
    def value(self) -> str:
        """As typed: ``sum``, ``output:loss``, ``fn:loss.py:ce``."""
        return self.kind.value if self.arg is None else f"{self.kind.value}:{self.arg}"

    def __str__(self) -> str:
        return self.value


DEFAULT_LOSS = Loss()  # the default sum, not typed by the user


DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "long", "int32", "bool")
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")


def parse_hook_kinds(text: str | None) -> tuple[HookKind, ...] | None:
    """``pre,forward`` -> (PRE, FORWARD); None when the option was not given."""
    from hookcli.errors import UsageError

    if text is None:
        return None
    kinds: list[HookKind] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            kind = HookKind(part)
        except ValueError:
            allowed = ",".join(k.value for k in HookKind)
            raise UsageError(
                f"unknown hook kind {part!r} in --hooks; choose from {allowed}"
            ) from None
        if kind not in kinds:
            kinds.append(kind)
    if not kinds:
        raise UsageError(
            "--hooks needs at least one kind: pre,forward,backward-pre,backward,tensor"
        )
    return tuple(kinds)


# -- values the Python API may also give as lists or enums (the CLI gives strings) ------

Hooks = str | Sequence[str | HookKind] | None
Names = str | Sequence[str] | None


def hook_kinds_arg(hooks: Hooks) -> tuple[HookKind, ...] | None:
    """``--hooks`` (``hooks=``) as a string or a list -> the kinds; None when not given."""
    if hooks is None or isinstance(hooks, str):
        return parse_hook_kinds(hooks)
    items = [k.value if isinstance(k, HookKind) else k for k in _strings(hooks, "hooks")]
    return parse_hook_kinds(",".join(items))


def _strings(value: Any, option: str) -> list[Any]:
    from hookcli.errors import UsageError

    if isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        return list(value)
    raise UsageError(f"{option} must be a string or a list of strings, got {value!r}")


def names_arg(value: Names, option: str = "fail_on") -> str | None:
    """A comma string or a list of names (``fail_on=``, ``columns=``) -> the comma string;
    ``fail_on=""`` (no check named) is a UsageError, as ``--fail-on ''``."""
    from hookcli.errors import UsageError

    if value is None:
        return value
    text = value if isinstance(value, str) else ",".join(_strings(value, option))
    # (fail_on=[] is no check; a string or names that name nothing is a mistake)
    given = isinstance(value, str) or len(value) > 0
    if option == "fail_on" and given and not text.replace(",", "").strip():
        raise UsageError(f"{option}={value!r} names nothing; give the names, or None")
    return text


def depth_arg(depth: int | None) -> int | None:
    """``depth`` checked: None or >= 0."""
    from hookcli.errors import UsageError

    if depth is not None and depth < 0:
        raise UsageError(f"depth must be >= 0, got {depth}")
    return depth


def split_function_spec(spec: str, shown: str, prefix: str = "") -> tuple[str, str]:
    """``FILE.py:fn`` / ``pkg.mod:fn`` -> (where, attr), nothing imported; malformed is
    exit 2, the error led by ``shown`` (the option and its value)."""
    from hookcli.errors import UsageError

    where, sep, attr = spec.rpartition(":")
    if not sep or not where or not attr:
        raise UsageError(
            f"{shown}: write {prefix}FILE.py:FUNCTION or {prefix}package.module:FUNCTION"
        )
    if not all(part.isidentifier() for part in attr.split(".")):
        raise UsageError(f"{shown}: {attr!r} is not a Python name")
    return where, attr


def check_loss_fn(spec: str) -> tuple[str, str]:
    """``--loss fn:FILE.py:fn`` / ``fn:pkg.mod:fn`` -> (where, attr); malformed is exit 2.

    Nothing is imported here (that happens once the model is built)."""
    from hookcli.errors import UsageError

    where, attr = split_function_spec(spec, f"--loss fn:{spec}", "fn:")
    if (where.endswith(".py") or "/" in where) and not Path(where).is_file():
        raise UsageError(f"--loss fn:{spec}: no such file {where}")
    return where, attr


LOSS_FORMS = "sum, mean, random, output:KEY or fn:FILE.py:FUNCTION"


def loss_arg(value: str | LossKind | Loss | None) -> Loss:
    """``--loss`` (``loss=``) as typed, a ``LossKind`` or a ``Loss``; None: the default sum."""
    from hookcli.errors import UsageError

    if value is None:
        return Loss()
    if isinstance(value, Loss):
        return value
    if isinstance(value, LossKind):
        value = value.value
    if not isinstance(value, str):
        raise UsageError(f"--loss must be {LOSS_FORMS}; got {value!r}")
    head, sep, arg = value.strip().partition(":")
    try:
        kind = LossKind(head)
    except ValueError:
        raise UsageError(f"--loss must be {LOSS_FORMS}; got {value!r}") from None
    if kind in (LossKind.OUTPUT, LossKind.FN):
        if not arg.strip():
            form = (
                "output:KEY (output:loss, output:1)"
                if kind is LossKind.OUTPUT
                else ("fn:FILE.py:FUNCTION or fn:package.module:FUNCTION")
            )
            raise UsageError(f"--loss {value!r}: write {form}")
        if kind is LossKind.FN:
            check_loss_fn(arg.strip())  # malformed or no such file: exit 2 before the build
        return Loss(kind, arg.strip(), explicit=True)
    if sep:
        raise UsageError(f"--loss {head} takes no argument; got {value!r}")
    return Loss(kind, explicit=True)


@dataclass(frozen=True)
class ModelOptions:
    """How to build the model: MODEL, --kwargs, --weights, --trust-pickle, --seed."""

    spec: str
    kwargs: tuple[str, ...] = ()
    weights: Path | None = None
    trust_pickle: bool = False
    seed: int = 0


@dataclass(frozen=True)
class RunOptions:
    """How to run it: inputs, device, dtype, mode."""

    inputs: tuple[str, ...] = ()
    batch_size: int | None = None
    device: str = "cpu"
    dtype: str | None = None
    mode: Mode = Mode.EVAL
    global_hooks: bool = False
    input_file: Path | None = None  # --input-file: saved tensors
    inputs_from: str | None = None  # --inputs-from FILE.py:fn / pkg.mod:fn
    offer_no_forward: bool = False  # inspect: "no input known" also names --no-forward


@dataclass(frozen=True)
class CIOptions:
    """--baseline, --update-baseline, --annotate, --junit and the baseline tolerances."""

    baseline: Path | None = None
    update_baseline: bool = False
    annotate: Annotate | None = None  # None: github when GITHUB_ACTIONS=true
    junit: Path | None = None
    rtol: float | None = None
    atol: float | None = None


HTML_SUFFIXES = (".html", ".htm")


def format_for(fmt: Format, output: Path | None) -> Format:
    """``-o FILE.html`` (or ``.htm``) with the default ``--format table``: the html page."""
    if fmt is Format.TABLE and output is not None and output.suffix.lower() in HTML_SUFFIXES:
        return Format.HTML
    return fmt


@dataclass(frozen=True)
class OutputOptions:
    """Where and how the report goes."""

    format: Format = Format.TABLE
    output: Path | None = None
    depth: int | None = None
    debug: bool = False
    ci: CIOptions = CIOptions()
