"""Typer option types shared by the commands (``Annotated`` aliases), no torch import;
their groups (``Param``: name, type, default) and ``forwards``, which makes a command of
the groups and options it names.

This module deliberately avoids ``from __future__ import annotations``: Typer reads
the annotations of the command functions at runtime.
"""

import importlib
import inspect
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from hookcli.helpfmt import complete_model
from hookcli.options import (
    Annotate,
    CIOptions,
    Format,
    Mode,
    ModelOptions,
    OutputOptions,
    RunOptions,
    format_for,
)


def option(kind: Any, *flags: str, **settings: Any) -> Any:
    """The Typer type of an option: ``Annotated[kind, typer.Option(*flags, **settings)]``; an
    option that may be left out (``kind`` admits None) shows no default in --help."""
    if isinstance(kind, types.UnionType) and type(None) in kind.__args__:
        settings.setdefault("show_default", False)
    return Annotated[kind, typer.Option(*flags, **settings)]


def threshold(flag: str, help: str, **settings: Any) -> Any:
    """An optional number X >= 0 (``--rtol X``, ``--max-grad-norm X``)."""
    return option(float | None, flag, metavar="X", min=0.0, help=help, **settings)


def backward(help: str) -> Any:
    """``--backward``: a command that also runs backward says here what it adds."""
    return option(bool, "--backward", help=help)


def checks(help: str) -> Any:
    """``--fail-on CHECKS``: the comma-separated checks that fail the run (``parse_fail_on``)."""
    return option(str | None, "--fail-on", metavar="CHECKS", help=help)


def plot(help: str) -> Any:
    """``--plot FILE.png``: a chart saved with matplotlib."""
    return option(Path | None, "--plot", metavar="FILE.png", help=help)


def patterns(flag: str, help: str, kind: Any = list[str] | None) -> Any:
    """``FLAG PATTERN``: a glob or a module name (repeatable where ``kind`` is a list)."""
    return option(kind, flag, metavar="PATTERN", help=help)


MODEL_HELP = (
    "A torchvision name (resnet18), pkg.module:attr, pkg.module.attr or path/to/file.py:attr "
    "(attr: an nn.Module class, a factory, or an instance), hf:NAME[:HEAD] (a transformers "
    "model type, config folder or cached Hub id; -k sets config attributes) or timm:NAME."
)

