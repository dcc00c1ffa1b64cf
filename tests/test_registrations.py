"""``hookcli registrations``: the registrations of a build, against the built model's structure."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from hookcli.registrations import RegistrationRecorder
from sample_models import BNMLP, LeNet, Net
from tests.conftest import global_hook_counts, invoke, invoke_json

NO_GLOBAL_HOOKS = dict.fromkeys(global_hook_counts(), 0)


def own(module: nn.Module, prefix: str) -> list[tuple]:
    """A leaf's own parameters, then its buffers, as (module, parent, kind, name)."""
    cls = type(module).__name__
    rows = [(prefix, cls, "parameter", n) for n, _ in module.named_parameters(recurse=False)]
    rows += [(prefix, cls, "buffer", n) for n, _ in module.named_buffers(recurse=False)]
    return rows


def flat_expectation(model: nn.Module) -> list[tuple]:
    """A model whose __init__ assigns leaf children one by one: each child's own
    registrations happen in its constructor, then the parent registers it."""
    rows: list[tuple] = []
    for name, child in model.named_children():
        rows += own(child, name)
        rows.append(("", type(model).__name__, "module", name))
    return rows


def plain_registrations(build: Any) -> list[tuple[int, str, str, bool]]:
    """(id of the registering module, kind, name, overwrites) for every registration while
    ``build()`` runs, from torch's public global registration hooks: the oracle."""
    from torch.nn.modules import module as mm

    events: list[tuple[int, str, str, bool]] = []

    def hook(kind: str, store: str) -> Any:
        def fn(module: nn.Module, name: str, value: Any) -> None:
            events.append((id(module), kind, name, name in getattr(module, store)))

        return fn

    handles = [
        mm.register_module_module_registration_hook(hook("module", "_modules")),
        mm.register_module_parameter_registration_hook(hook("parameter", "_parameters")),
        mm.register_module_buffer_registration_hook(hook("buffer", "_buffers")),
    ]
    try:
        model = build()
    finally:
        for h in handles:
            h.remove()
    events.append((id(model), "root", "", False))  # the root's id, last
    return events


def seen(report: dict) -> list[tuple]:
    return [(r["module"], r["parent"], r["kind"], r["name"]) for r in report["registrations"]]


@pytest.mark.parametrize("cls", [Net, LeNet])
def test_flat_models_in_order(cls: type[nn.Module]) -> None:
    report = invoke_json("registrations", f"sample_models:{cls.__name__}")
    model = cls()
    assert seen(report) == flat_expectation(model)
    assert [r["seq"] for r in report["registrations"]] == list(range(len(seen(report))))
    params = dict(model.named_parameters())
    for r in report["registrations"]:
        assert r["overwrites"] is False
        if r["kind"] == "parameter":
            p = params[f"{r['module']}.{r['name']}"]
            assert r["shape"] == list(p.shape)
            assert r["dtype"] == str(p.dtype).removeprefix("torch.")
            assert r["type"] is None and r["persistent"] is None
        else:
            assert r["type"] == type(getattr(model, r["name"])).__name__
            assert r["shape"] is None and r["dtype"] is None
    t = report["totals"]
    assert t["parameter"] == len(params)
    assert t["module"] == len(list(model.children()))
    assert t["buffer"] == 0


def test_bnmlp_sequential_and_non_persistent_buffer() -> None:
    report = invoke_json("registrations", "sample_models:BNMLP")
    model = BNMLP()
    expected: list[tuple] = []
    # Sequential's children are built (as arguments) before Sequential registers them
    for name, child in model.net.named_children():
        expected += own(child, f"net.{name}")
    expected += [("net", "Sequential", "module", name) for name, _ in model.net.named_children()]
    expected += [("", "BNMLP", "module", "net"), ("", "BNMLP", "buffer", "step_scale")]
    assert seen(report) == expected
    state = set(model.state_dict())
    buffers = dict(model.named_buffers())
    for r in report["registrations"]:
        if r["kind"] == "buffer":
            full = f"{r['module']}.{r['name']}" if r["module"] else r["name"]
            assert r["persistent"] == (full in state), full
            assert r["shape"] == list(buffers[full].shape)
            assert r["dtype"] == str(buffers[full].dtype).removeprefix("torch.")
    rows = {(r["module"], r["name"]): r for r in report["registrations"]}
    assert rows[("", "step_scale")]["persistent"] is False
    assert rows[("net.1", "running_mean")]["persistent"] is True


