"""``--ddp``: hookcli under torchrun (2 ranks, gloo, cpu), checked against plain DDP.

The torchrun tests (marked slow: each launch starts two Python processes that
import torch) compare hookcli's report with ``tests/ddp_oracle.py``, which runs the
same step with plain torch.distributed. Every launch has a hard timeout, so a
hang fails the test instead of stalling the suite. Each rank's stdout and stderr
are captured in files (torchrun ``--log-dir --redirects 3``), so the tests can
tell which rank printed what.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hookcli.distributed.launch import DistEnv, detect_env, first_host
from hookcli.distributed.ranks import (
    Divergence,
    RankRows,
    desync_check,
    merge_checks,
    merge_rows,
    spread,
    unused_check,
)
from hookcli.report import CheckResult
from tests.conftest import invoke

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = Path(sys.executable).with_name("torchrun")
ORACLE = Path(__file__).with_name("ddp_oracle.py")
TIMEOUT = 120  # seconds: a hung rank fails the test


def _env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "TORCHELASTIC_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env.update(
        PYTHONPATH=str(ROOT),
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        COLUMNS="200",
        PYTHONUNBUFFERED="1",
    )
    return env


def torchrun(
    tmp: Path, *args: str, module: bool = True, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Launch 2 ranks; their exit codes and each rank's stdout/stderr (from log files)."""
    logs = tmp / f"logs{len(list(tmp.glob('logs*')))}"
    cmd = [
        str(TORCHRUN),
        "--nproc_per_node=2",
        "--standalone",  # a free rendezvous port: launches may run side by side
        f"--log-dir={logs}",
        "--redirects=3",
        *(["-m", "hookcli"] if module else []),
        *args,
    ]
    # torchrun in a session of its own: on a timeout the whole group goes, workers
    # included (subprocess.run's kill would leave the ranks running, orphaned)
    with subprocess.Popen(
        cmd,
        cwd=tmp,
        env={**_env(), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as popen:
        try:
            _, stderr = popen.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.communicate()
            raise
    proc = subprocess.CompletedProcess(cmd, popen.returncode, "", stderr)
    ranks: dict[int, dict[str, str]] = {}
    for rank in (0, 1):
        out = list(logs.rglob(f"attempt_0/{rank}/stdout.log"))
        err = list(logs.rglob(f"attempt_0/{rank}/stderr.log"))
        ranks[rank] = {
            "stdout": out[0].read_text() if out else "",
            "stderr": err[0].read_text() if err else "",
        }
    return {"returncode": proc.returncode, "torchrun": proc.stderr, "ranks": ranks}


def oracle(tmp: Path, spec: str, *extra: str) -> list[dict[str, Any]]:
    out = tmp / "oracle"
    out.mkdir(exist_ok=True)
    env = {"TORCH_DISTRIBUTED_DEBUG": "INFO"} if "--plain-ddp-error" in extra else None
    run = torchrun(tmp, str(ORACLE), spec, str(out), *extra, module=False, env=env)
    assert run["returncode"] == 0, run
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def report_of(run: dict[str, Any]) -> dict[str, Any]:
    """Rank 0's JSON report; rank 1 must have printed nothing on stdout."""
    assert run["ranks"][1]["stdout"] == "", run["ranks"][1]
    return json.loads(run["ranks"][0]["stdout"])


def spoken(stderr: str) -> list[str]:
    """stderr lines, less DDP's own warning that find_unused_parameters found none unused."""
    return [
        line
        for line in stderr.strip().splitlines()
        if "find_unused_parameters=True was specified" not in line
    ]


def close(a: float | None, b: float | None, rel: float = 1e-5) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-7)


def rows_by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in report["layers"] if r["call"] == 0}


def check(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in report["checks"] if c["name"] == name)


# -- environment detection ----------------------------------------------------------------


def test_torchrun_env_is_read() -> None:
    env = detect_env(
        {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "7"}
    )
    assert env == DistEnv(3, 4, 1, "torchrun", "h", 7)


