"""`hookcli ablate`: every figure against the same ablation written by hand with plain hooks."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn

import hookcli.ablate.runner as ablate_cmd
from hookcli.ablate.passes import apply_op, map_tensors, parse_op
from hookcli.errors import UsageError
from sample_models import BNMLP, LeNet
from sample_models.causal_lm import TinyCausalLM
from tests.conftest import (
    assert_no_hooks,
    assert_same_state,
    global_hook_counts,
    invoke,
    invoke_json,
    state_snapshot,
)


# -- models (loaded as tests.test_ablate:NAME) ----------------------------------------------
class Picky(nn.Module):
    """``check`` raises when its input is all zeros (so zeroing ``a`` makes the model raise)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.check = Guard()
        self.b = nn.Linear(4, 3)
        self.example_input_array = torch.randn(2, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.check(self.a(x)))


class Guard(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not bool(x.any()):
            raise ValueError("all-zero input")
        return x


class CtrlC(nn.Module):
    """Presses Ctrl-C (KeyboardInterrupt) in the pass where ``a`` is zeroed, in train mode."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)
        self.b = nn.Linear(4, 3)
        self.example_input_array = torch.randn(3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if not bool(h.any()):
            raise KeyboardInterrupt
        return self.b(self.bn(h))


class Spare(nn.Module):
    """``spare`` runs but its output is thrown away: ablating it does nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(8, 8)
        self.spare = nn.Linear(8, 8)
        self.out = nn.Linear(8, 5)
        self.never = nn.Linear(8, 8)
        self.example_input_array = torch.randn(6, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.spare(x)
        return self.out(torch.relu(self.used(x)))


class Vector(nn.Module):
    """A 1-D output: neither a classifier nor a language model."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.example_input_array = torch.randn(2, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).sum(dim=0)


class Broken(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ok = nn.Linear(3, 3)
        self.bad = nn.Linear(5, 2)
        self.example_input_array = torch.randn(2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bad(self.ok(x))


def tiny_gpt2() -> nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "gpt2", n_layer=2, n_embd=32, n_head=2, vocab_size=100, bos_token_id=0, eos_token_id=0
    )
    return AutoModelForCausalLM.from_config(config)


CTRL_C = CtrlC()
BN_MLP = BNMLP()  # an instance: the CLI uses it as it is, so the test can look at it after
RESNET = torchvision.models.resnet18(weights=None, num_classes=10).eval()


# -- hand-written references -------------------------------------------------------------------
def seeded_input(*shape: int) -> torch.Tensor:
    """The CLI's input: torch.randn from a Generator seeded with --seed (0)."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(0))


def build(cls: Callable[[], nn.Module]) -> nn.Module:
    torch.manual_seed(0)  # what the CLI does right before building
    return cls().eval()


def run_with(
    model: nn.Module, x: Any, hooks: Sequence[tuple[nn.Module, Callable[..., Any]]], seed: int = 0
) -> torch.Tensor:
    handles = [m.register_forward_hook(fn) for m, fn in hooks]
    try:
        torch.manual_seed(seed)
        with torch.no_grad():
            out = model(x)
    finally:
        for h in handles:
            h.remove()
    return out.logits if hasattr(out, "logits") else out


def reference(clean: torch.Tensor, ablated: torch.Tensor) -> dict[str, float]:
    """The metrics, in float64, written out plainly."""
    c, a = clean.double(), ablated.double()
    d = (a - c).flatten()
    out = {
        "rel_l2": float(d.norm() / c.flatten().norm()),
        "cosine": float(F.cosine_similarity(a.flatten(), c.flatten(), dim=0)),
        "max_abs": float(d.abs().max()),
    }
    if c.dim() in (2, 3):
        out["top1_agreement"] = float((a.argmax(-1) == c.argmax(-1)).double().mean())
        p_log, q_log = c.log_softmax(-1), a.log_softmax(-1)
        out["kl"] = float((p_log.exp() * (p_log - q_log)).sum(-1).mean())
    return out


def assert_metrics(row: dict[str, Any], expected: dict[str, float]) -> None:
    for key, value in expected.items():
        assert row[key] == pytest.approx(value, rel=2e-5, abs=1e-6), (row["name"], key)


def by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in report["ablations"]}


# -- ops against hand-written hooks --------------------------------------------------------------
OPS = {
    "zero": lambda o: torch.zeros_like(o),
    "scale:-0.5": lambda o: o * -0.5,
    "mean": lambda o: o.mean(dim=0, keepdim=True).expand_as(o),
    "clamp:-0.05..0.02": lambda o: o.clamp(-0.05, 0.02),
    "clamp:0..": lambda o: o.clamp(min=0),
}


@pytest.mark.parametrize("op", list(OPS))
def test_each_op_matches_a_hand_written_forward_hook(op):
    report = invoke_json(
        "ablate", "sample_models.basic:LeNet", "-l", "conv*", "-l", "fc1", "-i", "4x1x32x32",
        "--op", op,
    )  # fmt: skip
    model, x = build(LeNet), seeded_input(4, 1, 32, 32)
    clean = run_with(model, x, [])
    rows = by_name(report)
    assert set(rows) == {"conv1", "conv2", "fc1"}
    fn = OPS[op]
    for name in rows:
        ablated = run_with(model, x, [(model.get_submodule(name), lambda m, i, o: fn(o))])
        assert_metrics(rows[name], reference(clean, ablated))
        assert rows[name]["calls"] == 1 and rows[name]["tensors"] == 1
    assert report["settings"]["op"] == op
    assert report["totals"]["forward_passes"] == 4
    c = report["totals"]["clean_output"]
    assert c["kind"] == "classifier" and c["shapes"] == [[4, 10]]
    assert c["top1"] == clean.argmax(-1).tolist()
    assert c["norm"] == pytest.approx(float(clean.double().norm()), rel=1e-6)


def test_noise_is_seeded_relative_to_the_std_and_reproducible():
    def noisy(seed: int) -> Callable[..., torch.Tensor]:
        g = torch.Generator().manual_seed(seed)

        def hook(m: nn.Module, i: Any, o: torch.Tensor) -> torch.Tensor:
            return o + (0.3 * o.std(correction=0)) * torch.randn(o.shape, generator=g)

        return hook

    model, x = build(LeNet), seeded_input(1, 1, 32, 32)
    clean = run_with(model, x, [])
    for seed in (0, 7):
        args = ["ablate", "sample_models.basic:LeNet", "-l", "fc2", "--op", "noise:0.3"]
        report = invoke_json(*args, "-i", "1x1x32x32", "--seed", str(seed))
        torch.manual_seed(seed)
        model = LeNet().eval()  # --seed also seeds the build
        x = torch.randn((1, 1, 32, 32), generator=torch.Generator().manual_seed(seed))
        clean = run_with(model, x, [])
        ablated = run_with(model, x, [(model.fc2, noisy(seed))])
        assert_metrics(report["ablations"][0], reference(clean, ablated))
    again = invoke_json(*args, "-i", "1x1x32x32", "--seed", "7")
    assert again["ablations"] == report["ablations"]


def test_apply_op_and_map_tensors_rebuild_structures():
    t = torch.tensor([[1.0, -2.0], [3.0, 4.0]])
    from hookcli.ablate.passes import _Generators

    g = _Generators(0)
    assert torch.equal(apply_op(parse_op("clamp:..0"), t, g), t.clamp(max=0))
    assert torch.equal(apply_op(parse_op("mean"), t, g), torch.tensor([[2.0, 1.0], [2.0, 1.0]]))
    out = apply_op(parse_op("mean"), t.t().contiguous().t(), g)  # strides kept
    assert out.stride() == t.t().contiguous().t().stride()
    ids = torch.tensor([1, 2])
    nested = {"a": (t, ids, None), "b": [t]}
    mapped = map_tensors(nested, lambda x: x * 0 if x.is_floating_point() else x)
    assert torch.equal(mapped["a"][0], torch.zeros(2, 2)) and mapped["a"][1] is ids
    assert mapped["a"][2] is None and torch.equal(mapped["b"][0], torch.zeros(2, 2))


# -- ranking, --metric, --together -----------------------------------------------------------------
def test_rows_are_ranked_by_the_chosen_metric():
    args = ("ablate", "sample_models.basic:LeNet", "-l", "*", "--leaves", "-i", "3x1x32x32")
    default = invoke_json(*args)
    rel = [r["rel_l2"] for r in default["ablations"]]
    assert rel == sorted(rel, reverse=True)
    assert [r["rank"] for r in default["ablations"]] == list(range(1, len(rel) + 1))
    # --leaves: no container (the root) among the rows
    assert "" not in {r["name"] for r in default["ablations"]}
    cos = invoke_json(*args, "--metric", "cosine")
    values = [r["cosine"] for r in cos["ablations"]]
    assert values == sorted(values)  # least similar (largest effect) first
    kl = invoke_json(*args, "--metric", "kl")
    values = [r["kl"] for r in kl["ablations"]]
    assert values == sorted(values, reverse=True)
    assert kl["settings"]["metric"] == "kl"


def test_together_ablates_every_match_in_one_pass():
    report = invoke_json(
        "ablate", "sample_models.basic:LeNet", "-l", "fc1", "-l", "conv2", "--together",
        "--op", "scale:0.5", "-i", "2x1x32x32",
    )  # fmt: skip
    (row,) = report["ablations"]
    assert row["modules"] == ["conv2", "fc1"] and row["calls"] == 2
    model, x = build(LeNet), seeded_input(2, 1, 32, 32)
    clean = run_with(model, x, [])
    half = lambda m, i, o: o * 0.5  # noqa: E731
    ablated = run_with(model, x, [(model.conv2, half), (model.fc1, half)])
    assert_metrics(row, reference(clean, ablated))
    assert report["totals"]["forward_passes"] == 2


# -- language models ------------------------------------------------------------------------------
def test_language_model_kl_and_top1_per_position():
    report = invoke_json(
        "ablate", "sample_models.causal_lm:TinyCausalLM", "-l", "blocks.*.mlp", "-l",
        "blocks.0.attn", "-i", "int64:3x10:0..64", "--metric", "kl",
    )  # fmt: skip
    model = build(TinyCausalLM)
    tokens = torch.randint(0, 64, (3, 10), generator=torch.Generator().manual_seed(0))
    clean = run_with(model, tokens, [])
    assert report["totals"]["clean_output"]["kind"] == "language-model"
    for name, row in by_name(report).items():
        zero = lambda m, i, o: torch.zeros_like(o)  # noqa: E731
        ablated = run_with(model, tokens, [(model.get_submodule(name), zero)])
        assert_metrics(row, reference(clean, ablated))
    kls = [r["kl"] for r in report["ablations"]]
    assert kls == sorted(kls, reverse=True) and kls[0] > 0


def test_hugging_face_model_output_logits_are_compared(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    report = invoke_json(
        "ablate", "tests.test_ablate:tiny_gpt2", "-i", "int64:2x6:0..100",
        "-l", "transformer.h.0", "-l", "transformer.h.1.mlp",
    )  # fmt: skip
    model = build(tiny_gpt2)
    ids = torch.randint(0, 100, (2, 6), generator=torch.Generator().manual_seed(0))
    clean = run_with(model, ids, [])
    assert report["totals"]["clean_output"]["compared"] == "logits"
    for name, row in by_name(report).items():
        # a block returns a tuple: zero every floating tensor in it
        def zero(m: nn.Module, i: Any, o: Any) -> Any:
            if isinstance(o, torch.Tensor):
                return torch.zeros_like(o)
            return tuple(torch.zeros_like(t) if isinstance(t, torch.Tensor) else t for t in o)

        ablated = run_with(model, ids, [(model.get_submodule(name), zero)])
        assert_metrics(row, reference(clean, ablated))
    # the base model returns a ModelOutput: rebuilt with its hidden state halved; the
    # logits (lm_head has no bias) halve with it: rel_l2 0.5, the ranking unchanged
    halved = invoke_json(
        "ablate", "tests.test_ablate:tiny_gpt2", "-i", "int64:2x6:0..100", "-l", "transformer",
        "--op", "scale:0.5",
    )  # fmt: skip
    (row,) = halved["ablations"]
    assert row["rel_l2"] == pytest.approx(0.5, rel=1e-5) and row["top1_agreement"] == 1
    assert row["cosine"] == pytest.approx(1.0, abs=1e-6)


# -- gradient side ----------------------------------------------------------------------------------
def hand_grad_norms(
    model: nn.Module, x: torch.Tensor, module: nn.Module | None, fn: Callable[..., Any] | None
) -> dict[str, float]:
    """Own-parameter grad norm of every module, with ``fn`` as a tensor hook on module's output."""
    for p in model.parameters():
        p.grad = None
    tensor_handles: list[Any] = []

    def fwd(m: nn.Module, i: Any, o: torch.Tensor) -> None:
        tensor_handles.append(o.register_hook(fn))

    handle = module.register_forward_hook(fwd) if module is not None else None
    try:
        model(x).sum().backward()
    finally:
        if handle is not None:
            handle.remove()
        for h in tensor_handles:
            h.remove()
    out = {}
    for name, m in model.named_modules():
        own = [p for p in m.parameters(recurse=False)]
        if own:
            sq = sum(float(p.grad.double().norm()) ** 2 for p in own if p.grad is not None)
            out[name] = sq**0.5
    for p in model.parameters():
        p.grad = None
    return out


def test_grad_scale_matches_a_hand_written_tensor_hook_and_the_closed_form():
    report = invoke_json(
        "ablate", "sample_models.basic:LeNet", "-l", "conv2", "-l", "fc2",
        "--grad-op", "scale:0.25", "-i", "2x1x32x32",
    )  # fmt: skip
    assert report["settings"]["metric"] == "grad_rel_l2" and report["settings"]["op"] is None
    model, x = build(LeNet), seeded_input(2, 1, 32, 32)
    clean = hand_grad_norms(model, x, None, None)
    assert report["totals"]["clean_output"]["grad_norm"] == pytest.approx(
        sum(v * v for v in clean.values()) ** 0.5, rel=1e-5
    )
    order = ["conv1", "conv2", "fc1", "fc2", "fc3"]
    for name, row in by_name(report).items():
        assert row["rel_l2"] is None  # the output itself is untouched
        hand = hand_grad_norms(model, x, model.get_submodule(name), lambda g: g * 0.25)
        groups = {g["group"]: g for g in row["grad_groups"]}
        assert list(groups) == order
        for group, g in groups.items():
            assert g["clean_grad_norm"] == pytest.approx(clean[group], rel=1e-5)
            assert g["grad_norm"] == pytest.approx(hand[group], rel=1e-5)
            # closed form: the module and everything before it get 0.25x, the rest 1x
            upstream = order.index(group) <= order.index(name)
            assert g["ratio"] == pytest.approx(0.25 if upstream else 1.0, rel=1e-5)
            assert g["changed"] == upstream


def test_grad_zero_on_a_residual_branch_leaves_the_skip_path():
    """bn2's output is then changed in place (``out += identity``): only bn2's own gradient
    is zeroed, exactly as if its output were detached."""
    report = invoke_json(
        "ablate", "tests.test_ablate:RESNET", "-l", "layer1.0.bn2", "--grad-op", "zero",
        "-i", "1x3x32x32",
    )  # fmt: skip
    x = seeded_input(1, 3, 32, 32)
    detached = hand_grad_norms_detached(RESNET, x, RESNET.layer1[0].bn2)
    groups = {g["group"]: g for g in report["ablations"][0]["grad_groups"]}
    for name in ("layer1.0.conv1", "layer1.0.bn1", "layer1.0.conv2", "layer1.0.bn2"):
        assert groups[name]["grad_norm"] == 0
    assert groups["conv1"]["grad_norm"] > 0  # the identity path still carries gradient
    for name, g in groups.items():
        assert g["grad_norm"] == pytest.approx(detached[name], rel=1e-5, abs=1e-12), name
    assert_no_hooks(RESNET)


def hand_grad_norms_detached(
    model: nn.Module, x: torch.Tensor, module: nn.Module
) -> dict[str, float]:
    """Grad norms when ``module``'s output is replaced by a detached copy (same values)."""
    h = module.register_forward_hook(lambda m, i, o: o.detach().clone())
    try:
        return hand_grad_norms(model, x, None, None)
    finally:
        h.remove()


# -- the model is left exactly as found ----------------------------------------------------------------
def test_model_restored_bit_identical_after_the_whole_command_in_train_mode():
    model = BN_MLP
    model.train()
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.5)

    def clean_output() -> torch.Tensor:
        model.eval()
        with torch.no_grad():
            out = model(x)
        model.train()
        return out

    before_out, before = clean_output(), state_snapshot(model)
    rng = torch.get_rng_state()
    hooks = global_hook_counts()
    result = invoke(
        "ablate", "tests.test_ablate:BN_MLP", "-l", "net.*", "--mode", "train",
        "--op", "noise:0.5", "--grad-op", "scale:2", "--format", "json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert len(json.loads(result.stdout)["ablations"]) == 9
    assert_same_state(before, state_snapshot(model))
    assert torch.equal(before_out, clean_output())
    assert torch.equal(rng, torch.get_rng_state())
    assert_no_hooks(model, hooks)
    assert all(torch.equal(p.grad, torch.full_like(p, 0.5)) for p in model.parameters())


def test_train_mode_reuses_the_dropout_masks_so_only_the_ablation_counts():
    report = invoke_json(
        "ablate", "sample_models.basic:BNMLP", "-l", "net.4", "-l", "net.3", "--mode", "train",
        "--op", "scale:1",
    )  # fmt: skip
    # scale:1 changes nothing; a different dropout mask in each pass would show here
    for row in report["ablations"]:
        assert row["rel_l2"] == 0 and row["max_abs"] == 0
    report = invoke_json(
        "ablate", "sample_models.basic:BNMLP", "-l", "net.4", "--mode", "train", "--op", "zero",
        "-i", "4x16",
    )  # fmt: skip
    model = build(BNMLP).train()
    x = seeded_input(4, 16)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    clean = run_with(model, x, [])
    model.load_state_dict(state)
    ablated = run_with(model, x, [(model.net[4], lambda m, i, o: torch.zeros_like(o))])
    assert_metrics(report["ablations"][0], reference(clean, ablated))


def test_resnet18_every_leaf_one_at_a_time_leaves_no_trace():
    x = seeded_input(1, 3, 32, 32)
    with torch.no_grad():
        before_out = RESNET(x)
    before = state_snapshot(RESNET)
    report = invoke_json(
        "ablate", "tests.test_ablate:RESNET", "-l", "*", "--leaves", "-i", "1x3x32x32"
    )
    leaves = [n for n, m in RESNET.named_modules() if not list(m.children())]
    assert sorted(r["name"] for r in report["ablations"]) == sorted(leaves)
    relu = by_name(report)["layer1.0.relu"]
    assert relu["calls"] == 2  # BasicBlock calls its ReLU twice: both calls are ablated
    with torch.no_grad():
        assert torch.equal(before_out, RESNET(x))
    assert_same_state(before, state_snapshot(RESNET))
    assert_no_hooks(RESNET)
    # one hand-checked row
    clean = run_with(RESNET, x, [])
    ablated = run_with(RESNET, x, [(RESNET.layer1[0].relu, lambda m, i, o: torch.zeros_like(o))])
    assert_metrics(relu, reference(clean, ablated))


# -- checks -------------------------------------------------------------------------------------------
def test_fail_on_flags_a_layer_that_does_nothing():
    args = ("ablate", "tests.test_ablate:Spare", "-l", "*", "--leaves", "-f", "json")
    result = invoke(*args, "--fail-on", "top1_agreement>0.99")
    assert result.exit_code == 1, result.stderr
    report = json.loads(result.stdout)
    (check,) = report["checks"]
    assert check["passed"] is False and check["name"] == "top1_agreement>0.99"
    rows = by_name(report)
    assert rows["spare"]["rel_l2"] == 0 and rows["spare"]["top1_agreement"] == 1
    assert rows["never"]["calls"] == 0 and rows["never"]["note"].startswith("never called")
    assert {"spare", "never"} <= set(check["layers"])
    assert "used" not in check["layers"] and "out" not in check["layers"]
    # scoped to a layer that matters: passes, exit 0
    ok = invoke(*args, "--fail-on", "out:top1_agreement>0.99", "--fail-on", "used:rel_l2<1e-6")
    assert ok.exit_code == 0, ok.stdout
    assert all(c["passed"] for c in json.loads(ok.stdout)["checks"])
    table = invoke("ablate", "tests.test_ablate:Spare", "-l", "spare", "--fail-on", "rel-l2<=0")
    assert table.exit_code == 1 and "FAIL  rel-l2<=0" in table.stdout


def test_a_pass_that_raises_is_reported_and_exits_4():
    result = invoke("ablate", "tests.test_ablate:Picky", "-l", "a", "-l", "b", "-f", "json")
    assert result.exit_code == 4
    report = json.loads(result.stdout)
    first, second = report["ablations"]
    assert first["name"] == "a" and "all-zero input" in first["error"]
    assert second["name"] == "b" and second["error"] is None and second["rel_l2"] == 1
    assert "1 ablation(s) made the model raise; first: a:" in result.stderr
    assert "Traceback" not in result.stderr and "all-zero input" in result.stderr


def test_ctrl_c_during_an_ablation_restores_the_model_and_exits_130():
    model = CTRL_C.train()
    before, hooks = state_snapshot(model), global_hook_counts()
    result = invoke(
        "ablate", "tests.test_ablate:CTRL_C", "-l", "b", "-l", "a", "--mode", "train",
        "--grad-op", "scale:2", "--op", "zero",
    )  # fmt: skip
    assert result.exit_code == 130 and "interrupted" in result.stderr
    assert result.stdout == ""
    assert_same_state(before, state_snapshot(model))
    assert_no_hooks(model, hooks)


def test_clean_pass_failure_names_the_module_and_leaves_no_hooks():
    hooks = global_hook_counts()
    result = invoke("ablate", "tests.test_ablate:Broken", "-l", "ok")
    assert result.exit_code == 4
    assert "bad (Linear)" in result.stderr and "Traceback" not in result.stderr
    assert global_hook_counts() == hooks


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--op", "blur"], "unknown --op"),
        (["--op", "scale"], "needs a value"),
        (["--op", "scale:x"], "not a number"),
        (["--op", "zero:1"], "takes no value"),
        (["--op", "clamp:2..1"], "LO must not be above HI"),
        (["--op", "clamp:1"], "clamp:LO..HI"),
        (["--op", "noise:-1"], "sigma must be >= 0"),
        (["--grad-op", "mean"], "unknown --grad-op"),
        (["--metric", "speed"], "unknown metric"),
        (["--metric", "grad_rel_l2"], "needs --grad-op"),
        (["--grad-op", "zero", "--metric", "kl"], "add --op"),
        (["--fail-on", "rel_l2"], "bad --fail-on"),
        (["--fail-on", "rel_l2<x"], "not a number"),
        (["--fail-on", "conv1:rel_l2<1"], "matches no module that --layer selects"),
        (["--op", "mean"], "batch of one"),
        (["--device", "meta"], "--device meta"),
        (["-l", "fc9"], "matches no module"),
    ],
)
def test_bad_options_exit_2_with_one_line(extra, message):
    result = invoke("ablate", "sample_models.basic:LeNet", "-l", "fc1", *extra)
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_logit_metrics_need_a_logits_shaped_output():
    result = invoke("ablate", "tests.test_ablate:Vector", "-l", "fc", "--metric", "top1_agreement")
    assert result.exit_code == 2 and "need(s) logits" in result.stderr
    report = invoke_json("ablate", "tests.test_ablate:Vector", "-l", "fc")
    assert report["totals"]["clean_output"]["kind"] == "tensor"
    assert report["ablations"][0]["kl"] is None


