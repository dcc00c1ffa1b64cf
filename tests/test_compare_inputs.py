"""`hookcli compare`'s inputs, gradients present on one side only, tolerances under
autocast and modules called in another order: each against plain PyTorch (a plain
forward on the user's values, plain autograd)."""

from __future__ import annotations

import copy
import json
import warnings
from typing import Any

import pytest
import torch
from torch import nn

from tests.conftest import invoke, invoke_json
from tests.test_compare import metrics, plain_run

T = "tests.test_compare_inputs"


class Inplace(nn.Module):
    """Its forward doubles its input in place (as some published code does); ``bug``:
    its output scaled by 1.5."""

    def __init__(self, bug=False):
        super().__init__()
        self.lin = nn.Linear(16, 4)
        self.relu = nn.ReLU(inplace=True)
        self.bug = bug
        self.example_input_array = torch.randn(2, 16)

    def forward(self, x):
        x.mul_(2)
        y = self.lin(self.relu(x))
        return y * 1.5 if self.bug else y


def _plain(bug: bool) -> torch.Tensor:
    torch.manual_seed(0)
    model = Inplace(bug).eval()
    with torch.no_grad():
        return model(model.example_input_array.clone())


# every way compare runs its passes: in step, one after the other, the extra passes of
# --copy-weights and --backward, the settings that are the process's
RUNS = [
    (),
    ("--mode", "train"),
    ("--backward",),
    ("--align", "order"),
    ("--copy-weights",),
    ("--rtol", "1e-3"),
]


@pytest.mark.parametrize("extra", RUNS, ids=lambda e: " ".join(e) or "plain")
def test_every_pass_gets_the_users_inputs_when_forward_writes_them(extra: tuple[str, ...]) -> None:
    report = invoke_json("compare", f"{T}:Inplace", f"{T}:Inplace", "--b-kwargs", "bug=True",
                         *extra)  # fmt: skip
    want_a, want_b = _plain(False), _plain(True)
    root = report["calls"][0]
    assert root["name"] == "" and root["rel_l2"] == pytest.approx(
        metrics(want_a, want_b)["rel_l2"], rel=1e-6
    )
    d = report["first_divergence"]
    assert d["module"] == ""
    at = tuple(d["worst"])
    assert d["value_a"] == pytest.approx(want_a[at].item(), rel=1e-6)
    assert d["value_b"] == pytest.approx(want_b[at].item(), rel=1e-6)
    # local: the root fed A's input (the user's) adds the scale alone
    assert root["local_rel_l2"] == pytest.approx(0.5, rel=1e-6)
    assert [r["module"] for r in report["local_ranking"] if r["rel_l2"]] == [""]


@pytest.mark.parametrize("vs", ["threads=1", "deterministic", "seed=3", "dtype=float32"])
def test_a_setting_that_changes_nothing_finds_nothing_when_forward_writes_its_input(
    vs: str,
) -> None:
    # (drawn inputs: hookcli's own tensors, which a forward can write)
    report = invoke_json("compare", f"{T}:Inplace", "--vs", vs, "-i", "2x16")
    assert report["first_divergence"] is None
    assert report["first_divergence_local"] is None
    assert all(r["max_abs"] == 0 for r in report["calls"])


def test_the_api_leaves_the_users_input_tensors_as_they_were() -> None:
    import hookcli

    torch.manual_seed(0)
    a = Inplace().eval()
    b = copy.deepcopy(a)
    x = a.example_input_array.clone()
    before = x.clone()
    report = hookcli.compare(a, b, (x,), vs=None).to_dict()
    assert torch.equal(x, before)
    assert report["first_divergence"] is None


# -- --backward: a gradient one side has and the other lacks ---------------------------------


class Det(nn.Module):
    """``bug``: the hidden state detached (no gradient reaches l1)."""

    def __init__(self, bug=False):
        super().__init__()
        self.l1 = nn.Linear(8, 8)
        self.l2 = nn.Linear(8, 8)
        self.bug = bug
        self.example_input_array = torch.randn(2, 8)

    def forward(self, x):
        h = self.l1(x)
        if self.bug:
            h = h.detach()
        return self.l2(h)