def test_slurm_env_is_read_with_master_from_the_nodelist() -> None:
    env = detect_env(
        {
            "SLURM_PROCID": "5",
            "SLURM_NTASKS": "8",
            "SLURM_LOCALID": "1",
            "SLURM_JOB_NODELIST": "gpu[07-08,11],cpu1",
            "SLURM_JOB_ID": "123456",
        }
    )
    assert env == DistEnv(5, 8, 1, "slurm", "gpu07", 29500 + 123456 % 1000)


def test_torchrun_wins_over_slurm_and_plain_process_is_none() -> None:
    both = {"RANK": "0", "WORLD_SIZE": "2", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"}
    env = detect_env(both)
    assert env is not None and env.source == "torchrun" and env.rank == 0
    assert detect_env({"PATH": "/bin"}) is None


@pytest.mark.parametrize(
    ("nodelist", "host"),
    [("node1", "node1"), ("a,b", "a"), ("n[3-5]", "n3"), ("n[09,12]x", "n09"), ("x[1],y", "x1")],
)
def test_first_host_of_a_slurm_nodelist(nodelist: str, host: str) -> None:
    assert first_host(nodelist) == host


# -- usage: without a launcher nothing changes, and --ddp says what it needs ---------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["grads", "sample_models:Net", "--ddp"], "--ddp needs a distributed launch"),
        (["grads", "sample_models:Net", "--fail-on", "desync"], "--fail-on desync needs --ddp"),
        (["grads", "sample_models:Net", "--backend", "gloo"], "--backend needs --ddp"),
        (["inspect", "sample_models:Net", "--backend", "gloo"], "--backend needs --ddp"),
        (["stats", "sample_models:Net", "--fail-on", "desync"], "unknown check 'desync'"),
        (["grads", "sample_models:Net", "--ddp", "--per-param"], "--per-param does not combine"),
        (["grads", "sample_models:Net", "--ddp", "--hooks", "backward"], "add tensor to --hooks"),
    ],
)
def test_ddp_usage_errors_exit_2_with_one_line(
    args: list[str], needle: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert needle in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


# -- pure merging -----------------------------------------------------------------------


def test_spread_is_max_minus_min_over_max() -> None:
    assert spread([2.0, 1.5]) == pytest.approx(0.25)
    assert spread([3.0, 3.0]) == 0.0
    assert spread([1.0, None]) is None
    assert spread([0.0, 0.0]) == 0.0
    assert math.isnan(spread([1.0, math.nan]) or 0.0)


def _rows(rank: int, *items: tuple[str, float | None]) -> RankRows:
    rows = tuple(({"name": n, "call": 0, "grad_norm": g}, {"shown_params": 1}) for n, g in items)
    return RankRows(rank, rows)


def test_merge_rows_keeps_rank0_order_then_rows_only_other_ranks_ran() -> None:
    merged = merge_rows(
        [_rows(0, ("", None), ("a", 2.0)), _rows(1, ("", None), ("b", 4.0))],
        per_rank_keys=("grad_norm",),
        spread_keys=("grad_norm",),
    )
    assert [r.data["name"] for r in merged] == ["", "a", "b"]
    assert [r.data["ranks"] for r in merged] == [[0, 1], [0], [1]]
    assert merged[1].data["grad_norm_per_rank"] == [2.0, None]
    assert merged[2].data["grad_norm_per_rank"] == [None, 4.0]
    assert merged[2].display["mark"] == "(rank 1 only)"


def test_merge_checks_fails_when_one_rank_fails() -> None:
    ok = CheckResult("nan", True, "no NaN")
    bad = CheckResult("nan", False, "NaN in fc", ("fc",))
    merged = merge_checks([[ok], [bad]])
    assert merged == (CheckResult("nan", False, "rank 1: NaN in fc", ("fc",)),)
    assert merge_checks([[ok], [ok]])[0].passed


def test_unused_check_words_it_as_ddp_debug_info_does() -> None:
    result = unused_check([["b.weight", "b.bias"], []], [[4, 5], []])
    assert not result.passed
    assert "Parameters which did not receive grad for rank 0: b.bias, b.weight" in result.detail
    assert "Parameter indices which did not receive grad for rank 0: 4 5" in result.detail
    assert "rank 1" not in result.detail
    assert result.layers == ("b.weight", "b.bias")
    assert unused_check([[], []], [[], []]).passed


def test_desync_check_tolerance_is_relative_to_rank0_scale() -> None:
    found = [Divergence("buffer", "bn.running_mean", 1, 0.01, 0.001)]
    assert not desync_check(found, 0.0).passed
    assert desync_check(found, 0.01).passed
    missing = [Divergence("grad", "w", 1, math.inf, math.inf, "no gradient, rank 0 has one")]
    failed = desync_check(missing, 1.0)
    assert not failed.passed and "no gradient" in failed.detail


def test_desync_buffers_that_ddp_rebroadcasts_are_a_note_not_a_failure() -> None:
    drift = Divergence("buffer", "bn.running_mean", 1, 0.01, 0.5)
    noted = desync_check([drift], 0.0, buffers_resynced=True)
    assert noted.passed and "note: 1 buffer(s)" in noted.detail and noted.layers == ()
    assert not desync_check([drift], 0.0, buffers_resynced=False).passed
    param = Divergence("param", "fc.weight", 1, 0.01, 0.02)
    both = desync_check([drift, param], 0.0, buffers_resynced=True)
    assert not both.passed and both.layers == ("fc.weight",)
    assert both.detail.startswith("1 parameter(s) differ") and "note: 1 buffer(s)" in both.detail


# -- one rank, without torchrun: the whole --ddp path in a single process ------------------


def test_single_rank_group_matches_plain_backward(tmp_path: Path) -> None:
    """WORLD_SIZE=1: DDP's reduced grads equal the local ones, equal to plain autograd."""
    import socket

    import torch

    from sample_models.distributed import HealthyMLP

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **_env(),
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    cmd = [sys.executable, "-m", "hookcli", "grads", "sample_models.distributed:HealthyMLP"]
    proc = subprocess.run(
        [*cmd, "--ddp", "--seed", "3", "-f", "json", "--fail-on", "unused,desync"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    torch.manual_seed(3)
    model = HealthyMLP()
    example = model.example_input_array
    x = torch.randn(example.shape, generator=torch.Generator().manual_seed(3 + 0))
    model(x).sum().backward()
    rows = rows_by_name(report)
    for name in ("fc1", "fc2", "head"):
        m = model.get_submodule(name)
        expected = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in m.parameters()))
        assert close(rows[name]["grad_norm_per_rank"][0], expected)
        assert close(rows[name]["reduced_grad_norm"], expected)
    assert report["settings"]["world_size"] == 1
    assert all(c["passed"] for c in report["checks"])


# -- two ranks under torchrun, against plain torch.distributed ------------------------------


def raise_site() -> str:
    """Where FailsOnRank's block raises, as the error line names it (the model's own line)."""
    source = ROOT / "sample_models" / "distributed.py"
    lines = source.read_text().splitlines()
    n = next(i for i, ln in enumerate(lines, 1) if "refusing to run on rank" in ln)
    return f"sample_models/distributed.py:{n}"


@pytest.mark.distributed
def test_healthy_model_matches_plain_ddp(tmp_path: Path) -> None:
    spec = "sample_models.distributed:HealthyMLP"
    ref = oracle(tmp_path, spec, "--seed", "1")
    run = torchrun(
        tmp_path, "grads", spec, "--ddp", "--seed", "1", "-f", "json", "--fail-on",
        "unused,desync,nan,inf",
    )  # fmt: skip
    assert run["returncode"] == 0, run
    report = report_of(run)
    assert spoken(run["ranks"][1]["stderr"]) == []
    rows = rows_by_name(report)
    for name in ref[0]["local"]:
        assert all(
            close(rows[name]["grad_norm_per_rank"][r], ref[r]["local"][name]) for r in (0, 1)
        )
        assert close(rows[name]["reduced_grad_norm"], ref[0]["reduced"][name])
        per_rank = [ref[r]["local"][name] for r in (0, 1)]
        assert close(
            rows[name]["grad_norm_spread"], (max(per_rank) - min(per_rank)) / max(per_rank)
        )
    # the ranks saw different batches (seed + rank), so the local norms differ
    assert ref[0]["local"]["head"] != ref[1]["local"]["head"]
    totals = report["totals"]
    assert all(close(totals["loss_per_rank"][r], ref[r]["loss"]) for r in (0, 1))
    assert totals["unused_params_per_rank"] == [[], []]
    assert ref[0]["grads_differ"] == [] and ref[0]["buffers_differ"] == []
    assert all(c["passed"] for c in report["checks"]), report["checks"]


RANK_BRANCH = "sample_models.distributed:RankBranch"


@pytest.fixture(scope="module")
def rank_branch_ref(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The plain-DDP oracle of RankBranch (seed 0), with DDP's own unused-parameter error:
    one launch, read by the ``unused`` test and by the stats/inspect test (whose
    ``output_mean`` is computed before any DDP step, so the error's second run leaves it
    as it is)."""
    return oracle(tmp_path_factory.mktemp("rank_branch"), RANK_BRANCH, "--plain-ddp-error")


@pytest.mark.distributed
def test_rank_dependent_unused_branch_named_as_ddp_names_it(
    tmp_path: Path, rank_branch_ref: list[dict[str, Any]]
) -> None:
    spec = RANK_BRANCH
    ref = rank_branch_ref
    run = torchrun(tmp_path, "grads", spec, "--ddp", "-f", "json", "--fail-on", "unused")
    assert run["returncode"] != 0  # exit 1 on each rank: a check failed
    report = report_of(run)
    unused = check(report, "unused")
    assert not unused["passed"]
    for r in (0, 1):
        # PyTorch's own error (TORCH_DISTRIBUTED_DEBUG=INFO) and plain autograd agree
        assert sorted(ref[r]["ddp_error_unused"]) == sorted(ref[r]["local_unused"])
        assert sorted(report["totals"]["unused_params_per_rank"][r]) == sorted(
            ref[r]["local_unused"]
        )
        names = ", ".join(sorted(ref[r]["ddp_error_unused"]))
        assert f"Parameters which did not receive grad for rank {r}: {names}" in unused["detail"]
    rows = rows_by_name(report)
    assert rows["branch_a"]["ranks"] == [0] and rows["branch_b"]["ranks"] == [1]
    for branch in ("branch_a", "branch_b"):  # per row, also for the rank it did not run on
        expected = [
            sorted(n for n in ref[r]["local_unused"] if n.startswith(branch + ".")) for r in (0, 1)
        ]
        assert [sorted(u) for u in rows[branch]["unused_params_per_rank"]] == expected
    for name in ("trunk", "branch_a", "branch_b", "head"):
        for r in (0, 1):
            assert close(rows[name]["grad_norm_per_rank"][r], ref[r]["local"][name])
        assert close(rows[name]["reduced_grad_norm"], ref[0]["reduced"][name])
    # the exit statuses: every rank exits 1 (torchrun's summary lists each of the 2)
    assert run["torchrun"].count("exitcode  : 1") == 2, run["torchrun"]


@pytest.mark.distributed
def test_batchnorm_buffer_drift_is_a_note_unless_buffers_are_not_broadcast(
    tmp_path: Path,
) -> None:
    """DDP re-broadcasts rank 0's buffers at every forward: drift after the step is normal.

    With broadcast_buffers=False nothing re-synchronises them: then it is a desync.
    """
    spec = "sample_models.distributed:BatchNormNet"
    ref = oracle(tmp_path, spec)
    assert ref[0]["buffers_differ"]  # plain DDP: running stats differ after the step
    assert ref[0]["grads_differ"] == [] and ref[0]["params_differ"] == []
    run = torchrun(tmp_path, "grads", spec, "--ddp", "-f", "json", "--fail-on", "desync")
    assert run["returncode"] == 0, run
    report = report_of(run)
    desync = check(report, "desync")
    assert desync["passed"], desync
    assert "not a desync" in desync["detail"] and "bn.running_mean" in desync["detail"]
    assert report["totals"]["desync"] == []
    drift = {d["name"] for d in report["totals"]["buffer_drift"]}
    assert drift == set(ref[0]["buffers_differ"])
    assert report["settings"]["broadcast_buffers"] is True
    strict = torchrun(
        tmp_path, "grads", spec, "--ddp", "-f", "json", "--fail-on", "desync",
        "--no-broadcast-buffers",
    )  # fmt: skip
    assert strict["returncode"] != 0
    report = report_of(strict)
    desync = check(report, "desync")
    assert not desync["passed"]
    assert sorted(desync["layers"]) == sorted(ref[0]["buffers_differ"])
    assert {d["name"] for d in report["totals"]["desync"]} == set(ref[0]["buffers_differ"])
    assert "buffer bn.running_mean" in desync["detail"]
    assert report["settings"]["broadcast_buffers"] is False


@pytest.mark.distributed
def test_parameters_changed_on_one_rank_are_a_desync(tmp_path: Path) -> None:
    """DDP syncs parameters only when it wraps the model: a rank-local change stays."""
    spec = "sample_models.distributed:ParamDriftOnRank"
    ref = oracle(tmp_path, spec)
    assert ref[0]["params_differ"] == ["fc.weight"] and ref[0]["grads_differ"] == []
    run = torchrun(tmp_path, "grads", spec, "--ddp", "-f", "json", "--fail-on", "desync")
    assert run["returncode"] != 0
    desync = check(report_of(run), "desync")
    assert not desync["passed"]
    assert desync["layers"] == ref[0]["params_differ"]
    assert desync["detail"].startswith("1 parameter(s) differ from rank 0's")
    assert "parameter fc.weight (rank 1: max |diff| 0.01" in desync["detail"]


RESNET = ("resnet18", "-b", "2", "-i", "2x3x64x64", "-f", "json")


@pytest.mark.distributed
def test_healthy_resnet18_passes_desync_under_ddp(tmp_path: Path) -> None:
    """Issue 19: every BatchNorm model failed desync with its (re-broadcast) running stats."""
    run = torchrun(tmp_path, "grads", *RESNET, "--ddp", "--fail-on", "unused,nan,desync")
    assert run["returncode"] == 0, run["ranks"][0]["stderr"]
    report = report_of(run)
    assert all(c["passed"] for c in report["checks"]), report["checks"]
    assert report["totals"]["desync"] == []
    import torchvision

    model = torchvision.models.resnet18(weights=None)
    bn_buffers = [n for n, _ in model.named_buffers() if "running_" in n]
    drift = {d["name"] for d in report["totals"]["buffer_drift"]}
    assert drift == set(bn_buffers)  # each rank's own batch moves every running stat
    assert "not a desync" in check(report, "desync")["detail"]


@pytest.mark.distributed
@pytest.mark.slow
def test_resnet18_without_broadcast_buffers_fails_desync(tmp_path: Path) -> None:
    run = torchrun(
        tmp_path, "grads", *RESNET, "--ddp", "--fail-on", "desync", "--no-broadcast-buffers"
    )
    assert run["returncode"] != 0
    desync = check(report_of(run), "desync")
    assert not desync["passed"] and "40 buffer(s) differ" in desync["detail"]


@pytest.mark.distributed
def test_failure_on_one_rank_ends_every_rank_with_one_line(tmp_path: Path) -> None:
    run = torchrun(tmp_path, "grads", "sample_models.distributed:FailsOnRank", "--ddp")
    assert run["returncode"] != 0
    assert spoken(run["ranks"][0]["stderr"]) == [
        "hookcli: error: rank 1 failed: forward failed in block (_Fragile) with input shapes "
        f"[4, 8]: ValueError: refusing to run on rank 1 (raised at {raise_site()} in forward)"
    ]
    assert spoken(run["ranks"][1]["stderr"]) == []  # rank 0 alone speaks
    assert run["ranks"][0]["stdout"] == "" and run["ranks"][1]["stdout"] == ""
    assert "exitcode  : 4" in run["torchrun"]


@pytest.mark.distributed
def test_stats_and_inspect_under_ddp(tmp_path: Path, rank_branch_ref: list[dict[str, Any]]) -> None:
    spec = RANK_BRANCH
    ref = rank_branch_ref
    stats = torchrun(tmp_path, "stats", spec, "--ddp", "--mode", "train", "-f", "json")
    assert stats["returncode"] == 0, stats
    root = rows_by_name(report_of(stats))[""]
    assert all(close(root["mean_per_rank"][r], ref[r]["output_mean"]) for r in (0, 1))
    inspect = torchrun(tmp_path, "inspect", spec, "--ddp", "-f", "json")
    assert inspect["returncode"] == 0, inspect
    rows = rows_by_name(report_of(inspect))
    assert rows["branch_a"]["ranks"] == [0] and rows["branch_b"]["ranks"] == [1]
    assert rows["head"]["output_shapes_per_rank"] == [[[4, 2]], [[4, 2]]]


def check_nan_on_rank_1(run: dict[str, Any]) -> None:
    """NaNOnRank's run (``--fail-on nan,inf``): ``nan`` fails naming rank 1 alone."""
    assert run["returncode"] != 0
    report = report_of(run)
    nan = check(report, "nan")
    assert not nan["passed"]
    assert nan["detail"].startswith("rank 1: ") and "rank 0" not in nan["detail"]
    assert check(report, "inf")["passed"]
    rows = rows_by_name(report)
    # rank 0's local grads are finite, rank 1's are NaN; the reduction spreads the NaN
    g0, g1 = rows["fc1"]["grad_norm_per_rank"]
    assert math.isfinite(g0) and g1 == "nan"
    assert rows["fc1"]["reduced_grad_norm"] == "nan"


@pytest.mark.distributed
def test_nan_on_one_rank_is_reported_for_that_rank(tmp_path: Path) -> None:
    spec = "sample_models.distributed:NaNOnRank"
    check_nan_on_rank_1(
        torchrun(tmp_path, "grads", spec, "--ddp", "-f", "json", "--fail-on", "nan,inf")
    )


def test_ddp_session_leaves_the_model_as_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """One rank, in this process: DDP's reducer and every hook go, state is restored."""
    import socket

    import torch

    from hookcli.distributed.ddp import run_ddp_session
    from hookcli.distributed.launch import launch
    from hookcli.grads.probe import GradProbe
    from hookcli.inputs.grammar import Inputs
    from hookcli.losses import reduce_output
    from hookcli.options import HookKind, Mode
    from hookcli.pipeline import Prepared
    from sample_models.distributed import BatchNormNet
    from tests.conftest import assert_no_hooks, assert_same_state, state_snapshot

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }.items():
        monkeypatch.setenv(key, value)
    model = BatchNormNet().eval()
    for p in model.parameters():
        p.grad = torch.ones_like(p)  # grads from an earlier step must come back
    before = state_snapshot(model)
    loaded = type("Loaded", (), {"module": model, "spec": "x", "family": None})()
    prepared = Prepared(
        loaded=loaded,  # type: ignore[arg-type]
        inputs=Inputs((torch.randn(8, 8),), {}, (), "test"),
        settings={},
    )
    seen: dict[str, object] = {}

    def body(ctx: object) -> int:
        probe = GradProbe(frozenset(HookKind))
        run = run_ddp_session(
            ctx,  # type: ignore[arg-type]
            prepared,
            [probe],
            mode=Mode.TRAIN,
            backward=True,
            loss_fn=reduce_output,
            compare=True,
        )
        seen["run"] = run
        return 0

    assert launch(body, device="cpu", backend=None, timeout_s=30) == 0
    assert not torch.distributed.is_initialized()
    assert_no_hooks(model)
    assert_same_state(before, state_snapshot(model))
    run = seen["run"]
    assert run.divergences == ()  # type: ignore[attr-defined]
    assert run.reduced["fc.weight"] is not None  # type: ignore[attr-defined]
