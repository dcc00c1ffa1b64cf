"""Ranks that run different modules under ``--fsdp`` and ``--ddp`` (issue 28, B10).

FSDP2 pairs the ranks' all-gathers by order, one per unit call. Before the fix, a rank
that called one more unit than rank 0 (``tests.fixtures.rank_units:ExtraBlockOnRank1``)
made gloo abort rank 0 ("terminate called after throwing an instance of
'gloo::EnforceNotMet'"): no report, no hookcli line. Now every rank stops before that
unit and rank 0 says which rank called what (exit 4). DDP with
``find_unused_parameters=True`` runs such a model, and ``unused`` names what each rank
skipped (exit 1).

Each launch is 2 ranks, gloo, cpu, with the hard timeout of ``tests/test_distributed.py``.
The expected unit names and parameter indices come from the fixtures' own structure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from torch import nn

from hookcli.distributed.ranks import unit_desync_message
from tests.fixtures.rank_units import BranchInsideUnit, ExtraBlockOnRank1
from tests.test_distributed import check, report_of, rows_by_name, spoken, torchrun
from tests.test_fsdp import NEEDS_CPU_FSDP

FIXTURES = "tests.fixtures.rank_units"


def _ddp_indices(model: nn.Module, names: list[str]) -> str:
    """DDP's indices of ``names``: positions among the trainable parameters, in model order."""
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    return " ".join(str(trainable.index(n)) for n in sorted(names, key=trainable.index))


def _line_of(text: str) -> int:
    """The line of rank_units.py holding ``text`` (where the fixture raises)."""
    lines = (Path(__file__).parent / "fixtures" / "rank_units.py").read_text().splitlines()
    return next(i for i, ln in enumerate(lines, 1) if text in ln)


def _only_rank_0_speaks(run: dict[str, Any]) -> str:
    """Rank 0's single stderr line; nothing else on any stream; exit 4 on both ranks."""
    assert run["ranks"][0]["stdout"] == "" and run["ranks"][1]["stdout"] == "", run
    assert spoken(run["ranks"][1]["stderr"]) == [], run
    assert "EnforceNotMet" not in run["torchrun"] + run["ranks"][0]["stderr"]
    lines = spoken(run["ranks"][0]["stderr"])
    assert len(lines) == 1, run
    assert run["torchrun"].count("exitcode  : 4") == 2, run["torchrun"]
    return lines[0]


# -- the message, without torchrun ------------------------------------------------------------


def test_the_desync_message_names_what_each_rank_called_after_the_calls_alike() -> None:
    msg = unit_desync_message(["", "blocks.0", "blocks.1"], [None, "blocks.2"])
    assert msg.startswith(
        "the ranks' forwards ran different FSDP units: after 3 unit call(s) alike on every "
        "rank (the last: blocks.1), rank 0 ended its forward; rank 1 went on to call blocks.2; "
        "FSDP needs every rank to run the same units in the same order"
    )
    assert "\n" not in msg
    # ranks that did the same are named together; a unit called before is "again"
    msg = unit_desync_message(["", "a"], ["b", "a", "b", None])
    assert "ranks 0, 2 went on to call b; rank 1 went on to call a again; rank 3 ended" in msg
    assert unit_desync_message([], ["", None]).startswith(
        "the ranks' forwards ran different FSDP units: at the first unit call, rank 0 went on "
        "to call (root); rank 1 ended its forward;"
    )


# -- under torchrun ---------------------------------------------------------------------------


@pytest.mark.distributed
@NEEDS_CPU_FSDP
def test_an_extra_unit_on_rank_1_stops_every_rank_with_one_line(tmp_path: Path) -> None:
    model = ExtraBlockOnRank1()
    extra = f"blocks.{len(model.blocks) - 1}"  # the block only rank 1 runs
    alike = 1 + len(model.blocks) - 1  # the root, then every block but the last
    expected = (
        f"hookcli: error: the ranks' forwards ran different FSDP units: after {alike} unit "
        f"call(s) alike on every rank (the last: blocks.{len(model.blocks) - 2}), rank 0 ended "
        f"its forward; rank 1 went on to call {extra}; FSDP needs every rank to run the same "
        "units in the same order"
    )
    spec = f"{FIXTURES}:ExtraBlockOnRank1"
    run = torchrun(tmp_path, "grads", spec, "--fsdp", "--fail-on", "unused", "--dist-timeout", "60")
    assert _only_rank_0_speaks(run).startswith(expected)
    run = torchrun(tmp_path, "inspect", spec, "--fsdp", "--dist-timeout", "60")  # forward only
    assert _only_rank_0_speaks(run).startswith(expected)


@pytest.mark.distributed
@NEEDS_CPU_FSDP
def test_a_branch_that_is_its_own_unit_per_rank_stops_every_rank(tmp_path: Path) -> None:
    # RankBranch: trunk on every rank, then branch_a on even ranks, branch_b on odd ones,
    # each its own unit (FSDP2 would have paired branch_a's all-gather with branch_b's)
    spec = "sample_models.distributed:RankBranch"
    run = torchrun(tmp_path, "grads", spec, "--fsdp", "--fail-on", "unused", "--dist-timeout", "60")
    assert _only_rank_0_speaks(run).startswith(
        "hookcli: error: the ranks' forwards ran different FSDP units: after 2 unit call(s) "
        "alike on every rank (the last: trunk), rank 0 went on to call branch_a; rank 1 went "
        "on to call branch_b; "
    )


