"""Issue 10, items 8, 9, 10, 18, 20, 22: odd models, odd weights files, clearer grads failures,
one name matcher, no second forward in features, thin command modules.

Figures are checked against plain PyTorch computed here (parameter counts, shapes,
autograd norms), never against hookcli's own output alone.
"""

from __future__ import annotations

import ast
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import hookcli
from hookcli.errors import LoadError
from hookcli.globs import name_matches, select_modules
from hookcli.loading import load_model
from sample_models import LeNet
from tests.conftest import assert_no_hooks, assert_same_state, invoke, state_snapshot
from tests.fixtures import hardening_models as hm

FIX = "tests.fixtures.hardening_models"
ROOT = Path(__file__).resolve().parent.parent


def one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr and "internal error" not in stderr
    return lines[0]


# -- 8: TorchScript, torch.compile, quantized --------------------------------------------------
@pytest.mark.parametrize("factory", ["scripted", "traced"])
@pytest.mark.parametrize(
    "command",
    [
        ["inspect"],
        ["grads"],
        ["stats", "--backward"],
        ["buffers"],
        ["trace"],
        ["features", "-l", "fc1"],
        ["inspect", "--global-hooks"],
    ],
)
def test_torchscript_root_is_one_clear_line(factory, command):
    result = invoke(*command, f"{FIX}:{factory}", "-i", "3x4")
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    line = one_line(result.stderr)
    assert "TorchScript module" in line and "eager nn.Module" in line
    assert result.stdout == ""


@pytest.mark.parametrize("factory", ["scripted", "traced"])
def test_torchscript_params_are_reported(factory):
    model = getattr(hm, factory)()
    expected = {n: p.numel() for n, p in model.named_parameters()}
    result = invoke("params", f"{FIX}:{factory}", "-f", "json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert {r["name"]: r["numel"] for r in report["params"]} == expected
    assert report["totals"]["params"] == sum(expected.values())


def test_scripted_submodule_runs_unhooked_and_the_model_is_restored():
    torch.manual_seed(0)
    model = hm.WithScriptedChild().train()
    x = torch.randn(3, 4)
    before = state_snapshot(model)
    report = hookcli.inspect(model, x)
    assert [r.data["name"] for r in report.layers] == ["", "pre"]
    assert report.totals["params"] == sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        expected = model(x).shape
    assert report.layers[0].data["output_shapes"] == [list(expected)]
    grads = hookcli.grads(model, x)
    torch.manual_seed(0)
    plain = hm.WithScriptedChild()
    plain(x).sum().backward()
    want = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(p.grad) for p in plain.parameters()])
    ).item()
    assert grads.totals["grad_norm"] == pytest.approx(want, rel=1e-5)
    assert_no_hooks(model)
    assert_same_state(before, state_snapshot(model))


def test_scripted_submodule_note_and_global_backward_refused():
    ok = invoke("inspect", f"{FIX}:WithScriptedChild")
    assert ok.exit_code == 0 and "TorchScript submodule(s) inner" in ok.stderr
    bad = invoke("grads", f"{FIX}:WithScriptedChild", "--global-hooks")
    assert bad.exit_code == 2 and "without --global-hooks" in one_line(bad.stderr)


def test_compiled_model_is_reported_through_its_eager_module():
    result = invoke("inspect", f"{FIX}:compiled", "-f", "json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert [r["name"] for r in report["layers"]] == ["", "fc1", "act", "fc2"]
    assert report["model"]["class"] == "Small"
    assert "torch.compile" in result.stderr
    torch.manual_seed(0)
    eager = hm.Small()
    x = eager.example_input_array
    assert report["layers"][1]["output_shapes"] == [list(eager.fc1(x).shape)]
    grads = json.loads(invoke("grads", f"{FIX}:compiled", "-f", "json").stdout)
    eager(x).sum().backward()
    want = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(p.grad) for p in eager.parameters()])
    ).item()
    assert grads["totals"]["grad_norm"] == pytest.approx(want, rel=1e-5)


def _packed_numel(model: nn.Module) -> int:
    """Plain PyTorch: the elements of every quantized module's unpacked weight and bias."""
    total = 0
    for m in model.modules():
        if isinstance(m, torch.ao.nn.quantized.Linear | torch.ao.nn.quantized.Conv2d):
            total += m.weight().numel() + (m.bias().numel() if m.bias() is not None else 0)
    return total


