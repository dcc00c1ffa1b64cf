"""--fit: the largest batch whose training-step peak fits, searched on meta.

Checked against a real search: the same model on the CPU, each batch's step measured
by the allocator oracle (tests/memory_oracle.py), the largest batch under the limit.
"""

from __future__ import annotations

import pytest
import torch

from hookcli.memory.fit import MAX_BATCH, batch_of, largest_fitting, rebatched
from tests.conftest import invoke, invoke_json, run_hookcli
from tests.fixtures import memory_models
from tests.memory_oracle import measure_step, steady_step


@pytest.mark.parametrize(
    "peak",
    [
        lambda b: 1000 + 37 * b,  # a line
        lambda b: max(5000, 1000 + 90 * b),  # flat (the optimizer's step), then a line
        lambda b: 1000 + b * b,  # convex
        lambda b: 800 + 10 * b + (300 if b > 40 else 0),  # a jump
    ],
)
@pytest.mark.parametrize("limit", [900, 1050, 4999, 5000, 6543, 20000])
def test_search_equals_brute_force(peak, limit) -> None:
    calls: list[int] = []

    def counted(b: int) -> int:
        calls.append(b)
        return int(peak(b))

    found = largest_fitting(counted, limit)
    brute = 0
    while brute < 10_000 and peak(brute + 1) <= limit:
        brute += 1
    assert found.batch == brute
    assert found.next_peak == peak(brute + 1)
    assert found.peak == (peak(brute) if brute else None)
    assert len(set(calls)) == found.evaluations <= 30


def test_search_stops_at_the_cap() -> None:
    assert largest_fitting(lambda b: 0, 1).batch == MAX_BATCH


def test_rebatched_inputs() -> None:
    x, mask, table = torch.zeros(4, 3), torch.ones(4, dtype=torch.bool), torch.zeros(7, 2)
    args, kwargs = (x, [mask, 3]), {"table": table, "m": mask}
    assert batch_of([args, kwargs]) == 4
    a, k = rebatched(args, 4, 9), rebatched(kwargs, 4, 9)
    assert a[0].shape == (9, 3) and a[0].is_meta and a[1][0].dtype == torch.bool
    assert a[1][1] == 3 and k["m"].shape == (9,)
    assert k["table"].is_meta and k["table"].shape == table.shape  # on meta, as it was
    assert rebatched(k, 9, 9)["table"] is k["table"]


DECODER = [
    "sample_models.decoder:Decoder",
    *("-k", "vocab=512", "-k", "dim=128", "-k", "layers=2", "-k", "heads=4"),
    *("-k", "kv_heads=2", "-k", "hidden=352", "-k", "seq=64"),
]


def _measured(batch: int) -> int:
    torch.manual_seed(0)
    model = memory_models.llama()
    x = memory_models.tokens(batch)
    return measure_step(steady_step(model, (x,), optimizer="sgd")).peak_bytes


def test_fit_equals_a_real_search_on_a_small_decoder() -> None:
    measured = {b: _measured(b) for b in range(1, 9)}
    assert all(measured[b] < measured[b + 1] for b in range(1, 8))
    limit = (measured[5] + measured[6]) // 2
    real = max(b for b, p in measured.items() if p <= limit)
    rep = invoke_json(
        "cost",
        *DECODER,
        "--device",
        "meta",
        "-i",
        "int64:1x64:0..512",
        "--optimizer",
        "sgd",
        "--fit",
        str(limit),
    )
    t = rep["totals"]
    assert t["fit_batch"] == real == 5
    assert t["fit_peak_bytes"] <= limit < t["fit_next_peak_bytes"]
    # each within the tracker's error of the measured peaks at the same batches
    assert abs(t["fit_peak_bytes"] - measured[5]) <= 0.05 * measured[5]
    assert abs(t["fit_next_peak_bytes"] - measured[6]) <= 0.05 * measured[6]


def test_fit_needs_no_meta() -> None:
    """On the CPU, --fit searches on a meta copy of the model and says so on stderr."""
    args = ("cost", *DECODER, "-i", "int64:1x64:0..512", "--optimizer", "sgd", "--fit", "64MiB")
    on_cpu = invoke_json(*args)["totals"]
    on_meta = invoke_json(*args, "--device", "meta")["totals"]
    assert on_cpu["fit_batch"] == on_meta["fit_batch"] > 0
    res = invoke(*args)
    assert res.exit_code == 0 and "--fit searches batch sizes on meta" in res.stderr


def test_fit_line_in_the_table() -> None:
    res = run_hookcli(
        "cost", *DECODER, "--device", "meta", "-i", "int64:1x64:0..512", "--fit", "64MiB"
    )
    assert res.returncode == 0, res.stderr
    assert "Fits in 64.00 MiB: batch " in res.stdout
