"""``hookcli grads``: every figure checked against plain autograd, computed by hand.

The reference runs rebuild each model the way docs/reference.md "Seeding" says
(``torch.manual_seed(seed)`` right before building, inputs from a
``torch.Generator`` seeded with the seed), run forward by hand capturing the
module outputs, and take ``torch.autograd.grad`` of the loss.
"""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any

import pytest
import torch
import torchvision
from torch import nn

from sample_models import BNMLP, LSTMModel, TiedEmbeddingLM
from tests.conftest import invoke, invoke_json

REL = 1e-5


def close(got: float | None, want: float, rel: float = REL) -> bool:
    assert got is not None
    return math.isclose(got, want, rel_tol=rel, abs_tol=1e-12)


def norm(*tensors: torch.Tensor | None) -> float:
    """L2 over every tensor, in float64."""
    parts = [t.detach().double().reshape(-1) for t in tensors if t is not None]
    return float(torch.cat(parts).norm())


def rows_by_label(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """name (or name#call for repeated calls) -> row."""
    out = {}
    for r in report["layers"]:
        label = r["name"] + (f"#{r['call']}" if r["call"] else "")
        out[label] = r
    return out


def check_params(report: dict[str, Any], model: nn.Module) -> None:
    """Every parameter's grad norm and weight norm, and the totals, against the hand run."""
    per_param = {p["name"]: p for p in report["params"]}
    named = dict(model.named_parameters())
    assert list(per_param) == list(named)
    for name, p in named.items():
        assert p.grad is not None, name
        row = per_param[name]
        assert close(row["grad_norm"], norm(p.grad)), (name, row["grad_norm"], norm(p.grad))
        assert close(row["weight_norm"], norm(p)), name
        assert row["shape"] == list(p.shape)
        assert row["nan_count"] == int(torch.isnan(p.grad).sum())
        assert row["inf_count"] == int(torch.isinf(p.grad).sum())
    total = torch.nn.utils.get_total_norm([p.grad for p in named.values()], norm_type=2.0)
    assert close(report["totals"]["grad_norm"], float(total))
    # per layer: L2 over the module's own parameters
    layers = rows_by_label(report)
    for mname, m in model.named_modules():
        own = list(m.parameters(recurse=False))
        row = layers.get(mname)
        if row is None:
            continue
        if own:
            assert close(row["grad_norm"], norm(*[p.grad for p in own])), mname
            assert close(row["weight_norm"], norm(*own)), mname
            assert close(row["grad_weight_ratio"], norm(*[p.grad for p in own]) / norm(*own))
        else:
            assert row["grad_norm"] is None and row["weight_norm"] is None
        assert row["unused_params"] == []


# -- BNMLP: batch norm + dropout in train mode ------------------------------------------
def test_bnmlp_matches_autograd() -> None:
    report = invoke_json("grads", "sample_models:BNMLP", "--per-param")
    torch.manual_seed(0)
    m = BNMLP()
    x = m.example_input_array
    m.train()
    outs = []
    h = x
    for layer in m.net:  # the Sequential's own loop, by hand, capturing each output
        h = layer(h)
        outs.append(h)
    y = h * m.step_scale
    loss = y.sum()
    grads = torch.autograd.grad(loss, [y, *outs], retain_graph=True)
    loss.backward()
    assert report["settings"]["mode"] == "train"
    assert close(report["totals"]["loss"], loss.item())
    check_params(report, m)
    rows = rows_by_label(report)
    g_y, g_outs = grads[0], grads[1:]
    assert close(rows[""]["grad_output_norm"], norm(g_y))
    assert close(rows["net"]["grad_output_norm"], norm(g_outs[-1]))
    for i in range(len(m.net)):
        assert close(rows[f"net.{i}"]["grad_output_norm"], norm(g_outs[i])), i
        if i == 0:
            assert rows["net.0"]["grad_input_norm"] is None  # x does not require grad
        else:
            assert close(rows[f"net.{i}"]["grad_input_norm"], norm(g_outs[i - 1])), i
    assert rows[""]["grad_input_norm"] is None


def test_bnmlp_mean_loss_scales_gradients() -> None:
    report = invoke_json("grads", "sample_models:BNMLP", "--loss", "mean", "--per-param")
    torch.manual_seed(0)
    m = BNMLP()
    m.train()
    y = m(m.example_input_array)
    loss = y.mean()
    loss.backward()
    assert report["settings"]["loss"] == "mean"
    assert close(report["totals"]["loss"], loss.item())
    check_params(report, m)


# -- LSTM: nested outputs ------------------------------------------------------------------
def test_lstm_matches_autograd() -> None:
    report = invoke_json("grads", "sample_models:LSTMModel", "--per-param")
    torch.manual_seed(0)
    m = LSTMModel()
    x = m.example_input_array
    m.train()
    p = m.proj(x)
    out, (h, c) = m.lstm(p)
    y = m.head(out)
    loss = y.sum() + h.sum() + c.sum()  # --loss sum: every floating element of the output
    g_p, g_out, g_h, g_c, g_y = torch.autograd.grad(loss, [p, out, h, c, y], retain_graph=True)
    loss.backward()
    assert close(report["totals"]["loss"], loss.item())
    check_params(report, m)
    rows = rows_by_label(report)
    assert close(rows["proj"]["grad_output_norm"], norm(g_p))
    assert close(rows["head"]["grad_output_norm"], norm(g_y))
    assert close(rows["head"]["grad_input_norm"], norm(g_out))  # head's share of out's grad
    # Full backward hooks see the top-level tensors of a module's output only:
    # the LSTM's (h, c) pair is nested, so grad_output is out's gradient alone.
    assert close(rows["lstm"]["grad_output_norm"], norm(g_out))
    assert not close(rows["lstm"]["grad_output_norm"], norm(g_out, g_h, g_c))
    assert close(rows["lstm"]["grad_input_norm"], norm(g_p))


def test_lstm_output_tensor_hooks_see_nested_outputs() -> None:
    report = invoke_json(
        "grads", "sample_models:LSTMModel", "--hooks", "forward,backward-pre,backward,tensor"
    )
    torch.manual_seed(0)
    m = LSTMModel()
    m.train()
    out, (h, c) = m.lstm(m.proj(m.example_input_array))
    loss = m.head(out).sum() + h.sum() + c.sum()
    g_out, g_h, g_c = torch.autograd.grad(loss, [out, h, c])
    rows = rows_by_label(report)
    assert close(rows["lstm"]["output_grad_norm"], norm(g_out, g_h, g_c))
    assert close(rows["lstm"]["grad_output_norm"], norm(g_out))


# -- resnet18: residual in-place adds, a ReLU called twice per block -------------------------
def _block(block: nn.Module, x: torch.Tensor, cap: dict[str, torch.Tensor], name: str) -> Any:
    identity = x
    out = block.conv1(x)
    cap[f"{name}.conv1"] = out
    out = block.bn1(out)
    cap[f"{name}.bn1"] = out
    out = block.relu(out)
    cap[f"{name}.relu"] = out
    out = block.conv2(out)
    cap[f"{name}.conv2"] = out
    out = block.bn2(out)
    cap[f"{name}.bn2"] = out
    if block.downsample is not None:
        identity = block.downsample(x)
        cap[f"{name}.downsample"] = identity
    out = out + identity  # not in place, so the captured bn2 output stays as it was
    out = block.relu(out)
    cap[f"{name}.relu#1"] = out
    cap[name] = out
    return out


def _resnet(m: nn.Module, x: torch.Tensor, cap: dict[str, torch.Tensor]) -> torch.Tensor:
    for name in ("conv1", "bn1", "relu", "maxpool"):
        x = getattr(m, name)(x)
        cap[name] = x
    for lname in ("layer1", "layer2", "layer3", "layer4"):
        for i, block in enumerate(getattr(m, lname)):
            x = _block(block, x, cap, f"{lname}.{i}")
        cap[lname] = x
    x = m.avgpool(x)
    cap["avgpool"] = x
    x = m.fc(torch.flatten(x, 1))
    cap["fc"] = x
    return x


def test_resnet18_matches_autograd() -> None:
    report = invoke_json("grads", "resnet18", "-i", "2x3x64x64", "--per-param")
    torch.manual_seed(0)
    m = torchvision.models.get_model("resnet18", weights=None)
    for mod in m.modules():
        if hasattr(mod, "inplace"):
            mod.inplace = False  # the hand run captures outputs: keep them intact
    m.train()
    x = torch.randn((2, 3, 64, 64), generator=torch.Generator().manual_seed(0))
    cap: dict[str, torch.Tensor] = {}
    out = _resnet(m, x, cap)
    loss = out.sum()
    names = list(cap)
    captured = torch.autograd.grad(loss, list(cap.values()), retain_graph=True)
    grads = dict(zip(names, captured, strict=True))
    # layer1.1.conv1's grad_input: its share of the gradient of layer1.0's output
    (g_in,) = torch.autograd.grad(
        cap["layer1.1.conv1"], cap["layer1.0"], grads["layer1.1.conv1"], retain_graph=True
    )
    loss.backward()
    assert close(report["totals"]["loss"], loss.item())
    check_params(report, m)
    rows = rows_by_label(report)
    for name, g in grads.items():
        assert name in rows, name
        assert close(rows[name]["grad_output_norm"], norm(g)), name
    # every call whose output autograd reached has a grad_output_norm, and no other call
    with_grad = {label for label, r in rows.items() if r["grad_output_norm"] is not None}
    assert set(grads) | {""} <= with_grad
    # the rest are submodules the hand run does not name (a downsample's conv and bn)
    extra = with_grad - set(grads) - {""}
    assert all(any(e.startswith(n + ".") for n in grads) for e in extra), extra
    # the root's grad_output is d(sum)/d(out): ones, of norm sqrt(numel)
    assert close(rows[""]["grad_output_norm"], out.numel() ** 0.5)
    # each block's ReLU runs twice: a row per call, the parameter-free module's calls differ
    assert rows["layer1.0.relu"]["call"] == 0 and rows["layer1.0.relu#1"]["call"] == 1
    assert rows["layer1.0.relu"]["grad_output_norm"] != rows["layer1.0.relu#1"]["grad_output_norm"]
    assert close(rows["layer1.1.conv1"]["grad_input_norm"], norm(g_in))


def test_tied_weights_counted_once_in_total() -> None:
    report = invoke_json("grads", "sample_models:TiedEmbeddingLM", "--per-param")
    torch.manual_seed(0)
    m = TiedEmbeddingLM()
    m.train()
    m(m.example_input_array).sum().backward()
    check_params(report, m)  # named_parameters() lists the tied tensor once, as embed.weight
    rows = rows_by_label(report)
    tied = norm(m.embed.weight.grad)
    assert close(rows["embed"]["grad_norm"], tied)  # both owners show the whole tied grad
    assert close(rows["lm_head"]["grad_norm"], tied)


def test_module_called_twice_gets_a_row_per_call() -> None:
    report = invoke_json("grads", f"{__name__}:SHARED", "-i", "3x4")
    model = SHARED
    torch.manual_seed(0)
    x = torch.randn((3, 4), generator=torch.Generator().manual_seed(0))
    a = model.block(x)
    b = model.block(a)
    loss = model.head(torch.tanh(b)).sum()
    g_a, g_b = torch.autograd.grad(loss, [a, b], retain_graph=True)
    loss.backward()
    rows = rows_by_label(report)
    assert rows["block"]["call"] == 0 and rows["block#1"]["call"] == 1
    assert close(rows["block"]["grad_output_norm"], norm(g_a))
    assert close(rows["block#1"]["grad_output_norm"], norm(g_b))
    assert close(rows["block#1"]["grad_input_norm"], norm(g_a))
    # parameter grads are the accumulated ones, the same on both rows
    want = norm(model.block.weight.grad, model.block.bias.grad)
    assert close(rows["block"]["grad_norm"], want)
    assert close(rows["block#1"]["grad_norm"], want)
    for p in model.parameters():
        p.grad = None


class SharedBlock(nn.Module):
    """One Linear called twice in a row."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.block(self.block(x))))


SHARED = SharedBlock()


# -- options ------------------------------------------------------------------------------
def test_global_hooks_give_the_same_figures() -> None:
    a = invoke_json("grads", "sample_models:BNMLP")
    b = invoke_json("grads", "sample_models:BNMLP", "--global-hooks")
    keys = ("grad_norm", "grad_output_norm", "grad_input_norm")
    assert [[r[k] for k in keys] for r in a["layers"]] == [
        [r[k] for k in keys] for r in b["layers"]
    ]


def test_depth_limits_rows_not_figures() -> None:
    full = rows_by_label(invoke_json("grads", "sample_models:BNMLP"))
    shallow = invoke_json("grads", "sample_models:BNMLP", "--depth", "1")
    assert [r["name"] for r in shallow["layers"]] == ["", "net"]
    assert shallow["layers"][1]["grad_output_norm"] == full["net"]["grad_output_norm"]
    assert shallow["totals"]["grad_norm"] == pytest.approx(
        math.sqrt(sum(r["grad_norm"] ** 2 for r in full.values() if r["grad_norm"]))
    )


@pytest.mark.parametrize(
    ("hooks", "present", "absent"),
    [
        ("backward-pre", {"grad_output_norm"}, {"grad_norm", "grad_input_norm"}),
        ("backward", {"grad_input_norm"}, {"grad_norm", "grad_output_norm"}),
        ("tensor", {"grad_norm", "weight_norm", "output_grad_norm"}, {"grad_output_norm"}),
    ],
)
def test_hooks_choose_the_columns(hooks: str, present: set[str], absent: set[str]) -> None:
    report = invoke_json("grads", "sample_models:LeNet", "--hooks", hooks)
    keys = set(report["layers"][0])
    assert present <= keys and not (absent & keys)
    assert "output_shapes" not in keys and "input_shapes" not in keys


def test_default_columns_and_json_keys() -> None:
    report = invoke_json("grads", "sample_models:LeNet")
    assert report["schema"] == "hookcli.report/1" and report["command"] == "grads"
    row = report["layers"][1]
    for key in (
        "name",
        "type",
        "depth",
        "call",
        "output_shapes",
        "grad_norm",
        "weight_norm",
        "grad_weight_ratio",
        "grad_output_norm",
        "grad_input_norm",
        "unused_params",
    ):
        assert key in row, key
    assert "output_grad_norm" not in row  # output tensor hooks only with an explicit --hooks tensor
    assert {"loss", "grad_norm", "params"} <= set(report["totals"])
    assert report["checks"] == []
    assert "params" not in report  # --per-param only


def test_table_shows_columns_totals_and_failed_rows_marked() -> None:
    result = invoke("grads", "sample_models:LeNet", "--max-grad-norm", "0")
    assert result.exit_code == 1
    text = result.stdout
    for header in ("Grad norm", "Weight norm", "Grad/weight", "Grad output", "Grad input"):
        assert header in text
    assert "Loss:" in text and "Total grad norm:" in text
    marked = [ln for ln in text.splitlines() if "<- FAIL max-grad-norm" in ln]
    assert len(marked) == 5  # conv1, conv2, fc1, fc2, fc3
    assert "FAIL  max-grad-norm" in text


def test_per_param_table_csv_and_markdown(tmp_path: Any) -> None:
    table = invoke("grads", "sample_models:LeNet", "--per-param")
    assert table.exit_code == 0
    assert "Parameters:" in table.stdout and "conv1.weight" in table.stdout
    assert table.stdout.index("Parameters:") < table.stdout.index("Total params:")
    out = tmp_path / "params.csv"
    result = invoke("grads", "sample_models:LeNet", "--per-param", "-f", "csv", "-o", str(out))
    assert result.exit_code == 0 and result.stdout == ""
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    torch.manual_seed(0)
    from sample_models import LeNet

    m = LeNet()
    m.train()
    m(m.example_input_array).sum().backward()
    assert [r["name"] for r in rows] == [n for n, _ in m.named_parameters()]
    for r, (_, p) in zip(rows, m.named_parameters(), strict=True):
        assert close(float(r["grad_norm"]), norm(p.grad))
        assert json.loads(r["shape"]) == list(p.shape)
    layers_csv = invoke("grads", "sample_models:LeNet", "-f", "csv")
    assert layers_csv.stdout.splitlines()[0].startswith("name,type,depth,call")
    md = invoke("grads", "sample_models:LeNet", "--per-param", "-f", "markdown")
    assert "| name | shape |" in md.stdout and "conv1.weight" in md.stdout


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_inspect_backward_kinds_match_plain_backward_hooks() -> None:
    # inspect in eval mode with a backward kind: grad_input norms against torch's own
    # full backward hooks on the same model, input and loss (the sum of the output).
    report = invoke_json("inspect", "sample_models:BNMLP", "--hooks", "pre,forward,backward")
    from sample_models import BNMLP

    torch.manual_seed(0)
    m = BNMLP().eval()
    names = {id(mod): n for n, mod in m.named_modules()}
    want: dict[str, float | None] = {}

    def hook(mod: torch.nn.Module, grad_input: Any, grad_output: Any) -> None:
        gs = [g for g in grad_input if g is not None]
        want[names[id(mod)]] = norm(torch.cat([g.reshape(-1) for g in gs])) if gs else None

    handles = [mod.register_full_backward_hook(hook) for mod in m.modules()]
    try:
        m(m.example_input_array).sum().backward()
    finally:
        for h in handles:
            h.remove()
    assert {r["name"] for r in report["layers"]} == set(want)
    for row in report["layers"]:
        w = want[row["name"]]
        if w is None:
            assert row["grad_input_norm"] is None, row["name"]
        else:
            assert close(row["grad_input_norm"], w), (row["name"], row["grad_input_norm"], w)


def test_help_lists_options() -> None:
    result = invoke("grads", "--help")
    assert result.exit_code == 0
    for opt in ("--loss", "--per-param", "--fail-on", "--max-grad-norm", "--plot", "--hooks"):
        assert opt in result.stdout


def test_command_module_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys, hookcli.commands.grads, hookcli.grads.checks, hookcli.grads.plot; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