class _Twice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * 2


class GradBug(Det):
    """``bug``: the gradient doubled between l2 and l1 (the forward is the same)."""

    def forward(self, x):
        h = self.l1(x)
        if self.bug:
            h = _Twice.apply(h)
        return self.l2(h)


def _plain_grads(cls: type[nn.Module], bug: bool) -> tuple[nn.Module, dict[str, Any]]:
    """One backward from the output's sum (hookcli's default loss), with full backward
    hooks keeping each module's grad_input."""
    torch.manual_seed(0)
    model = cls(bug).eval()
    gin: dict[str, Any] = {}
    handles = [
        m.register_full_backward_hook(lambda m, gi, go, n=n: gin.__setitem__(n, gi))
        for n, m in model.named_modules()
    ]
    try:
        with warnings.catch_warnings():  # (a hook on a module whose input needs no grad)
            warnings.simplefilter("ignore", UserWarning)
            model(model.example_input_array.clone()).sum().backward()
    finally:
        for h in handles:
            h.remove()
    return model, gin


@pytest.mark.parametrize("bug_side", ["B", "A"])
def test_a_grad_none_on_one_side_is_a_divergence_that_names_the_side(bug_side: str) -> None:
    kw = "--b-kwargs" if bug_side == "B" else "--a-kwargs"
    args = ("compare", f"{T}:Det", f"{T}:Det", kw, "bug=True", "--backward")
    report = invoke_json(*args)
    a, gin_a = _plain_grads(Det, bug_side == "A")
    b, gin_b = _plain_grads(Det, bug_side == "B")
    lacking = f"no grad in {bug_side}"
    # plain autograd: l2's grad_input and l1's parameter grads exist on one side only
    assert (gin_a["l2"][0] is None) == (bug_side == "A") != (gin_b["l2"][0] is None)
    assert (a.l1.weight.grad is None) == (bug_side == "A") != (b.l1.weight.grad is None)
    rows = {r["name"]: r for r in report["calls"]}
    assert rows["l2"]["grad_input_diverged"] is True
    assert [t["problem"] for t in rows["l2"]["grad_inputs"]] == [lacking]
    assert rows["l1"]["param_grad_diverged"] is True
    assert [(p["a"], p["b"], p["problem"], p["diverged"]) for p in rows["l1"]["param_grads"]] == [
        ("weight", "weight", lacking, True),
        ("bias", "bias", lacking, True),
    ]
    # l2's own parameter grads exist on both sides and agree (plain autograd says so)
    assert torch.equal(a.l2.weight.grad, b.l2.weight.grad)
    assert rows["l2"]["param_grad_diverged"] is False
    first = report["first_grad_divergence"]
    assert (first["module"], first["what"], first["problem"]) == ("l2", "grad_input", lacking)
    # the forward is the same: the gate fails on the gradient
    assert report["first_divergence"] is None
    gate = invoke(*args, "--fail-on", "divergence")
    assert gate.exit_code == 1, gate.stdout[-800:]
    assert f"FAIL  divergence: first grad divergence at l2 <-> l2 (grad_input: {lacking})" in (
        gate.stdout
    )


def test_fail_on_divergence_with_backward_fails_on_a_gradient_error_alone() -> None:
    args = ("compare", f"{T}:GradBug", f"{T}:GradBug", "--b-kwargs", "bug=True", "--backward")
    report = invoke_json(*args)
    a, _ = _plain_grads(GradBug, False)
    b, _ = _plain_grads(GradBug, True)
    want = metrics(a.l1.weight.grad, b.l1.weight.grad)["rel_l2"]
    assert want == pytest.approx(1.0)  # doubled
    row = next(r for r in report["calls"] if r["name"] == "l1")
    assert row["param_grad_rel_l2"] == pytest.approx(want, rel=1e-6)
    assert report["first_divergence"] is None
    assert report["first_grad_divergence"]["module"] == "l1"
    gate = invoke(*args, "--fail-on", "divergence")
    assert gate.exit_code == 1, gate.stdout[-800:]
    # the same models, forward only: the gate is the forward's (unchanged) and passes
    fwd = invoke("compare", f"{T}:GradBug", f"{T}:GradBug", "--b-kwargs", "bug=True",
                 "--fail-on", "divergence")  # fmt: skip
    assert fwd.exit_code == 0, fwd.stdout[-800:]
    same = invoke("compare", f"{T}:GradBug", f"{T}:GradBug", "--backward", "--fail-on",
                  "divergence")  # fmt: skip
    assert same.exit_code == 0, same.stdout[-800:]
    assert "outputs and gradients" in same.stdout


