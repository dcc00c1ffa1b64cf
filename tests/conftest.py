"""Shared test helpers: a CLI runner with a fixed width, hook-state probes, golden files."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.modules import module as module_mod
from typer.testing import CliRunner

from hookcli.cli import app

# The GitHub Actions variables are unset so the suite's output is the same in CI.
ENV: dict[str, str | None] = {
    "COLUMNS": "120",
    "NO_COLOR": "1",
    "TERM": "dumb",
    "GITHUB_ACTIONS": None,
    "GITHUB_STEP_SUMMARY": None,
    "HOOKCLI_NO_CONFIG": "1",
}

GLOBAL_HOOK_DICTS = (
    "_global_forward_pre_hooks",
    "_global_forward_hooks",
    "_global_forward_hooks_always_called",
    "_global_forward_hooks_with_kwargs",
    "_global_backward_pre_hooks",
    "_global_backward_hooks",
    "_global_module_registration_hooks",
    "_global_parameter_registration_hooks",
    "_global_buffer_registration_hooks",
)
MODULE_HOOK_DICTS = (
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_backward_pre_hooks",
    "_backward_hooks",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden", action="store_true", help="rewrite tests/golden/* from current output"
    )


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


def invoke(*args: str, **kwargs: Any):  # -> typer.testing.Result
    """Run the CLI in-process with a fixed terminal width."""
    return CliRunner(env=ENV).invoke(app, list(args), **kwargs)


def invoke_json(*args: str) -> dict[str, Any]:
    """Run a command with --format json, assert exit 0, return the parsed report."""
    result = invoke(*args, "--format", "json")
    assert result.exit_code == 0, (result.exit_code, result.stderr, result.stdout[-500:])
    return json.loads(result.stdout)


def plain_forward(model: nn.Module, args: tuple[Any, ...], handles: Sequence[Any]) -> None:
    """One ``no_grad`` forward of ``model`` with the plain PyTorch hooks of ``handles``,
    which are removed after it, also when the model raises (the tests' independent
    references)."""
    try:
        with torch.no_grad():
            model(*args)
    finally:
        for h in handles:
            h.remove()


def global_hook_counts() -> dict[str, int]:
    """How many global hooks of each kind are registered now."""
    return {name: len(getattr(module_mod, name)) for name in GLOBAL_HOOK_DICTS}


def hook_count(model: nn.Module) -> int:
    """Every per-module hook on ``model`` plus every tensor hook on its parameters."""
    total = 0
    for m in model.modules():
        for name in MODULE_HOOK_DICTS:
            total += len(getattr(m, name, {}) or {})
    for p in model.parameters():
        total += len(p._backward_hooks or {})
    return total


def assert_no_hooks(model: nn.Module, before: dict[str, int] | None = None) -> None:
    """No hook remains on the model, its parameters, or in the global dicts."""
    assert hook_count(model) == 0
    assert global_hook_counts() == (before or dict.fromkeys(GLOBAL_HOOK_DICTS, 0))


def state_snapshot(model: nn.Module) -> dict[str, Any]:
    """Training flags, buffer values and identities, and grads: to compare before/after."""
    return {
        "training": [m.training for m in model.modules()],
        "buffers": {k: (id(v), v.detach().clone()) for k, v in model.named_buffers()},
        "grads": {
            k: None if p.grad is None else p.grad.clone() for k, p in model.named_parameters()
        },
        "inplace": [getattr(m, "inplace", None) for m in model.modules()],
    }


def assert_same_state(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Two snapshots are equal."""
    assert a["training"] == b["training"]
    assert a["inplace"] == b["inplace"]
    assert a["buffers"].keys() == b["buffers"].keys()
    for k, (ida, va) in a["buffers"].items():
        idb, vb = b["buffers"][k]
        assert ida == idb, f"buffer {k} was replaced"
        assert torch.equal(va, vb), f"buffer {k} changed"
    assert a["grads"].keys() == b["grads"].keys()
    for k, ga in a["grads"].items():
        gb = b["grads"][k]
        assert (ga is None) == (gb is None), f"grad of {k}"
        if ga is not None:
            assert torch.equal(ga, gb)


def shapes(rows: Sequence[dict[str, Any]], key: str) -> list[list[list[int]]]:
    return [r[key] for r in rows]


# -- the order pytest-xdist hands files out in (``make test``: ``--dist loadfile``) ---------


def pytest_configure(config: pytest.Config) -> None:
    if getattr(config.option, "dist", "no") in ("loadfile", "loadscope"):
        # xdist's own order is by number of tests alone; the queue follows the
        # collection order instead, which pytest_collection_modifyitems sets below
        config.option.loadscopereorder = False


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker (whose collection is the queue under ``--dist loadfile``), the
    files that launch torchrun (tests marked ``distributed``, several seconds a launch)
    go first, the most such tests first, then the others by their number of tests, as
    xdist itself orders them: the longest files start first, so none is left to run
    alone on one worker at the end (a file with few tests, sorted last by count alone,
    could). Tests keep their order within a file; only the files' order changes."""
    if not hasattr(config, "workerinput"):
        return
    files: dict[str, list[pytest.Item]] = {}
    for item in items:  # after -m/-k deselection (trylast)
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)

    def weight(group: list[pytest.Item]) -> tuple[int, int]:
        launches = sum(1 for item in group if item.get_closest_marker("distributed"))
        return (-launches, -len(group))

    items[:] = [item for group in sorted(files.values(), key=weight) for item in group]


# -- the skip ledger (tests/skips.py): a skip nobody expected fails the run ------------------

_SKIPS: list[tuple[str, str]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        _SKIPS.append((report.nodeid, reason))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from tests.skips import unexpected

    bad = unexpected(_SKIPS)
    if bad and exitstatus == 0:
        session.exitstatus = 1
    if bad:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = ["skips the ledger (tests/skips.py) does not expect on this machine:", *bad]
        if reporter is not None:
            reporter.write_line("\n".join(lines), red=True)


REPO = Path(__file__).resolve().parent.parent


def run_hookcli(*args: str, limit: int | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m hookcli ARGS`` in a fresh process from the repository root, as a user
    runs it (optionally under an address-space limit of ``limit`` bytes)."""

    def cap() -> None:
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return subprocess.run(
        [sys.executable, "-m", "hookcli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=cap,
    )


def run_json(*args: str) -> dict[str, Any]:
    """``run_hookcli`` with ``-f json``: exit 0 asserted, the parsed report."""
    r = run_hookcli(*args, "-f", "json")
    assert r.returncode == 0, r.stderr[-2000:]
    data: dict[str, Any] = json.loads(r.stdout)
    return data
