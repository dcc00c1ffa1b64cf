"""``hookcli trace``: the event order, checked against plain per-module hooks."""

from __future__ import annotations

import json
import sys
import textwrap
import types
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from sample_models import Net
from tests.conftest import (
    assert_no_hooks,
    assert_same_state,
    global_hook_counts,
    invoke,
    invoke_json,
    state_snapshot,
)

NO_GLOBAL_HOOKS = dict.fromkeys(global_hook_counts(), 0)


def plain_trace(model: nn.Module, x: torch.Tensor, backward: bool = False) -> list[tuple]:
    """(event, name, call, shapes) per firing, recorded with plain per-module hooks."""
    names = {id(m): n for n, m in model.named_modules()}
    calls: dict[int, int] = {}
    open_calls: dict[int, list[int]] = {}
    events: list[tuple] = []
    handles = []

    def shapes(obj):
        if isinstance(obj, torch.Tensor):
            return [list(obj.shape)]
        if isinstance(obj, (tuple, list)):
            return [s for o in obj for s in shapes(o)]
        return []

    def pre(m, args):
        call = calls.get(id(m), 0)
        calls[id(m)] = call + 1
        open_calls.setdefault(id(m), []).append(call)
        events.append(("forward_pre", names[id(m)], call, shapes(args)))

    def fwd(m, args, out):
        call = open_calls[id(m)].pop()
        events.append(("forward", names[id(m)], call, shapes(out)))

    def bw_pre(m, grad_output):
        events.append(("backward_pre", names[id(m)], None, shapes(grad_output)))

    def bw(m, grad_input, grad_output):
        events.append(("backward", names[id(m)], None, shapes(grad_input)))

    for m in model.modules():
        handles.append(m.register_forward_pre_hook(pre))
        handles.append(m.register_forward_hook(fwd))
        if backward:
            handles.append(m.register_full_backward_pre_hook(bw_pre))
            handles.append(m.register_full_backward_hook(bw))
    try:
        if backward:
            # torch warns (some versions) that the first module's grad_input is None
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*Full backward hook.*")
                model(x).sum().backward()
        else:
            with torch.no_grad():
                model(x)
    finally:
        for h in handles:
            h.remove()
    return events


def seen(report: dict, with_call: bool = True) -> list[tuple]:
    return [
        (e["event"], e["module"], e["call"] if with_call else None, e["shapes"])
        for e in report["events"]
    ]


def test_forward_order_and_shapes_match_plain_hooks_on_net() -> None:
    report = invoke_json("trace", "sample_models:Net")
    torch.manual_seed(0)
    model = Net()
    expected = plain_trace(model, model.example_input_array)
    assert seen(report) == expected
    assert [e["seq"] for e in report["events"]] == list(range(len(expected)))
    # forward_pre, children nested inside, then forward: the root opens and closes the run
    assert report["events"][0]["event"] == "forward_pre" and report["events"][0]["module"] == ""
    assert report["events"][-1]["event"] == "forward" and report["events"][-1]["module"] == ""
    assert report["totals"]["events"] == len(expected)
    assert report["totals"]["forward_pre"] == report["totals"]["forward"] == 5
    assert all(e["elapsed_ms"] >= 0 for e in report["events"])
    assert global_hook_counts() == NO_GLOBAL_HOOKS


def test_backward_order_matches_plain_hooks_on_net() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = invoke("trace", "sample_models:Net", "--backward", "--format", "json")
    assert result.exit_code == 0, result.stderr
    # torch's warning about the first module's grad_input is expected here: hushed
    assert not [w for w in caught if "Full backward hook" in str(w.message)]
    report = json.loads(result.stdout)
    torch.manual_seed(0)
    model = Net()
    expected = plain_trace(model, model.example_input_array, backward=True)
    assert seen(report, with_call=False) == [(e, n, None, s) for e, n, _, s in expected]

    events = [(e["event"], e["module"]) for e in report["events"]]
    forward_order = [n for ev, n in events if ev == "forward_pre"]
    backward_order = [n for ev, n in events if ev == "backward_pre"]
    assert backward_order == forward_order[:1] + forward_order[1:][::-1]
    for name in forward_order:  # backward_pre before backward, both after the forward
        assert events.index(("forward", name)) < events.index(("backward_pre", name))
        assert events.index(("backward_pre", name)) < events.index(("backward", name))
    # the loss is the sum of the outputs, as plain torch computes it
    torch.manual_seed(0)
    model = Net()
    assert report["totals"]["loss"] == pytest.approx(
        float(model(model.example_input_array).sum().detach())
    )
    assert global_hook_counts() == NO_GLOBAL_HOOKS


def test_resnet18_calls_match_plain_hooks() -> None:
    import torchvision

    report = invoke_json("trace", "resnet18", "-i", "1x3x32x32")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    expected = plain_trace(model, x)
    assert seen(report) == expected
    # BasicBlock calls its relu twice: the second call is call 1
    assert ("forward_pre", "layer1.0.relu", 1) in [(e, n, c) for e, n, c, _ in expected]


