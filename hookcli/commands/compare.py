"""``hookcli compare A B`` / ``hookcli compare MODEL --vs KEY=VALUE``: two models (or one
model under two settings) on the same inputs, module call by module call."""

from pathlib import Path
from typing import Annotated, Any

import typer

from hookcli import cliopts as opts
from hookcli.options import Annotate

NAME = "compare"


def _opt(flag: str, metavar: str | None, text: str, panel: str) -> Any:
    return typer.Option(flag, metavar=metavar, help=text, show_default=False, rich_help_panel=panel)


Items = list[str] | None
ModelBArg = Annotated[
    str | None,
    typer.Argument(
        metavar="[B]",
        help="The second model (any MODEL form); omit it and give --vs to compare MODEL "
        "with itself under one changed setting.",
        show_default=False,
    ),
]
VsOpt = Annotated[Items, _opt("--vs", "KEY=VALUE",
    "B is MODEL with this changed: amp=bf16|fp16, dtype=NAME, device=DEV, weights=FILE, "
    "compile[=BACKEND], quantize=dynamic, threads=N, deterministic, seed=N. Repeatable.",
    "Model")]  # fmt: skip
AKwargsOpt = Annotated[Items, _opt("--a-kwargs", "KEY=VALUE", "-k for A alone.", "Model")]
BKwargsOpt = Annotated[Items, _opt("--b-kwargs", "KEY=VALUE", "-k for B alone.", "Model")]
AKwFileOpt = Annotated[
    str | None, _opt("--a-kwargs-file", "FILE", "--kwargs-file for A alone.", "Model")
]
BKwFileOpt = Annotated[
    str | None, _opt("--b-kwargs-file", "FILE", "--kwargs-file for B alone.", "Model")
]
AWeightsOpt = Annotated[str | None, _opt("--a-weights", "PATH", "--weights for A alone.", "Model")]
BWeightsOpt = Annotated[str | None, _opt("--b-weights", "PATH", "--weights for B alone.", "Model")]
CopyWeightsOpt = Annotated[bool, typer.Option("--copy-weights", rich_help_panel="Model",
    help="Give B A's parameters through the alignment (a Conv1D/Linear weight pair is "
    "transposed); exit 2 if any of B's cannot be filled.")]  # fmt: skip
MapOpt = Annotated[Items, _opt("--map", "A_PATTERN=B_PATTERN",
    "Pair A's modules with B's where names differ: "
    "'transformer.h.{i}.attn=model.layers.{i}.self_attn' ({i} matches an index; a rule also "
    "maps the modules under the name). Repeatable.", "Run")]  # fmt: skip
MapFileOpt = Annotated[str | None, _opt("--map-file", "FILE",
    "--map rules, one per line ('#' comments), as --print-map writes them.", "Run")]  # fmt: skip
AlignOpt = Annotated[str, typer.Option("--align", metavar="HOW", rich_help_panel="Run",
    help="auto (names and --map rules where they pair at least half of A's calls, else "
    "call order), names, or order (a diff of the call sequences by type and output "
    "shape).")]  # fmt: skip
PrintMapOpt = Annotated[bool, typer.Option("--print-map", rich_help_panel="Output",
    help="Print the alignment as --map rules (for --map-file) instead of the report.")]  # fmt: skip
BackwardOpt = Annotated[bool, typer.Option("--backward", rich_help_panel="Run",
    help="Also compare gradients: each aligned call's grad_input and its parameters' "
    "grads, after backward from --loss on each side.")]  # fmt: skip
FailOnOpt = Annotated[str | None, _opt("--fail-on", "divergence",
    "Exit 1 when an aligned call's output passes --rtol/--atol.", "Checks")]  # fmt: skip
# (compare has no --baseline: its annotations and JUnit carry its checks alone)
AnnotateOpt = opts.option(Annotate | None, "--annotate",
    help="Print failed checks (--fail-on divergence) as CI annotations on stderr (github: "
    "::error workflow commands; on by itself when GITHUB_ACTIONS=true).")  # fmt: skip
JunitOpt = opts.option(Path | None, "--junit", metavar="FILE",
    help="Write the checks (--fail-on divergence) as JUnit XML test cases to FILE.")  # fmt: skip


@opts.forwards(
    "hookcli.compare.runner:cli_command",
    (opts.MODEL, opts.Param("model_b", ModelBArg), opts.Param("vs", VsOpt)),
    (opts.Param("map_rules", MapOpt), opts.Param("map_file", MapFileOpt, convert=Path)),
    (opts.Param("align", AlignOpt, "auto"), opts.Param("print_map", PrintMapOpt, False)),
    (opts.Param("copy_weights", CopyWeightsOpt, False), opts.Param("backward", BackwardOpt, False)),
    (opts.LOSS, opts.RTOL, opts.ATOL, opts.Param("fail_on", FailOnOpt), opts.KWARGS),
    (opts.Param("a_kwargs", AKwargsOpt), opts.Param("b_kwargs", BKwargsOpt)),
    opts.Param("a_kwargs_file", AKwFileOpt, convert=Path),
    opts.Param("b_kwargs_file", BKwFileOpt, convert=Path),
    (opts.WEIGHTS, opts.Param("a_weights", AWeightsOpt, convert=Path)),
    (opts.Param("b_weights", BWeightsOpt, convert=Path), opts.TRUST_PICKLE),
    (*opts.INPUTS, *opts.RUN, opts.FORMAT, opts.OUTPUT, opts.DEPTH),
    (opts.Param("annotate", AnnotateOpt), opts.Param("junit", JunitOpt)),
    (opts.SEED, opts.DEBUG),
)
def command() -> None:
    """Compare two models (A B), or one model under one changed setting (MODEL --vs
    KEY=VALUE), on the same inputs: per aligned module call, the error of each output,
    propagated and local, and the first divergence."""
