"""``--loss`` guards (issue 44, point 8 and the sweep): a ``fn:`` that is no function of the
user's is refused with exit 2 before the model runs; one that exits is blamed on the user's
file and line, never hookcli's; the default sum of an output that cancels out (SAM's image
encoder ends in a LayerNorm) notes once that its gradients are noise and names
``--loss random``, and an ordinary output gets no such note."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SAM = (
    "segment_anything.modeling.image_encoder:ImageEncoderViT",
    *("-k", "img_size=32", "-k", "patch_size=8", "-k", "embed_dim=32", "-k", "depth=1"),
    *("-k", "num_heads=2", "-k", "out_chans=16", "-i", "1x3x32x32"),
)
NOTE = "it cancels out"


def hookcli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "hookcli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("hookcli: error:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    """A model whose forward leaves a file behind: it shows whether the model ran."""
    (tmp_path / "marked.py").write_text(
        "import pathlib\n"
        "import torch\n"
        "class Marked(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = torch.nn.Linear(4, 3)\n"
        "    def forward(self, x):\n"
        f"        pathlib.Path({str(tmp_path / 'ran')!r}).touch()\n"
        "        return self.fc(x)\n"
    )
    return tmp_path / "marked.py"


@pytest.mark.parametrize(
    "spec", ["os:system", "os:_exit", "subprocess:call", "torch:sum", "builtins:print"]
)
@pytest.mark.parametrize("command", [("grads",), ("cost", "--backward")])
def test_a_loss_that_is_no_function_of_the_users_is_refused_before_the_run(
    model_file: Path, spec: str, command: tuple[str, ...]
) -> None:
    result = hookcli(
        command[0], f"{model_file}:Marked", "-i", "2x4", *command[1:], "--loss", f"fn:{spec}"
    )
    assert result.returncode == 2, result.stderr
    line = error_line(result)
    assert f"--loss fn:{spec}:" in line and "not a loss function of yours" in line
    assert "hookcli/" not in line
    assert not (model_file.parent / "ran").exists()


def test_a_loss_that_exits_is_blamed_on_the_users_file(model_file: Path) -> None:
    losses = model_file.parent / "mylosses.py"
    losses.write_text(
        "import os\nimport sys\n\ndef quit(output):\n    os._exit(3)\n\n"
        "def leave(output):\n    sys.exit(5)\n"
    )
    for name, said, line_no in (("quit", "os._exit(3)", 5), ("leave", "sys.exit(5)", 8)):
        result = hookcli(
            "grads", f"{model_file}:Marked", "-i", "2x4", "--loss", f"fn:{losses}:{name}"
        )
        assert result.returncode == 4, result.stderr
        line = error_line(result)
        assert f"the loss function fn:{losses}:{name} called {said}" in line
        assert f"(raised at mylosses.py:{line_no} in {name})" in line, line
        assert "hookcli/" not in line and "the model called" not in line


def _ratio(output: torch.Tensor) -> float:
    out = output.detach().double()
    return float(out.sum().abs() / out.norm())


def test_the_sum_of_sams_normalised_encoder_output_notes_loss_random() -> None:
    from segment_anything.modeling.image_encoder import ImageEncoderViT

    result = hookcli("grads", *SAM, "--format", "json")
    assert result.returncode == 0, result.stderr
    assert result.stderr.count(NOTE) == 1 and "--loss random" in result.stderr
    # the oracle: the same encoder and input, in plain PyTorch
    torch.manual_seed(0)
    enc = ImageEncoderViT(
        img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, out_chans=16
    ).train()
    x = torch.randn((1, 3, 32, 32), generator=torch.Generator().manual_seed(0))
    out = enc(x).detach()
    loss = json.loads(result.stdout)["totals"]["loss"]
    assert abs(loss - float(out.sum())) <= 1e-5 * float(out.abs().sum())
    assert _ratio(out) < 1e-3
    # a random projection does not cancel: no note
    projected = hookcli("grads", *SAM, "--loss", "random")
    assert projected.returncode == 0 and NOTE not in projected.stderr


def test_an_ordinary_output_gets_no_note() -> None:
    args = ("torch.nn:Linear", "-k", "in_features=8", "-k", "out_features=4", "-i", "2x8")
    result = hookcli("grads", *args)
    assert result.returncode == 0, result.stderr
    assert NOTE not in result.stderr
    torch.manual_seed(0)
    out = torch.nn.Linear(8, 4)(torch.randn((2, 8), generator=torch.Generator().manual_seed(0)))
    assert _ratio(out) > 1e-3
