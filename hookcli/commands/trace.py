"""``hookcli trace MODEL``: the hook events of one run, in the order they fire."""

from typing import Annotated

import typer

from hookcli.cliopts import (
    AnnotateOpt,
    AtolOpt,
    BaselineOpt,
    BatchOpt,
    DebugOpt,
    DepthOpt,
    DeviceOpt,
    DtypeOpt,
    FormatOpt,
    InputFileOpt,
    InputOpt,
    InputsFromOpt,
    JunitOpt,
    KwargsOpt,
    LossOpt,
    ModelArg,
    ModeOpt,
    OutputOpt,
    RtolOpt,
    SeedOpt,
    TrustPickleOpt,
    UpdateBaselineOpt,
    WeightsOpt,
)
from hookcli.options import Format

NAME = "trace"

BackwardOpt = Annotated[
    bool,
    typer.Option(
        "--backward",
        help="Also run backward (loss from --loss) and trace the global "
        "full backward-pre and backward hooks.",
    ),
]
LimitOpt = Annotated[
    int | None,
    typer.Option(
        "--limit",
        "-n",
        min=1,
        metavar="N",
        help="Keep the first N events (after --filter).",
        show_default=False,
    ),
]
FilterOpt = Annotated[
    str | None,
    typer.Option(
        "--filter",
        metavar="PATTERN",
        help="Keep events of matching modules: a glob on the qualified name or the class "
        "name (layer1.*, *conv*, BatchNorm2d), a module name with its submodules (layer1), "
        "or (root).",
        show_default=False,
    ),
]


def command(
    model: ModelArg,
    kwargs: KwargsOpt = None,
    weights: WeightsOpt = None,
    trust_pickle: TrustPickleOpt = False,
    input: InputOpt = None,
    input_file: InputFileOpt = None,
    inputs_from: InputsFromOpt = None,
    batch_size: BatchOpt = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = None,
    mode: ModeOpt = None,
    depth: DepthOpt = None,
    backward: BackwardOpt = False,
    loss: LossOpt = None,
    limit: LimitOpt = None,
    filter: FilterOpt = None,
    format: FormatOpt = Format.TABLE,
    output: OutputOpt = None,
    baseline: BaselineOpt = None,
    update_baseline: UpdateBaselineOpt = False,
    rtol: RtolOpt = None,
    atol: AtolOpt = None,
    annotate: AnnotateOpt = None,
    junit: JunitOpt = None,
    seed: SeedOpt = 0,
    debug: DebugOpt = False,
) -> int:
    """The event timeline: every global forward-pre/forward (and backward) hook firing."""
    from hookcli.probes.trace import cli_command

    return cli_command(
        model=model,
        kwargs=kwargs,
        weights=weights,
        trust_pickle=trust_pickle,
        input=input,
        input_file=input_file,
        inputs_from=inputs_from,
        batch_size=batch_size,
        device=device,
        dtype=dtype,
        mode=mode,
        depth=depth,
        backward=backward,
        loss=loss,
        limit=limit,
        filter=filter,
        format=format,
        output=output,
        baseline=baseline,
        update_baseline=update_baseline,
        rtol=rtol,
        atol=atol,
        annotate=annotate,
        junit=junit,
        seed=seed,
        debug=debug,
    )
