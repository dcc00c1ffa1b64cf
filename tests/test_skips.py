"""The skip ledger (tests/skips.py): skips nobody expected fail the run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.skips import DOCS_SKIPS, DOCS_TEST, unexpected
from tests.test_docs_examples import all_blocks

ROOT = Path(__file__).resolve().parent.parent


def test_the_docs_skip_count_is_the_pages_own() -> None:
    # the committed count is exactly the blocks the pages mark skip: a new skip directive
    # (or one more skipped docs example at run time) needs this number changed on purpose
    assert sum(b.skip is not None for b in all_blocks()) == DOCS_SKIPS


def test_an_unlisted_skip_is_unexpected() -> None:
    assert unexpected([("tests/test_x.py::test_a", "Skipped: torch is too new")]) == [
        "tests/test_x.py::test_a: Skipped: torch is too new"
    ]


def test_one_docs_skip_too_many_is_unexpected() -> None:
    docs = [(f"tests/{DOCS_TEST}[p:{i}]", "documented") for i in range(DOCS_SKIPS)]
    assert unexpected(docs) == []
    more = [*docs, (f"tests/{DOCS_TEST}[p:99]", "the version")]
    assert unexpected(more)[-1].endswith(f"at most {DOCS_SKIPS} expected")


def test_a_cuda_skip_is_expected_exactly_without_cuda() -> None:
    import torch

    bad = unexpected([("tests/test_x.py::test_gpu", "Skipped: needs CUDA")])
    assert bool(bad) == torch.cuda.is_available()


@pytest.mark.parametrize("workers", [None, "2"], ids=["one-process", "xdist"])
def test_a_run_with_an_unexpected_skip_fails(tmp_path: Path, workers: str | None) -> None:
    # the whole mechanism: pytest on a file of ours whose only test skips for a reason
    # the ledger does not know exits non-zero and names it, in one process and as `make
    # test` runs it, in pytest-xdist workers (the ledger is kept where reports arrive)
    # a name of this process and parametrization: under xdist the two cases can run at
    # once in two workers, whose tmp_path names are the same (each worker has its own
    # base), and one would delete the other's file
    probe = ROOT / "tests" / f"test_zz_skip_probe_{os.getpid()}_{workers or 'one'}.py"
    probe.write_text(
        textwrap.dedent(
            """
            import pytest

            def test_skips_for_no_good_reason():
                pytest.skip("a reason nobody listed")
            """
        )
    )
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:randomly",
                "-p",
                "no:cacheprovider",
                *(["-n", workers] if workers else []),
                str(probe),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        probe.unlink()
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "a reason nobody listed" in proc.stdout
    assert "tests/skips.py" in proc.stdout
