"""``hookcli params``: every parameter name, tied groups, totals, --frozen; against plain torch."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import torch
from torch import nn

from sample_models import CustomLinearLayer, TiedEmbeddingLM
from tests.conftest import assert_no_hooks, global_hook_counts, invoke, invoke_json
from tests.fixtures import instances

NO_GLOBAL_HOOKS = dict.fromkeys(global_hook_counts(), 0)


def unique_numel(model: nn.Module) -> int:
    return sum(p.numel() for p in set(model.parameters()))


def check_rows(report: dict, model: nn.Module) -> None:
    """Rows agree with ``named_parameters(remove_duplicate=False)`` of ``model``."""
    named = list(model.named_parameters(remove_duplicate=False))
    assert [r["name"] for r in report["params"]] == [n for n, _ in named]
    for r, (n, p) in zip(report["params"], named, strict=True):
        assert r["shape"] == list(p.shape)
        assert r["dtype"] == str(p.dtype).removeprefix("torch.")
        assert r["device"] == str(p.device)
        assert r["requires_grad"] == p.requires_grad
        assert r["numel"] == p.numel()
        others = [o for o, q in named if q is p and o != n]
        assert r["shared_with"] == others


def test_tied_embedding_shared_with_and_totals() -> None:
    report = invoke_json("params", "sample_models:TiedEmbeddingLM")
    torch.manual_seed(0)
    model = TiedEmbeddingLM()
    check_rows(report, model)
    rows = {r["name"]: r for r in report["params"]}
    assert rows["embed.weight"]["shared_with"] == ["lm_head.weight"]
    assert rows["lm_head.weight"]["shared_with"] == ["embed.weight"]
    assert rows["body.0.weight"]["shared_with"] == []
    t = report["totals"]
    assert t["params"] == unique_numel(model)
    assert t["params"] < sum(r["numel"] for r in report["params"])  # the tie counted once
    assert t["tensors"] == len(set(model.parameters())) == 3
    assert t["names"] == 4
    assert t["shared_groups"] == [["embed.weight", "lm_head.weight"]]
    assert t["trainable_params"] == t["params"] and t["frozen_params"] == 0
    assert t["param_bytes"] == sum(p.numel() * p.element_size() for p in set(model.parameters()))


def test_reused_module_is_shared(tmp_path: Path) -> None:
    path = tmp_path / "reuse.py"
    path.write_text(
        textwrap.dedent(
            """
            from torch import nn

            class Reuse(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.enc = nn.Linear(3, 3)
                    self.dec = self.enc  # the same module under two names
                    self.out = nn.Linear(3, 1)
            """
        )
    )
    report = invoke_json("params", f"{path}:Reuse")
    rows = {r["name"]: r for r in report["params"]}
    assert rows["enc.weight"]["shared_with"] == ["dec.weight"]
    assert rows["dec.bias"]["shared_with"] == ["enc.bias"]
    assert rows["out.weight"]["shared_with"] == []
    assert report["totals"]["params"] == 3 * 3 + 3 + 3 + 1
    assert report["totals"]["names"] == 6 and report["totals"]["tensors"] == 4


def test_resnet18_frozen_patterns() -> None:
    import torchvision

    report = invoke_json("params", "resnet18", "--frozen", "layer*", "--frozen", "conv1")
    model = torchvision.models.resnet18(weights=None)
    # frozen by hand, through the module attributes rather than name patterns
    for m in (model.conv1, model.layer1, model.layer2, model.layer3, model.layer4):
        for p in m.parameters():
            p.requires_grad_(False)
    check_rows(report, model)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    t = report["totals"]
    assert t["params"] == unique_numel(model)
    assert t["frozen_params"] == frozen
    assert t["trainable_params"] == unique_numel(model) - frozen
    assert t["trainable_tensors"] == sum(1 for p in model.parameters() if p.requires_grad)
    assert sorted(t["frozen_by_option"]) == sorted(
        n for n, p in model.named_parameters() if not p.requires_grad
    )
    assert report["settings"]["frozen"] == ["layer*", "conv1"]
    assert "mode" not in report["settings"]


def test_frozen_tied_tensor_and_globs() -> None:
    report = invoke_json("params", "sample_models:TiedEmbeddingLM", "--frozen", "lm_head.*")
    rows = {r["name"]: r for r in report["params"]}
    # one tensor: freezing it under one name freezes it under the other
    assert rows["embed.weight"]["requires_grad"] is False
    assert rows["lm_head.weight"]["requires_grad"] is False
    assert rows["body.0.bias"]["requires_grad"] is True
    torch.manual_seed(0)
    model = TiedEmbeddingLM()
    assert report["totals"]["frozen_params"] == model.embed.weight.numel()

    report = invoke_json("params", "sample_models:CustomLinearLayer", "--frozen", "*.bias")
    model = CustomLinearLayer()
    frozen = {n for n, _ in model.named_parameters() if n.endswith(".bias")}
    assert {r["name"] for r in report["params"] if not r["requires_grad"]} == frozen
    # root-level "bias" has no dot before it: "*.bias" leaves it trainable
    assert {r["name"]: r for r in report["params"]}["bias"]["requires_grad"] is True


def test_frozen_without_match_is_usage_error() -> None:
    result = invoke("params", "resnet18", "--frozen", "lyer*")
    assert result.exit_code == 2
    assert "Traceback" not in result.stderr
    assert "lyer*" in result.stderr and "conv1.weight" in result.stderr
    assert result.stdout == ""


def test_dtype_and_instance_untouched() -> None:
    report = invoke_json("params", "sample_models:LeNet", "--dtype", "float64")
    assert {r["dtype"] for r in report["params"]} == {"float64"}
    assert report["settings"]["dtype"] == "float64"

    model = instances.LENET
    flags = [p.requires_grad for p in model.parameters()]
    assert invoke("params", "tests.fixtures.instances:LENET").exit_code == 0
    assert [p.requires_grad for p in model.parameters()] == flags
    assert_no_hooks(model)


def test_table_sums_to_total_and_other_formats(tmp_path: Path) -> None:
    result = invoke("params", "sample_models:TiedEmbeddingLM")
    assert result.exit_code == 0
    text = result.stdout
    lines = text.splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.startswith("Parameter"))
    end = lines[header].index("Numel") + len("Numel")
    body = lines[header + 2 : lines.index("", header)]
    assert len(body) == 4
    cells = [ln[:end].split()[-1] for ln in body]
    column = sum(int(c.replace(",", "")) for c in cells if c != "-")
    total = re.search(r"Total params:\s+([\d,]+)", text)
    assert total is not None and column == int(total.group(1).replace(",", ""))
    assert "lm_head.weight (tied)" in text

    csv_lines = invoke("params", "sample_models:LeNet", "-f", "csv").stdout.splitlines()
    assert csv_lines[0].split(",") == [
        "name",
        "shape",
        "dtype",
        "device",
        "requires_grad",
        "numel",
        "shared_with",
    ]
    assert len(csv_lines) == 1 + 10

    md = invoke("params", "sample_models:LeNet", "-f", "markdown").stdout
    assert md.count("| conv") == 4

    target = tmp_path / "p.json"
    assert (
        invoke("params", "sample_models.basic.LeNet", "-f", "json", "-o", str(target)).exit_code
        == 0
    )
    assert json.loads(target.read_text())["command"] == "params"

    shallow = invoke_json("params", "sample_models:CustomLinearLayer", "--depth", "0")
    assert [r["name"] for r in shallow["params"]] == ["weight", "bias"]
    assert global_hook_counts() == NO_GLOBAL_HOOKS


def test_bad_model_exit_codes() -> None:
    assert invoke("params", "no_such_model_xyz").exit_code == 3
    assert invoke("params", "tests.fixtures.broken:CtorRaises").exit_code == 3
    assert invoke("params", "sample_models:LeNet", "--device", "tpu9").exit_code == 2
