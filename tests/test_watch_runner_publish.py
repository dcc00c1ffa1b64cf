"""benchmarks/publish.py: a figure whose margin to its target is smaller than its noise
row's distance from 1 is published "within noise", neither met nor NOT MET (the watch
rows: issue 45). The oracle is arithmetic on the figures given, not a run."""

from __future__ import annotations

from typing import Any

import pytest


def _data(results: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "date": "2030-01-02 03:04 UTC",
        "torch": "9.9.0",
        "python": "3.11.0",
        "machine": {"cpu": "CPU-A", "cores": 2, "load_1min": 0.5, "threads": 2},
        "benchmarks": [{"bench": "bench_watch"}],
        "results": results,
    }


def _row(key: str, value: float) -> dict[str, Any]:
    return {"key": key, "value": value, "what": key.replace("_", " "), "threads": 2}


@pytest.mark.parametrize(
    "value, noise, expected",
    [
        (1.045, 0.966, "within noise"),  # the GPT figures: margin 0.005 < 0.034
        (1.019 + 0.025, 0.966, "within noise"),  # over its bound, still inside the noise
        (1.02, 1.001, "met"),  # a margin of 0.03 against 0.001 of noise
        (1.096, 1.050, "within noise"),  # over by 0.046, with a noise row of 0.050
        (1.20, 1.050, "NOT MET"),
        (0.97, 1.0, "met"),  # no noise at all: as measured
    ],
)
def test_a_figure_inside_its_noise_is_within_noise(
    value: float, noise: float, expected: str
) -> None:
    from benchmarks import publish

    results = [_row("watch_gpt", value), _row("watch_gpt_again", noise)]
    assert publish.status(results[0], results) == expected
    text = publish.table(_data(results), None, [])
    row = next(line for line in text.splitlines() if line.startswith("| watch gpt |"))
    assert row.strip("| ").split(" | ")[4] == expected
    lines = publish.statuses(_data(results))
    assert len(lines) == 1 and lines[0].startswith(expected)
    if expected == "within noise":
        assert "noise row" in lines[0]
    # the line the benchmark prints as it runs says the same
    from benchmarks.common import target_line

    assert target_line("x", value, "watch_gpt", noise).endswith(f": {expected})")


def test_every50_and_device_rows_find_their_noise_row() -> None:
    from benchmarks import publish

    results = [
        _row("watch_gpt_every50", 1.019),  # target <= 1.02: margin 0.001
        _row("watch_gpt_again", 0.966),
        _row("watch_inproc_resnet18_every50_cuda", 1.019),
        _row("watch_inproc_resnet18_again_cuda", 1.003),
        _row("watch_inproc_resnet18", 1.019),  # no noise row (only the cuda one): as measured
    ]
    assert publish.noise_row(results[0], results) is results[1]
    assert publish.noise_row(results[2], results) is results[3]
    assert publish.status(results[0], results) == "within noise"
    assert publish.status(results[4], results) == "met"
    # without rows beside it a figure is judged as measured
    assert publish.status(results[0]) == "met"


def test_the_in_process_cpu_time_rows_are_judged_against_their_own_noise_row() -> None:
    """bench_watch's process CPU-time figures (beside the wall-clock ones, the same
    rounds) carry the same targets and are judged against the CPU-time noise row,
    not the wall clock's."""
    from benchmarks import publish
    from benchmarks.common import target_line

    results = [
        _row("watch_inproc_resnet18_every50", 1.030),
        _row("watch_inproc_resnet18_again", 1.040),  # a noisy wall clock
        _row("watch_inproc_cpu_resnet18_every50", 1.030),
        _row("watch_inproc_cpu_resnet18_again", 1.002),  # a steadier CPU time
        _row("watch_inproc_cpu_resnet18", 1.010),
    ]
    assert publish.noise_row(results[2], results) is results[3]
    assert publish.noise_row(results[4], results) is results[3]
    assert publish.target(results[2]) == "<= 1.02"
    assert publish.target(results[4]) == "<= 1.05"
    # over 1.02 by 0.010: inside the wall clock's noise (0.040), outside the CPU time's
    assert publish.status(results[0], results) == "within noise"
    assert publish.status(results[2], results) == "NOT MET"
    assert publish.status(results[4], results) == "met"
    line = target_line("x", 1.030, "watch_inproc_cpu_resnet18_every50", 1.002)
    assert line.endswith("(target <= 1.02: NOT MET)")