def test_dynamic_quantized_model_counts_packed_weights():
    model = hm.dynamic_quantized()
    assert sum(p.numel() for p in model.parameters()) == 0  # what a parameter count sees
    expected = _packed_numel(model)
    assert expected == 4 * 8 + 8 + 8 * 2 + 2
    report = json.loads(invoke("inspect", f"{FIX}:dynamic_quantized", "-f", "json").stdout)
    assert report["totals"]["params"] == expected
    assert report["totals"]["packed_params"] == expected
    assert report["totals"]["trainable_params"] == 0
    by_name = {r["name"]: r for r in report["layers"]}
    assert by_name["fc1"]["params"] == model.fc1.weight().numel() + model.fc1.bias().numel()
    params = json.loads(invoke("params", f"{FIX}:dynamic_quantized", "-f", "json").stdout)
    rows = {r["name"]: r for r in params["params"]}
    assert set(rows) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    assert rows["fc1.weight"]["dtype"] == "qint8" and rows["fc1.weight"]["packed"] is True
    assert rows["fc2.weight"]["shape"] == list(model.fc2.weight().shape)
    assert params["totals"]["params"] == expected


@pytest.mark.slow
def test_quantized_resnet18_counts_packed_weights():
    import torchvision

    result = invoke("inspect", "quantized_resnet18", "-k", "quantize=True", "-f", "json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    eager = torchvision.models.resnet18(weights=None)
    # Quantization folds each BatchNorm into the conv before it: the BN's weight and bias
    # go, the conv gains a bias of the same length.
    bn = sum(m.num_features for m in eager.modules() if isinstance(m, nn.BatchNorm2d))
    assert report["totals"]["params"] == sum(p.numel() for p in eager.parameters()) - bn
    assert report["totals"]["params"] == 11_684_712


# -- 9: weights files ----------------------------------------------------------------------------
def test_trust_pickle_loads_a_plain_pickle_state_dict(tmp_path):
    torch.manual_seed(1)
    source = LeNet()
    path = tmp_path / "weights.pkl"
    with path.open("wb") as f:
        pickle.dump(source.state_dict(), f)
    refused = invoke("inspect", "sample_models:LeNet", "--weights", str(path))
    assert refused.exit_code == 3 and "--trust-pickle" in one_line(refused.stderr)
    loaded = load_model("sample_models:LeNet", weights=path, trust_pickle=True, seed=0)
    for key, value in source.state_dict().items():
        assert torch.equal(loaded.module.state_dict()[key], value), key
    ok = invoke("params", "sample_models:LeNet", "--weights", str(path), "--trust-pickle")
    assert ok.exit_code == 0, ok.stderr


def _write(kind: str, tmp_path: Path) -> Path:
    if kind == "dir":
        path = tmp_path / "folder"
        path.mkdir()
        (path / "notes.txt").write_text("not weights")
        return path
    path = tmp_path / f"{kind}.pt"
    data = {
        "text": b"epoch 3, loss 0.25\nweights are elsewhere\n",
        "empty": b"",
        "random": bytes(range(7, 255)) * 8,
    }[kind]
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("text", "text file"),
        ("empty", "empty (0 bytes)"),
        ("random", "first bytes (07 08 09"),
        ("dir", "folder with no checkpoint"),
    ],
)
@pytest.mark.parametrize("trust", [False, True])
def test_unreadable_weights_file_gets_a_reason(tmp_path, kind, words, trust):
    path = _write(kind, tmp_path)
    args = ["--trust-pickle"] if trust else []
    result = invoke("inspect", "sample_models:LeNet", "--weights", str(path), *args)
    assert result.exit_code == 3
    line = one_line(result.stderr)
    assert "not a PyTorch checkpoint" in line and words in line, line
    with pytest.raises(LoadError, match="not a PyTorch checkpoint"):
        load_model("sample_models:LeNet", weights=path, trust_pickle=trust)


