"""``--enable-grad``: a forward decorated with ``@torch.no_grad()`` / ``@torch.inference_mode()``
runs undecorated, with gradients, and the model is put back after.

Oracle: plain autograd on the undecorated function (``type(m).forward.__wrapped__``), on
the same seeded model and inputs, in float64 where the model runs in it (segment-anything
casts its point coordinates to float32 itself, so its oracle runs in float32).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch

from hookcli import gradmode
from hookcli.failure import grad_off_forwards
from tests.conftest import assert_no_hooks, global_hook_counts, invoke, invoke_json, run_hookcli
from tests.fixtures import gradoff_models as fx

LLAMA = "tests.fixtures.gradoff_models:tiny_llama"


def plain_grads(model: torch.nn.Module, run: Any) -> tuple[float, dict[str, float]]:
    """Sum of every floating output element, backward: total and per-parameter grad norms."""
    out = run(model)
    leaves = []
    stack = [out]
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            if v.is_floating_point():
                leaves.append(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    loss = sum(t.sum() for t in leaves)
    assert isinstance(loss, torch.Tensor) and loss.requires_grad
    loss.backward()
    per = {n: float(p.grad.norm()) for n, p in model.named_parameters() if p.grad is not None}
    total = math.sqrt(sum(float(p.grad.double().norm()) ** 2 for p in model.parameters()
                          if p.grad is not None))  # fmt: skip
    return total, per


def compare(report: dict[str, Any], total: float, per: dict[str, float], rtol: float) -> None:
    assert report["totals"]["grad_norm"] == pytest.approx(total, rel=rtol)
    got = {r["name"]: r["grad_norm"] for r in report["params"] if r["grad_norm"] is not None}
    assert set(got) == set(per)  # the parameters plain autograd reaches, and no others
    for name, norm in per.items():
        assert got[name] == pytest.approx(norm, rel=rtol, abs=1e-12), name


def test_refusal_names_enable_grad() -> None:
    result = invoke("grads", LLAMA, "-i", "int64:2x6:0..32", "-i", "py:3")
    assert result.exit_code == 2
    assert "decorated with @torch.inference_mode()" in result.stderr
    assert "pass --enable-grad" in result.stderr


def test_llama_inference_mode_forward_matches_float64_autograd() -> None:
    report = invoke_json(
        "grads", LLAMA, "-i", "int64:2x6:0..32", "-i", "py:3", "--dtype", "float64",
        "--enable-grad", "--per-param",
    )  # fmt: skip
    assert report["settings"]["enable_grad"] is True
    torch.manual_seed(0)
    model = fx.tiny_llama().double().train()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 32, (2, 6), generator=g)
    undecorated = type(model).forward.__wrapped__  # type: ignore[attr-defined]
    total, per = plain_grads(model, lambda m: undecorated(m, tokens, 3))
    assert total > 0
    compare(report, total, per, 1e-9)


def test_decorator_beneath_another_one_is_lifted_and_put_back() -> None:
    """``@logged @torch.no_grad()`` on a submodule: its parameters get their gradient with
    --enable-grad (the float64 oracle), and none without (a note says why)."""
    plain = invoke_json("grads", "tests.fixtures.gradoff_models:WithFrozenEncoder", "-i", "3x4",
                        "--dtype", "float64", "--per-param")  # fmt: skip
    assert {r["name"] for r in plain["params"] if r["grad_norm"]} == {"head.weight", "head.bias"}
    report = invoke_json("grads", "tests.fixtures.gradoff_models:WithFrozenEncoder", "-i", "3x4",
                         "--dtype", "float64", "--per-param", "--enable-grad")  # fmt: skip
    torch.manual_seed(0)
    model = fx.WithFrozenEncoder().double().train()
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    inner = fx.FrozenEncoder.forward.__wrapped__.__wrapped__  # type: ignore[attr-defined]
    total, per = plain_grads(model, lambda m: m.head(inner(m.encoder, x)))
    compare(report, total, per, 1e-9)
    # the wrapper under @logged enters torch.no_grad again
    wrapper = fx.FrozenEncoder.forward.__wrapped__  # type: ignore[attr-defined]
    cell = wrapper.__closure__[wrapper.__code__.co_freevars.index("ctx_factory")]
    assert isinstance(cell.cell_contents.__self__, torch.no_grad)


@pytest.mark.parametrize(
    "command",
    [
        ("cost", "--backward"),
        ("profile", "--backward", "--warmup", "0", "--repeat", "1"),
        ("stats", "--backward"),
        ("ablate", "-l", "layers.0", "--grad-op", "zero"),
    ],
)
def test_every_backward_command_refuses_then_runs_with_enable_grad(
    command: tuple[str, ...],
) -> None:
    args = (command[0], LLAMA, "-i", "int64:2x6:0..32", "-i", "py:0", *command[1:])
    refused = invoke(*args)
    assert refused.exit_code == 2, refused.stderr
    assert "--enable-grad" in refused.stderr
    ran = invoke(*args, "--enable-grad")
    assert ran.exit_code == 0, ran.stderr
    assert "--enable-grad: (root) (Transformer.forward) runs without its" in ran.stderr


def test_the_model_is_left_as_found() -> None:
    """An instance run in-process: its forward, hooks, grads and the class come back."""
    model = fx.LLAMA
    before_forward = type(model).forward
    before_globals = global_hook_counts()
    state = copy.deepcopy(model.state_dict())
    result = invoke("grads", "tests.fixtures.gradoff_models:LLAMA", "-i", "int64:2x6:0..32",
                    "-i", "py:1", "--enable-grad")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "forward" not in vars(model)
    assert type(model).forward is before_forward
    assert grad_off_forwards(model)[0].decorator == "@torch.inference_mode()"
    assert_no_hooks(model, before_globals)
    assert all(p.grad is None for p in model.parameters())
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k


def test_lift_is_undone_when_the_run_raises() -> None:
    model = fx.WithFrozenEncoder()
    wrapper = fx.FrozenEncoder.forward.__wrapped__  # type: ignore[attr-defined]
    cell = wrapper.__closure__[wrapper.__code__.co_freevars.index("ctx_factory")]
    original = cell.cell_contents
    with pytest.raises(RuntimeError, match="boom"), gradmode.requested(True):
        assert gradmode.lift_requested(model)
        assert cell.cell_contents is not original
        x = torch.randn(2, 4)
        assert model(x).requires_grad  # the encoder ran with gradients
        raise RuntimeError("boom")
    assert cell.cell_contents is original
    assert not gradmode.current()
    assert not model.encoder(torch.randn(2, 4)).requires_grad


def test_only_the_lifted_instance_runs_undecorated() -> None:
    a, b = fx.tiny_llama(), fx.tiny_llama()
    undo, lifted = gradmode.lift(a)
    try:
        assert [o.name for o in lifted] == [""]
        tokens = torch.randint(0, 32, (1, 4))
        assert a(tokens, 0).requires_grad
        assert not b(tokens, 0).requires_grad
        with torch.no_grad():  # hookcli's (and anyone's) own no_grad still holds
            assert not a(tokens, 0).requires_grad
    finally:
        undo()
    assert "forward" not in vars(a)
    assert not a(torch.randint(0, 32, (1, 4)), 0).requires_grad


def test_enable_grad_on_a_plain_model_notes_it_and_changes_nothing() -> None:
    result = invoke("grads", "sample_models:LeNet", "-i", "1x1x32x32", "--enable-grad")
    assert result.exit_code == 0, result.stderr
    assert "no forward of the model is decorated" in result.stderr


def test_from_a_real_process() -> None:
    """The console script, as a user types it."""
    done = run_hookcli("grads", LLAMA, "-i", "int64:2x6:0..32", "-i", "py:2", "--enable-grad",
                       "-f", "json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert '"enable_grad": true' in done.stdout
