"""``hookcli compare A B`` / ``hookcli compare MODEL --vs KEY=VALUE``: two models (or one
model under two settings) on the same inputs, module call by module call."""

from typing import Annotated

import typer

from hookcli.cliopts import (
    AnnotateOpt,
    AtolOpt,
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
    WeightsOpt,
)
from hookcli.options import Format

NAME = "compare"

ModelBArg = Annotated[
    str | None,
    typer.Argument(
        metavar="[B]",
        help="The second model (any MODEL form); omit it and give --vs to compare MODEL "
        "with itself under one changed setting.",
        show_default=False,
    ),
]
VsOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--vs",
        metavar="KEY=VALUE",
        help="B is MODEL with this changed: amp=bf16|fp16, dtype=NAME, device=DEV, "
        "weights=FILE, compile[=BACKEND], quantize=dynamic, threads=N, deterministic, seed=N. "
        "Repeatable.",
        show_default=False,
    ),
]
AKwargsOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--a-kwargs", metavar="KEY=VALUE", help="-k for A alone. Repeatable.", show_default=False
    ),
]
BKwargsOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--b-kwargs", metavar="KEY=VALUE", help="-k for B alone. Repeatable.", show_default=False
    ),
]
MapOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--map",
        metavar="A_PATTERN=B_PATTERN",
        help="Pair A's modules with B's where names differ: "
        "'transformer.h.{i}.attn=model.layers.{i}.self_attn' ({i} matches an index; a rule "
        "also maps the modules under the name). Repeatable.",
        show_default=False,
    ),
]
AlignOpt = Annotated[
    str,
    typer.Option(
        "--align",
        metavar="HOW",
        help="auto (names and --map rules where they pair at least half of A's calls, else "
        "call order), names, or order (a diff of the call sequences by type and output shape).",
    ),
]
PrintMapOpt = Annotated[
    bool,
    typer.Option(
        "--print-map",
        help="Print the alignment as --map rules (one per line, for --map-file) and stop.",
    ),
]
CopyWeightsOpt = Annotated[
    bool,
    typer.Option(
        "--copy-weights",
        help="Give B A's parameters through the alignment (a transposed Conv1D/Linear weight "
        "is recognised); exit 2 if any of B's cannot be filled.",
    ),
]
CompareFailOnOpt = Annotated[
    str | None,
    typer.Option(
        "--fail-on",
        metavar="divergence",
        help="Exit 1 when an aligned call's output passes --rtol/--atol.",
        show_default=False,
    ),
]


def command(
    model: ModelArg,
    model_b: ModelBArg = None,
    vs: VsOpt = None,
    map_rules: MapOpt = None,
    map_file: Annotated[
        str | None,
        typer.Option("--map-file", metavar="FILE", help="--map rules, one per line ('#' "
                     "comments), as --print-map writes them.", show_default=False),
    ] = None,  # fmt: skip
    align: AlignOpt = "auto",
    print_map: PrintMapOpt = False,
    copy_weights: CopyWeightsOpt = False,
    rtol: RtolOpt = None,
    atol: AtolOpt = None,
    fail_on: CompareFailOnOpt = None,
    kwargs: KwargsOpt = None,
    a_kwargs: AKwargsOpt = None,
    b_kwargs: BKwargsOpt = None,
    a_kwargs_file: Annotated[
        str | None,
        typer.Option("--a-kwargs-file", metavar="FILE", help="--kwargs-file for A alone.",
                     show_default=False),
    ] = None,  # fmt: skip
    b_kwargs_file: Annotated[
        str | None,
        typer.Option("--b-kwargs-file", metavar="FILE", help="--kwargs-file for B alone.",
                     show_default=False),
    ] = None,  # fmt: skip
    weights: WeightsOpt = None,
    a_weights: Annotated[
        str | None,
        typer.Option("--a-weights", metavar="PATH", help="--weights for A alone.",
                     show_default=False),
    ] = None,  # fmt: skip
    b_weights: Annotated[
        str | None,
        typer.Option("--b-weights", metavar="PATH", help="--weights for B alone.",
                     show_default=False),
    ] = None,  # fmt: skip
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
    annotate: AnnotateOpt = None,
    junit: JunitOpt = None,
    seed: SeedOpt = 0,
    debug: DebugOpt = False,
) -> int:
    """Compare two models (A B), or one model under one changed setting (MODEL --vs
    KEY=VALUE), on the same inputs: per aligned module call, the error of each output,
    propagated and local, and the first divergence."""
    from pathlib import Path

    from hookcli.compare.runner import cli_command

    def path(v: str | None) -> Path | None:
        return None if v is None else Path(v)

    return cli_command(
        model=model,
        model_b=model_b,
        vs=vs,
        kwargs=kwargs,
        a_kwargs=a_kwargs,
        b_kwargs=b_kwargs,
        a_kwargs_file=path(a_kwargs_file),
        b_kwargs_file=path(b_kwargs_file),
        weights=weights,
        a_weights=path(a_weights),
        b_weights=path(b_weights),
        trust_pickle=trust_pickle,
        map_rules=map_rules,
        map_file=path(map_file),
        align=align,
        print_map=print_map,
        copy_weights=copy_weights,
        input=input,
        input_file=input_file,
        inputs_from=inputs_from,
        batch_size=batch_size,
        device=device,
        dtype=dtype,
        mode=mode,
        format=format,
        output=output,
        rtol=rtol,
        atol=atol,
        fail_on=fail_on,
        annotate=annotate,
        junit=junit,
        seed=seed,
        debug=debug,
    )
