"""docs/reference.md agrees with the commands: the option grid, and every flag documented."""

from __future__ import annotations

from tests.docs_tables import REFERENCE, command_options, grid, page_grid


def test_option_grid_matches_the_commands():
    assert page_grid(REFERENCE.read_text(encoding="utf-8")) == grid(), (
        "docs/reference.md's option grid is stale: run python -m tests.docs_tables"
    )


def test_every_flag_of_every_command_is_documented():
    text = REFERENCE.read_text(encoding="utf-8")
    missing = sorted(
        f"{name} {flag}"
        for name, flags in command_options().items()
        for flag in flags
        if f"`{flag}" not in text
    )
    assert not missing, missing
