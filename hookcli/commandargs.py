"""The options most commands share, as Typer parsed them, written once.

A command's ``cli_command`` takes its own options by name and the shared ones as
``**common: Unpack[RunArgs]`` (or ``BuildArgs`` where it runs no forward); the
functions here make the option objects of ``hookcli.options`` from them, with the
checks of ``hookcli.cliopts``. No torch import here.

    ModelArgs    the model: MODEL, --kwargs, --weights, --trust-pickle, --seed
    OutputArgs   --format, -o, the CI options (--baseline, --rtol, ...), --debug
    BuildArgs    both
    RunArgs      and the inputs and the run: -i, --input-file, ..., --device, --mode
    LaunchArgs   --fsdp, --shard, --backend, --dist-timeout; with --ddp: DdpArgs;
                 with --desync-tol and --no-broadcast-buffers: DesyncArgs
    RunFsdpArgs, RunDdpArgs, RunDesyncArgs: RunArgs with one of those three
"""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

from hookcli.options import Annotate, Format, Mode, ModelOptions, OutputOptions, RunOptions


class ModelArgs(TypedDict):
    model: str
    kwargs: list[str] | None
    weights: Path | None
    trust_pickle: bool
    seed: int


class OutputArgs(TypedDict):
    format: Format
    output: Path | None
    baseline: Path | None
    update_baseline: bool
    rtol: float | None
    atol: float | None
    annotate: Annotate | None
    junit: Path | None
    debug: bool


class BuildArgs(ModelArgs, OutputArgs):
    """What a command that builds the model and writes a report takes."""


class RunArgs(BuildArgs):
    """What a command that also runs the model on inputs takes."""

    input: list[str] | None
    input_file: Path | None
    inputs_from: str | None
    batch_size: int | None
    device: str
    dtype: str | None
    mode: Mode | None


class LaunchArgs(TypedDict):
    """A distributed launch's options (``hookcli.distributed.dispatch``)."""

    fsdp: bool
    shard: list[str] | None
    backend: str | None
    dist_timeout: float


class DdpArgs(LaunchArgs):
    ddp: bool


class DesyncArgs(DdpArgs):
    """With the ranks compared after the step (grads, stats)."""

    desync_tol: float
    broadcast_buffers: bool


class RunFsdpArgs(RunArgs, LaunchArgs):
    """cost's."""


class RunDdpArgs(RunArgs, DdpArgs):
    """inspect's."""


class RunDesyncArgs(RunArgs, DesyncArgs):
    """grads' and stats'."""


def model_part(args: ModelArgs) -> ModelOptions:
    """The model's options."""
    from hookcli.cliopts import model_options

    return model_options(
        args["model"], args["kwargs"], args["weights"], args["trust_pickle"], args["seed"]
    )


def output_part(args: OutputArgs, depth: int | None) -> OutputOptions:
    """The output's options, the CI ones checked (exit 2)."""
    from hookcli.cliopts import ci_options, output_options

    ci = ci_options(
        args["baseline"],
        args["update_baseline"],
        args["annotate"],
        args["junit"],
        args["rtol"],
        args["atol"],
    )
    return output_options(args["format"], args["output"], depth, args["debug"], ci)


def run_part(
    args: RunArgs,
    default_mode: Mode,
    global_hooks: bool = False,
    offer_no_forward: bool = False,
) -> RunOptions:
    """The run's options (``cliopts.run_options``: one source of inputs at most)."""
    from hookcli.cliopts import run_options

    return run_options(
        args["input"],
        args["batch_size"],
        args["device"],
        args["dtype"],
        args["mode"],
        default_mode,
        global_hooks,
        input_file=args["input_file"],
        inputs_from=args["inputs_from"],
        offer_no_forward=offer_no_forward,
    )


def command_options(
    args: RunArgs,
    default_mode: Mode,
    depth: int | None,
    global_hooks: bool = False,
    offer_no_forward: bool = False,
) -> tuple[ModelOptions, RunOptions, OutputOptions]:
    """The model's, the run's and the output's options of a command that runs the model;
    the CI options are checked first, then the inputs' (exit 2)."""
    out = output_part(args, depth)
    return model_part(args), run_part(args, default_mode, global_hooks, offer_no_forward), out
