"""Property tests on random small models: totals equal the deduplicated count; no hook remains."""

from __future__ import annotations

import json

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from tests.conftest import assert_no_hooks, assert_same_state, invoke, state_snapshot
from tests.fixtures import instances


@st.composite
def stacks(draw: st.DrawFn) -> tuple[nn.Module, str]:
    """A random Conv/Linear stack, sometimes with a layer reused (tied) or frozen."""
    conv = draw(st.booleans())
    n = draw(st.integers(1, 4))
    layers: list[nn.Module] = []
    if conv:
        ch = draw(st.integers(1, 4))
        spec = f"2x{ch}x8x8"
        for _ in range(n):
            out = draw(st.integers(1, 4))
            layers += [nn.Conv2d(ch, out, 3, padding=1, bias=draw(st.booleans())), nn.ReLU()]
            if draw(st.booleans()):
                layers.append(nn.BatchNorm2d(out))
            ch = out
        layers.append(nn.Flatten())
    else:
        width = draw(st.integers(1, 8))
        spec = f"3x{width}"
        for _ in range(n):
            out = draw(st.integers(1, 8))
            lin = nn.Linear(width, out, bias=draw(st.booleans()))
            layers.append(lin)
            if out == width and draw(st.booleans()):
                layers.append(lin)  # the same module twice: tied parameters
            width = out
    model = nn.Sequential(*layers)
    for p in model.parameters():
        if draw(st.integers(0, 4)) == 0:
            p.requires_grad_(False)
    return model, spec


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stacks(), st.sampled_from(["eval", "train"]))
def test_totals_equal_unique_params_and_no_hook_remains(case, mode):
    model, spec = case
    instances.DYNAMIC = model
    before = state_snapshot(model)
    result = invoke(
        "inspect", "tests.fixtures.instances:DYNAMIC", "-i", spec, "--mode", mode, "-f", "json"
    )
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    unique = set(model.parameters())
    assert report["totals"]["params"] == sum(p.numel() for p in unique)
    assert report["totals"]["trainable_params"] == sum(p.numel() for p in unique if p.requires_grad)
    root = report["layers"][0]
    assert root["params"] == report["totals"]["params"]
    assert_no_hooks(model)
    assert_same_state(before, state_snapshot(model))
    # the table's Params column still sums to the total
    table = invoke("inspect", "tests.fixtures.instances:DYNAMIC", "-i", spec, "--depth", "1")
    from tests.test_inspect import table_params

    col_sum, total, not_run = table_params(table.stdout)
    assert total == sum(p.numel() for p in unique)  # the printed total, against torch
    assert col_sum + not_run == total
    assert torch.is_grad_enabled()
