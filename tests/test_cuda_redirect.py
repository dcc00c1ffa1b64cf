"""A model that puts itself on the GPU in ``__init__`` (``.cuda()``, ``device="cuda"``,
``.to("cuda")``, ``self.cuda()``) builds on a run that is not CUDA's: its placements go
to the run's device, and one note names the model's first such line.

The oracle is the same source with its CUDA placements written out (``.cuda()``
removed, ``"cuda"`` made ``"cpu"``), built by plain PyTorch on the CPU with the same
seed: parameter counts, the loss and the total grad norm (float64) must match.
"""

from __future__ import annotations

import json
import math
import types
from pathlib import Path

import torch

from hookcli.cudaredirect import wanted
from tests.conftest import invoke
from tests.fixtures import cuda_init

FILE = Path(cuda_init.__file__)
SPEC = f"{FILE}:Net"
SOURCE = FILE.read_text()
FIRST_CUDA_LINE = next(
    i for i, line in enumerate(SOURCE.splitlines(), 1) if "torch.ones(1, 1, d_model).cuda()" in line
)


def _cpu_net() -> torch.nn.Module:
    """The fixture's source with its CUDA placements written out, built on the CPU."""
    text = SOURCE.replace(".cuda()", "").replace('"cuda"', '"cpu"')
    assert ".cuda()" not in text and '"cuda"' not in text
    mod = types.ModuleType("cuda_init_on_cpu")
    exec(compile(text, "cuda_init_on_cpu.py", "exec"), mod.__dict__)
    torch.manual_seed(0)
    return mod.Net()


def test_the_build_redirects_and_notes_the_first_line() -> None:
    result = invoke("params", SPEC, "--format", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    net = _cpu_net()
    assert report["totals"]["params"] == sum(p.numel() for p in net.parameters())
    assert {p["device"] for p in report["params"]} == {"cpu"}
    notes = [line for line in result.stderr.splitlines() if "asks for cuda" in line]
    assert notes == [
        f"hookcli: note: tests/fixtures/cuda_init.py:{FIRST_CUDA_LINE} asks for cuda; built on cpu"
    ]
    assert torch._C._len_torch_function_stack() == 0  # the redirect ended with the build


def test_grads_match_plain_pytorch_on_the_cpu_in_float64() -> None:
    net = _cpu_net().double()
    torch.manual_seed(0)
    x = torch.randn(2, 8, 16)
    result = invoke("grads", SPEC, "-i", "2x8x16", "--format", "json")
    assert result.exit_code == 0, result.output
    totals = json.loads(result.stdout)["totals"]
    inputs = json.loads(result.stdout)["inputs"]
    assert [i["shape"] for i in inputs] == [[2, 8, 16]]
    loss = net(x.double()).sum()
    loss.backward()
    norm = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in net.parameters()))
    assert math.isclose(float(totals["loss"]), float(loss.detach()), rel_tol=1e-5, abs_tol=1e-6)
    assert math.isclose(float(totals["grad_norm"]), norm, rel_tol=1e-5)


def test_meta_builds_it_without_the_note() -> None:
    result = invoke("params", SPEC, "--device", "meta", "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["totals"]["params"] == sum(
        p.numel() for p in _cpu_net().parameters()
    )
    assert "asks for cuda" not in result.stderr


def test_where_placements_go() -> None:
    """Nothing is redirected for a CUDA run (the GPU is what the model asks for) nor on
    meta (which takes every placement already); a CPU run takes them."""
    assert wanted(torch.device("cuda")) is None
    assert wanted(torch.device("cuda", 0)) is None
    assert wanted(torch.device("meta")) is None
    assert wanted(torch.device("cpu")) == torch.device("cpu")
    expected = None if torch.cuda.is_available() else torch.device("cpu")
    assert wanted(None) == expected