def test_modules_created_in_forward_show_in_brackets(tmp_path: Path) -> None:
    path = tmp_path / "dyn.py"
    path.write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn

            class Dyn(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(4, 4)
                    self.example_input_array = torch.randn(2, 4)

                def forward(self, x):
                    return nn.ReLU()(self.fc(x)) * 2
            """
        )
    )
    report = invoke_json("trace", f"{path}:Dyn")
    assert [(e["event"], e["module"], e["type"]) for e in report["events"]] == [
        ("forward_pre", "", "Dyn"),
        ("forward_pre", "fc", "Linear"),
        ("forward", "fc", "Linear"),
        ("forward_pre", "[ReLU]", "ReLU"),
        ("forward", "[ReLU]", "ReLU"),
        ("forward", "", "Dyn"),
    ]
    assert report["totals"]["outside_tree"] == ["[ReLU]"]
    assert global_hook_counts() == NO_GLOBAL_HOOKS


FAILING = """
import torch
from torch import nn

class Boom(nn.Module):
    def forward(self, x):
        raise {exc}("boom")

class Bad(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.block = nn.Sequential(nn.ReLU(), Boom(), nn.Linear(4, 2))
        self.example_input_array = torch.randn(2, 4)

    def forward(self, x):
        return self.block(self.fc(x))
"""


def test_failing_model_trace_ends_at_failing_module(tmp_path: Path) -> None:
    path = tmp_path / "bad.py"
    path.write_text(FAILING.format(exc="ValueError"))
    result = invoke("trace", f"{path}:Bad", "--format", "json")
    assert result.exit_code == 4
    assert "Traceback" not in result.stderr
    err_lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(err_lines) == 1 and "block.1" in err_lines[0] and "Boom" in err_lines[0]
    report = json.loads(result.stdout)
    events = [(e["event"], e["module"], e["failed"]) for e in report["events"]]
    # block.2 never runs; the always_call forward hook still fires for block.1 and its parents
    assert events[-4:] == [
        ("forward_pre", "block.1", False),
        ("forward", "block.1", True),
        ("forward", "block", True),
        ("forward", "", True),
    ]
    assert not any(n == "block.2" for _, n, _ in events)
    assert "block.1" in report["error"]
    assert global_hook_counts() == NO_GLOBAL_HOOKS

    table = invoke("trace", f"{path}:Bad")
    assert table.exit_code == 4
    assert "block.1 <- raised here" in table.stdout
    assert global_hook_counts() == NO_GLOBAL_HOOKS


def test_keyboard_interrupt_leaves_no_global_hook(tmp_path: Path) -> None:
    path = tmp_path / "interrupt.py"
    path.write_text(FAILING.format(exc="KeyboardInterrupt"))
    result = invoke("trace", f"{path}:Bad", "--backward")
    assert result.exit_code == 130
    assert global_hook_counts() == NO_GLOBAL_HOOKS


def test_limit_and_filter() -> None:
    full = invoke_json("trace", "sample_models:Net", "--backward")
    limited = invoke_json("trace", "sample_models:Net", "--backward", "--limit", "3")
    assert [e["seq"] for e in limited["events"]] == [0, 1, 2]
    assert limited["totals"]["events"] == full["totals"]["events"] == 20
    assert limited["totals"]["shown"] == 3

    only_fc = invoke_json("trace", "sample_models:Net", "--backward", "--filter", "fc")
    assert [e["event"] for e in only_fc["events"]] == [
        "forward_pre",
        "forward",
        "backward_pre",
        "backward",
    ]
    assert {e["module"] for e in only_fc["events"]} == {"fc"}
    full_fc = [e["seq"] for e in full["events"] if e["module"] == "fc"]
    assert [e["seq"] for e in only_fc["events"]] == full_fc  # original seq numbers kept

    by_type = invoke_json("trace", "sample_models:Net", "--filter", "*Pool*", "-n", "1")
    assert [(e["event"], e["module"]) for e in by_type["events"]] == [("forward_pre", "pool")]


def test_table_csv_markdown_and_output_file(tmp_path: Path) -> None:
    table = invoke("trace", "sample_models:Net", "--backward")
    assert table.exit_code == 0
    assert "backward_pre" in table.stdout and "Events:" in table.stdout
    lines = table.stdout.splitlines()
    assert any(ln.split()[:3] == ["0", "forward_pre", "(root)"] for ln in lines)

    csv_out = invoke("trace", "sample_models:Net", "--format", "csv")
    header = csv_out.stdout.splitlines()[0].split(",")
    assert header[:5] == ["seq", "event", "module", "type", "depth"]
    assert len(csv_out.stdout.splitlines()) == 1 + 10

    md = invoke("trace", "sample_models:Net", "--format", "markdown")
    assert md.stdout.count("| forward_pre |") == 5

    target = tmp_path / "trace.json"
    result = invoke("trace", "sample_models.basic.Net", "-f", "json", "-o", str(target))
    assert result.exit_code == 0 and result.stdout == ""
    assert json.loads(target.read_text())["command"] == "trace"


def test_instance_left_as_found() -> None:
    torch.manual_seed(0)
    model = Net()
    model.conv.weight.grad = torch.ones_like(model.conv.weight)
    name = "hookcli_test_trace_instance"
    mod = types.ModuleType(name)
    mod.MODEL = model  # type: ignore[attr-defined]
    sys.modules[name] = mod
    try:
        before = state_snapshot(model)
        assert invoke("trace", f"{name}:MODEL", "--backward").exit_code == 0
        assert_same_state(before, state_snapshot(model))
        assert_no_hooks(model)
    finally:
        del sys.modules[name]


def test_bad_options_exit_2() -> None:
    assert invoke("trace", "sample_models:Net", "--limit", "0").exit_code == 2
    result = invoke("trace", "sample_models:Net", "-i", "1xZ")
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert invoke("trace", "no_such_model_xyz").exit_code == 3
    assert global_hook_counts() == NO_GLOBAL_HOOKS


def test_meta_device_backward_has_shapes_and_no_loss() -> None:
    report = invoke_json("trace", "sample_models:Net", "--device", "meta", "--backward")
    cpu = invoke_json("trace", "sample_models:Net", "--backward")
    assert seen(report) == seen(cpu)
    assert "loss" not in report["totals"] and "loss" in cpu["totals"]
