"""``cost`` without ``--backward`` on a forward decorated ``@torch.no_grad()`` or
``@torch.inference_mode()`` (SAM's ``Sam.forward``, Llama's ``Transformer.forward``) says
that the forward cannot train instead of giving a training total (issue 44, point 8)."""

from __future__ import annotations

import pytest

from tests.conftest import invoke, invoke_json

FIX = "tests.fixtures.real_models"


@pytest.mark.parametrize(
    "name, decorator",
    [("NoGradNet", "@torch.no_grad()"), ("InferenceModeNet", "@torch.inference_mode()")],
)
def test_a_forward_that_cannot_train_has_no_training_total(name: str, decorator: str) -> None:
    report = invoke_json("cost", f"{FIX}:{name}", "-i", "3x4")
    totals = report["totals"]
    assert totals["step_peak_bytes"] is None
    assert f"{name}.forward (tests/fixtures/real_models.py:" in totals["cannot_train"]
    assert decorator in totals["cannot_train"]
    assert totals["inference_peak_bytes"] > 0  # inference is still what it is
    table = invoke("cost", f"{FIX}:{name}", "-i", "3x4")
    assert table.exit_code == 0, table.stderr
    line = next(ln for ln in table.stdout.splitlines() if ln.startswith("Training peak:"))
    assert "cannot train" in line and decorator in line and " = params" not in line
    gated = invoke("cost", f"{FIX}:{name}", "-i", "3x4", "--max-memory", "1GiB")
    assert gated.exit_code == 5, gated.stderr  # the max-memory check's exit status
    assert "cannot train" in gated.stderr and "--memory-for inference" in gated.stderr


def test_a_forward_that_can_train_keeps_its_training_total() -> None:
    totals = invoke_json("cost", f"{FIX}:InnerInferenceMode", "-i", "3x4")["totals"]
    # only a child is decorated: the root trains (its head), so the total stands
    assert totals["step_peak_bytes"] > 0 and "cannot_train" not in totals


def test_an_output_without_a_gradient_has_no_training_peak_by_default() -> None:
    # the forward runs with autograd, but its output (nonzero's int64 indices) carries no
    # gradient: the default cost says so in place of a training peak; --backward, which
    # asks for the backward, is refused as before
    spec = "tests.fixtures.metaonly:NonzeroInForward"
    totals = invoke_json("cost", spec, "-i", "2x4")["totals"]
    assert totals["step_peak_bytes"] is None
    assert totals["cannot_train"].startswith("the model's output is a int64 Tensor [")
    assert totals["inference_peak_bytes"] > 0
    asked = invoke("cost", spec, "-i", "2x4", "--backward")
    assert asked.exit_code == 2 and "nothing to backpropagate" in asked.stderr
