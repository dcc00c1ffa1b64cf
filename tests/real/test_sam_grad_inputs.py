"""segment-anything's real ``Sam`` (``Sam.forward`` is ``@torch.no_grad()`` and takes
``(batched_input, multimask_output)``: a list of dicts and a bool), built from small
parts (tests/fixtures/gradoff_models.py:tiny_sam), from the command line alone.

Oracle: plain autograd on ``Sam.forward.__wrapped__`` (the undecorated function) with
the same seeded model and inputs. SAM casts its point coordinates to float32 itself,
so the model runs in float32 on both sides.
"""

from __future__ import annotations

import torch

from tests.conftest import invoke, invoke_json, run_json
from tests.fixtures import gradoff_models as fx
from tests.real.conftest import need
from tests.test_enable_grad import compare, plain_grads

SAM = "tests.fixtures.gradoff_models:tiny_sam"
BATCH = (
    'batched_input=py:[{"image": tensor("3x32x32"), "original_size": (32, 32), '
    '"point_coords": tensor("1x2x2"), "point_labels": tensor("int64:1x2:0..2")}]'
)


def test_sam_grads_with_enable_grad_match_autograd_on_the_undecorated_forward() -> None:
    need("segment_anything")
    from segment_anything.modeling import Sam

    refused = invoke("grads", SAM, "-i", BATCH, "-i", "multimask_output=py:True")
    assert refused.exit_code == 2
    assert "Sam.forward" in refused.stderr and "--enable-grad" in refused.stderr
    report = invoke_json("grads", SAM, "-i", BATCH, "-i", "multimask_output=py:True",
                         "--enable-grad", "--per-param")  # fmt: skip
    torch.manual_seed(0)
    model = fx.tiny_sam().train()
    g = torch.Generator().manual_seed(0)
    record = {
        "image": torch.randn(3, 32, 32, generator=g),
        "original_size": (32, 32),
        "point_coords": torch.randn(1, 2, 2, generator=g),
        "point_labels": torch.randint(0, 2, (1, 2), generator=g),
    }
    undecorated = Sam.forward.__wrapped__  # type: ignore[attr-defined]
    total, per = plain_grads(model, lambda m: undecorated(m, [record], True))
    assert total > 0
    compare(report, total, per, 1e-4)
    assert "forward" not in vars(model)


def test_sam_takes_a_list_of_dicts_and_a_bool_from_the_command_line() -> None:
    need("segment_anything")
    report = run_json("inspect", SAM, "-i", BATCH, "-i", "multimask_output=py:False")
    names = [i["name"] for i in report["inputs"]]
    assert names == [
        "batched_input[0].image",
        "batched_input[0].point_coords",
        "batched_input[0].point_labels",
    ]
    decoder = next(r for r in report["layers"] if r["name"] == "mask_decoder")
    assert decoder["output_shapes"][0] == [1, 1, 16, 16]  # multimask_output=False: one mask
    several = invoke_json("inspect", SAM, "-i", BATCH, "-i", "multimask_output=py:True")
    decoder = next(r for r in several["layers"] if r["name"] == "mask_decoder")
    assert decoder["output_shapes"][0] == [1, 3, 16, 16]


def test_sam_missing_argument_is_exit_2_with_its_signature() -> None:
    need("segment_anything")
    result = invoke("grads", SAM, "-i", BATCH)
    assert result.exit_code == 2
    assert "missing a required argument: 'multimask_output'" in result.stderr
    assert "Sam.forward(batched_input, multimask_output)" in result.stderr
