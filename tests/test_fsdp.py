"""``--fsdp``: hookcli under torchrun with FSDP2 (2 ranks, gloo, cpu), against plain FSDP2.

``tests/fsdp_oracle.py`` runs the same step with plain ``fully_shard`` (no hookcli code);
the DDP figures come from hookcli's own ``--ddp``, itself tested against plain DDP in
tests/test_distributed.py. Every launch has a hard timeout, and the launches are few
(each costs several seconds here): one launch checks many things.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from hookcli.distributed.fsdp import (
    cpu_fsdp_supported,
    memory_per_rank,
    shard_plan,
)
from hookcli.memory.fsdp import shard_rows, unit_params
from tests.conftest import invoke
from tests.test_distributed import (
    check,
    check_nan_on_rank_1,
    close,
    oracle,
    raise_site,
    report_of,
    rows_by_name,
    spoken,
    torchrun,
)

ORACLE = Path(__file__).with_name("fsdp_oracle.py")
MLP = "sample_models.distributed:HealthyMLP"
DECODER = "sample_models.decoder:Decoder"


def fsdp_oracle(tmp: Path, spec: str, *extra: str) -> list[dict[str, Any]]:
    out = tmp / "fsdp_oracle"
    out.mkdir(exist_ok=True)
    run = torchrun(tmp, str(ORACLE), spec, str(out), *extra, module=False)
    assert run["returncode"] == 0, run
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


# -- the shard plan and the memory arithmetic, without torchrun ------------------------------


def test_default_plan_is_each_block_of_the_largest_modulelist() -> None:
    from sample_models.decoder import Decoder

    assert shard_plan(Decoder(layers=3)) == ("layers.0", "layers.1", "layers.2")

    class TwoLists(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.small = nn.ModuleList([nn.Linear(2, 2)])
            self.big = nn.ModuleList([nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)])

    assert shard_plan(TwoLists()) == ("big.0", "big.2")  # modules without params are skipped


def test_plan_without_modulelist_is_each_top_level_child_and_shard_picks_classes() -> None:
    from sample_models.decoder import Decoder
    from sample_models.distributed import BatchNormNet

    assert shard_plan(BatchNormNet()) == ("fc", "bn", "head")
    plan = shard_plan(Decoder(layers=1), ["Linear", "Block"])
    # inner units before the block that holds them
    linears = [n for n, m in Decoder(layers=1).named_modules() if isinstance(m, nn.Linear)]
    assert sorted(plan) == sorted([*linears, "layers.0"])
    assert plan.index("layers.0.self_attn.q_proj") < plan.index("layers.0")


def test_shard_class_missing_is_a_usage_error() -> None:
    from hookcli.errors import UsageError
    from sample_models.distributed import HealthyMLP

    with pytest.raises(UsageError, match="--shard Conv2d: no module of that class"):
        shard_plan(HealthyMLP(), ["Conv2d"])


@pytest.mark.parametrize(("dim0", "world"), [(16, 2), (3, 2), (1, 4), (7, 3), (5, 8)])
def test_shard_rows_follow_torch_chunk(dim0: int, world: int) -> None:
    chunks = [c.shape[0] for c in torch.arange(dim0).chunk(world)]
    chunks += [0] * (world - len(chunks))
    assert [shard_rows(dim0, world, r) for r in range(world)] == chunks


def test_memory_per_rank_from_the_plan() -> None:
    from sample_models.decoder import Decoder

    model = Decoder(layers=3)
    units = (*shard_plan(model), "")
    managed = unit_params(model, units)
    assert sum(len(v) for v in managed.values()) == len(list(model.parameters()))
    full = {u: sum(p.numel() * 4 for p in ps) for u, ps in managed.items()}
    mem = memory_per_rank(model, units, ["layers.0", "layers.1", "layers.2"], 2, 1, 2)
    # every dimension 0 here is even: each rank holds exactly half
    total = sum(p.numel() * 4 for p in model.parameters())
    assert mem["param_bytes"] == mem["grad_bytes"] == total // 2
    assert mem["optimizer_state_bytes"] == total  # adam: two copies of the shard
    assert mem["all_gather_peak_bytes"] == full[""] + 2 * full["layers.0"]


def test_fsdp_usage_errors_exit_2_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    cases = [
        (["grads", MLP, "--fsdp"], "--fsdp needs a distributed launch"),
        (["grads", MLP, "--fsdp", "--ddp"], "choose one"),
        (["grads", MLP, "--shard", "Linear"], "--shard needs --fsdp"),
        (["inspect", MLP, "--shard", "Linear"], "--shard needs --fsdp"),
        (["grads", MLP, "--fsdp", "--fail-on", "zero-grad"], "does not combine with --fsdp"),
        (["cost", MLP, "--fsdp"], "--fsdp needs a distributed launch"),
        (["grads", MLP, "--no-broadcast-buffers"], "--no-broadcast-buffers needs --ddp"),
    ]
    for args, needle in cases:
        result = invoke(*args)
        assert result.exit_code == 2, (args, result.output)
        assert needle in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1
        assert "Traceback" not in result.stderr


def test_fsdp_refused_in_one_line_where_torch_cannot_run_it_on_cpu(monkeypatch) -> None:
    """torch 2.6's CPU stream cannot record events, so FSDP2 fails in the first forward
    there: hookcli says so before launching anything (exit 2)."""
    import hookcli.distributed.fsdp

    monkeypatch.setattr(hookcli.distributed.fsdp, "cpu_fsdp_supported", lambda: False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    result = invoke("grads", MLP, "--fsdp")
    assert result.exit_code == 2
    assert "--fsdp on the CPU needs a newer torch" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


NEEDS_CPU_FSDP = pytest.mark.skipif(
    not cpu_fsdp_supported(),
    reason="this torch cannot run FSDP2 on the CPU (its CPU stream has no record_event)",
)


# -- two ranks under torchrun ----------------------------------------------------------------


@pytest.mark.distributed
@NEEDS_CPU_FSDP
def test_grads_fsdp_matches_plain_fsdp2_and_ddp(tmp_path: Path) -> None:
    ref = fsdp_oracle(tmp_path, MLP, "--seed", "2")
    flags = ("-f", "json", "--seed", "2", "--fail-on", "unused,nan,inf,desync")
    fsdp_run = torchrun(tmp_path, "grads", MLP, "--fsdp", *flags)
    assert fsdp_run["returncode"] == 0, fsdp_run
    fsdp = report_of(fsdp_run)  # one report: rank 1 printed nothing on stdout
    assert spoken(fsdp_run["ranks"][1]["stderr"]) == []
    ddp = report_of(torchrun(tmp_path, "grads", MLP, "--ddp", *flags))

    import jsonschema

    import hookcli.schema
    from sample_models.distributed import HealthyMLP

    jsonschema.validate(fsdp, hookcli.schema.load())
    assert fsdp["totals"]["params"] == sum(p.numel() for p in HealthyMLP().parameters())
    assert fsdp["model"]["class"] == "HealthyMLP"
    assert fsdp["settings"]["fsdp_units"] == [u or "(root)" for u in ref[0]["units"]]
    assert all(c["passed"] for c in fsdp["checks"]), fsdp["checks"]
    # the reduced norm: hookcli --fsdp == hookcli --ddp == clip_grad_norm_ in plain FSDP2
    total = fsdp["totals"]["reduced_grad_norm"]
    assert math.isclose(total, ddp["totals"]["reduced_grad_norm"], rel_tol=1e-5)
    assert math.isclose(total, ref[0]["total_norm"], rel_tol=1e-5)
    assert all(close(fsdp["totals"]["loss_per_rank"][r], ref[r]["loss"]) for r in (0, 1))
    # per parameter: shards and gradients as plain FSDP2 has them on each rank
    shards = {s["name"]: s for s in fsdp["shards"]}
    assert set(shards) == set(ref[0]["params"])
    for name, s in shards.items():
        assert s["shape"] == ref[0]["params"][name]["shape"]
        for r in (0, 1):
            mine = ref[r]["params"][name]
            assert s["shard_numel_per_rank"][r] == mine["shard_numel"]
            assert s["shard_bytes_per_rank"][r] == mine["shard_bytes"]
            assert close(s["shard_grad_norm_per_rank"][r], mine["shard_grad_norm"])
            assert close(s["grad_norm_per_rank"][r], ref[r]["local"][name])  # before reduction
        assert close(s["reduced_grad_norm"], ref[0]["params"][name]["reduced_grad_norm"])
    assert (
        sum(s["shard_numel_per_rank"][0] for s in shards.values())
        == (fsdp["totals"]["shard_params_per_rank"][0])
    )
    # per parameter: the same reduced gradient as plain DDP's all-reduce gives
    plain_ddp = oracle(tmp_path, MLP, "--seed", "2")
    assert set(plain_ddp[0]["reduced_params"]) == set(shards)
    for name, s in shards.items():
        assert close(s["reduced_grad_norm"], plain_ddp[0]["reduced_params"][name]), name
    # per module: the same reduced gradients, and the same local ones, as under DDP
    frows, drows = rows_by_name(fsdp), rows_by_name(ddp)
    for name in ("fc1", "fc2", "head"):
        assert close(frows[name]["reduced_grad_norm"], drows[name]["reduced_grad_norm"])
        for r in (0, 1):
            assert close(frows[name]["grad_norm_per_rank"][r], drows[name]["grad_norm_per_rank"][r])
        assert frows[name]["type"] == "Linear" and frows[name]["fsdp_unit"]


@pytest.mark.distributed
@NEEDS_CPU_FSDP
def test_failure_on_one_rank_ends_every_rank_with_one_line(tmp_path: Path) -> None:
    spec = "sample_models.distributed:FailsOnRank"
    run = torchrun(tmp_path, "grads", spec, "--fsdp", "--dist-timeout", "60")
    assert run["returncode"] != 0
    assert spoken(run["ranks"][0]["stderr"]) == [
        "hookcli: error: rank 1 failed: forward failed in block (_Fragile) with input shapes "
        f"[4, 8]: ValueError: refusing to run on rank 1 (raised at {raise_site()} in forward)"
    ]
    assert spoken(run["ranks"][1]["stderr"]) == []
    assert run["ranks"][0]["stdout"] == "" and run["ranks"][1]["stdout"] == ""
    assert "exitcode  : 4" in run["torchrun"]


@pytest.mark.distributed
@NEEDS_CPU_FSDP
def test_nan_on_one_rank_and_drifting_buffers_fail_their_checks(tmp_path: Path) -> None:
    """The failing side of ``nan`` and ``desync`` under FSDP2 (the healthy side is above)."""
    spec = "sample_models.distributed:NaNOnRank"
    run = torchrun(
        tmp_path, "grads", spec, "--fsdp", "-f", "json", "--fail-on", "nan,inf",
        "--dist-timeout", "60",
    )  # fmt: skip
    check_nan_on_rank_1(run)  # the reduce-scatter spreads rank 1's NaN

    # FSDP2 never broadcasts buffers: BatchNorm's running statistics, updated from each
    # rank's own batch, stay apart (plain DDP's oracle shows they differ after a step)
    spec = "sample_models.distributed:BatchNormNet"
    run = torchrun(
        tmp_path, "grads", spec, "--fsdp", "-f", "json", "--fail-on", "desync",
        "--dist-timeout", "60",
    )  # fmt: skip
    assert run["returncode"] != 0
    desync = check(report_of(run), "desync")
    assert not desync["passed"]
    assert {"bn.running_mean", "bn.running_var"} <= set(desync["layers"]), desync


@pytest.mark.distributed
@NEEDS_CPU_FSDP
def test_inspect_stats_and_cost_fsdp_on_a_decoder(tmp_path: Path) -> None:
    ref = fsdp_oracle(tmp_path, DECODER, "--blocks", "layers")
    from sample_models.decoder import Decoder

    model = Decoder()
    n_params = sum(p.numel() for p in model.parameters())
    per_rank = [sum(p["shard_numel"] for p in ref[r]["params"].values()) for r in (0, 1)]
    bytes_per_rank = [sum(p["shard_bytes"] for p in ref[r]["params"].values()) for r in (0, 1)]

    inspect = torchrun(tmp_path, "inspect", DECODER, "--fsdp", "-f", "json")
    assert inspect["returncode"] == 0, inspect
    report = report_of(inspect)
    assert report["settings"]["fsdp_units"] == ["layers.0", "layers.1", "(root)"]
    assert [u or "(root)" for u in ref[0]["units"]] == report["settings"]["fsdp_units"]
    assert report["totals"]["params"] == n_params
    assert report["totals"]["shard_params_per_rank"] == per_rank
    rows = rows_by_name(report)
    q = "layers.0.self_attn.q_proj"
    assert rows[q]["shard_numel_per_rank"] == [
        ref[r]["params"][f"{q}.weight"]["shard_numel"] for r in (0, 1)
    ]
    assert rows[q]["unsharded_shapes"] == [[64, 64]] and rows[q]["type"] == "Linear"

    stats = torchrun(tmp_path, "stats", DECODER, "--fsdp", "--mode", "train", "-f", "json")
    assert stats["returncode"] == 0, stats
    root = rows_by_name(report_of(stats))[""]
    assert all(close(root["mean_per_rank"][r], ref[r]["output_mean"]) for r in (0, 1))

    cost = torchrun(tmp_path, "cost", DECODER, "--fsdp", "-f", "json")
    assert cost["returncode"] == 0, cost
    cost_report = report_of(cost)
    import jsonschema

    import hookcli.schema

    jsonschema.validate(cost_report, hookcli.schema.load())
    # the shard plan's parts (JSON only): each rank's shards against fully_shard's
    mem = {row["component"]: row for row in cost_report["memory_parts_per_rank"]}
    assert mem["params"]["fsdp_bytes_per_rank"] == bytes_per_rank
    assert mem["params"]["ddp_bytes"] == n_params * 4
    assert mem["adam state"]["fsdp_bytes_per_rank"] == [2 * b for b in bytes_per_rank]
    managed = unit_params(model, ("layers.0", "layers.1", ""))
    unsharded = sum(p.numel() * 4 for ps in managed.values() for p in ps)
    # two blocks: the root + both blocks is the whole model, unsharded
    assert mem["all-gather peak (unsharded)"]["fsdp_bytes_per_rank"] == [unsharded] * 2
