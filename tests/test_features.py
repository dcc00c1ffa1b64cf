"""`hookcli features`: saved tensors equal outputs captured by hand with plain PyTorch."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torchvision
from torch import nn

import sample_models
from hookcli.errors import RunError, UsageError
from hookcli.features.plot import mosaic
from hookcli.features.probe import FeatureProbe
from hookcli.globs import select_modules
from hookcli.options import Mode
from hookcli.session import HookSession
from tests.conftest import (
    MODULE_HOOK_DICTS,
    assert_no_hooks,
    assert_same_state,
    invoke,
    invoke_json,
    plain_forward,
    state_snapshot,
)


# -- models (loaded as tests.test_features:NAME) -----------------------------------------
class SharedTwice(nn.Module):
    """``blk`` is called twice; ``head`` returns a dict."""

    def __init__(self) -> None:
        super().__init__()
        self.blk = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        self.head = Heads()
        self.example_input_array = torch.randn(3, 4)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.head(self.blk(self.blk(x)))


class Heads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 2)
        self.b = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.a(x), "score": self.b(x)}


class Boom(nn.Module):
    """``bad`` raises (wrong width) after ``ok`` ran."""

    def __init__(self) -> None:
        super().__init__()
        self.ok = nn.Linear(3, 3)
        self.mid = nn.Sequential(nn.ReLU(), nn.Linear(5, 2))
        self.example_input_array = torch.randn(2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mid(self.ok(x))


def hooks_on(module: nn.Module) -> int:
    return sum(len(getattr(module, d, {}) or {}) for d in MODULE_HOOK_DICTS)


class Spy(nn.Module):
    """Records, from inside its own forward, how many hooks each of its modules holds."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Sequential(nn.ReLU(), nn.Linear(3, 3))
        self.seen: dict[str, int] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen = {n: hooks_on(m) for n, m in self.named_modules()}
        return self.b(self.a(x))


# -- the independent reference ---------------------------------------------------------------
def hand_capture(model: nn.Module, args: tuple[Any, ...], names: list[str]) -> dict[str, Any]:
    """Plain forward hooks on ``names``: name -> list of cloned outputs, one per call."""
    got: dict[str, list[Any]] = {n: [] for n in names}
    modules = dict(model.named_modules())

    def clone(o: Any) -> Any:
        if isinstance(o, torch.Tensor):
            return o.detach().clone()
        if isinstance(o, dict):
            return {k: clone(v) for k, v in o.items()}
        return type(o)(clone(v) for v in o)

    handles = [
        modules[n].register_forward_hook(lambda m, i, o, n=n: got[n].append(clone(o)))
        for n in names
    ]
    plain_forward(model, args, handles)
    return got


def seeded_resnet18() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    g = torch.Generator().manual_seed(0)
    return model, (torch.randn((1, 3, 64, 64), generator=g),)


