"""``hookcli features MODEL --layer PATTERN``: save the outputs of matching modules."""

from pathlib import Path
from typing import Annotated

import typer

from hookcli.cliopts import (
    AnnotateOpt,
    AtolOpt,
    BaselineOpt,
    BatchOpt,
    DebugOpt,
    DeviceOpt,
    DtypeOpt,
    FormatOpt,
    InputFileOpt,
    InputOpt,
    InputsFromOpt,
    JunitOpt,
    KwargsOpt,
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

NAME = "features"

LayerOpt = Annotated[
    list[str],
    typer.Option(
        "--layer",
        "-l",
        metavar="PATTERN",
        help="A qualified module name (layer4) or a glob (layer3.*.conv2); only matching "
        "modules get a hook. Repeatable.",
        show_default=False,
    ),
]
OutOpt = Annotated[
    Path | None,
    typer.Option(
        "--out",
        metavar="FILE",
        help="Save the outputs: .pt (torch.save of a dict name -> tensor), .npz, or "
        ".safetensors (needs the safetensors package). Written atomically.",
        show_default=False,
    ),
]
PngOpt = Annotated[
    Path | None,
    typer.Option(
        "--png",
        metavar="FILE",
        help="A PNG grid of the feature maps (needs matplotlib: pip install 'hookcli[plot]').",
        show_default=False,
    ),
]
ChannelsOpt = Annotated[
    int,
    typer.Option(
        "--channels", min=1, metavar="N", help="Channels shown per 4-D feature map in --png."
    ),
]


def command(
    model: ModelArg,
    layer: LayerOpt,
    out: OutOpt = None,
    png: PngOpt = None,
    channels: ChannelsOpt = 16,
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
    """Save the outputs of the modules --layer matches (.pt, .npz, .safetensors); optional
    PNG grid of their feature maps."""
    from hookcli.features.runner import cli_command

    return cli_command(
        model=model,
        layer=layer,
        out=out,
        png=png,
        channels=channels,
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
