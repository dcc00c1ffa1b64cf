"""The option grid of docs/reference.md, generated from the commands themselves.

``python -m tests.docs_tables`` rewrites the grid between its markers;
tests/test_docs.py fails when the page and the commands disagree.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import typer

from hookcli.cli import app
from hookcli.helpfmt import PANEL_ORDER, panel_of

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "reference.md"
START, END = "<!-- options-grid:start -->", "<!-- options-grid:end -->"


def command_options() -> dict[str, dict[str, str]]:
    """command -> {first long flag: panel} for every option but --help."""
    group = typer.main.get_command(app)
    out: dict[str, dict[str, str]] = {}
    for name, cmd in group.commands.items():  # type: ignore[attr-defined]
        flags: dict[str, str] = {}
        for p in cmd.params:
            longs = [o for o in getattr(p, "opts", ()) if o.startswith("--")]
            if p.param_type_name == "option" and longs and longs[0] != "--help":
                flags[longs[0]] = panel_of(p)
        out[name] = flags
    return out


def grid() -> str:
    """The Markdown grid: one row per option that two or more commands take."""
    opts = command_options()
    names = list(opts)
    shared: dict[str, str] = {}
    for flags in opts.values():
        for flag, panel in flags.items():
            if sum(flag in f for f in opts.values()) >= 2:
                shared[flag] = panel
    order = {p: i for i, p in enumerate(PANEL_ORDER)}
    rows = sorted(shared, key=lambda f: (order.get(shared[f], len(order)), f))
    lines = [
        "| option | panel | " + " | ".join(names) + " |",
        "|---|---|" + "|".join("---" for _ in names) + "|",
    ]
    for flag in rows:
        cells = ["x" if flag in opts[n] else "" for n in names]
        lines.append(f"| `{flag}` | {shared[flag]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


_BLOCK = re.compile(re.escape(START) + r"\n?(.*?)\n?" + re.escape(END), re.S)


def page_grid(text: str) -> str:
    match = _BLOCK.search(text)
    return match.group(1) if match else ""


def main() -> int:
    text = REFERENCE.read_text(encoding="utf-8")
    new = _BLOCK.sub(lambda _: f"{START}\n{grid()}\n{END}", text)
    REFERENCE.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
