"""``hookcli grads --plot FILE.png``: the gradient-flow chart, and exit 2 without matplotlib."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision

from tests.conftest import invoke

BAR_BLUE = np.array([0x48, 0x78, 0xD0]) / 255.0
NAN_RED = np.array([0xD6, 0x27, 0x28]) / 255.0


def read_png(path: Path) -> np.ndarray:
    import matplotlib.image

    return np.asarray(matplotlib.image.imread(str(path)))[..., :3]


def assert_chart(path: Path, min_width: int) -> np.ndarray:
    """A real PNG of the expected height, at least ``min_width`` wide, and not blank."""
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rgb = read_png(path)
    height, width = rgb.shape[:2]
    assert height == 480 and width >= min_width
    assert rgb.std() > 0.05
    return rgb


def near(rgb: np.ndarray, color: np.ndarray) -> np.ndarray:
    return np.abs(rgb - color).max(axis=2) < 0.02


def bars(rgb: np.ndarray) -> int:
    """Bars crossing a pixel row just above the x axis (the lowest long black line)."""
    black = (rgb.max(axis=2) < 0.1).sum(axis=1)
    axis_row = int(np.nonzero(black > rgb.shape[1] // 2)[0].max())
    row = near(rgb, BAR_BLUE)[axis_row - 3]
    return int(np.count_nonzero(row[1:] & ~row[:-1]) + row[0])


def test_plot_has_one_bar_per_parameterized_layer(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "flow.png"
    result = invoke("grads", "sample_models:LeNet", "--plot", str(out))
    assert result.exit_code == 0
    assert f"gradient-flow plot written to {out}" in result.stderr
    rgb = assert_chart(out, 600)
    assert bars(rgb) == 5  # conv1, conv2, fc1, fc2, fc3
    assert not near(rgb, NAN_RED).any()


def test_plot_of_resnet18_scales_with_the_layers(tmp_path: Path) -> None:
    out = tmp_path / "resnet.png"
    result = invoke("grads", "resnet18", "-i", "2x3x32x32", "--plot", str(out), "-f", "json")
    assert result.exit_code == 0
    model = torchvision.models.get_model("resnet18", weights=None)
    with_params = [m for m in model.modules() if list(m.parameters(recurse=False))]
    assert len(with_params) == 41
    rgb = assert_chart(out, 1000)
    assert bars(rgb) == 41


def test_plot_marks_non_finite_layers(tmp_path: Path) -> None:
    out = tmp_path / "nan.png"
    assert invoke("grads", "sample_models:NaNModel", "--plot", str(out)).exit_code == 0
    rgb = assert_chart(out, 600)
    assert near(rgb, NAN_RED).sum() > 50  # the marker for fc2, whose grad norm is nan
    assert bars(rgb) == 1  # fc1 alone has a finite grad norm


def test_plot_without_matplotlib_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    out = tmp_path / "flow.png"
    result = invoke("grads", "sample_models:LeNet", "--plot", str(out))
    assert result.exit_code == 2
    assert "pip install 'hookcli[plot]'" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == "" and not out.exists()  # stopped before running the model


def test_plot_into_a_file_as_folder_exits_2_before_running(tmp_path: Path) -> None:
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    result = invoke("grads", "sample_models:LeNet", "--plot", str(blocker / "flow.png"))
    assert result.exit_code == 2 and "is not a folder" in result.stderr
    assert result.stdout == ""


def test_plot_leaves_no_figure_open(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    before = len(plt.get_fignums())
    assert invoke("grads", "sample_models:LeNet", "--plot", str(tmp_path / "a.png")).exit_code == 0
    assert len(plt.get_fignums()) == before
    assert torch.is_grad_enabled()
