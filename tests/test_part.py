"""``--part NAME``: a command on a submodule of the built model (SAM's ``image_encoder``
of ``segment_anything.build_sam_vit_b()``), checked against the same submodule of the
model built in Python: ``sum(p.numel())`` of its parameters, and on a checkpoint of the
whole model, the loss and total grad norm of plain autograd in float64.
"""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import segment_anything
import torch
import torchvision
from segment_anything.build_sam import _build_sam

from tests.conftest import invoke

SMALL_SAM = "segment_anything.build_sam:_build_sam"
SMALL_KWARGS = (
    "-k",
    "encoder_embed_dim=32",
    "-k",
    "encoder_depth=2",
    "-k",
    "encoder_num_heads=2",
    "-k",
    "encoder_global_attn_indexes=[1]",
)


def _numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_sam_vit_b_image_encoder_on_meta() -> None:
    with torch.device("meta"):
        sam = segment_anything.build_sam_vit_b()
    result = invoke(
        "inspect",
        "segment_anything.build_sam_vit_b",
        "--part",
        "image_encoder",
        "--device",
        "meta",
        "-i",
        "1x3x1024x1024",
        "--format",
        "json",
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["totals"]["params"] == _numel(sam.image_encoder)
    assert report["model"]["class"] == "ImageEncoderViT"
    assert report["settings"]["part"] == "image_encoder"
    root = next(r for r in report["layers"] if r["depth"] == 0)
    assert root["output_shapes"] == [[1, 256, 64, 64]]


def test_a_small_sam_on_the_cpu_part_by_part() -> None:
    torch.manual_seed(0)
    sam = _build_sam(32, 2, 2, [1])
    for name in ("image_encoder", "prompt_encoder", "mask_decoder.transformer"):
        result = invoke("params", SMALL_SAM, *SMALL_KWARGS, "--part", name, "--format", "json")
        assert result.exit_code == 0, (name, result.output)
        report = json.loads(result.stdout)
        part = sam.get_submodule(name)
        assert report["totals"]["params"] == _numel(part), name
        assert {p["name"] for p in report["params"]} == {n for n, _ in part.named_parameters()}
        assert report["settings"]["part"] == name


def test_an_unknown_part_is_exit_2_naming_the_nearest() -> None:
    result = invoke("params", SMALL_SAM, *SMALL_KWARGS, "--part", "image_encodr")
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "--part 'image_encodr'" in lines[0]
    assert "nearest: image_encoder" in lines[0]
    result = invoke("params", SMALL_SAM, *SMALL_KWARGS, "--part", "zzz")
    assert result.exit_code == 2, result.output
    assert "image_encoder, prompt_encoder, mask_decoder" in result.stderr  # the top level


def test_weights_are_applied_to_the_whole_model_before_the_part(tmp_path: Path) -> None:
    torch.manual_seed(7)  # other values than hookcli's own build (seed 0)
    whole = torchvision.models.resnet18()
    ckpt = tmp_path / "resnet18.pt"
    torch.save(whole.state_dict(), ckpt)
    result = invoke(
        "grads",
        "resnet18",
        "--part",
        "layer2",
        "--weights",
        str(ckpt),
        "-i",
        "2x64x8x8",
        "--format",
        "json",
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["settings"]["part"] == "layer2"
    assert report["settings"]["weights"]["path"] == str(ckpt)
    part = whole.layer2.double().train()
    torch.manual_seed(0)
    x = torch.randn(2, 64, 8, 8).double()
    loss = part(x).sum()
    loss.backward()
    grad_norm = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in part.parameters()))
    weight_norm = math.sqrt(sum(float(p.detach().pow(2).sum()) for p in part.parameters()))
    totals = report["totals"]
    assert math.isclose(float(totals["weight_norm"]), weight_norm, rel_tol=1e-5)
    assert math.isclose(float(totals["grad_norm"]), grad_norm, rel_tol=1e-4)
    assert math.isclose(float(totals["loss"]), float(loss.detach()), rel_tol=1e-4, abs_tol=1e-3)


def test_the_parts_own_example_input_array_or_dash_i(tmp_path: Path) -> None:
    """The whole model's default inputs do not carry over to a part."""
    (tmp_path / "whole.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn

            class Encoder(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(6, 3)
                    self.example_input_array = torch.zeros(5, 6)

                def forward(self, x):
                    return self.fc(x)

            class Whole(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.encoder = Encoder()
                    self.head = nn.Linear(3, 1)
                    self.example_input_array = torch.zeros(4, 6)

                def forward(self, x):
                    return self.head(self.encoder(x))
            """
        )
    )
    spec = f"{tmp_path / 'whole.py'}:Whole"
    result = invoke("inspect", spec, "--part", "encoder", "--format", "json")
    assert result.exit_code == 0, result.output
    assert [i["shape"] for i in json.loads(result.stdout)["inputs"]] == [[5, 6]]
    result = invoke("inspect", spec, "--part", "head")
    assert result.exit_code == 2, result.output
    assert "no input known" in result.stderr
    result = invoke("inspect", spec, "--part", "head", "-i", "7x3", "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["totals"]["params"] == 4
