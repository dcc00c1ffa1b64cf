"""``--loss``, mixed inputs and errors that name the right party, on models written the way
public projects write theirs (issue 29, points 3-5; tests/fixtures/real_models.py).

The commands run in-process (``tests.conftest.invoke``, the CLI's own entry), but one:
``python -m hookcli`` from another folder, a loss file found on its path; the loss and
gradient figures are checked against plain PyTorch autograd on the same model (built
after ``torch.manual_seed(0)``, as ``--seed 0`` builds it) and the same inputs.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.conftest import invoke
from tests.fixtures import real_models as rm

ROOT = Path(__file__).resolve().parents[1]
FIX = "tests.fixtures.real_models"
GPT = (f"{FIX}:tiny_gpt", "--inputs-from", f"{FIX}:gpt_inputs")
REL = 1e-5


def hookcli(*args: str) -> subprocess.CompletedProcess[str]:
    """The command in-process, its exit status and streams as a process's."""
    result = invoke(*args)
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def report_of(*args: str) -> tuple[dict[str, Any], str]:
    result = hookcli(*args, "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), result.stderr


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("hookcli: error:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


def close(a: float | None, b: float) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=REL, abs_tol=1e-7)


def built(factory: Any) -> nn.Module:
    torch.manual_seed(0)
    return factory()


def grad_norm(model: nn.Module) -> float:
    grads = [p.grad.detach().double().reshape(-1) for p in model.parameters() if p.grad is not None]
    return float(torch.cat(grads).norm())


def param_norms(model: nn.Module) -> dict[str, float]:
    return {
        n: float(p.grad.double().norm()) for n, p in model.named_parameters() if p.grad is not None
    }


def gpt_oracle(loss_of: Any) -> tuple[float, float]:
    model = built(rm.tiny_gpt).train()
    idx, targets = rm.gpt_inputs()
    loss = loss_of(model(idx, targets))
    loss.backward()
    return float(loss.detach()), grad_norm(model)


# -- --loss output:KEY ----------------------------------------------------------------------


def test_gpt_output_1_is_the_models_own_loss() -> None:
    """nanoGPT returns (logits, loss): output:1 backpropagates the cross-entropy, not
    sum(logits) + loss."""
    report, _ = report_of("grads", *GPT, "--loss", "output:1")
    loss, norm = gpt_oracle(lambda out: out[1])
    assert close(report["totals"]["loss"], loss)
    assert close(report["totals"]["grad_norm"], norm)
    assert report["settings"]["loss"] == "output:1"
    assert "natural_loss" not in report["totals"]


def test_default_sum_names_the_natural_loss() -> None:
    """The default stays the sum of every output, and says which loss the model returns."""
    report, stderr = report_of("grads", *GPT)
    loss, norm = gpt_oracle(lambda out: out[0].sum() + out[1])
    assert close(report["totals"]["loss"], loss)
    assert close(report["totals"]["grad_norm"], norm)
    assert report["settings"]["loss"] == "sum"
    assert report["totals"]["natural_loss"] == "output:1"
    assert "pass --loss output:1" in stderr
    own, _ = gpt_oracle(lambda out: out[1])
    assert f"the model's own loss, output:1 ({own:.4g})" in stderr


def test_an_explicit_sum_says_nothing() -> None:
    report, stderr = report_of("grads", *GPT, "--loss", "sum")
    assert "natural_loss" not in report["totals"] and "--loss output" not in stderr


def test_dataclass_output_by_field_name() -> None:
    """output:loss and output:logits on a dataclass output (a non-scalar element: its sum)."""
    args = (f"{FIX}:DataclassLM", "--inputs-from", f"{FIX}:gpt_inputs")
    for key, pick in (("loss", lambda o: o.loss), ("logits", lambda o: o.logits.sum())):
        report, _ = report_of("grads", *args, "--loss", f"output:{key}")
        model = built(rm.DataclassLM).train()
        loss = pick(model(*rm.gpt_inputs()))
        loss.backward()
        assert close(report["totals"]["loss"], float(loss.detach())), key
        assert close(report["totals"]["grad_norm"], grad_norm(model)), key
    _, stderr = report_of("grads", *args)
    assert "pass --loss output:loss" in stderr


def test_nested_key_in_a_dict() -> None:
    report, _ = report_of("grads", f"{FIX}:DictLoss", "-i", "3x4", "--loss", "output:aux.loss")
    model = built(rm.DictLoss).train()
    g = torch.Generator().manual_seed(0)
    x = torch.randn((3, 4), generator=g)
    loss = model(x)["aux"]["loss"]
    loss.backward()
    assert close(report["totals"]["loss"], float(loss.detach()))
    assert close(report["totals"]["grad_norm"], grad_norm(model))


def test_output_key_errors_list_what_exists() -> None:
    result = hookcli("grads", *GPT, "--loss", "output:logits")
    assert result.returncode == 2
    line = error_line(result)
    assert "has no 'logits'" in line and "its keys are 0, 1" in line
    result = hookcli("grads", f"{FIX}:DictLoss", "-i", "3x4", "--loss", "output:aux.los")
    assert result.returncode == 2 and "output:aux (a dict) has no 'los'" in error_line(result)
    # no targets: nanoGPT returns (logits, None)
    result = hookcli("grads", f"{FIX}:tiny_gpt", "-i", "int64:2x8:0..32", "--loss", "output:1")
    assert result.returncode == 2 and "returned None there" in error_line(result)


@pytest.mark.parametrize(
    "value, fragment",
    [
        ("median", "--loss must be sum, mean, random, output:KEY or fn:FILE.py:FUNCTION"),
        ("output:", "write output:KEY"),
        ("sum:3", "--loss sum takes no argument"),
        ("fn:nowhere.py:f", "no such file nowhere.py"),
        ("fn:loss.py", "write fn:FILE.py:FUNCTION"),
    ],
)
def test_bad_loss_values_are_usage_errors_before_the_build(value: str, fragment: str) -> None:
    result = invoke("grads", f"{FIX}:InferenceModeNet", "-i", "3x4", "--loss", value)
    assert result.exit_code == 2, result.stderr
    assert fragment in result.stderr
    assert "forward ran" not in result.stderr


# -- --loss random ------------------------------------------------------------------------


def test_random_projection_matches_its_definition() -> None:
    """sum_i <R_i, out_i>, R_i ~ N(0, 1) from one CPU generator seeded 0, in output order."""
    report, _ = report_of("grads", *GPT, "--loss", "random")
    model = built(rm.tiny_gpt).train()
    out = model(*rm.gpt_inputs())
    g = torch.Generator().manual_seed(0)
    loss = sum((t * torch.randn(t.shape, generator=g)).sum() for t in out)
    loss.backward()
    assert close(report["totals"]["loss"], float(loss.detach()))
    assert close(report["totals"]["grad_norm"], grad_norm(model))
    assert report["settings"]["loss"] == "random"


def test_random_projection_on_a_normalised_output() -> None:
    """A LayerNorm'd output sums to zero whatever the weights: its sum's gradients are
    rounding noise, a random projection's are not."""
    summed, _ = report_of("grads", f"{FIX}:Normalized", "-i", "4x8")
    projected, _ = report_of("grads", f"{FIX}:Normalized", "-i", "4x8", "--loss", "random")
    assert abs(summed["totals"]["loss"]) < 1e-4
    assert projected["totals"]["grad_norm"] > 1e4 * summed["totals"]["grad_norm"]


# -- --loss fn:FILE.py:FUNCTION -------------------------------------------------------------


def test_fn_loss_with_the_inputs_and_with_the_output_alone(tmp_path: Path) -> None:
    (tmp_path / "lossfns.py").write_text(
        "import torch.nn.functional as F\n"
        "def ce(output, idx, targets):\n"
        "    logits, _ = output\n"
        "    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())\n"
        "def squares(output):\n"
        "    return (output[0] ** 2).mean()\n"
        "def broken(output):\n"
        "    raise ValueError('no loss here')\n"
    )
    path = tmp_path / "lossfns.py"
    report, _ = report_of("grads", *GPT, "--loss", f"fn:{path}:ce")
    loss, norm = gpt_oracle(lambda out: out[1])  # the same cross-entropy as the model's
    assert close(report["totals"]["loss"], loss) and close(report["totals"]["grad_norm"], norm)
    assert report["settings"]["loss"] == f"fn:{path}:ce"
    report, _ = report_of("grads", *GPT, "--loss", f"fn:{path}:squares")
    loss, norm = gpt_oracle(lambda out: (out[0] ** 2).mean())
    assert close(report["totals"]["loss"], loss) and close(report["totals"]["grad_norm"], norm)
    result = hookcli("grads", *GPT, "--loss", f"fn:{path}:broken")
    assert result.returncode == 4
    line = error_line(result)
    assert "the loss function" in line and "ValueError: no loss here" in line
    assert "lossfns.py:8 in broken" in line
    result = hookcli("grads", *GPT, "--loss", f"fn:{path}:missing")
    assert result.returncode == 2 and "missing" in error_line(result)


# -- every command that runs backward -----------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ("stats", "--backward"),
        ("ablate", "-l", "lm_head", "--grad-op", "zero"),
        ("cost", "--backward"),
        ("profile", "--backward", "--warmup", "0", "--repeat", "1"),
        ("inspect", "--hooks", "forward,backward"),
        ("trace", "--backward"),
    ],
)
def test_every_backward_command_takes_the_loss(command: tuple[str, ...]) -> None:
    """Each command's own figure for --loss output:1 against plain autograd: the loss
    value (stats, trace, ablate), a gradient it reports (inspect: the grad into lm_head, in
    float64), the backward FLOPs FlopCounterMode counts (cost, profile; and below, a loss
    that changes them)."""
    report, _ = report_of(command[0], *GPT, *command[1:], "--loss", "output:1")
    assert report["settings"]["loss"] == "output:1"
    want, _ = gpt_oracle(lambda out: out[1])
    if command[0] in ("stats", "trace"):
        assert close(report["totals"]["loss"], want)
    elif command[0] == "ablate":
        assert close(report["totals"]["clean_output"]["loss"], want)
    elif command[0] == "inspect":
        rows = {r["name"]: r for r in report["layers"]}
        assert close(rows["lm_head"]["grad_input_norm"], lm_head_grad_in(lambda o: o[1]))
        assert not close(rows["lm_head"]["grad_input_norm"], lm_head_grad_in(summed))
    else:
        fwd, bwd = flops_oracle(rm.tiny_gpt, rm.gpt_inputs, lambda o: o[1])
        assert (report["totals"]["flops"], report["totals"]["backward_flops"]) == (fwd, bwd)