def test_progress_only_on_a_terminal(monkeypatch):
    args = ("ablate", "sample_models.basic:LeNet", "-l", "fc*")
    assert "ablate [" not in invoke(*args).stderr
    monkeypatch.setattr(ablate_cmd, "_stderr_is_tty", lambda: True)
    lines = [ln for ln in invoke(*args).stderr.splitlines() if ln.startswith("ablate [")]
    assert lines == ["ablate [1/3] fc1", "ablate [2/3] fc2", "ablate [3/3] fc3"]


def test_table_and_csv_formats():
    table = invoke(
        "ablate", "sample_models.basic:LeNet", "-l", "fc*", "--grad-op", "zero", "--op", "zero"
    )
    assert table.exit_code == 0
    assert "Top-1 agree" in table.stdout and "Grads changed in" in table.stdout
    assert "Clean output:" in table.stdout and "Ranked by:" in table.stdout
    csv = invoke("ablate", "sample_models.basic:LeNet", "-l", "fc*", "-f", "csv")
    header = csv.stdout.splitlines()[0].split(",")
    assert header[:3] == ["rank", "name", "type"] and "kl" in header
    assert len(csv.stdout.splitlines()) == 4


def test_parse_op_values():
    assert parse_op("scale:2.5").value == 2.5
    c = parse_op("clamp:..6")
    assert c.lo is None and c.hi == 6
    with pytest.raises(UsageError):
        parse_op("clamp:..")


def test_ablate_baseline_round_trip(tmp_path):
    base = tmp_path / "ablate.json"
    args = ["ablate", "sample_models:LeNet", "-l", "conv*", "--baseline", str(base)]
    first = invoke(*args, "--update-baseline")
    assert first.exit_code == 0, first.stderr
    assert json.loads(base.read_text())["command"] == "ablate"
    assert invoke(*args).exit_code == 0
    other = invoke(*args[:-2], "-l", "fc1", "--baseline", str(base))
    assert other.exit_code == 1