def test_tied_weight_is_an_overwrite() -> None:
    report = invoke_json("registrations", "sample_models:TiedEmbeddingLM")
    again = [r for r in report["registrations"] if r["overwrites"]]
    assert [(r["module"], r["parent"], r["kind"], r["name"]) for r in again] == [
        ("lm_head", "Linear", "parameter", "weight")
    ]
    assert report["registrations"][-1]["overwrites"] is True  # the tie is the last statement
    assert report["totals"]["overwrites"] == 1


def test_resnet18_counts_and_names() -> None:
    import torchvision

    report = invoke_json("registrations", "resnet18")
    model = torchvision.models.resnet18(weights=None)
    modules = dict(model.named_modules())
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    t = report["totals"]
    assert t["parameter"] == len(params) == 62
    assert t["buffer"] == len(buffers) == 60
    assert t["module"] == len(modules) - 1  # every module but the root is registered once
    assert t["overwrites"] == 0 and t["outside_model"] == 0
    assert t["registrations"] == len(report["registrations"])
    registered = set()
    for r in report["registrations"]:
        assert r["parent"] == type(modules[r["module"]]).__name__
        full = f"{r['module']}.{r['name']}" if r["module"] else r["name"]
        registered.add((r["kind"], full))
        if r["kind"] == "parameter":
            assert r["shape"] == list(params[full].shape)
        elif r["kind"] == "buffer":
            assert r["shape"] == list(buffers[full].shape)
            assert r["persistent"] is True
        else:
            assert r["type"] == type(modules[full]).__name__
    assert registered == (
        {("parameter", n) for n in params}
        | {("buffer", n) for n in buffers}
        | {("module", n) for n in modules if n}
    )
    # a child is registered by its parent only after its own constructor finished
    order = {(r["kind"], r["module"], r["name"]): r["seq"] for r in report["registrations"]}
    assert order[("parameter", "layer1.0.conv1", "weight")] < order[("module", "layer1.0", "conv1")]
    assert order[("module", "layer1.0", "conv1")] < order[("module", "", "layer1")]
    top = t["top_parents"][0]
    assert top == {"module": "", "parent": "ResNet", "count": len(list(model.children()))}


FILE_MODEL = """
import torch
from torch import nn

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.register_buffer("cache", torch.zeros(2), persistent=False)
        self.register_buffer("cache", torch.ones(3))  # registered again, now persistent
        self.lazy = nn.LazyLinear(4)

def make():
    scratch = nn.Linear(1, 1)  # built and thrown away: not in the model
    del scratch
    return Block()

INSTANCE = Block()
"""


def test_file_spec_overwrite_lazy_and_outside_model(tmp_path: Path) -> None:
    path = tmp_path / "blocks.py"
    path.write_text(textwrap.dedent(FILE_MODEL))
    report = invoke_json("registrations", f"{path}:make")
    rows = report["registrations"]
    outside = [r for r in rows if r["module"] is None]
    # the file's own INSTANCE (built while the file is imported) and make()'s scratch Linear
    assert report["totals"]["outside_model"] == len(outside) > 0
    mine = [r for r in rows if r["module"] is not None]
    caches = [r for r in mine if r["name"] == "cache"]
    assert [(r["persistent"], r["overwrites"], r["shape"]) for r in caches] == [
        (False, False, [2]),
        (True, True, [3]),
    ]
    lazy = [(r["name"], r["shape"], r["overwrites"]) for r in mine if r["module"] == "lazy"]
    # LazyLinear runs Linear.__init__ with 0 features, then swaps in uninitialized parameters
    assert lazy == [("weight", [0, 0], False), ("weight", None, True), ("bias", None, False)]
    assert global_hook_counts() == NO_GLOBAL_HOOKS

    # an instance made when the file is imported: still seen, the import is part of the build
    report = invoke_json("registrations", f"{path}:INSTANCE")
    assert any(r["module"] == "lin" and r["name"] == "weight" for r in report["registrations"])