def summed(out: Any) -> torch.Tensor:
    return out[0].sum() + out[1]


def lm_head_grad_in(loss_of: Any) -> float:
    """The L2 norm of the gradient into nanoGPT's lm_head (float64), eval mode."""
    model = built(rm.tiny_gpt).eval()
    seen: list[torch.Tensor] = []

    def keep_grad(module: nn.Module, args: Any) -> None:
        args[0].register_hook(seen.append)

    model.get_submodule("lm_head").register_forward_pre_hook(keep_grad)
    loss_of(model(*rm.gpt_inputs())).backward()
    return float(seen[0].double().norm())


def flops_oracle(factory: Any, inputs: Any, loss_of: Any) -> tuple[int, int]:
    """FlopCounterMode's forward FLOPs, and the backward FLOPs from that loss."""
    from torch.utils.flop_counter import FlopCounterMode

    model = built(factory).eval()
    with FlopCounterMode(display=False) as forward:
        out = model(*inputs())
    loss = loss_of(out)
    with FlopCounterMode(display=False) as backward:
        loss.backward()
    return forward.get_total_flops(), backward.get_total_flops()


@pytest.mark.parametrize("command", [("cost",), ("profile", "--warmup", "0", "--repeat", "1")])
def test_cost_and_profile_count_the_backward_of_the_loss_given(command: tuple[str, ...]) -> None:
    """output:hidden stops before the head, output:loss runs through it: the backward
    FLOPs differ, each as FlopCounterMode counts the plain backward of that loss."""
    args = (f"{FIX}:DataclassLM", "--inputs-from", f"{FIX}:gpt_inputs", "--backward")
    got = {}
    for key in ("hidden", "loss"):
        report, _ = report_of(command[0], *args, *command[1:], "--loss", f"output:{key}")
        want = flops_oracle(rm.DataclassLM, rm.gpt_inputs, lambda o, k=key: getattr(o, k).sum())
        got[key] = (report["totals"]["flops"], report["totals"]["backward_flops"])
        assert got[key] == want, key
    assert got["hidden"][1] < got["loss"][1]


