"""The skip ledger: every skip the suite may take, and on which machines.

A check must not turn green by skipping. Each skip a run takes must match a row below
whose condition holds on this machine; any other skip fails the run (``conftest.py``
checks it when the session ends and prints the skips it did not expect). The docs
pages' own ``<!-- docs-check: skip -->`` blocks are counted, not matched: a run may skip
at most ``DOCS_SKIPS`` of them, so a directive added without changing the count fails.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass


def _no_cuda() -> bool:
    import torch

    return not torch.cuda.is_available()


def _torch_below(major: int, minor: int) -> Callable[[], bool]:
    def below() -> bool:
        import torch

        parts = torch.__version__.split("+")[0].split(".")
        return (int(parts[0]), int(parts[1])) < (major, minor)

    return below


def _module_missing(name: str) -> Callable[[], bool]:
    def missing() -> bool:
        import importlib.util

        return importlib.util.find_spec(name) is None

    return missing


def _no_browser() -> bool:
    """No Playwright or no Chromium (tests/test_html_browser.py; ``make test-browser``
    installs both, and there a missing one fails instead)."""
    import importlib.util
    import os
    import shutil

    if os.environ.get("HOOKCLI_REQUIRE_BROWSER"):
        return False
    found = os.environ.get("HOOKCLI_CHROMIUM") or shutil.which("chromium")
    return importlib.util.find_spec("playwright") is None or not (
        found or shutil.which("chromium-browser") or shutil.which("google-chrome")
    )


def _always() -> bool:
    return True


@dataclass(frozen=True)
class Allowed:
    """A skip reason (regex, searched) and the condition under which it is expected."""

    reason: str
    when: Callable[[], bool]
    why: str


LEDGER = (
    Allowed(r"needs (a )?CUDA", _no_cuda, "CUDA tests, on a machine without a GPU"),
    Allowed(
        r"cannot run FSDP2 on the CPU",
        _torch_below(2, 8),
        "an old torch (the matrix's floor) has no CPU FSDP2",
    ),
    Allowed(r"has no aten\.|has no convolution_backward formula", _torch_below(2, 8), "old torch"),
    Allowed(r"\(private\) moved in this torch", _torch_below(2, 8), "old torch"),
    Allowed(r"No module named 'tomllib'", _module_missing("tomllib"), "Python 3.10"),
    Allowed(r"No module named 'yaml'", _module_missing("yaml"), "PyYAML not installed"),
    Allowed(r"No module named 'pydantic'", _module_missing("pydantic"), "pydantic not installed"),
    Allowed(r"needs Linux /proc", _always, "a machine without /proc"),
    Allowed(r"needs playwright and chromium", _no_browser, "the html pages' browser tests"),
)

# Blocks of README.md and docs/*.md marked ``<!-- docs-check: skip REASON -->``.
DOCS_SKIPS = 6  # docs/exit-codes.md: torch failing to load under ulimit -v (machine-dependent)
DOCS_TEST = "test_docs_examples.py::test_example_prints_what_the_page_shows"


def unexpected(skips: list[tuple[str, str]]) -> list[str]:
    """The skips, as ``(nodeid, reason)``, that the ledger does not allow here."""
    bad: list[str] = []
    docs = [(n, r) for n, r in skips if DOCS_TEST in n]
    if len(docs) > DOCS_SKIPS:
        bad += [f"{n}: {r}" for n, r in docs]
        bad.append(f"{len(docs)} docs examples skipped, at most {DOCS_SKIPS} expected")
    for nodeid, reason in skips:
        if DOCS_TEST in nodeid:
            continue
        if not any(re.search(a.reason, reason) and a.when() for a in LEDGER):
            bad.append(f"{nodeid}: {reason}")
    return bad