def load_out(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".pt":
        return torch.load(path, weights_only=True)
    if path.suffix == ".npz":
        with np.load(path) as z:
            return {k: torch.from_numpy(z[k]) for k in z.files}
    from safetensors.torch import load_file

    return load_file(str(path))


# -- saved tensors equal plain PyTorch ------------------------------------------------------------
def test_resnet18_saved_tensors_equal_hand_captured(tmp_path):
    out = tmp_path / "feats.pt"
    result = invoke(
        "features",
        "resnet18",
        "-i",
        "1x3x64x64",
        "--layer",
        "layer1.0.bn1",
        "--layer",
        "layer3.*.conv2",
        "--layer",
        "layer4",
        "--out",
        str(out),
    )
    assert result.exit_code == 0, result.stderr
    saved = load_out(out)
    names = ["layer1.0.bn1", "layer3.0.conv2", "layer3.1.conv2", "layer4"]
    assert list(saved) == names  # in call order
    model, args = seeded_resnet18()
    ref = hand_capture(model, args, names)
    for name in names:
        (want,) = ref[name]
        assert torch.equal(saved[name], want), name
    # layer1.0.bn1's output is overwritten in place by the ReLU after it: the copy is not.
    assert (saved["layer1.0.bn1"] < 0).any()
    assert "saved 4 tensor(s)" in result.stdout and str(out) in result.stdout


@pytest.mark.parametrize("suffix", [".pt", ".npz", ".safetensors"])
def test_every_format_round_trips(tmp_path, suffix):
    out = tmp_path / f"lenet{suffix}"
    result = invoke(
        "features", "sample_models:LeNet", "-l", "conv1", "-l", "fc*", "--out", str(out)
    )
    assert result.exit_code == 0, result.stderr
    saved = load_out(out)
    torch.manual_seed(0)
    model = sample_models.LeNet().eval()
    names = ["conv1", "fc1", "fc2", "fc3"]
    ref = hand_capture(model, (model.example_input_array,), names)
    assert sorted(saved) == sorted(names)
    for name in names:
        assert torch.equal(saved[name], ref[name][0]), name


def test_repeated_calls_and_structured_outputs_are_keyed(tmp_path):
    out = tmp_path / "f.pt"
    report = invoke_json(
        "features", "tests.test_features:SharedTwice", "-l", "blk", "-l", "head", "--out", str(out)
    )
    saved = load_out(out)
    assert list(saved) == ["blk", "blk#1", "head[logits]", "head[score]"]
    torch.manual_seed(0)
    model = SharedTwice().eval()
    ref = hand_capture(model, (model.example_input_array,), ["blk", "head"])
    assert torch.equal(saved["blk"], ref["blk"][0])
    assert torch.equal(saved["blk#1"], ref["blk"][1])
    assert torch.equal(saved["head[logits]"], ref["head"][0]["logits"])
    assert torch.equal(saved["head[score]"], ref["head"][0]["score"])
    rows = report["layers"]
    assert [(r["name"], r["call"]) for r in rows] == [("blk", 0), ("blk", 1), ("head", 0)]
    assert rows[2]["keys"] == ["head[logits]", "head[score]"]
    assert rows[2]["bytes"] == (3 * 2 + 3 * 1) * 4
    assert report["totals"]["tensors"] == 4
    assert report["totals"]["bytes"] == sum(t.numel() * 4 for t in saved.values())


def test_lstm_tuple_output_and_root_alias(tmp_path):
    out = tmp_path / "f.npz"
    result = invoke(
        "features", "sample_models:LSTMModel", "-l", "lstm", "-l", "(root)", "--out", str(out)
    )
    assert result.exit_code == 0, result.stderr
    saved = load_out(out)
    torch.manual_seed(0)
    model = sample_models.LSTMModel().eval()
    ref = hand_capture(model, (model.example_input_array,), ["lstm", ""])
    (lstm_out, (h, c)) = ref["lstm"][0]
    assert torch.equal(saved["lstm[0]"], lstm_out)
    assert torch.equal(saved["lstm[1][0]"], h)
    assert torch.equal(saved["lstm[1][1]"], c)
    assert torch.equal(saved["(root)[0]"], ref[""][0][0])
    assert list(saved)[:2] == ["(root)[0]", "(root)[1][0]"]  # by call start: the root first


# -- only matching modules get hooks; the model is left as found ------------------------------
def test_only_matching_modules_are_hooked_during_the_run():
    torch.manual_seed(0)
    model = Spy()
    before = state_snapshot(model)
    selected = select_modules(model, ["b.*"])
    assert [n for n, _ in selected] == ["b.0", "b.1"]
    probe = FeatureProbe()
    with HookSession(model, [probe], mode=Mode.EVAL, only=[m for _, m in selected]) as s:
        s.forward((torch.randn(2, 3),))
        s.finish()
    assert model.seen[""] == model.seen["a"] == model.seen["b"] == 0
    assert model.seen["b.0"] > 0 and model.seen["b.1"] > 0
    assert list(probe.tensors()) == ["b.0", "b.1"]
    assert_no_hooks(model)
    assert_same_state(before, state_snapshot(model))


def test_hooks_removed_when_the_model_raises():
    torch.manual_seed(0)
    model = Boom()
    selected = [m for _, m in select_modules(model, ["ok", "mid.1"])]
    with (
        pytest.raises(RunError, match=r"mid\.1"),
        HookSession(model, [FeatureProbe()], mode=Mode.EVAL, only=selected) as s,
    ):
        s.forward((torch.randn(2, 3),))
    assert_no_hooks(model)


# -- errors -------------------------------------------------------------------------------------
def test_unmatched_pattern_exits_2_naming_close_names(tmp_path):
    out = tmp_path / "f.pt"
    result = invoke("features", "resnet18", "-l", "layer4", "-l", "layer5", "--out", str(out))
    assert result.exit_code == 2
    assert "--layer 'layer5' matches no module" in result.stderr
    assert "layer4" in result.stderr.split("close names:")[1]
    assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_select_modules_globs_and_suggestions():
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None)
    names = [n for n, _ in select_modules(model, ["layer3.*.conv2", "fc"])]
    assert names == ["layer3.0.conv2", "layer3.1.conv2", "fc"]
    with pytest.raises(UsageError, match=r"close names: .*layer1\.0\.conv1"):
        select_modules(model, ["layer1.0.conv"])


def test_missing_layer_option_is_a_usage_error():
    result = invoke("features", "sample_models:LeNet")
    assert result.exit_code == 2
    assert "--layer" in result.stderr


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--out", "x.txt"], "unknown file type .txt"),
        (["--out", "noext"], "unknown file type (none)"),
        (["--channels", "0"], "--channels"),
        (["--device", "meta"], "meta"),
    ],
)
def test_bad_options_exit_2(tmp_path, extra, message):
    result = invoke("features", "sample_models:LeNet", "-l", "conv1", *extra)
    assert result.exit_code == 2, result.stdout
    assert message in result.stderr and "Traceback" not in result.stderr


