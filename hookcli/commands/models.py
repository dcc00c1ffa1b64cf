"""``hookcli models``: the model names hookcli can build."""

import fnmatch
from typing import Annotated

import typer

from hookcli.cliopts import DebugOpt, FormatOpt, OutputOpt
from hookcli.options import Format

NAME = "models"

FilterOpt = Annotated[
    str | None,
    typer.Option(
        "--filter",
        metavar="PATTERN",
        help="Keep names matching a glob (resnet*) or containing the text.",
        show_default=False,
    ),
]


def _matches(name: str, pattern: str | None) -> bool:
    if not pattern:
        return True
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatch(name, pattern)
    return pattern.lower() in name.lower()


def command(
    filter: FilterOpt = None,
    format: FormatOpt = Format.TABLE,
    output: OutputOpt = None,
    debug: DebugOpt = False,
) -> int:
    """The model names it can build: the torchvision registry and sample_models."""
    import torchvision.models as tvm

    from hookcli.loading import TORCHVISION_FAMILIES, torchvision_names
    from hookcli.options import OutputOptions
    from hookcli.pipeline import emit
    from hookcli.render import Column
    from hookcli.report import Report, Row
    from sample_models import SAMPLES

    family_of: dict[str, str] = {}
    for fam in TORCHVISION_FAMILIES:
        for n in tvm.list_models(module=getattr(tvm, fam)):
            family_of[n] = fam
    rows = [
        Row.of({"name": n, "source": "torchvision", "family": family_of.get(n, "classification")})
        for n in torchvision_names()
        if _matches(n, filter)
    ]
    rows += [
        Row.of({"name": spec, "source": "sample_models", "family": "sample"})
        for spec in SAMPLES
        if _matches(spec, filter)
    ]
    report = Report(
        command=NAME,
        model={"spec": None, "class": None},
        settings={},
        lists={"models": tuple(rows)},
        primary="models",
        totals={"models": len(rows)},
    )
    cols = [Column("name", "Model"), Column("family", "Family"), Column("source", "Source")]
    out = OutputOptions(format=format, output=output, debug=debug)
    return emit(report, out, cols, [("Models", str(len(rows)))])