# -- mixed inputs: integer tokens next to float features, a sparse adjacency ---------------


def test_whisper_decoder_takes_integer_tokens_and_float_features() -> None:
    report, _ = report_of(
        "grads",
        f"{FIX}:tiny_whisper",
        "--inputs-from",
        f"{FIX}:whisper_inputs",
        "--per-param",
        "--fail-on",
        "nan,inf,unused",
    )
    model = built(rm.tiny_whisper).train()
    seen: list[torch.Tensor] = []

    def keep_grad(module: nn.Module, args: Any, output: torch.Tensor) -> None:
        output.register_hook(seen.append)

    model.encoder.register_forward_hook(keep_grad)
    out = model(*rm.whisper_inputs())
    out.sum().backward()
    assert close(report["totals"]["loss"], float(out.sum().detach()))
    want = param_norms(model)
    got = {p["name"]: p["grad_norm"] for p in report["params"]}
    assert set(got) == set(want)
    assert all(close(got[n], want[n]) for n in want)
    assert report["totals"]["unused_params"] == []
    rows = {r["name"]: r for r in report["layers"]}
    # grad_input of decoder(tokens, features): the features' grad; the int64 ids have none
    assert close(rows["decoder"]["grad_input_norm"], float(seen[0].double().norm()))


def test_pygcn_sparse_adjacency_grads_inspect_and_stats() -> None:
    args = (f"{FIX}:PyGCN", "--inputs-from", f"{FIX}:gcn_inputs", "--mode", "eval")
    report, _ = report_of("grads", *args, "--per-param", "--fail-on", "unused")
    model = built(rm.PyGCN).eval()
    x, adj = rm.gcn_inputs()
    out = model(x, adj)
    out.sum().backward()
    assert close(report["totals"]["loss"], float(out.sum().detach()))
    want = param_norms(model)
    assert all(close(p["grad_norm"], want[p["name"]]) for p in report["params"])
    assert report["checks"][0]["passed"]
    report, _ = report_of("inspect", *args, "--hooks", "pre,forward,backward")
    assert report.get("error") is None
    stats, _ = report_of("stats", *args)  # a sparse input: no aminmax on it, no blame
    rows = {r["name"]: r for r in stats["layers"]}
    h = model.gc1(x, adj)
    assert close(rows["gc1"]["mean"], float(h.mean()))
    assert close(rows[""]["max"], float(out.max()))


