"""``COMMAND --help`` with its options grouped into panels, and MODEL completion.

Panels come from one table, keyed by an option's first flag, so every command
(and every option a command adds) lands in the same panel; a parameter's own
``rich_help_panel`` wins. Plain Click formatting, no rich import: ``--help``
stays fast.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from typer.core import TyperCommand

PANEL_ORDER = ("Model", "Input", "Run", "Output", "Checks", "CI", "Distributed")
PANELS: dict[str, str] = {}
for _panel, _flags in {
    "Model": (
        "--kwargs",
        "--kwargs-file",
        "--config-class",
        "--weights",
        "--trust-pickle",
        "--seed",
        "--model-parallel",
        "--part",
    ),
    "Input": ("--input", "--input-file", "--inputs-from", "--batch-size"),
    "Run": (
        "--device",
        "--dtype",
        "--amp",
        "--enable-grad",
        "--mode",
        "--hooks",
        "--global-hooks",
        "--loss",
        "--backward",
        "--steps",
        "--optimizer",
        "--zero-grad",
        "--checkpoint",
        "--fit",
        "--foreach",
        "--layer",
        "--leaves",
        "--op",
        "--grad-op",
        "--together",
        "--frozen",
        "--no-forward",
        "--warmup",
        "--repeat",
        "--sync",
    ),
    "Output": (
        "--depth",
        "--columns",
        "--format",
        "--output",
        "--per-param",
        "--plot",
        "--out",
        "--grid",
        "--png",
        "--channels",
        "--limit",
        "--filter",
        "--source",
        "--metric",
        "--debug",
        "--sort",
        "--trace-out",
    ),
    "Checks": (
        "--fail-on",
        "--max-grad-norm",
        "--min-grad-norm",
        "--dead-threshold",
        "--max-memory",
        "--max-flops",
        "--memory-for",
        "--max-ms",
    ),
    "CI": (
        "--baseline",
        "--update-baseline",
        "--rtol",
        "--atol",
        "--only",
        "--ignore",
        "--annotate",
        "--junit",
    ),
    "Distributed": (
        "--ddp",
        "--backend",
        "--desync-tol",
        "--dist-timeout",
        "--broadcast-buffers",
        "--fsdp",
        "--shard",
    ),
}.items():
    PANELS.update(dict.fromkeys(_flags, _panel))


def panel_of(param: Any) -> str:
    """The panel an option belongs in ("Options" when the table does not know it)."""
    own = getattr(param, "rich_help_panel", None)
    if own:
        return str(own)
    flags = [o for o in getattr(param, "opts", ()) if o.startswith("--")]
    return PANELS.get(flags[0], "Options") if flags else "Options"


class PanelCommand(TyperCommand):
    """A Typer command whose plain (non-rich) help groups its options into panels."""

    def format_options(self, ctx: Any, formatter: Any) -> None:
        args: list[tuple[str, str]] = []
        groups: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                args.append(record)
            else:
                groups.setdefault(panel_of(param), []).append(record)
        if args:
            with formatter.section("Arguments"):
                formatter.write_dl(args)
        order = [p for p in PANEL_ORDER if p in groups] + [
            p for p in groups if p not in PANEL_ORDER
        ]
        for panel in order:
            with formatter.section(panel):
                formatter.write_dl(groups[panel])


def complete_model(incomplete: str) -> list[str]:
    """MODEL names for shell completion: torchvision names, hf:/timm: names, samples."""
    try:
        if incomplete.startswith("hf:"):
            names = [f"hf:{n}" for n in _cached("hf", "transformers", _hf_names)]
        elif incomplete.startswith("timm:"):
            names = [f"timm:{n}" for n in _cached("timm", "timm", _timm_names)]
        elif any(c in incomplete for c in ":/."):
            return []  # a Python path or a file: the shell completes those
        else:
            names = [*_cached("torchvision", "torchvision", _torchvision_names), "hf:", "timm:"]
            names += ["sample_models:"]
    except Exception:  # completion must never print a traceback into the shell
        return []
    return [n for n in names if n.startswith(incomplete)]


def _cached(source: str, package: str, load: Any) -> Iterable[str]:
    """Names of a source, cached per installed version (importing it takes seconds)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version(package)
    except PackageNotFoundError:
        return []
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hookcli"
    path = base / f"models-{source}-{ver}.txt"
    try:
        return path.read_text(encoding="utf-8").split()
    except OSError:
        pass
    names = list(load())
    try:
        base.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(names), encoding="utf-8")
    except OSError:
        pass
    return names


def _torchvision_names() -> list[str]:
    from hookcli.loading import torchvision_names

    return torchvision_names()


def _hf_names() -> list[str]:
    from hookcli.loading import force_offline

    force_offline()
    from hookcli.sources import hf

    return hf.names()


def _timm_names() -> list[str]:
    from hookcli.sources import timm_models

    return timm_models.names()