# -- 10: clearer grads / stats --backward failures --------------------------------------------------
@pytest.mark.parametrize(
    ("model", "what"),
    [
        ("ReturnsNone", "output is None"),
        ("ReturnsInt", "output is an int"),
        ("NoParams", "float32 Tensor [2, 4] that does not require grad"),
    ],
)
@pytest.mark.parametrize("command", [["grads"], ["stats", "--backward"], ["trace", "--backward"]])
def test_nothing_to_backpropagate_is_exit_2_naming_the_output_type(model, what, command):
    result = invoke(*command, f"{FIX}:{model}")
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    line = one_line(result.stderr)
    assert "nothing to backpropagate" in line and what in line, line
    assert result.stdout == ""


@pytest.mark.parametrize("command", [["grads"], ["stats", "--backward", "--mode", "train"]])
def test_detection_model_in_train_mode_gets_a_mode_eval_hint(command):
    result = invoke(*command, f"{FIX}:tiny_detector")
    assert result.exit_code == 4
    line = one_line(result.stderr)
    assert "targets" in line and "hint:" in line and "--mode eval" in line
    assert invoke(*command, f"{FIX}:tiny_detector", "--mode", "eval").exit_code == 0


@pytest.mark.slow
def test_torchvision_detection_name_in_train_mode_gets_the_hint():
    result = invoke("grads", "ssdlite320_mobilenet_v3_large")
    assert result.exit_code == 4 and "--mode eval" in one_line(result.stderr)


def test_batchnorm_batch_of_one_hint_holds_for_stats_backward():
    result = invoke("stats", f"{FIX}:BatchNormOne", "--backward", "--mode", "train")
    assert result.exit_code == 4
    line = one_line(result.stderr)
    assert "bn (BatchNorm1d)" in line and "-b 2" in line and "--mode eval" in line
    report = json.loads(
        invoke("stats", f"{FIX}:BatchNormOne", "--backward", "--mode", "train", "-f", "json").stdout
    )
    assert "-b 2" in report["error"]
    ok = invoke("stats", f"{FIX}:BatchNormOne", "--backward", "--mode", "train", "-b", "2")
    assert ok.exit_code == 0, ok.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["grads"],
        ["stats", "--backward"],
        ["grads", "--global-hooks"],
        ["stats", "--backward", "--global-hooks"],
    ],
)
def test_custom_backward_that_raises_names_its_module(command):
    result = invoke(*command, f"{FIX}:CustomBackwardFails")
    assert result.exit_code == 4
    line = one_line(result.stderr)
    assert "backward failed in boom (Exploder)" in line and "custom backward exploded" in line


@pytest.mark.parametrize("command", [["grads"], ["stats", "--backward"]])
def test_pytorch_warnings_are_one_line_unless_debug(command):
    quiet = invoke(*command, f"{FIX}:WarnsInForward")
    assert quiet.exit_code == 0
    line = one_line(quiet.stderr)
    assert "UserWarning: To copy construct from a tensor" in line and "--debug" in line
    # in a subprocess: pytest records warnings itself, so --debug's would not reach stderr
    loud = subprocess.run(
        [sys.executable, "-m", "hookcli", *command, f"{FIX}:WarnsInForward", "--debug"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "HOOKCLI_NO_CONFIG": "1"},
        timeout=120,
    )
    assert loud.returncode == 0, loud.stderr
    assert "To copy construct from a tensor" in loud.stderr
    assert "hardening_models.py" in loud.stderr  # Python's own warning, with its location
    assert "--debug shows" not in loud.stderr


# -- 18: one module-name glob matcher ---------------------------------------------------------------
def test_one_matcher_semantics():
    assert name_matches("layer1.0.conv1", "layer1.*")
    assert name_matches("layer1.0.conv1", "*conv1")
    assert not name_matches("layer1.0.conv1", "layer1")  # a plain name is that module alone
    assert name_matches("layer1.0.conv1", "layer1", subtree=True)
    assert name_matches("layer1.0.conv1", "layer1.", subtree=True)
    assert not name_matches("layer10.conv", "layer1", subtree=True)
    assert name_matches("", "(root)") and name_matches("", "") and not name_matches("fc", "")
    assert name_matches("features.3", "BatchNorm2d", type_name="BatchNorm2d")
    assert name_matches("features.3", "Batch*", type_name="BatchNorm2d")
    assert not name_matches("features.3", "Batch*")
    assert name_matches("ResNet18", "resnet*", fold_case=True)
    assert not name_matches("lenet5", "lenet", fold_case=True)