# -- errors that name the right party ------------------------------------------------------


@pytest.mark.parametrize(
    "name, decorator",
    [("InferenceModeNet", "@torch.inference_mode()"), ("NoGradNet", "@torch.no_grad()")],
)
@pytest.mark.parametrize(
    "command",
    [("grads",), ("cost", "--backward"), ("profile", "--backward"), ("stats", "--backward")],
)
def test_a_forward_without_autograd_is_named_before_any_work(
    name: str, decorator: str, command: tuple[str, ...]
) -> None:
    result = hookcli(command[0], f"{FIX}:{name}", "-i", "3x4", *command[1:])
    assert result.returncode == 2, result.stderr
    line = error_line(result)
    assert f"{name}.forward (tests/fixtures/real_models.py:" in line
    assert f"is decorated with {decorator}" in line
    assert "forward ran" not in result.stderr  # refused before the model ran


def test_no_grad_inside_forward_is_named_at_once() -> None:
    result = hookcli("grads", f"{FIX}:NoGradInside", "-i", "3x4")
    assert result.returncode == 2
    assert "torch.no_grad()" in error_line(result)


def test_an_inner_inference_mode_forward_is_named_with_its_unused_parameters() -> None:
    report, stderr = report_of("grads", f"{FIX}:InnerInferenceMode", "-i", "3x4")
    assert report["totals"]["unused_params"] == ["inner.fc.weight", "inner.fc.bias"]
    assert "inner (InferenceModeNet.forward" in stderr
    assert "@torch.inference_mode()" in stderr


