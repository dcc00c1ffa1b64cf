"""MODEL strings, kwargs and weights, checked against models built by hand."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hookcli.errors import LoadError, UsageError
from hookcli.loading import load_model, parse_kwargs
from hookcli.weights import apply_weights
from sample_models import LeNet

FIXTURES = Path(__file__).parent / "fixtures"


def test_parse_kwargs_literals_and_strings():
    got = parse_kwargs(["a=1", "b=[1, 2]", "c=hello", "d=None", "e=2.5", "f='x=y'"])
    assert got == {"a": 1, "b": [1, 2], "c": "hello", "d": None, "e": 2.5, "f": "x=y"}
    with pytest.raises(UsageError):
        parse_kwargs(["noequals"])
    with pytest.raises(UsageError):
        parse_kwargs(["1bad=3"])


@pytest.mark.parametrize(
    "spec",
    [
        "sample_models:LeNet",
        "sample_models.LeNet",
        "sample_models.basic:LeNet",
        "sample_models.basic.LeNet",
    ],
)
def test_module_class_forms(spec):
    loaded = load_model(spec, {"num_classes": 7}, seed=1)
    torch.manual_seed(1)
    expected = LeNet(num_classes=7)
    got = dict(loaded.module.state_dict())
    assert got.keys() == expected.state_dict().keys()
    for k, v in expected.state_dict().items():
        assert torch.equal(got[k], v), k  # same seed, same weights


def test_file_form_factory_and_instance():
    loaded = load_model(f"{FIXTURES / 'broken.py'}:build_needs_args", {"width": 6})
    assert loaded.module.fc.in_features == 6
    inst = load_model("tests.fixtures.broken:INSTANCE")
    from tests.fixtures.broken import INSTANCE

    assert inst.module is INSTANCE


def test_dotted_attr_inside_class(tmp_path):
    (tmp_path / "nested_mod.py").write_text(
        "from torch import nn\n"
        "class Outer:\n"
        "    @staticmethod\n"
        "    def build(width=3):\n"
        "        return nn.Linear(width, 2)\n"
    )
    loaded = load_model(f"{tmp_path / 'nested_mod.py'}:Outer.build", {"width": 5})
    assert loaded.module.in_features == 5


def test_torchvision_name_and_family():
    loaded = load_model("resnet18", {"num_classes": 10})
    assert loaded.family == "classification" and loaded.module.fc.out_features == 10
    assert load_model("r3d_18").family == "video"


@pytest.mark.parametrize(
    ("spec", "kwargs", "error", "fragment"),
    [
        ("resnet81", {}, LoadError, "did you mean resnet18"),
        ("sample_models:LeNett", {}, LoadError, "did you mean LeNet"),
        ("no_such_pkg.mod:X", {}, LoadError, "no_such_pkg"),
        ("tests/fixtures/missing.py:X", {}, LoadError, "not found"),
        ("tests.fixtures.broken:CtorRaises", {}, LoadError, "always fails"),
        ("tests.fixtures.broken:not_a_module", {}, LoadError, "not an nn.Module"),
        ("tests.fixtures.broken:NUMBER", {}, LoadError, "int"),
        ("sample_models:LeNet", {"bogus": 1}, LoadError, "bogus"),
        ("tests.fixtures.broken:INSTANCE", {"width": 2}, UsageError, "instance"),
        ("tests/fixtures/broken.py", {}, UsageError, "NeedsArgs"),
    ],
)
def test_load_errors(spec, kwargs, error, fragment):
    with pytest.raises(error) as info:
        load_model(spec, kwargs)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_weights_state_dict_and_wrapped(tmp_path):
    torch.manual_seed(5)
    source = LeNet()
    plain = tmp_path / "plain.pt"
    wrapped = tmp_path / "wrapped.pt"
    torch.save(source.state_dict(), plain)
    torch.save({"state_dict": source.state_dict(), "epoch": 3}, wrapped)
    for path in (plain, wrapped):
        loaded = load_model("sample_models:LeNet", weights=path, seed=0)
        for k, v in source.state_dict().items():
            assert torch.equal(loaded.module.state_dict()[k], v)


def test_weights_missing_and_unexpected_keys_named(tmp_path):
    sd = LeNet().state_dict()
    sd.pop("fc3.bias")
    sd["extra.weight"] = torch.zeros(1)
    path = tmp_path / "bad.pt"
    torch.save(sd, path)
    with pytest.raises(LoadError) as info:
        apply_weights(LeNet(), path)
    assert "fc3.bias" in str(info.value) and "extra.weight" in str(info.value)


def test_weights_shape_mismatch_and_garbage(tmp_path):
    sd = LeNet(num_classes=3).state_dict()
    path = tmp_path / "mismatch.pt"
    torch.save(sd, path)
    with pytest.raises(
        LoadError, match=r"shape mismatches \(2\): fc3.weight \[3, 84\] \(model \[10, 84\]\)"
    ):
        apply_weights(LeNet(), path)
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(LoadError, match="cannot read"):
        apply_weights(LeNet(), junk)


def test_pickled_model_needs_trust(tmp_path):
    model = LeNet()
    path = tmp_path / "full.pt"
    torch.save(model, path)
    with pytest.raises(LoadError, match="--trust-pickle"):
        apply_weights(LeNet(), path)
    target = LeNet()
    apply_weights(target, path, trust_pickle=True)
    assert torch.equal(target.fc1.weight, model.fc1.weight)
