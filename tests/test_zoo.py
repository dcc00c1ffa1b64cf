"""The torchvision zoo: `inspect` on every name with its default input (`make zoo`, slow).

Each model either reports (exit 0) or ends with a clean exit code and one line;
a traceback is a failure. The counts are printed at the end and written to
``zoo-summary.txt`` for the README.
"""

from __future__ import annotations

import gc
import time
from collections import Counter
from pathlib import Path

import pytest

# A torchvision that does not import is an error of the suite, never an empty zoo.
import torchvision

from tests.conftest import invoke

NAMES = sorted(torchvision.models.list_models())
# Models that may end with a clean error instead of a report: name -> (exit code, words
# of the message). Every torchvision model reports today (docs/performance.md).
EXPECTED_ERRORS: dict[str, tuple[int, str]] = {}


def test_the_zoo_is_not_empty() -> None:
    assert len(NAMES) > 100, NAMES


RESULTS: dict[str, tuple[int, str, float]] = {}


@pytest.fixture(scope="module", autouse=True)
def summary():
    yield
    if not RESULTS:  # no zoo model ran (make test runs only the check above)
        return
    counts = Counter(
        "reported" if code == 0 else ("traceback" if code < 0 else "clean error")
        for code, _, _ in RESULTS.values()
    )
    lines = [
        f"zoo: {len(RESULTS)} models: {counts['reported']} reported, "
        f"{counts['clean error']} clean errors, {counts['traceback']} tracebacks"
    ]
    for name, (code, msg, _secs) in sorted(RESULTS.items()):
        if code != 0:
            lines.append(f"  {name}: exit {code}: {msg}")
    slowest = sorted(RESULTS.items(), key=lambda kv: -kv[1][2])[:5]
    lines.append("  slowest: " + ", ".join(f"{n} {s:.1f}s" for n, (_, _, s) in slowest))
    text = "\n".join(lines)
    Path("zoo-summary.txt").write_text(text + "\n")
    print("\n" + text)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_zoo_model(name: str) -> None:
    start = time.perf_counter()
    result = invoke("inspect", name, "--format", "json")
    secs = time.perf_counter() - start
    traceback = "Traceback" in result.stderr or "Traceback" in result.stdout
    code = -1 if traceback or result.exit_code not in (0, 2, 3, 4, 5) else result.exit_code
    RESULTS[name] = (code, result.stderr.strip().replace("\n", " | ")[:300], secs)
    gc.collect()
    assert code >= 0, result.stderr
    want_code, words = EXPECTED_ERRORS.get(name, (0, ""))
    assert result.exit_code == want_code, (name, result.exit_code, result.stderr[-500:])
    if code:
        assert result.stderr.strip().count("\n") == 0, result.stderr
        assert words in result.stderr, result.stderr