def test_missing_optional_packages_exit_2_with_install_hint(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = invoke(
        "features", "sample_models:LeNet", "-l", "conv1", "--png", str(tmp_path / "g.png")
    )
    assert result.exit_code == 2
    assert "pip install 'hookcli[plot]'" in result.stderr
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    out = tmp_path / "f.safetensors"
    result = invoke("features", "sample_models:LeNet", "-l", "conv1", "--out", str(out))
    assert result.exit_code == 2
    assert "hookcli[safetensors]" in result.stderr
    assert not list(tmp_path.iterdir())


def test_model_that_raises_exits_4_names_the_module_and_writes_nothing(tmp_path):
    out = tmp_path / "f.pt"
    result = invoke(
        "features", "tests.test_features:Boom", "-l", "ok", "--out", str(out), "-f", "json"
    )
    assert result.exit_code == 4
    # Only `ok` is hooked, yet the message names the module that raised.
    assert "mid.1 (Linear)" in result.stderr and "[2, 3]" in result.stderr
    report = json.loads(result.stdout)
    assert [r["name"] for r in report["layers"]] == ["ok"]
    assert report["totals"]["out"] is None
    assert not out.exists()


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path, monkeypatch):
    out = tmp_path / "f.pt"
    out.write_bytes(b"previous contents")

    def broken_save(obj: Any, f: Any, *a: Any, **k: Any) -> None:
        f.write(b"half a fi")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", broken_save)
    result = invoke("features", "sample_models:LeNet", "-l", "conv1", "--out", str(out))
    assert result.exit_code == 2
    assert "No space left on device" in result.stderr
    assert out.read_bytes() == b"previous contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.pt"]


def test_out_into_a_new_folder_and_report_formats(tmp_path):
    out = tmp_path / "new" / "dir" / "f.pt"
    report = invoke_json("features", "sample_models:LeNet", "-l", "conv2", "--out", str(out))
    assert out.exists()
    assert report["command"] == "features"
    assert report["totals"]["matched"] == ["conv2"]
    assert report["totals"]["out"] == str(out)
    (row,) = report["layers"]
    assert row["output_shapes"] == [[1, 16, 10, 10]] and row["keys"] == ["conv2"]
    assert row["bytes"] == 16 * 10 * 10 * 4
    csv_text = invoke("features", "sample_models:LeNet", "-l", "conv2", "-f", "csv").stdout
    header, line = csv_text.strip().splitlines()
    assert "keys" in header.split(",") and "bytes" in header.split(",")
    assert line.startswith("conv2,Conv2d,")
    md = invoke("features", "sample_models:LeNet", "-l", "conv2", "-f", "markdown").stdout
    assert "| conv2 |" in md
    table = invoke("features", "sample_models:LeNet", "-l", "conv2").stdout
    assert "nothing saved: pass --out FILE" in table


# -- PNG ----------------------------------------------------------------------------------------
def read_png(path: Path) -> np.ndarray:
    import matplotlib.image

    return matplotlib.image.imread(str(path))


def test_png_grid_of_feature_maps_and_heat_maps(tmp_path):
    png = tmp_path / "grid.png"
    result = invoke(
        "features",
        "sample_models:LeNet",
        "-l",
        "conv*",
        "-l",
        "fc1",
        "--png",
        str(png),
        "--channels",
        "4",
    )
    assert result.exit_code == 0, result.stderr
    img = read_png(png)
    # Three panels in one row of 3.2 x 3.2 inches at 100 dpi.
    assert img.shape[:2] == (320, 960)
    colours = np.unique(img.reshape(-1, img.shape[-1]), axis=0)
    assert len(colours) > 100  # not blank
    assert img[..., :3].std() > 0.1
    assert "feature grid" in result.stdout


def test_png_resnet18_two_rows(tmp_path):
    png = tmp_path / "r.png"
    result = invoke(
        "features",
        "resnet18",
        "-i",
        "1x3x64x64",
        "-l",
        "layer1",
        "-l",
        "layer2",
        "-l",
        "layer3",
        "-l",
        "layer4",
        "--png",
        str(png),
    )
    assert result.exit_code == 0, result.stderr
    img = read_png(png)
    assert img.shape[:2] == (640, 960)
    assert len(np.unique(img.reshape(-1, img.shape[-1]), axis=0)) > 100


def test_mosaic_normalizes_each_channel_independently():
    maps = np.stack([np.arange(6.0).reshape(2, 3) * s + s for s in (1.0, 100.0, -3.0)])
    maps[2, 0, 0] = np.nan
    tiled = mosaic(maps)
    assert tiled.shape == (2 * 3 - 1, 2 * 4 - 1)  # 2x2 tiles of 2x3 with 1-pixel gutters
    for i in range(3):
        r, k = divmod(i, 2)
        tile = tiled[r * 3 : r * 3 + 2, k * 4 : k * 4 + 3]
        ch = maps[i]
        finite = np.isfinite(ch)
        want = (ch - ch[finite].min()) / (ch[finite].max() - ch[finite].min())
        np.testing.assert_allclose(tile[finite], want[finite])
        assert np.nanmin(tile) == 0 and np.nanmax(tile) == 1
    assert np.isnan(tiled[2, :]).all()  # the gutter
    assert np.isnan(tiled[3:, 4:]).all()  # the empty fourth tile