def test_the_four_commands_share_the_matcher():
    for rel in (
        "hookcli/commands/params.py",
        "hookcli/commands/trace.py",
        "hookcli/features/probe.py",
        "hookcli/commands/models.py",
    ):
        tree = ast.parse((ROOT / rel).read_text())
        imported = {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in node.names
        }
        assert "fnmatch" not in imported, rel
        funcs = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert not funcs & {"matches", "_matches", "select_modules", "_suggest"}, rel


def test_each_command_keeps_its_matching_behaviour():
    torch.manual_seed(0)
    model = LeNet()
    # params --frozen: a module name freezes everything under it
    report = json.loads(
        invoke("params", "sample_models:LeNet", "--frozen", "conv1", "-f", "json").stdout
    )
    frozen = sum(p.numel() for n, p in model.named_parameters() if n.startswith("conv1."))
    assert report["totals"]["frozen_params"] == frozen
    # features --layer: a plain name is that module alone
    assert [n for n, _ in select_modules(model, ["conv1"])] == ["conv1"]
    # trace --filter: a class name, and (root) for the root
    trace = json.loads(
        invoke("trace", "sample_models:LeNet", "--filter", "Conv2d", "-f", "json").stdout
    )
    convs = [n for n, m in model.named_modules() if isinstance(m, nn.Conv2d)]
    assert sorted({e["module"] for e in trace["events"]}) == sorted(convs)
    root = json.loads(
        invoke("trace", "sample_models:LeNet", "--filter", "(root)", "-f", "json").stdout
    )
    assert [e["module"] for e in root["events"]] == ["", ""]
    # models --filter: a glob matched whole, any case
    models = json.loads(
        invoke("models", "--source", "samples", "--filter", "*LENET*", "-f", "json").stdout
    )
    assert models["models"] and all("lenet" in r["name"].lower() for r in models["models"])


# -- 20: features does not run forward twice ---------------------------------------------------------
def test_features_failure_is_located_without_a_second_forward(tmp_path):
    hm.CountsForward.calls = 0
    out = tmp_path / "f.pt"
    result = invoke("features", f"{FIX}:CountsForward", "-l", "ok", "--out", str(out))
    assert result.exit_code == 4
    line = one_line(result.stderr)
    # only `ok` is hooked, yet the failing module and its input shapes are named
    assert "forward failed in mid.1 (Linear) with input shapes [2, 3]" in line, line
    assert hm.CountsForward.calls == 1
    assert not out.exists()


# -- 22: command modules hold their signature and how they compose probes -----------------------------
@pytest.mark.parametrize("name", ["grads", "params", "buffers", "trace", "registrations"])
def test_command_modules_hold_no_formatting_helpers(name):
    tree = ast.parse((ROOT / "hookcli" / "commands" / f"{name}.py").read_text())
    top = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert top == ["command"], top


def test_moved_helpers_render_the_same_tables():
    result = invoke("grads", "sample_models:LeNet", "--per-param")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    start = lines.index("Parameters:")
    header = lines[start + 1].split()
    assert header[:3] == ["Parameter", "Shape", "Grad"]
    names = [ln.split()[0] for ln in lines[start + 3 : start + 3 + 10]]
    assert names == [n for n, _ in LeNet().named_parameters()]


def test_api_reports_a_compiled_model_through_its_eager_module():
    torch.manual_seed(0)
    eager = hm.Small()
    report = hookcli.inspect(torch.compile(eager), torch.randn(3, 4))
    assert [r.data["name"] for r in report.layers] == ["", "fc1", "act", "fc2"]
    assert report.totals["params"] == sum(p.numel() for p in eager.parameters())
    assert_no_hooks(eager)


@pytest.mark.parametrize("command", ["features", "ablate"])
def test_layer_selecting_a_scripted_submodule_is_exit_2(command):
    result = invoke(command, f"{FIX}:WithScriptedChild", "-l", "inner.fc1")
    assert result.exit_code == 2, result.stderr
    assert "TorchScript module(s)" in one_line(result.stderr)
