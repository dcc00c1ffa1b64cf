"""``models``: the names each MODEL source knows (torchvision, hf:, timm:, samples)."""

from __future__ import annotations

from pathlib import Path

from hookcli.options import Format


def cli_command(
    *,
    filter: str | None,
    source: list[str] | None,
    format: Format,
    output: Path | None,
    debug: bool,
) -> int:
    """The models command's run (``hookcli models``): the names each source knows, emit."""
    import importlib.util

    from hookcli.cliopts import output_options
    from hookcli.errors import UsageError
    from hookcli.globs import name_matches
    from hookcli.pipeline import emit
    from hookcli.report import Column, Report, Row

    if filter is not None and not filter.strip():
        # an empty variable in a script ($PATTERN unset): listing every model would hide it
        raise UsageError(
            f"--filter {filter!r} is empty: give a glob (resnet*, '*llama*'), or leave "
            "--filter out to list every model"
        )
    wanted = tuple(source or SOURCES)
    for s in wanted:
        if s not in SOURCES:
            raise UsageError(f"unknown --source {s!r}: choose from {', '.join(SOURCES)}")
    found: list[tuple[str, str, str]] = []  # (name, source, family)
    if "torchvision" in wanted:
        found += _torchvision()
    if "hf" in wanted and importlib.util.find_spec("transformers") is not None:
        from hookcli.loading import force_offline

        force_offline()
        from hookcli.sources import hf

        found += [(f"hf:{n}", "hf", "hf") for n in hf.names()]
    if "timm" in wanted and importlib.util.find_spec("timm") is not None:
        from hookcli.sources import timm_models

        found += [(f"timm:{n}", "timm", "timm") for n in timm_models.names()]
    if "samples" in wanted:
        from sample_models import SAMPLES

        found += [(spec, "samples", "sample") for spec in SAMPLES]
    rows = [
        Row.of({"name": n, "source": src, "family": fam})
        for n, src, fam in found
        if not filter or name_matches(n, filter, fold_case=True)
    ]
    if filter and not rows:
        _no_match_hint(filter, [n for n, _, _ in found])
    report = Report(
        command="models",
        model={"spec": None, "class": None},
        settings={},
        lists={"models": tuple(rows)},
        primary="models",
        totals={"models": len(rows)},
    )
    cols = [Column("name", "Model"), Column("family", "Family"), Column("source", "Source")]
    out = output_options(format, output, None, debug)
    return emit(report, out, cols, [("Models", str(len(rows)))])


SOURCES = ("torchvision", "hf", "timm", "samples")


def _torchvision() -> list[tuple[str, str, str]]:
    import torchvision.models as tvm

    from hookcli.loading import TORCHVISION_FAMILIES, torchvision_names

    family_of: dict[str, str] = {}
    for fam in TORCHVISION_FAMILIES:
        for n in tvm.list_models(module=getattr(tvm, fam)):
            family_of[n] = fam
    return [(n, "torchvision", family_of.get(n, "classification")) for n in torchvision_names()]


def _no_match_hint(pattern: str, names: list[str]) -> None:
    """--filter matched nothing: say that it matches whole names, and what is close."""
    import difflib
    import sys

    from hookcli.globs import name_matches

    hints = []
    if not any(c in pattern for c in "*?["):
        wide = f"*{pattern}*"
        hits = [n for n in names if name_matches(n, wide, fold_case=True)]
        if hits:
            some = ", ".join(hits[:3])
            hints.append(f"try --filter '{wide}' ({len(hits)} match(es), e.g. {some})")
        else:
            hints.append(f"--filter matches whole names: try '{wide}'")
    close = difflib.get_close_matches(pattern.lower(), [n.lower() for n in names], n=5, cutoff=0.6)
    by_lower = {n.lower(): n for n in names}
    if close:
        hints.append("close names: " + ", ".join(by_lower[c] for c in close))
    said = "".join(f"; {h}" for h in hints)  # none: the line ends after "name"
    print(f"hookcli: note: --filter {pattern!r} matches no model name{said}", file=sys.stderr)
    sys.stderr.flush()
