"""`hookcli inspect` end to end, checked against plain PyTorch."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import (
    assert_no_hooks,
    assert_same_state,
    global_hook_counts,
    invoke,
    invoke_json,
    state_snapshot,
)
from tests.fixtures import instances


def unique_numel(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in set(model.parameters()))


def table_params(text: str) -> tuple[int, int, int]:
    """Re-read a printed table: (sum of Params column, Total params, params not run)."""
    lines = text.splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.startswith("Layer"))
    start = lines[header].index("Params")
    end = start + len("Params")
    col_sum = 0
    for ln in lines[header + 2 :]:
        if not ln.strip():
            break
        cell = ln[: end + 1].split()[-1]  # right-aligned: the cell ends at the header's end
        col_sum += int(cell.replace(",", ""))
    total = int(re.search(r"Total params:\s+([\d,]+)", text).group(1).replace(",", ""))
    not_run = re.search(r"did not run:\s+([\d,]+)", text)
    return col_sum, total, int(not_run.group(1).replace(",", "")) if not_run else 0


def test_resnet18_json_schema_and_totals():
    import torchvision

    report = invoke_json("inspect", "resnet18")
    assert report["schema"] == "hookcli.report/1"
    assert report["command"] == "inspect"
    assert report["model"] == {"spec": "resnet18", "class": "ResNet"}
    assert report["settings"] == {"device": "cpu", "dtype": "float32", "mode": "eval", "seed": 0}
    assert report["inputs"] == [{"name": "x", "shape": [1, 3, 224, 224], "dtype": "float32"}]
    assert report["checks"] == []
    model = torchvision.models.resnet18(weights=None)
    params = list(model.parameters())
    t = report["totals"]
    assert t["params"] == unique_numel(model) == 11_689_512
    assert t["trainable_params"] == t["params"] and t["non_trainable_params"] == 0
    assert t["param_bytes"] == sum(p.numel() * 4 for p in params)
    assert t["buffers"] == sum(b.numel() for b in model.buffers())
    assert t["buffer_bytes"] == sum(b.numel() * b.element_size() for b in model.buffers())
    row_keys = {
        "name",
        "type",
        "depth",
        "call",
        "called",
        "input_shapes",
        "output_shapes",
        "params",
        "own_params",
        "trainable_params",
    }
    for row in report["layers"]:
        assert set(row) == row_keys
    by_name = {(r["name"], r["call"]): r for r in report["layers"]}
    for name, module in model.named_modules():
        row = by_name[(name, 0)]
        assert row["type"] == type(module).__name__
        assert row["depth"] == (0 if not name else name.count(".") + 1)
        assert row["params"] == sum(p.numel() for p in module.parameters())
        assert row["own_params"] == sum(p.numel() for p in module.parameters(recurse=False))


def test_rows_one_per_call_in_begin_order():
    """The number and order of rows equal what a plain pre-hook counter sees."""
    import torchvision

    model = torchvision.models.resnet18(weights=None).eval()
    names = {id(m): n for n, m in model.named_modules()}
    seen: list[str] = []
    handles = [
        m.register_forward_pre_hook(lambda m, a: seen.append(names[id(m)])) for m in model.modules()
    ]
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        model(torch.randn((1, 3, 64, 64), generator=g))
    for h in handles:
        h.remove()
    report = invoke_json("inspect", "resnet18", "-i", "1x3x64x64")
    assert [r["name"] for r in report["layers"]] == seen
    relu_calls = [r["call"] for r in report["layers"] if r["name"] == "layer1.0.relu"]
    assert relu_calls == [0, 1]  # BasicBlock calls its ReLU twice


def test_shapes_match_hand_run_resnet18():
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn((2, 3, 64, 64), generator=torch.Generator().manual_seed(0))
    expected = {}
    with torch.no_grad():
        h = x
        for name in (
            "conv1",
            "bn1",
            "relu",
            "maxpool",
            "layer1",
            "layer2",
            "layer3",
            "layer4",
            "avgpool",
        ):
            before = list(h.shape)
            h = getattr(model, name)(h)
            expected[name] = (before, list(h.shape))
        flat = torch.flatten(h, 1)
        expected["fc"] = (list(flat.shape), list(model.fc(flat).shape))
    report = invoke_json("inspect", "resnet18", "-i", "2x3x64x64", "--depth", "1")
    rows = {r["name"]: r for r in report["layers"] if r["call"] == 0}
    for name, (inp, out) in expected.items():
        assert rows[name]["input_shapes"] == [inp], name
        assert rows[name]["output_shapes"] == [out], name
    assert rows[""]["output_shapes"] == [[2, 1000]]


def test_shapes_match_hand_run_lenet_and_dict_output():
    from sample_models import LeNet, TwoInputDictOutput

    torch.manual_seed(0)
    lenet = LeNet()
    x = lenet.example_input_array
    c1 = lenet.conv1(x)
    p1 = lenet.pool1(F.relu(c1))
    c2 = lenet.conv2(p1)
    report = invoke_json("inspect", "sample_models:LeNet")
    rows = {r["name"]: r for r in report["layers"]}
    assert rows["conv1"]["output_shapes"] == [list(c1.shape)]
    assert rows["pool1"]["output_shapes"] == [list(p1.shape)]
    assert rows["conv2"]["output_shapes"] == [list(c2.shape)]

    torch.manual_seed(0)
    model = TwoInputDictOutput()
    out = model(*model.example_input_array)
    report = invoke_json("inspect", "sample_models:TwoInputDictOutput")
    root = report["layers"][0]
    assert root["input_shapes"] == [[2, 3, 8, 8], [2, 6]]
    assert root["output_shapes"] == [list(v.shape) for v in out.values()]


def test_lstm_nested_output_flattened():
    report = invoke_json("inspect", "sample_models:LSTMModel")
    rows = {r["name"]: r for r in report["layers"]}
    from sample_models import LSTMModel

    torch.manual_seed(0)
    model = LSTMModel()
    x = model.example_input_array
    lstm_out, (h, c) = model.lstm(model.proj(x))  # run by hand: the oracle
    head_out = model.head(lstm_out)
    # nn.LSTM returns (output, (h, c)): three tensors, flattened in order
    assert rows["lstm"]["output_shapes"] == [list(t.shape) for t in (lstm_out, h, c)]
    assert rows[""]["output_shapes"] == [list(t.shape) for t in (head_out, h, c)]


@pytest.mark.parametrize("depth", [None, 0, 1, 2, 3])
def test_table_params_column_sums_to_total_resnet18(depth):
    args = ["inspect", "resnet18", "-i", "1x3x32x32"]
    if depth is not None:
        args += ["--depth", str(depth)]
    result = invoke(*args)
    assert result.exit_code == 0, result.stderr
    col_sum, total, not_run = table_params(result.stdout)
    assert total == 11_689_512
    assert col_sum == total and not_run == 0


@pytest.mark.parametrize("depth", [None, 0, 1])
def test_tied_weights_counted_once(depth):
    from sample_models import TiedEmbeddingLM

    model = TiedEmbeddingLM()
    naive = sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False))
    args = ["inspect", "sample_models:TiedEmbeddingLM"]
    if depth is not None:
        args += ["--depth", str(depth)]
    result = invoke(*args)
    col_sum, total, not_run = table_params(result.stdout)
    assert total == unique_numel(model) < naive
    assert col_sum + not_run == total and not_run == 0
    report = invoke_json(*args)
    assert report["totals"]["params"] == unique_numel(model)
    rows = {r["name"]: r for r in report["layers"]}
    if depth != 0:
        assert rows["lm_head"]["own_params"] == model.embed.weight.numel()


def test_unused_branch_params_reported_as_not_run():
    from sample_models import UnusedBranch

    model = UnusedBranch()
    result = invoke("inspect", "sample_models:UnusedBranch")
    col_sum, total, not_run = table_params(result.stdout)
    spare = sum(p.numel() for p in model.spare.parameters())
    assert not_run == spare and col_sum + not_run == total == unique_numel(model)


def test_stdout_and_stderr_split_and_output_file(tmp_path):
    ok = invoke("inspect", "sample_models:Net")
    assert ok.exit_code == 0 and "Total params" in ok.stdout and ok.stderr == ""
    bad = invoke("inspect", "resnet81")
    assert bad.exit_code == 3 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "did you mean resnet18" in bad.stderr
    out = tmp_path / "sub" / "report.json"
    res = invoke("inspect", "sample_models:Net", "-f", "json", "-o", str(out))
    assert res.exit_code == 0 and res.stdout == ""
    assert json.loads(out.read_text())["model"]["class"] == "Net"


def test_depth_filters_rows():
    report = invoke_json("inspect", "resnet18", "-i", "1x3x32x32", "--depth", "1")
    assert max(r["depth"] for r in report["layers"]) == 1
    assert report["layers"][0]["name"] == ""
    zero = invoke_json("inspect", "resnet18", "-i", "1x3x32x32", "--depth", "0")
    assert [r["name"] for r in zero["layers"]] == [""]


def test_hooks_option_selects_columns():
    only_pre = invoke_json("inspect", "sample_models:Net", "--hooks", "pre")
    assert all("input_shapes" in r and "output_shapes" not in r for r in only_pre["layers"])
    only_fwd = invoke_json("inspect", "sample_models:Net", "--hooks", "forward")
    assert all("output_shapes" in r and "input_shapes" not in r for r in only_fwd["layers"])
    bad = invoke("inspect", "sample_models:Net", "--hooks", "sideways")
    assert bad.exit_code == 2 and "sideways" in bad.stderr


def test_module_called_twice_and_global_hooks_see_forward_created_modules():
    before = state_snapshot(instances.SHARED)
    report = invoke_json("inspect", "tests.fixtures.instances:SHARED", "-i", "3x4")
    names = [(r["name"], r["call"]) for r in report["layers"]]
    assert names == [("", 0), ("block", 0), ("block", 1), ("head", 0)]
    glob = invoke_json("inspect", "tests.fixtures.instances:SHARED", "-i", "3x4", "--global-hooks")
    names = [(r["name"], r["call"]) for r in glob["layers"]]
    assert names == [("", 0), ("block", 0), ("block", 1), ("[Tanh]", 0), ("head", 0)]
    tanh = glob["layers"][3]
    assert tanh["depth"] == 1 and tanh["params"] == 0 and tanh["output_shapes"] == [[3, 4]]
    assert_no_hooks(instances.SHARED)
    assert_same_state(before, state_snapshot(instances.SHARED))


def test_meta_device_and_dtype():
    meta = invoke_json("inspect", "resnet18", "--device", "meta", "-b", "4")
    assert meta["settings"]["device"] == "meta"
    assert meta["layers"][-1]["output_shapes"] == [[4, 1000]]
    f64 = invoke_json("inspect", "sample_models:LeNet", "--dtype", "float64")
    assert f64["settings"]["dtype"] == "float64"
    assert f64["inputs"][0]["dtype"] == "float64"


def test_model_left_as_found_after_success_train_mode():
    model = instances.BN_MLP
    model.eval()
    model.net[1].train()  # mixed flags must come back exactly
    before = state_snapshot(model)
    counts = global_hook_counts()
    report = invoke_json("inspect", "tests.fixtures.instances:BN_MLP", "--mode", "train")
    assert report["settings"]["mode"] == "train"
    assert_no_hooks(model, counts)
    assert_same_state(before, state_snapshot(model))  # running stats restored too


def test_forward_failure_exit_4_names_module_and_keeps_rows():
    model = instances.RAISES
    before = state_snapshot(model)
    result = invoke("inspect", "tests.fixtures.instances:RAISES", "-f", "json")
    assert result.exit_code == 4
    msg = result.stderr.strip()
    assert "\n" not in msg and "Traceback" not in msg
    assert "block.1 (Linear)" in msg and "[2, 8]" in msg
    report = json.loads(result.stdout)
    assert [r["name"] for r in report["layers"]] == ["", "stem", "block", "block.0", "block.1"]
    assert report["layers"][1]["output_shapes"] == [[2, 8]]
    assert "block.1" in report["error"]
    assert_no_hooks(model)
    assert_same_state(before, state_snapshot(model))


def test_keyboard_interrupt_restores_everything():
    model = instances.INTERRUPTS
    model.eval()
    before = state_snapshot(model)
    result = invoke("inspect", "tests.fixtures.instances:INTERRUPTS", "--mode", "train")
    assert result.exit_code == 130 and "interrupted" in result.stderr
    assert_no_hooks(model)
    assert_same_state(before, state_snapshot(model))  # BN stats updated in train mode: restored


def test_debug_shows_traceback():
    result = invoke("inspect", "tests.fixtures.instances:RAISES", "--debug")
    assert result.exit_code == 4 and "Traceback" in result.stderr


def test_detection_and_optical_flow_defaults():
    det = invoke_json("inspect", "fasterrcnn_mobilenet_v3_large_320_fpn", "--depth", "1")
    assert det["inputs"] == [{"name": "images[0]", "shape": [3, 224, 224], "dtype": "float32"}]
    flow = invoke_json(
        "inspect", "raft_small", "--depth", "0", "-i", "1x3x128x128", "-i", "1x3x128x128"
    )
    assert [i["name"] for i in flow["inputs"]] == ["image1", "image2"]


def test_models_command():
    result = invoke("models", "--filter", "resnet1*")
    assert result.exit_code == 0
    assert "resnet18" in result.stdout and "resnet101" in result.stdout
    assert "vgg16" not in result.stdout
    everything = invoke_json("models")
    import torchvision

    names = {m["name"] for m in everything["models"]}
    assert set(torchvision.models.list_models()) <= names
    assert "sample_models:LeNet" in names


def test_help_and_version_do_not_import_torch():
    code = (
        "import sys\n"
        "from hookcli.cli import main\n"
        "for argv in (['hookcli', '--help'], ['hookcli', '--version'], ['hookcli', 'inspect', '--help']):\n"
        "    sys.argv = argv\n"
        "    try:\n"
        "        main()\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert "NO-TORCH" in proc.stderr, proc.stderr
    assert "hookcli 0.1.0" in proc.stdout and "--input" in proc.stdout
