"""cost's two memory figures by default (issue 46, point 1): the training figure is the
peak of one steady-state training step, the inference figure the peak of one no_grad
forward, both checked against the allocator (tests/memory_oracle.py) within 5%; a
forward that cannot train has no training figure; and ``--fit``: on any device, the
answered batch's measured peak at or under the size and the next batch's above it, its
bound said, every documented unit taken, ``--fit`` named in its errors, peaks printed
to the byte."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import hookcli
from tests.conftest import invoke, invoke_json, run_hookcli
from tests.fixtures import memory_models
from tests.memory_oracle import measure_inference, measure_step, steady_step


def _convnet() -> nn.Module:
    """A small convnet, as torchvision writes one (conv, batch norm, ReLU, pooling)."""
    import torchvision

    return torchvision.models.resnet18(num_classes=10)


def _densenet() -> nn.Module:
    """torchvision's DenseNet, two layers a block (densenet121 has 6, 12, 24 and 16): the
    dense blocks' concatenations and oneDNN's convolution buffers, where the old sum of
    parts was furthest off. The tracker measures each distinct convolution call, so
    densenet121's 120 cost this test ~45 s of CPU; densenet121's own inference peak is
    checked in tests/test_memory_tracker.py."""
    import torchvision

    return torchvision.models.DenseNet(
        growth_rate=32, block_config=(2, 2, 2, 2), num_init_features=64, num_classes=10
    )


def _gpt2() -> nn.Module:
    """transformers' GPT2LMHeadModel from a small config (no download): the LM head and
    its vocabulary projection in the step."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=1000, n_positions=64, n_embd=64, n_layer=2, n_head=4)
    config.use_cache = False
    return GPT2LMHeadModel(config)


CASES = {
    "resnet18": (_convnet, lambda: torch.randn(2, 3, 32, 32)),
    "densenet": (_densenet, lambda: torch.randn(2, 3, 64, 64)),
    "llama-style decoder": (memory_models.llama, lambda: memory_models.tokens(2)),
    "transformers GPT2LMHeadModel": (_gpt2, lambda: torch.randint(0, 1000, (2, 32))),
}


@pytest.mark.parametrize("name", list(CASES))
def test_default_figures_against_the_allocator(name: str) -> None:
    build, make_input = CASES[name]
    torch.manual_seed(0)
    model, x = build(), make_input()
    t = hookcli.cost(model, x).totals  # no backward asked: both figures all the same
    train = measure_step(steady_step(model, (x,), optimizer="adam")).peak_bytes
    infer = measure_inference(model, (x,)).peak_bytes
    figures = f"{name}: training {t['step_peak_bytes']} vs {train}; "
    figures += f"inference {t['inference_peak_bytes']} vs {infer}"
    assert abs(t["step_peak_bytes"] - train) <= 0.05 * train, figures
    assert abs(t["inference_peak_bytes"] - infer) <= 0.05 * infer, figures
    # the sums of parts are parts, not figures
    assert "train_step_bytes" not in t and "inference_bytes" not in t
    assert t["memory_parts"]["train_step_bytes"] > 0


def test_the_table_has_one_training_and_one_inference_figure() -> None:
    res = invoke("cost", "sample_models.basic:BNMLP")
    assert res.exit_code == 0, res.stderr
    labels = [ln.split(":")[0] for ln in res.stdout.splitlines()]
    assert labels.count("Training peak") == 1 and labels.count("Inference peak") == 1
    assert not {"Training step", "Inference", "Step peak"} & set(labels)


def test_a_forward_that_cannot_train_says_so() -> None:
    from tests.fixtures.real_models import NoGradNet

    model, x = NoGradNet(), torch.randn(3, 4)
    t = hookcli.cost(model, x).totals
    assert t["step_peak_bytes"] is None and "@torch.no_grad()" in t["cannot_train"]
    infer = measure_inference(model, (x,)).peak_bytes
    assert abs(t["inference_peak_bytes"] - infer) <= 0.05 * infer


DECODER = [
    "sample_models.decoder:Decoder",
    *("-k", "vocab=512", "-k", "dim=128", "-k", "layers=2", "-k", "heads=4"),
    *("-k", "kv_heads=2", "-k", "hidden=352", "-k", "seq=64"),
]
TOKENS = ("-i", "int64:1x64:0..512")


def _measured(batch: int) -> int:
    torch.manual_seed(0)
    model = memory_models.llama()
    return measure_step(
        steady_step(model, (memory_models.tokens(batch),), optimizer="sgd")
    ).peak_bytes


def test_fit_on_the_cpu_answers_what_the_allocator_says() -> None:
    measured = {b: _measured(b) for b in (3, 4, 5)}
    limit = (measured[3] + measured[4]) // 2
    res = run_hookcli("cost", *DECODER, *TOKENS, "--optimizer", "sgd", "--fit", str(limit))
    assert res.returncode == 0, res.stderr[-2000:]
    assert "--fit searches batch sizes on meta" in res.stderr  # said, not refused
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("Fits in"))
    assert line.startswith("Fits in") and "batch 3 (peak" in line, line
    # the answer's measured peak fits, the next batch's does not
    assert measured[3] <= limit < measured[4]
    # printed to the byte: two peaks a batch apart differ in print
    shown = [int(n.replace(",", "")) for n in re.findall(r"([\d,]+) bytes", line)]
    assert len(shown) == 2 and shown[0] <= limit < shown[1], line


def test_fit_says_when_the_search_stops_at_its_bound() -> None:
    rep = invoke_json("cost", "sample_models.basic:Net", "--device", "meta", "--fit", "1EiB")
    t = rep["totals"]
    assert t["fit_at_bound"] and t["fit_batch"] == t["fit_search_bound"]
    assert t["fit_peak_bytes"] <= 2**60
    res = invoke("cost", "sample_models.basic:Net", "--device", "meta", "--fit", "1EiB")
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("Fits in"))
    assert "or more: the search stops at its bound" in line, line


@pytest.mark.parametrize("value", ["-1", "1XB", "0"])
def test_fit_errors_name_fit(value: str) -> None:
    res = invoke("cost", "sample_models.basic:Net", "--device", "meta", "--fit", value)
    assert res.exit_code == 2 and "--fit" in res.stderr and "--max-memory" not in res.stderr
    assert "Traceback" not in res.stderr


def test_every_documented_size_unit_is_taken() -> None:
    from hookcli.cost.sizes import MAX_SIZE, parse_size

    assert parse_size("1EiB", "--fit") == 2**60 and parse_size("2EB", "--fit") == 2 * 10**18
    assert parse_size("1PiB") == 2**50 and parse_size(str(MAX_SIZE)) == MAX_SIZE
    res = invoke("cost", "sample_models.basic:Net", "--device", "meta", "--fit", "8EiB")
    assert res.exit_code == 2 and "--fit '8EiB' is too large" in res.stderr
