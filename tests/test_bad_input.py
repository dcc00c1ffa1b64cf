"""Malformed invocations: each gets its documented exit code and one clear line, never a traceback."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import invoke

FIX = "tests/fixtures/broken.py"

CASES = [
    # (argv, exit code, a fragment of the message)
    (["inspect", "sample_models:LeNet", "-i", "1x1x32xq"], 2, "grammar"),
    (["inspect", "sample_models:LeNet", "-i", "complex64:1x2"], 2, "unknown dtype"),
    (["inspect", "sample_models:LeNet", "-i", "1x0x32x32"], 2, "at least 1"),
    (["inspect", "sample_models:LeNet", "-i", "float32:1x2:0..4"], 2, "integer"),
    (["inspect", "sample_models:LeNet", "-i", "int64:1x2:9..3"], 2, "LOW < HIGH"),
    (["inspect", "sample_models:LeNet", "-i", "9bad=1x2"], 2, "identifier"),
    (["inspect", "sample_models:LeNet", "-i", "k=1x2", "-i", "1x2"], 2, "positional"),
    (["inspect", "sample_models:LeNet", "-i", "1x1x32x32", "--dtype", "int8"], 2, "--dtype"),
    (["inspect", "sample_models:LeNet", "--device", "tpu"], 2, "device"),
    # one past the last GPU here: never on this machine, however many it has
    (
        ["inspect", "sample_models:LeNet", "--device", f"cuda:{torch.cuda.device_count()}"],
        2,
        "cuda",
    ),
    (["inspect", "sample_models:LeNet", "--format", "xml"], 2, "xml"),
    (["inspect", "sample_models:LeNet", "--depth", "-1"], 2, "depth"),
    (["inspect", "sample_models:LeNet", "--hooks", "pre,sideways"], 2, "sideways"),
    (["inspect", "sample_models:LeNet", "--mode", "test"], 2, "mode"),
    (["inspect", "sample_models:LeNet", "-k", "no_equals_sign"], 2, "KEY=VALUE"),
    (["inspect", "tests.fixtures.broken:NeedsArgs", "-k", "width=4"], 2, "--input"),
    (["inspect", "sample_models:LeNet", "--bogus-option"], 2, "bogus"),
    (["inspect"], 2, "MODEL"),
    (["inspect", "resnet81"], 3, "did you mean resnet18"),
    (["inspect", "vit_b_61"], 3, "vit_b_16"),
    (["inspect", "sample_models:NoSuchModel"], 3, "no attribute"),
    (["inspect", "no_such_package.models:Net"], 3, "no_such_package"),
    (["inspect", "tests/fixtures/nowhere.py:Net"], 3, "not found"),
    (["inspect", f"{FIX}:CtorRaises"], 3, "always fails"),
    (["inspect", f"{FIX}:not_a_module"], 3, "not an nn.Module"),
    (["inspect", f"{FIX}:NUMBER"], 3, "not an nn.Module"),
    (["inspect", "sample_models:LeNet", "-k", "wrong_kwarg=3"], 3, "wrong_kwarg"),
    (["inspect", "resnet18", "-k", "num_classes='ten'"], 3, "resnet18"),
    (["inspect", "sample_models:LeNet", "--weights", "missing.pt"], 3, "not found"),
    (["inspect", "sample_models:LeNet", "-i", "1x3x32x32"], 4, "conv1"),
    (["inspect", "sample_models:LeNet", "-i", "int64:1x1x32x32"], 4, "conv1"),
    (["inspect", "tests.fixtures.broken:RaisesInMiddle"], 4, "block.1"),
]


@pytest.mark.parametrize(("argv", "code", "fragment"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_invocation(argv: list[str], code: int, fragment: str) -> None:
    result = invoke(*argv)
    assert result.exit_code == code, (result.exit_code, result.stderr)
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    assert fragment.lower() in result.stderr.lower()
    if code in (3, 4):
        # our own errors are one line on stderr
        assert result.stderr.strip().count("\n") == 0, result.stderr