@pytest.mark.distributed
@NEEDS_CPU_FSDP
def test_a_branch_inside_a_unit_is_named_per_rank_and_the_backward_skipped(
    tmp_path: Path,
) -> None:
    spec = f"{FIXTURES}:BranchInsideUnit"
    run = torchrun(
        tmp_path, "grads", spec, "--fsdp", "-f", "json", "--fail-on", "unused",
        "--dist-timeout", "60",
    )  # fmt: skip
    assert "exitcode  : 1" in run["torchrun"], run  # a check failed
    report = report_of(run)
    model = BranchInsideUnit()
    # even ranks use each block's ``a``, odd ones its ``b``
    skips = {
        r: [f"blocks.{i}.{ab}.{w}" for i in range(len(model.blocks)) for w in ("weight", "bias")]
        for r, ab in ((0, "b"), (1, "a"))
    }
    assert [sorted(u) for u in report["totals"]["unused_params_per_rank"]] == [
        sorted(skips[0]),
        sorted(skips[1]),
    ]
    unused = check(report, "unused")
    assert not unused["passed"]
    for r in (0, 1):
        names = ", ".join(sorted(skips[r]))
        assert f"Parameters which did not receive grad for rank {r}: {names};" in unused["detail"]
        # DDP's indices (model order), not FSDP's order of its units (the root's head first)
        indices = _ddp_indices(model, skips[r])
        assert (
            f"Parameter indices which did not receive grad for rank {r}: {indices}"
            in (unused["detail"])
        )
    assert "backward was skipped" in report["totals"]["backward_skipped"]
    assert report["totals"]["reduced_grad_norm"] is None
    rows = rows_by_name(report)
    assert rows["blocks.0"]["ranks"] == [0, 1]  # the unit ran everywhere
    assert rows["blocks.0.a"]["ranks"] == [0] and rows["blocks.0.b"]["ranks"] == [1]
    assert rows["blocks.0.a"]["unused_params_per_rank"] == [
        [],
        ["blocks.0.a.weight", "blocks.0.a.bias"],
    ]
    assert rows["blocks.0.a"]["shard_numel_per_rank"] == [36, 36]  # Linear(8, 8): 72 over 2


@pytest.mark.distributed
@NEEDS_CPU_FSDP
def test_a_rank_that_fails_before_a_unit_the_others_run_is_named(tmp_path: Path) -> None:
    # rank 1 raises after blocks.0 while rank 0 goes on to blocks.1: before the fix rank 1
    # aborted in gloo (its status exchange met rank 0's all-gather of blocks.1)
    spec = f"{FIXTURES}:FailsBeforeBlock1OnRank1"
    run = torchrun(tmp_path, "grads", spec, "--fsdp", "--dist-timeout", "60")
    assert _only_rank_0_speaks(run) == (
        "hookcli: error: rank 1 failed: forward failed in (root) (FailsBeforeBlock1OnRank1) "
        "with input shapes [4, 8]: ValueError: refusing to go on past blocks.0 on rank 1 "
        f"(raised at tests/fixtures/rank_units.py:{_line_of('refusing to go on past')} in forward)"
    )


@pytest.mark.distributed
def test_ddp_runs_an_extra_module_on_one_rank_and_names_it(tmp_path: Path) -> None:
    spec = f"{FIXTURES}:ExtraBlockOnRank1"
    run = torchrun(
        tmp_path, "grads", spec, "--ddp", "-f", "json", "--fail-on", "unused",
        "--dist-timeout", "60",
    )  # fmt: skip
    assert "exitcode  : 1" in run["torchrun"], run  # a check failed, no abort
    report = report_of(run)
    model = ExtraBlockOnRank1()
    extra = f"blocks.{len(model.blocks) - 1}"
    skipped = [f"{extra}.weight", f"{extra}.bias"]
    assert [sorted(u) for u in report["totals"]["unused_params_per_rank"]] == [sorted(skipped), []]
    unused = check(report, "unused")
    assert not unused["passed"]
    assert (
        f"Parameters which did not receive grad for rank 0: {', '.join(sorted(skipped))}; "
        f"Parameter indices which did not receive grad for rank 0: "
        f"{_ddp_indices(model, skipped)}"
    ) in unused["detail"]
    assert "did not receive grad for rank 1" not in unused["detail"]  # rank 1 used them all
    rows = rows_by_name(report)
    assert rows[extra]["ranks"] == [1]
    assert rows["head"]["ranks"] == [0, 1]
    # after DDP's all-reduce the extra block's gradient is rank 1's halved: both ranks hold it
    assert rows[extra]["reduced_grad_norm"] == pytest.approx(
        rows[extra]["grad_norm_per_rank"][1] / 2, rel=1e-5
    )
