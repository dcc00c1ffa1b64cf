"""Ranks release the process group together (hookcli/distributed/launch.py ``_release``).

On torch 2.6, with FSDP2's device mesh, a rank's ``destroy_process_group`` hung for good
once the other rank had destroyed its own and exited (``cost --fsdp --device meta -d 1``
hung 3 runs in 4). After a run every rank finished, each rank now marks in the rendezvous
store that it released the group and waits for the others' marks before it leaves.
Here two ranks are threads sharing one in-process store.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch.distributed as dist

from hookcli.distributed import launch


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Any:
    shared = dist.HashStore()
    monkeypatch.setattr(launch, "_store", lambda: shared)
    monkeypatch.setattr(dist, "destroy_process_group", lambda *a, **k: None)
    return shared


def test_a_rank_that_finished_first_waits_for_the_others(store: Any) -> None:
    done: dict[int, float] = {}

    def rank(r: int) -> None:
        launch._release(SimpleNamespace(rank=r, world_size=2), together=True)
        done[r] = time.monotonic()

    first = threading.Thread(target=rank, args=(0,))
    first.start()
    time.sleep(0.5)
    assert 0 not in done  # still there: rank 1 has not released yet
    started = time.monotonic()
    rank(1)
    first.join(timeout=10)
    assert done[0] >= started and done[1] >= started  # both left after rank 1 released


def test_after_a_failure_no_rank_waits(store: Any) -> None:
    """A lost peer will never mark the store: a failed run leaves at once."""
    start = time.monotonic()
    launch._release(SimpleNamespace(rank=0, world_size=2), together=False)
    assert time.monotonic() - start < 5
    assert not store.check(["hookcli/released/0"])


def test_hookclis_own_failure_on_a_rank_is_an_internal_error() -> None:
    """Under a launch as in one process: hookcli's own bug is exit 70, never the model's 4."""
    from hookcli.errors import EXIT_INTERNAL, RunError

    status = launch._status_of(1, KeyError("row"))
    assert status.code == EXIT_INTERNAL
    assert status.message.startswith("internal error in hookcli (not the model's fault)")
    model = launch._status_of(1, RunError("forward failed in fc"))
    assert model.code == 4 and model.message == "forward failed in fc"