# -- tolerances where B computes below what its outputs show -----------------------------------


class Res(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x):
        return x + self.lin(x)  # float32 under autocast: the add of a bfloat16 matmul


class ResNetTiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.blk = Res()
        self.norm = nn.LayerNorm(64)
        self.example_input_array = torch.randn(4, 64)

    def forward(self, x):
        return self.norm(self.blk(x))


class Upcast(nn.Module):
    """Logits upcast to float32 at the end, as many language models do."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.example_input_array = torch.randn(4, 16)

    def forward(self, x):
        return self.lin(x).float()


def _isclose_count(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float) -> int:
    return int((~torch.isclose(b.double(), a.double(), rtol=rtol, atol=atol)).sum())


def test_under_amp_every_pair_gets_the_autocast_dtypes_tolerance() -> None:
    from torch.testing._comparison import default_tolerances

    report = invoke_json("compare", f"{T}:ResNetTiny", "--vs", "amp=bf16")
    rtol, atol = default_tolerances(torch.bfloat16)
    torch.manual_seed(0)
    a = ResNetTiny().eval()
    b = copy.deepcopy(a)
    x = a.example_input_array
    outs_a, _ = plain_run(a, (x,))
    outs_b, _ = plain_run(b, (x,), ctx=lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    assert outs_b["blk"][0].dtype == torch.float32  # (its output shows no bfloat16)
    for row in report["calls"]:
        name = row["name"]
        (t,) = row["outputs"]
        assert (t["rtol"], t["atol"]) == (rtol, atol), name
        want = _isclose_count(outs_a[name][0], outs_b[name][0], rtol, atol)
        assert t["mismatched"] == want, name
        (lt,) = row["local_outputs"]
        assert (lt["rtol"], lt["atol"]) == (rtol, atol), name
    assert "at least bfloat16's" in invoke("compare", f"{T}:ResNetTiny", "--vs", "amp=bf16").stdout


def test_a_float32_upcast_of_half_precision_values_gets_the_half_tolerance() -> None:
    from torch.testing._comparison import default_tolerances

    report = invoke_json("compare", f"{T}:Upcast", "--vs", "dtype=float16")
    torch.manual_seed(0)
    a = Upcast().eval()
    b = copy.deepcopy(a).half()
    x = a.example_input_array
    with torch.no_grad():
        ya, yb = a(x), b(x.half())
    assert yb.dtype == torch.float32
    rtol, atol = default_tolerances(torch.float16)
    (t,) = report["calls"][0]["outputs"]
    assert (t["rtol"], t["atol"]) == (rtol, atol)
    assert t["mismatched"] == _isclose_count(ya, yb, rtol, atol)
    # the given value wins over the default
    given = invoke_json("compare", f"{T}:Upcast", "--vs", "dtype=float16", "--rtol", "0.5")
    assert given["calls"][0]["outputs"][0]["rtol"] == 0.5


# -- a module called several times, in another order on B's side ------------------------------


class Order(nn.Module):
    """One ReLU after each of two layers; ``swap``: B's code calls the second first."""

    def __init__(self, swap=False):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.swap = swap
        self.r = nn.ReLU()
        self.example_input_array = torch.randn(2, 8)

    def forward(self, x):
        if self.swap:
            yb = self.r(self.b(x))
            ya = self.r(self.a(x))
        else:
            ya = self.r(self.a(x))
            yb = self.r(self.b(x))
        return ya - yb