ModelArg = Annotated[
    str,
    typer.Argument(
        metavar="MODEL", help=MODEL_HELP, show_default=False, autocompletion=complete_model
    ),
]
KwargsOpt = option(
    list[str] | None,
    "--kwargs",
    "-k",
    metavar="KEY=VALUE",
    help="Constructor/factory keyword argument; VALUE is a Python literal (a string only "
    "where the parameter takes one). Dotted keys build config objects: -k config.n_layer=2. "
    "Repeatable.",
)
KwargsFileOpt = option(
    Path | None,
    "--kwargs-file",
    metavar="FILE",
    help="Keyword arguments from a .json, .yaml or .toml table (nested tables build config "
    "objects); -k wins.",
)
ConfigClassOpt = option(
    list[str] | None,
    "--config-class",
    metavar="[PARAM=]CLASS",
    help="The config class of a parameter with no annotation (def __init__(self, config)) "
    "where hookcli cannot infer it: a name in the model's module (GPTConfig, "
    "GPT.get_default_config), pkg.mod:Name or file.py:Name; dict passes the dict. "
    "Repeatable.",
)
WeightsOpt = option(
    Path | None,
    "--weights",
    metavar="PATH",
    help="A checkpoint applied strictly: a torch.save state dict (weights_only), a "
    ".safetensors file, a sharded *.index.json, or a folder holding one. On meta: keys "
    "and shapes are checked, no values loaded.",
)
ModelParallelOpt = option(
    int | None,
    "--model-parallel",
    metavar="N",
    min=1,
    help="Set up a process group and fairscale's (and megatron.core's) model-parallel "
    "groups of size N before the build, for ColumnParallelLinear-style code: 1 in one "
    "process, N under torchrun.",
)
PartOpt = option(
    str | None,
    "--part",
    metavar="NAME",
    help="Run on the built model's submodule NAME (a named_modules() name, e.g. "
    "image_encoder), after --weights are applied to the whole model.",
)
TrustPickleOpt = option(
    bool, "--trust-pickle", help="Allow --weights to unpickle arbitrary objects."
)
InputOpt = option(
    list[str] | None,
    "--input",
    "-i",
    metavar="SPEC",
    help="[NAME=][DTYPE:]DIMS[:LOW..HIGH], one per positional input of forward "
    "(NAME= for a keyword input). E.g. 1x3x224x224, int64:2x16:0..1000; int64:scalar:0..9 "
    '(0-d), sparse:100x100:0.05 (COO), py:0 or py:[{"x": tensor("3x8x8")}] (a Python '
    "literal). Repeatable.",
)
InputFileOpt = option(
    Path | None,
    "--input-file",
    metavar="FILE",
    help="Real inputs saved in FILE: .pt (torch.load weights_only), .safetensors, .npz or "
    ".npy. A tensor or list/tuple: positional inputs; a dict: keyword inputs; nested "
    "structures pass as they are.",
)
InputsFromOpt = option(
    str | None,
    "--inputs-from",
    metavar="FILE.py:FN",
    help="Call FN (FILE.py:fn or pkg.mod:fn; trusted code) after torch.manual_seed(--seed); "
    "it returns args or (args, kwargs): ints, strings, None, namedtuples, any tensors.",
)
NoForwardOpt = option(
    bool,
    "--no-forward",
    help="Run nothing: the module tree with parameters and buffers per module, no "
    "shapes. For a model whose inputs are unknown, and TorchScript models.",
)
ColumnsOpt = option(
    str | None,
    "--columns",
    metavar="NAMES",
    help="Extra columns, comma-separated: kernel_size, groups, param_percent, mult_adds "
    "(cost's MACs per call: one more counted forward), trainable. In every format.",
)
BatchOpt = option(
    int | None, "--batch-size", "-b", min=1, help="Replace the first dimension of every input."
)
DeviceOpt = option(str, "--device", help="cpu, cuda, cuda:N, mps, or meta (shapes only).")
DtypeOpt = option(
    str | None,
    "--dtype",
    help="Cast the model and floating inputs: float32, float16, bfloat16, float64.",
)
AmpOpt = option(
    str | None,
    "--amp",
    metavar="bf16|fp16",
    help="Run the forward under torch.autocast to this dtype on the run's device, as "
    "mixed-precision training does (parameters keep their dtype).",
)
EnableGradOpt = option(
    bool,
    "--enable-grad",
    help="Run forwards decorated with @torch.no_grad() or @torch.inference_mode() "
    "without the decorator, with gradients (as fine-tuning does); restored after.",
)
ModeOpt = option(
    Mode | None, "--mode", help="Module mode for the run (default: eval; grads and buffers: train)."
)
DepthOpt = option(
    int | None,
    "--depth",
    "-d",
    min=0,
    help="Rows for modules at depth <= N (root 0, its children 1); all when omitted.",
)
FormatOpt = option(Format, "--format", "-f", help="Report format.")
OutputOpt = option(
    Path | None,
    "--output",
    "-o",
    metavar="FILE",
    help="Write the report to FILE instead of stdout.",
)
SeedOpt = option(int, "--seed", help="torch.manual_seed before building; input generator seed.")
DebugOpt = option(bool, "--debug", help="Show the Python traceback on errors.")
HooksOpt = option(
    str | None,
    "--hooks",
    metavar="KINDS",
    help="Replace the default hook kinds: pre,forward,backward-pre,backward,tensor "
    "(backward kinds run a backward pass).",
)
GlobalHooksOpt = option(
    bool,
    "--global-hooks",
    help="Attach through torch.nn.modules.module.register_module_* (sees modules "
    "created inside forward).",
)
LossOpt = option(
    str | None,
    "--loss",
    metavar="LOSS",
    help="The scalar loss backward starts from: sum (default: of every floating-point "
    "element of the output structure), mean, random (a fixed, seeded random projection "
    "of every floating output), output:KEY (one element of the output: output:loss, "
    "output:1, output:aux.loss), fn:FILE.py:FUNCTION (your function of the output and "
    "the inputs).",
)
FailOnOpt = checks("Comma-separated checks that fail the run (exit 1).")


BaselineOpt = option(
    Path | None,
    "--baseline",
    metavar="FILE",
    help="After the run, diff the report against FILE (a saved --format json report); "
    "exit 1 when they differ beyond --rtol/--atol. The diff goes to stderr.",
)
UpdateBaselineOpt = option(
    bool, "--update-baseline", help="Write the report to the --baseline FILE instead of comparing."
)
AnnotateOpt = option(
    Annotate | None,
    "--annotate",
    help="Print failed checks and baseline differences as CI annotations on stderr "
    "(github: ::error workflow commands; on by itself when GITHUB_ACTIONS=true).",
)
JunitOpt = option(
    Path | None,
    "--junit",
    metavar="FILE",
    help="Write the checks and baseline diff as JUnit XML test cases to FILE.",
)
RtolOpt = threshold(
    "--rtol",
    "Relative tolerance of the comparison (default: torch.testing.assert_close's "
    "for the report's dtype; integers exact).",
)
AtolOpt = threshold(
    "--atol",
    "Absolute tolerance of the comparison (default: assert_close's for the dtype).",
)