def test_dotted_path_and_depth() -> None:
    report = invoke_json("registrations", "sample_models.basic.Net")
    assert seen(report) == flat_expectation(Net())
    shallow = invoke_json("registrations", "sample_models:BNMLP", "--depth", "0")
    assert [r["name"] for r in shallow["registrations"]] == ["net", "step_scale"]
    torch.manual_seed(0)
    every = plain_registrations(BNMLP)[:-1]
    assert shallow["totals"]["registrations"] == len(every) > 2  # totals: the whole build


def test_failing_constructor_leaves_no_global_hooks(tmp_path: Path) -> None:
    result = invoke("registrations", "tests.fixtures.broken:CtorRaises")
    assert result.exit_code == 3
    assert "Traceback" not in result.stderr and "always fails" in result.stderr
    assert global_hook_counts() == NO_GLOBAL_HOOKS

    path = tmp_path / "ctrl_c.py"
    path.write_text(
        textwrap.dedent(
            """
            from torch import nn

            class Interrupted(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(2, 2)
                    raise KeyboardInterrupt
            """
        )
    )
    result = invoke("registrations", f"{path}:Interrupted")
    assert result.exit_code == 130
    assert global_hook_counts() == NO_GLOBAL_HOOKS
    assert invoke("registrations", "no_such_model_xyz").exit_code == 3
    assert global_hook_counts() == NO_GLOBAL_HOOKS


def test_recorder_removes_hooks_on_exception_and_never_replaces_values() -> None:
    weight = nn.Parameter(torch.ones(2))
    with pytest.raises(RuntimeError), RegistrationRecorder() as rec:
        m = nn.Module()
        m.w = weight
        assert global_hook_counts()["_global_parameter_registration_hooks"] == 1
        raise RuntimeError("stop")
    assert global_hook_counts() == NO_GLOBAL_HOOKS
    assert m.w is weight
    regs = rec.resolve(m)
    assert [(r.module, r.kind, r.name, r.shape) for r in regs] == [("", "parameter", "w", (2,))]


def test_table_summary_and_formats(tmp_path: Path) -> None:
    result = invoke("registrations", "sample_models:TiedEmbeddingLM")
    assert result.exit_code == 0
    text = result.stdout
    from collections import Counter

    from sample_models import TiedEmbeddingLM

    *events, (root_id, _, _, _) = plain_registrations(TiedEmbeddingLM)
    kinds = Counter(kind for _, kind, _, _ in events)
    overwrites = sum(ow for *_, ow in events)
    assert overwrites >= 1  # the tied weight
    assert (
        f"Registrations:   {len(events)}: {kinds['module']} modules, {kinds['parameter']} "
        f"parameters, {kinds['buffer']} buffers, {overwrites} overwrites"
    ) in text
    by_parent = Counter(mid for mid, *_ in events)
    busiest = max(by_parent.values())
    assert by_parent[root_id] == busiest  # the root registers the most here
    assert f"Busiest parents: (root) (TiedEmbeddingLM) {busiest}" in text
    assert "weight (again)" in text

    csv_lines = invoke("registrations", "sample_models:Net", "-f", "csv").stdout.splitlines()
    assert csv_lines[0].split(",") == [
        "seq",
        "parent",
        "module",
        "kind",
        "name",
        "type",
        "shape",
        "dtype",
        "persistent",
        "overwrites",
    ]
    assert len(csv_lines) == 1 + len(flat_expectation(Net()))
    md = invoke("registrations", "sample_models:Net", "-f", "markdown").stdout
    assert md.count("| Net |  | module |") == 4

    target = tmp_path / "r.json"
    result = invoke("registrations", "sample_models:Net", "-f", "json", "-o", str(target))
    assert result.exit_code == 0 and result.stdout == ""
    assert json.loads(target.read_text())["command"] == "registrations"