def test_the_models_own_exception_names_its_file_and_line() -> None:
    result = hookcli("grads", f"{FIX}:RaisesInForward", "-i", "2x4")
    assert result.returncode == 4
    line = error_line(result)
    source = Path(rm.__file__).read_text().splitlines()
    number = next(i + 1 for i, s in enumerate(source) if "expected 4 features" in s)
    assert f"(raised at tests/fixtures/real_models.py:{number} in forward)" in line
    assert "forward failed in (root) (RaisesInForward)" in line


def test_an_error_in_hookcli_is_an_internal_error_not_the_models(monkeypatch: Any) -> None:
    """A probe hook that raises (here: called with arguments it does not take): exit 70,
    saying so, never 'forward failed in' the model's module."""
    from hookcli.grads.probe import GradProbe

    monkeypatch.setattr(GradProbe, "on_forward", staticmethod(math.sqrt))
    result = invoke("grads", f"{FIX}:RaisesInForward", "-i", "2x4")
    assert result.exit_code == 70, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("hookcli: error: internal error in hookcli"), line
    assert "not the model's" in line and "raised at hookcli/session.py:" in line
    assert "forward failed" not in result.stderr


@pytest.mark.parametrize(
    "command", [("cost", "--backward"), ("profile", "--backward", "--repeat", "2")]
)
def test_a_kv_cache_kept_in_attributes_is_put_back_between_passes(
    command: tuple[str, ...],
) -> None:
    """The cache is reset as found before each pass (tests/test_forward_state.py checks the
    figures on Meta's own Llama code): the commands run, with FlopCounterMode's FLOPs."""
    report, _ = report_of(command[0], f"{FIX}:tiny_llama", "-i", "int64:2x8:0..32", *command[1:])
    assert report.get("error") is None

    def tokens() -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        return [torch.randint(0, 32, (2, 8), generator=g)]

    want = flops_oracle(rm.tiny_llama, tokens, lambda o: o.sum())
    assert (report["totals"]["flops"], report["totals"]["backward_flops"]) == want


@pytest.mark.parametrize("loss", ["sum", "mean", "random"])
def test_grads_on_the_kv_cache_model_runs_once_and_matches_autograd(loss: str) -> None:
    """The loss value and the total grad norm of the chosen --loss, against plain autograd
    in float64 on the same model and tokens (``--seed 3`` builds and draws them)."""
    report, _ = report_of(
        "grads", f"{FIX}:tiny_llama", "-i", "int64:2x8:0..32", "--seed", "3", "--loss", loss
    )
    assert report.get("error") is None and report["settings"]["loss"] == loss
    torch.manual_seed(3)
    model = rm.tiny_llama().eval()
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 32, (2, 8), generator=g)
    out = model(tokens).double()
    if loss == "random":
        r = torch.randn(out.shape, generator=torch.Generator().manual_seed(0)).double()
        value = (out * r).sum()
    else:
        value = out.sum() if loss == "sum" else out.mean()
    value.backward()
    assert close(report["totals"]["loss"], float(value.detach()))
    assert close(report["totals"]["grad_norm"], grad_norm(model))


def test_loss_value_of_a_nanogpt_loss_function_file(tmp_path: Path) -> None:
    """fn: with a package.module spec, run from another folder."""
    (tmp_path / "mylosses.py").write_text(
        "def own(output, idx, targets=None):\n    return output[1]\n"
    )
    env_root = str(ROOT)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hookcli",
            "grads",
            *GPT,
            "--loss",
            "fn:mylosses:own",
            "--format",
            "json",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": env_root},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    loss, _ = gpt_oracle(lambda out: out[1])
    assert close(json.loads(result.stdout)["totals"]["loss"], loss)
