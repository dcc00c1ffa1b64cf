"""The input grammar, seeding and defaults, checked against plain torch."""

from __future__ import annotations

import pytest
import torch

from hookcli.errors import UsageError
from hookcli.inputs.grammar import build_inputs, default_specs, parse_spec
from sample_models import LeNet, TinyTransformer, TwoInputDictOutput


@pytest.mark.parametrize(
    ("text", "dims", "dtype", "low", "high", "name"),
    [
        ("1x3x224x224", (1, 3, 224, 224), None, 0, 2, None),
        ("1,3,32,32", (1, 3, 32, 32), None, 0, 2, None),
        ("float16:2x4", (2, 4), "float16", 0, 2, None),
        ("int64:2x16:0..1000", (2, 16), "int64", 0, 1000, None),
        ("long:3:5..9", (3,), "int64", 5, 9, None),
        ("mask=bool:2x16", (2, 16), "bool", 0, 2, "mask"),
        ("tokens=int32:4x8:-3..3", (4, 8), "int32", -3, 3, "tokens"),
    ],
)
def test_parse_spec(text, dims, dtype, low, high, name):
    spec = parse_spec(text)
    assert (spec.dims, spec.dtype, spec.low, spec.high, spec.name) == (dims, dtype, low, high, name)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "x3",
        "1x0",
        "1xax2",
        "complex:1x2",
        "float32:1x2:0..3",
        "int64:1x2:5..5",
        "int64:1x2:a..b",
        "1x2:3",
        "1=1x2",
        "int64:1x2:0..3:9",
        "-1x3",
    ],
)
def test_parse_spec_rejects_with_grammar(text):
    with pytest.raises(UsageError) as info:
        parse_spec(text)
    assert "grammar" in str(info.value)


def test_inputs_reproducible_with_plain_torch():
    model = torch.nn.Linear(4, 4)
    got = build_inputs(model, ["2x4", "int64:3x5:0..7", "w=float64:2", "m=bool:6"], seed=3)
    g = torch.Generator().manual_seed(3)
    a = torch.randn((2, 4), generator=g, dtype=torch.float32)
    b = torch.randint(0, 7, (3, 5), generator=g)
    w = torch.randn((2,), generator=g, dtype=torch.float64)
    m = torch.randint(0, 2, (6,), generator=g).to(torch.bool)
    assert torch.equal(got.args[0], a)
    assert torch.equal(got.args[1], b)
    assert torch.equal(got.kwargs["w"], w)
    assert torch.equal(got.kwargs["m"], m)
    assert [i.name for i in got.infos] == ["input", "input1", "w", "m"]


def test_batch_size_replaces_first_dim_and_dtype_casts_floats():
    model = torch.nn.Linear(4, 4)
    got = build_inputs(model, ["2x4", "int64:3x5"], batch_size=7, dtype="float64")
    assert got.args[0].shape == (7, 4) and got.args[0].dtype == torch.float64
    assert got.args[1].shape == (7, 5) and got.args[1].dtype == torch.int64


def test_example_input_array_tuple_and_names():
    torch.manual_seed(0)
    model = TwoInputDictOutput()
    got = build_inputs(model, [])
    assert got.source == "example_input_array"
    assert torch.equal(got.args[0], model.example_input_array[0])
    assert [i.name for i in got.infos] == ["image", "features"]


def test_example_input_array_with_batch_size_redraws():
    model = TinyTransformer()
    got = build_inputs(model, [], batch_size=5)
    tokens = got.args[0]
    assert tokens.shape == (5, 12) and tokens.dtype == torch.int64
    assert int(tokens.min()) >= 0 and int(tokens.max()) < 100


def test_no_input_known_is_usage_error():
    with pytest.raises(UsageError, match="--input"):
        build_inputs(torch.nn.Linear(2, 2), [])


def test_family_defaults():
    assert default_specs("classification", "resnet18")[0].dims == (1, 3, 224, 224)
    assert default_specs("classification", "inception_v3")[0].dims == (1, 3, 299, 299)
    assert default_specs("video", "r3d_18")[0].dims == (1, 3, 16, 112, 112)
    det = default_specs("detection", "fasterrcnn_resnet50_fpn")
    assert det[0].as_list and det[0].dims == (1, 3, 224, 224)
    assert len(default_specs("optical_flow", "raft_small")) == 2
    assert default_specs(None, None) is None


def test_detection_default_is_a_list_of_images():
    model = LeNet()
    got = build_inputs(model, [], family="detection", torchvision_name="fasterrcnn_resnet50_fpn")
    # LeNet has example_input_array, which wins over the family default
    assert got.source == "example_input_array"
    del model.example_input_array
    got = build_inputs(model, [], family="detection", torchvision_name="x", batch_size=2)
    assert isinstance(got.args[0], list) and len(got.args[0]) == 2
    assert got.args[0][0].shape == (3, 224, 224)


def test_bad_device_and_dtype():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(UsageError):
        build_inputs(model, ["1x2"], device="cuda" if not torch.cuda.is_available() else "nope")
    with pytest.raises(UsageError):
        build_inputs(model, ["1x2"], dtype="int64")
    with pytest.raises(UsageError):
        build_inputs(model, ["1x2"], device="tpu")


def test_batch_size_redraws_an_integer_example_built_on_meta():
    """A model built on meta has its example_input_array on meta too (no values): -b
    redraws it without reading them (it was an internal error, exit 4)."""
    from tests.conftest import invoke_json

    report = invoke_json("inspect", "sample_models.decoder:Decoder", "--device", "meta", "-b", "3")
    assert report["inputs"][0]["shape"][0] == 3
    assert report["inputs"][0]["dtype"] == "int64"