def _plain_calls(model: nn.Module, name: str) -> list[torch.Tensor]:
    """The outputs of each call of ``name`` in a plain forward (one plain hook)."""
    outs: list[torch.Tensor] = []
    h = model.get_submodule(name).register_forward_hook(lambda m, a, o: outs.append(o.detach()))
    try:
        with torch.no_grad():
            model(model.example_input_array)
    finally:
        h.remove()
    return outs


@pytest.mark.parametrize("extra", [(), ("--backward",)], ids=["in step", "one after the other"])
def test_calls_in_another_order_pair_by_their_place(extra: tuple[str, ...]) -> None:
    args = ("compare", f"{T}:Order", f"{T}:Order", "--b-kwargs", "swap=True", *extra)
    report = invoke_json(*args)
    torch.manual_seed(0)
    ra = _plain_calls(Order().eval(), "r")
    torch.manual_seed(0)
    rb = _plain_calls(Order(swap=True).eval(), "r")
    # plain hooks: A's first ReLU call is B's second (pairing by number compares apples
    # with pears)
    assert torch.equal(ra[0], rb[1]) and torch.equal(ra[1], rb[0])
    assert metrics(ra[0], rb[0])["rel_l2"] > 0.1
    rows = {(r["name"], r["call"]): r for r in report["calls"]}
    assert rows[("r", 0)]["partner_call"] == 1 and rows[("r", 1)]["partner_call"] == 0
    assert rows[("r", 0)]["rel_l2"] == metrics(ra[0], rb[1])["rel_l2"] == 0
    assert report["first_divergence"] is None and report["first_divergence_local"] is None
    gate = invoke(*args, "--fail-on", "divergence")
    assert gate.exit_code == 0, gate.stdout[-800:]
    assert "r: B calls it in another order" in gate.stdout
    assert "= #1" in gate.stdout  # the partner's call in the table


class Slices(nn.Module):
    """One ReLU on x, on its first half, on 2x; ``swap``: the first two in another order
    (the places alone cannot tell which is which: the input shapes can)."""

    def __init__(self, swap=False):
        super().__init__()
        self.r = nn.ReLU()
        self.swap = swap
        self.example_input_array = torch.randn(2, 8)

    def forward(self, x):
        if self.swap:
            v = self.r(x[:, :4])
            u = self.r(x)
        else:
            u = self.r(x)
            v = self.r(x[:, :4])
        w = self.r(x * 2)
        return u + w, v


class Host(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x, act=None):
        h = x * self.scale
        return act(h) if act is not None else h


class Placed(nn.Module):
    """One ReLU the root owns, run inside ``p`` (``moved``: inside ``q``) and at the end;
    the outputs agree (ReLU(6x) = 3 ReLU(2x)), the ReLU's first calls do not."""

    def __init__(self, moved=False):
        super().__init__()
        self.act = nn.ReLU()
        self.p = Host(2.0)
        self.q = Host(3.0)
        self.moved = moved
        self.example_input_array = torch.randn(2, 8)

    def forward(self, x):
        y = self.p(x, None if self.moved else self.act)
        return self.act(self.q(y, self.act if self.moved else None))


def test_a_call_paired_by_number_in_another_parent_is_noted_and_never_the_first_divergence():
    args = ("compare", f"{T}:Placed", f"{T}:Placed", "--b-kwargs", "moved=True")
    report = invoke_json(*args)
    torch.manual_seed(0)
    a = Placed().eval()
    torch.manual_seed(0)
    b = Placed(moved=True).eval()
    ya, yb = _plain_calls(a, "act"), _plain_calls(b, "act")
    pa, pb = _plain_calls(a, "p"), _plain_calls(b, "p")
    assert metrics(ya[0], yb[0])["rel_l2"] > 0.1  # the act calls differ (other inputs)
    assert metrics(pa[0], pb[0])["rel_l2"] > 0.1  # and so does p's output
    rows = {(r["name"], r["call"]): r for r in report["calls"]}
    assert rows[("act", 0)]["diverged"] is True  # compared all the same
    assert rows[("", 0)]["max_abs"] == 0
    # the first call that differs and is surely the same call on both sides: p
    assert report["first_divergence"]["module"] == "p"
    text = invoke(*args).stdout
    assert "act: call(s) #0 paired by number, though B's runs in another parent call" in text