_REQUIRED = inspect.Parameter.empty


@dataclass(frozen=True)
class Param:
    """One parameter of a command: its name, its Typer type (an ``Annotated`` alias) and its
    default (``REQUIRED``: none); ``convert`` turns a given value into what the command takes."""

    name: str
    annotation: Any
    default: Any = None
    convert: Callable[[Any], Any] | None = None


REQUIRED = _REQUIRED
MODEL = Param("model", ModelArg, REQUIRED)
KWARGS = Param("kwargs", KwargsOpt)
WEIGHTS = Param("weights", WeightsOpt)
TRUST_PICKLE = Param("trust_pickle", TrustPickleOpt, False)
DEVICE = Param("device", DeviceOpt, "cpu")
DTYPE = Param("dtype", DtypeOpt)
DEPTH = Param("depth", DepthOpt)
HOOKS = Param("hooks", HooksOpt)
GLOBAL_HOOKS = Param("global_hooks", GlobalHooksOpt, False)
LOSS = Param("loss", LossOpt)
FORMAT = Param("format", FormatOpt, Format.TABLE)
OUTPUT = Param("output", OutputOpt)
RTOL = Param("rtol", RtolOpt)
ATOL = Param("atol", AtolOpt)
ANNOTATE = Param("annotate", AnnotateOpt)
JUNIT = Param("junit", JunitOpt)
SEED = Param("seed", SeedOpt, 0)
DEBUG = Param("debug", DebugOpt, False)

# The groups a command names (``forwards``), each in its order in --help.
BUILD = (KWARGS, WEIGHTS, TRUST_PICKLE)  # how MODEL is built
INPUTS = (
    Param("input", InputOpt),
    Param("input_file", InputFileOpt),
    Param("inputs_from", InputsFromOpt),
    Param("batch_size", BatchOpt),
)
RUN = (DEVICE, DTYPE, Param("mode", ModeOpt))
FORWARD = (*BUILD, *INPUTS, *RUN)  # what every command that runs MODEL's forward takes
BASELINE = (Param("baseline", BaselineOpt), Param("update_baseline", UpdateBaselineOpt, False))
REPORT = (FORMAT, OUTPUT, *BASELINE, RTOL, ATOL, ANNOTATE, JUNIT, SEED, DEBUG)


def forwards(
    target: str | Callable[..., int], *params: Param | tuple[Param, ...]
) -> Callable[[Callable[[], None]], Callable[..., int]]:
    """The decorated function (a docstring, no body) as a command: ``params`` (groups
    flattened, in their order) are its Typer signature, its docstring is its help, and a call
    passes what Typer parsed, by name, to ``target`` ("pkg.module:function", imported only
    then: torch stays off the ``--help`` path)."""
    flat = [p for item in params for p in (item if isinstance(item, tuple) else (item,))]
    converters = {p.name: p.convert for p in flat if p.convert is not None}

    def decorate(fn: Callable[[], None]) -> Callable[..., int]:
        def command(**options: Any) -> int:
            for p in flat:  # a direct call (a benchmark, a test) gets the signature's defaults
                if p.name not in options and p.default is not REQUIRED:
                    options[p.name] = p.default
            for name, convert in converters.items():
                if options.get(name) is not None:
                    options[name] = convert(options[name])
            if isinstance(target, str):
                module, _, attr = target.partition(":")
                return int(getattr(importlib.import_module(module), attr)(**options))
            return target(**options)

        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(command, attr, getattr(fn, attr))
        kind = inspect.Parameter.KEYWORD_ONLY
        command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [
                inspect.Parameter(p.name, kind, default=p.default, annotation=p.annotation)
                for p in flat
            ],
            return_annotation=int,
        )
        command.__annotations__ = {**{p.name: p.annotation for p in flat}, "return": int}
        return command

    return decorate


def model_options(
    model: str,
    kwargs: list[str] | None,
    weights: Path | None,
    trust_pickle: bool,
    seed: int,
) -> ModelOptions:
    """The model part of the options."""
    return ModelOptions(
        spec=model,
        kwargs=tuple(kwargs or ()),
        weights=weights,
        trust_pickle=trust_pickle,
        seed=seed,
    )