class Extra(nn.Module):
    """A: r(e(a(x))) then r(b(x)), e an Identity B lacks (``plain``); B calls the b
    branch first."""

    def __init__(self, plain=False):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.r = nn.ReLU()
        if not plain:
            self.e = nn.Identity()
        self.plain = plain
        self.example_input_array = torch.randn(2, 8)

    def forward(self, x):
        if self.plain:
            yb = self.r(self.b(x))
            ya = self.r(self.a(x))
        else:
            ya = self.r(self.e(self.a(x)))
            yb = self.r(self.b(x))
        return ya - yb


def test_a_call_after_one_with_no_partner_pairs_by_the_nearest_call_before_it():
    args = ("compare", f"{T}:Extra", f"{T}:Extra", "--b-kwargs", "plain=True")
    report = invoke_json(*args)
    ra, rb = _plain_calls(Extra(), "r"), _plain_calls(Extra(plain=True), "r")
    # plain hooks: A's first ReLU (of the a branch) is B's second
    assert torch.equal(ra[0], rb[1]) and torch.equal(ra[1], rb[0])
    assert metrics(ra[0], rb[0])["rel_l2"] > 0.1
    rows = {(r["name"], r["call"]): r for r in report["calls"]}
    assert rows[("r", 0)]["partner_call"] == 1 and rows[("r", 1)]["partner_call"] == 0
    assert rows[("r", 0)]["max_abs"] == 0 and rows[("r", 1)]["max_abs"] == 0
    assert report["first_divergence"] is None
    gate = invoke(*args, "--fail-on", "divergence")
    assert gate.exit_code == 0, gate.stdout[-800:]


class _R(nn.Module):
    def __init__(self, fail):
        super().__init__()
        self.fail = fail
        self.n = 0

    def forward(self, x):
        self.n += 1
        if self.fail and self.n == 2:
            raise RuntimeError("r fails on its 2nd call")
        return torch.relu(x)


class Swapped(nn.Module):
    """``swap``: B calls r on the b branch first; ``fail``: r raises on its 2nd call."""

    def __init__(self, swap=False, fail=False):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.r = _R(fail)
        self.swap = swap
        self.example_input_array = torch.randn(2, 8)

    def forward(self, x):
        self.r.n = 0
        if self.swap:
            yb = self.r(self.b(x))
            ya = self.r(self.a(x))
        else:
            ya = self.r(self.a(x))
            yb = self.r(self.b(x))
        return ya - yb


def test_after_a_failure_calls_in_another_order_still_pair_by_their_place():
    args = ("compare", f"{T}:Swapped", f"{T}:Swapped", "--b-kwargs", "swap=True")
    result = invoke(*args, "--b-kwargs", "fail=True", "-f", "json", "--fail-on", "divergence")
    assert result.exit_code == 4, result.stdout[-800:]
    report = json.loads(result.stdout)
    ra = _plain_calls(Swapped(), "r")
    rb = _plain_calls(Swapped(swap=True), "r")
    # plain hooks: B's first r call (the one that returns) is A's second
    assert torch.equal(ra[1], rb[0]) and metrics(ra[0], rb[0])["rel_l2"] > 0.1
    rows = {(r["name"], r["call"]): r for r in report["calls"]}
    assert rows[("r", 1)]["partner_call"] == 0 and rows[("r", 1)]["max_abs"] == 0
    assert rows[("r", 0)]["partner"] is None  # its place partner is B's call that failed
    assert report["first_divergence"] is None
    text = invoke(*args, "--b-kwargs", "fail=True").stdout
    (line,) = [ln for ln in text.splitlines() if "failed here (B)" in ln]
    assert line.split()[0] == "r" and "#1" not in line.split("<-")[0]