def run_options(
    inputs: list[str] | None,
    batch_size: int | None,
    device: str,
    dtype: str | None,
    mode: Mode | None,
    default_mode: Mode,
    global_hooks: bool = False,
    input_file: Path | None = None,
    inputs_from: str | None = None,
    offer_no_forward: bool = False,
) -> RunOptions:
    """The run part of the options; ``mode`` falls back to the command's default
    (``offer_no_forward``: inspect's "no input known" also names ``--no-forward``).

    One source of inputs at most: ``-i``, ``--input-file`` or ``--inputs-from`` (exit 2).
    """
    from hookcli.errors import UsageError
    from hookcli.validate import given_flags

    given = given_flags(
        ("--input", inputs), ("--input-file", input_file), ("--inputs-from", inputs_from)
    )
    if len(given) > 1:
        raise UsageError(f"{' and '.join(given)} both give the inputs: pass one of them")
    if batch_size is not None and (input_file is not None or inputs_from):
        raise UsageError(
            f"--batch-size resizes drawn inputs; {given[0]} gives real ones: save them with "
            "the batch size you want"
        )
    return RunOptions(
        inputs=tuple(inputs or ()),
        batch_size=batch_size,
        device=device,
        dtype=dtype,
        mode=mode or default_mode,
        global_hooks=global_hooks,
        input_file=input_file,
        inputs_from=inputs_from,
        offer_no_forward=offer_no_forward,
    )


def output_options(
    fmt: Format,
    output: Path | None,
    depth: int | None,
    debug: bool,
    ci: CIOptions | None = None,
) -> OutputOptions:
    """The output part of the options; ``-o FILE.html`` (or ``.htm``) with the default
    ``--format table`` writes the html page."""
    fmt = format_for(fmt, output)
    return OutputOptions(format=fmt, output=output, depth=depth, debug=debug, ci=ci or CIOptions())


def ci_options(
    baseline: Path | None,
    update_baseline: bool,
    annotate: Annotate | None,
    junit: Path | None,
    rtol: float | None = None,
    atol: float | None = None,
) -> CIOptions:
    """The CI part of the options, checked before any work (exit 2)."""
    from hookcli.errors import UsageError

    if update_baseline and baseline is None:
        raise UsageError("--update-baseline needs --baseline FILE (the file to write)")
    if baseline is not None and not update_baseline and baseline.is_dir():
        raise UsageError(f"--baseline {baseline}: is a folder; give the baseline's JSON file")
    if baseline is not None and not update_baseline and not baseline.is_file():
        raise UsageError(f"--baseline {baseline}: no such file; create it with --update-baseline")
    for name, tol in (("--rtol", rtol), ("--atol", atol)):
        if tol is not None and not 0 <= tol < float("inf"):  # NaN too, before the run
            raise UsageError(f"{name} must be a finite number >= 0, got {tol}")
    return CIOptions(baseline, update_baseline, annotate, junit, rtol, atol)  # its field order


def parse_fail_on(text: str | None, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """``nan,unused`` -> ('nan', 'unused'); an unknown name is exit 2."""
    from hookcli.validate import comma_names

    return comma_names(text, allowed, "check", "--fail-on")


__all__ = [
    "ANNOTATE",
    "ATOL",
    "BASELINE",
    "BUILD",
    "DEBUG",
    "DEPTH",
    "DEVICE",
    "DTYPE",
    "FORMAT",
    "FORWARD",
    "GLOBAL_HOOKS",
    "HOOKS",
    "INPUTS",
    "JUNIT",
    "KWARGS",
    "LOSS",
    "MODEL",
    "OUTPUT",
    "REPORT",
    "REQUIRED",
    "RTOL",
    "RUN",
    "SEED",
    "TRUST_PICKLE",
    "WEIGHTS",
    "AnnotateOpt",
    "AtolOpt",
    "BaselineOpt",
    "BatchOpt",
    "ColumnsOpt",
    "ConfigClassOpt",
    "DebugOpt",
    "DepthOpt",
    "DeviceOpt",
    "DtypeOpt",
    "EnableGradOpt",
    "FailOnOpt",
    "FormatOpt",
    "GlobalHooksOpt",
    "HooksOpt",
    "InputFileOpt",
    "InputOpt",
    "InputsFromOpt",
    "JunitOpt",
    "KwargsFileOpt",
    "KwargsOpt",
    "LossOpt",
    "ModeOpt",
    "ModelArg",
    "ModelParallelOpt",
    "NoForwardOpt",
    "OutputOpt",
    "Param",
    "PartOpt",
    "RtolOpt",
    "SeedOpt",
    "TrustPickleOpt",
    "UpdateBaselineOpt",
    "WeightsOpt",
    "backward",
    "checks",
    "ci_options",
    "forwards",
    "model_options",
    "option",
    "output_options",
    "parse_fail_on",
    "patterns",
    "plot",
    "run_options",
    "threshold",
]
