"""`hookcli compare`: every figure against plain PyTorch hooks, planted bugs found where
they were planted, torch.ao's numeric suite for dynamic int8, and the refusals."""

from __future__ import annotations

import copy
import json
import math
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from tests.conftest import assert_no_hooks, invoke, invoke_json
from tests.test_compare_models import BUGS, ConvNet, Decoder, MLPNet

M = "tests.test_compare_models"


# -- the independent reference: plain hooks on every module ---------------------------------


def plain_run(
    model: nn.Module,
    args: tuple[Any, ...],
    feed: dict[str, list[tuple[torch.Tensor, ...]]] | None = None,
    ctx: Callable[[], Any] | None = None,
) -> tuple[dict[str, list[torch.Tensor]], dict[str, list[tuple[torch.Tensor, ...]]]]:
    """Every module's output per call (and its inputs); ``feed``: the input of each module
    it names replaced by the given one (cast to the dtype of its own)."""
    outs: dict[str, list[torch.Tensor]] = {}
    ins: dict[str, list[tuple[torch.Tensor, ...]]] = {}
    handles = []
    for name, m in model.named_modules():

        def pre(mod: nn.Module, a: tuple[Any, ...], name: str = name) -> Any:
            k = len(ins.get(name, []))
            ins.setdefault(name, []).append(tuple(t.detach().clone() for t in a))
            if feed is None or name not in feed:
                return None
            src = feed[name][k]
            return tuple(
                s.to(o.dtype) if o.is_floating_point() else s for s, o in zip(src, a, strict=True)
            )

        def post(mod: nn.Module, a: Any, out: torch.Tensor, name: str = name) -> None:
            outs.setdefault(name, []).append(out.detach().clone())

        handles.append(m.register_forward_pre_hook(pre))
        handles.append(m.register_forward_hook(post))
    try:
        with torch.no_grad(), ctx() if ctx else torch.no_grad():
            model(*args)
    finally:
        for h in handles:
            h.remove()
    return outs, ins


def metrics(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    a, b = a.double(), b.double()
    d = b - a
    na, nb, nd = a.norm().item(), b.norm().item(), d.norm().item()
    return {
        "max_abs": d.abs().max().item(),
        "rel_l2": nd / na,
        "cosine": (a * b).sum().item() / (na * nb),
        "sqnr_db": math.inf if nd == 0 else 10 * math.log10(na * na / (nd * nd)),
    }


def close(got: Any, want: float, rel: float = 1e-6) -> bool:
    got = float(got)
    if math.isinf(want) or math.isinf(got):
        return got == want
    return math.isclose(got, want, rel_tol=rel, abs_tol=1e-12)


def check_rows(report: dict[str, Any], want: dict[str, list[dict[str, float]]], prefix: str):
    checked = 0
    for row in report["calls"]:
        name = row["name"]
        if name not in want:
            continue
        expect = want[name][row["call"]]
        for key, value in expect.items():
            assert close(row[prefix + key], value), (prefix, name, key, row[prefix + key], value)
        checked += 1
    assert checked == len(report["calls"])


# -- planted bugs ------------------------------------------------------------------------------


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_planted_bug_is_the_first_divergence_and_tops_the_local_ranking(bug: str) -> None:
    report = invoke_json("compare", f"{M}:Decoder", f"{M}:Decoder", "--b-kwargs", f"bug={bug!r}")
    where = BUGS[bug]
    assert report["first_divergence"]["module"] == where
    assert report["first_divergence"]["partner"] == where
    assert report["first_divergence"]["call"] == 0
    assert report["first_divergence_local"]["module"] == where
    assert report["local_ranking"][0]["module"] == where
    # the bug's module alone adds error; every other aligned call's local output is exact
    rows = {r["name"]: r for r in report["calls"]}
    assert rows[where]["local_rel_l2"] > 0
    assert all(r["local_max_abs"] == 0 for n, r in rows.items() if not where.startswith(n))
    # A's value at the worst element is the correct model's, from a plain hook
    torch.manual_seed(0)
    model = Decoder().eval()
    outs, _ = plain_run(model, (model.example_input_array,))
    d = report["first_divergence"]
    assert outs[where][0][tuple(d["worst"])].item() == pytest.approx(d["value_a"], rel=1e-7)


def test_fail_on_divergence_exits_1_and_names_the_module() -> None:
    result = invoke(
        "compare", f"{M}:Decoder", f"{M}:Decoder", "--b-kwargs", "bug='scale'",
        "--fail-on", "divergence",
    )  # fmt: skip
    assert result.exit_code == 1, result.stderr
    assert "first divergence at h.1.attn" in result.stdout
    same = invoke("compare", f"{M}:Decoder", f"{M}:Decoder", "--fail-on", "divergence")
    assert same.exit_code == 0, same.stderr


# -- --vs amp / dtype against plain PyTorch ----------------------------------------------------


def _vs_reference(cls: type[nn.Module], vs: str) -> tuple[dict, dict]:
    torch.manual_seed(0)
    a = cls().eval()
    x = a.example_input_array
    b = copy.deepcopy(a)
    xb = x
    ctx = None
    if vs == "dtype=float16":
        b.half()
        xb = x.half() if x.is_floating_point() else x
    else:

        def ctx() -> Any:
            return torch.autocast("cpu", dtype=torch.bfloat16)

    outs_a, ins_a = plain_run(a, (x,))
    outs_b, _ = plain_run(b, (xb,), ctx=ctx)
    prop = {n: [metrics(p, q) for p, q in zip(outs_a[n], outs_b[n], strict=True)] for n in outs_a}
    return prop, local_reference(b, (xb,), ins_a, outs_a, ctx)


def local_reference(
    model: nn.Module,
    args: tuple[Any, ...],
    ins_a: dict[str, list[tuple[torch.Tensor, ...]]],
    outs_a: dict[str, list[torch.Tensor]],
    ctx: Callable[[], Any] | None = None,
) -> dict[str, list[dict[str, float]]]:
    """The local figures from plain hooks, in one run of B: every module gets A's input
    and hands A's output on (cast to B's dtype), so each adds only its own code's error;
    a module's figures are the worst (by relative L2) of its output's and of the inputs
    its code gave its children."""
    found: dict[str, list[list[dict[str, float]]]] = {}
    stack: list[tuple[str, int]] = []
    calls: dict[str, int] = {}
    handles = []
    for name, m in model.named_modules():

        def pre(mod: nn.Module, a: tuple[Any, ...], name: str = name) -> Any:
            k = calls.get(name, 0)
            calls[name] = k + 1
            src = ins_a[name][k]
            if stack:
                outer, ok = stack[-1]
                if any(not torch.equal(s.to(o.dtype), o) for s, o in zip(src, a, strict=True)):
                    found[outer][ok].append(metrics(src[0], a[0]))
            stack.append((name, k))
            found.setdefault(name, []).append([])
            return tuple(s.to(o.dtype) for s, o in zip(src, a, strict=True))

        def post(mod: nn.Module, a: Any, out: torch.Tensor, name: str = name) -> Any:
            _, k = stack.pop()
            found[name][k].append(metrics(outs_a[name][k], out))
            return outs_a[name][k].to(out.dtype)

        handles.append(m.register_forward_pre_hook(pre))
        handles.append(m.register_forward_hook(post))
    try:
        with torch.no_grad(), ctx() if ctx else torch.no_grad():
            model(*args)
    finally:
        for h in handles:
            h.remove()
    return {
        n: [max(c, key=lambda f: f["rel_l2"]) for c in per_call] for n, per_call in found.items()
    }


@pytest.mark.parametrize("cls", [ConvNet, Decoder])
@pytest.mark.parametrize("vs", ["amp=bf16", "dtype=float16"])
def test_vs_every_error_equals_plain_hooks(cls: type[nn.Module], vs: str) -> None:
    report = invoke_json("compare", f"{M}:{cls.__name__}", "--vs", vs)
    prop, loc = _vs_reference(cls, vs)
    check_rows(report, prop, "")
    check_rows(report, loc, "local_")
    assert report["first_divergence"] is not None  # half precision parts from float32
    assert report["settings"]["vs"] == [vs]


# -- dynamic int8 against torch.ao's numeric suite --------------------------------------------


def test_quantize_dynamic_matches_torch_ao_numeric_suite() -> None:
    from torch.ao.ns._numeric_suite import compare_model_outputs
    from torch.ao.ns.fx.utils import (
        compute_cosine_similarity,
        compute_normalized_l2_error,
        compute_sqnr,
    )

    report = invoke_json("compare", f"{M}:MLPNet", "--vs", "quantize=dynamic")
    torch.manual_seed(0)
    fmodel = MLPNet().eval()
    x = fmodel.example_input_array
    qmodel = torch.ao.quantization.quantize_dynamic(copy.deepcopy(fmodel), {nn.Linear}, torch.qint8)
    acts = compare_model_outputs(copy.deepcopy(fmodel), qmodel, x)
    rows = {r["name"]: r for r in report["calls"]}
    assert acts
    for key, pair in acts.items():
        name = key.removesuffix(".stats")
        f, q = pair["float"][0], pair["quantized"][0]
        row = rows[name]
        assert close(row["sqnr_db"], compute_sqnr(f, q).item(), 1e-4)
        assert close(row["rel_l2"], compute_normalized_l2_error(f, q).item(), 1e-4)
        assert close(row["cosine"], compute_cosine_similarity(f, q).item(), 1e-4)
    assert {k.removesuffix(".stats") for k in acts} == {"fc1", "fc2", "fc3"}


# -- alignment ----------------------------------------------------------------------------------


class Renamed(nn.Module):
    """MLPNet with other names: pairs with it by call order only."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(16, 32)
        self.relu = nn.ReLU()
        self.middle = nn.Linear(32, 32)
        self.last = nn.Linear(32, 4)

    def forward(self, x):
        return self.last(self.relu(self.middle(self.relu(self.first(x)))))


def test_order_alignment_prints_rules_that_reproduce_it(tmp_path: Any) -> None:
    a, b = f"{M}:MLPNet", "tests.test_compare:Renamed"
    report = invoke_json("compare", a, b, "-i", "4x16", "--copy-weights")
    assert report["settings"]["align"] == "order"
    pairs = {r["name"]: r["partner"] for r in report["calls"]}
    assert pairs["fc1"] == "first" and pairs["fc2"] == "middle" and pairs["fc3"] == "last"
    assert report["first_divergence"] is None  # the weights were copied: the same function
    printed = invoke("compare", a, b, "-i", "4x16", "--print-map")
    assert printed.exit_code == 0, printed.stderr
    assert "fc1=first" in printed.stdout.splitlines()
    rules = tmp_path / "map.txt"
    rules.write_text(printed.stdout)
    again = invoke_json("compare", a, b, "-i", "4x16", "--map-file", str(rules), "--copy-weights")
    assert again["settings"]["align"] == "names"
    assert {r["name"]: r["partner"] for r in again["calls"]} == pairs


def test_map_rules_with_an_index() -> None:
    from hookcli.compare.align import parse_rule

    rule = parse_rule("transformer.h.{i}.attn=model.layers.{i}.self_attn")
    assert rule.apply("transformer.h.3.attn") == "model.layers.3.self_attn"
    assert rule.apply("transformer.h.3.attn.c_proj") == "model.layers.3.self_attn.c_proj"
    assert rule.apply("transformer.h.3.attention") is None


def test_unaligned_modules_are_listed() -> None:
    report = invoke_json("compare", f"{M}:MLPNet", "tests.test_compare:Renamed", "-i", "4x16",
                         "--align", "names")  # fmt: skip
    names_a = {u["name"] for u in report["unaligned_a"]}
    assert {"fc1", "fc2", "fc3", "act"} <= names_a
    assert {r["name"] for r in report["unaligned_b"]} >= {"first", "middle", "last", "relu"}


def test_meta_compares_shapes_only() -> None:
    result = invoke("compare", f"{M}:Decoder", "--vs", "dtype=bfloat16", "--device", "meta",
                    "--format", "json")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["first_divergence"] is None
    assert report["values_compared"] is False
    assert all(r["rel_l2"] is None for r in report["calls"])
    assert all(r["partner_output_shapes"] == r["output_shapes"] for r in report["calls"])
    table = invoke("compare", f"{M}:Decoder", "--vs", "dtype=bfloat16", "--device", "meta")
    assert "on meta: alignment and shapes only" in table.stdout


# -- refusals -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, words",
    [
        (("--vs", "colour=red"), "unknown setting 'colour'"),
        (("--vs", "amp=fp8"), "amp must be one of"),
        (("--vs", "quantize=static"), "only quantize=dynamic"),
        ((f"{M}:MLPNet", "--vs", "seed=1"), "give one of them"),
        ((f"{M}:ConvNet", "--map", "a.b"), "A_PATTERN=B_PATTERN"),
    ],
)
def test_bad_input_is_exit_2_with_one_line(args: tuple[str, ...], words: str) -> None:
    result = invoke("compare", f"{M}:ConvNet", *args)
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    assert words in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_nothing_aligned_is_exit_2() -> None:
    result = invoke("compare", f"{M}:ConvNet", f"{M}:MLPNet", "--align", "names",
                    "--map", "(root)=elsewhere", "-i", "2x3x16x16")  # fmt: skip
    assert result.exit_code == 2, result.stderr
    assert "nothing aligned" in result.stderr


class Scaled(Renamed):
    """Renamed with one parameter more, which nothing in MLPNet can fill."""

    def __init__(self):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return super().forward(x) * self.gain


def test_copy_weights_refuses_what_cannot_be_filled() -> None:
    result = invoke("compare", f"{M}:MLPNet", "tests.test_compare:Scaled", "--copy-weights")
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    assert "--copy-weights cannot fill B: B's gain" in result.stderr


def test_models_are_left_as_found() -> None:
    import hookcli

    torch.manual_seed(0)
    a = Decoder().eval()
    b = Decoder(bug="gelu").eval()
    b.load_state_dict(a.state_dict())
    report = hookcli.compare(a, b, (a.example_input_array,))
    assert report.to_dict()["first_divergence"]["module"] == "h.1.mlp.act"
    assert_no_hooks(a)
    assert_no_hooks(b)
    assert not a.training and not b.training


# -- --backward against plain autograd ----------------------------------------------------------


def test_backward_grads_equal_plain_autograd() -> None:
    report = invoke_json("compare", f"{M}:MLPNet", "--vs", "dtype=bfloat16", "--backward")
    torch.manual_seed(0)
    a = MLPNet().train(False)
    x = a.example_input_array
    b = copy.deepcopy(a).to(torch.bfloat16)
    grads_in: dict[str, dict[str, torch.Tensor]] = {"a": {}, "b": {}}
    for side, model, inp in (("a", a, x), ("b", b, x.to(torch.bfloat16))):
        handles = [
            m.register_full_backward_hook(
                lambda mod, gi, go, n=n, s=side: grads_in[s].__setitem__(n, gi[0])
            )
            for n, m in model.named_modules()
            if n
        ]
        model(inp).float().sum().backward() if side == "b" else model(inp).sum().backward()
        for h in handles:
            h.remove()
    rows = {r["name"]: r for r in report["calls"]}
    for name in ("fc1", "fc2", "fc3"):
        pa = dict(a.get_submodule(name).named_parameters())
        pb = dict(b.get_submodule(name).named_parameters())
        worst = max(metrics(pa[k].grad, pb[k].grad)["rel_l2"] for k in pa)
        assert close(rows[name]["param_grad_rel_l2"], worst), name
    for name in ("fc2", "fc3"):  # fc1's input needs no grad: it has no grad_input
        want = metrics(grads_in["a"][name], grads_in["b"][name])["rel_l2"]
        assert close(rows[name]["grad_input_rel_l2"], want), name
    assert report["first_grad_divergence"]["module"] == "fc3"  # backward starts there
    # the note says what local means for gradients
    table = invoke("compare", f"{M}:MLPNet", "--vs", "dtype=bfloat16", "--backward")
    assert "local grads are B's module's own backward" in table.stdout, table.stdout[:500]


def test_html_page_charts_both_modes_and_marks_the_first_divergence(tmp_path: Any) -> None:
    page = tmp_path / "compare.html"
    result = invoke("compare", f"{M}:Decoder", f"{M}:Decoder", "--b-kwargs", "bug='gelu'",
                    "-o", str(page))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    text = page.read_text()
    assert "Error per module: relative L2, propagated and local" in text
    svg = text[text.index("<svg") : text.index("</svg>")]
    for word in ("propagated", "local", "first divergence", "h.1.mlp.act"):
        assert word in svg, word


# -- the other --vs settings, calls compared call by call, failures -------------------------------


class Dropped(nn.Module):
    """A dropout between two linears: in train mode its mask follows the seed."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.drop = nn.Dropout(0.5)
        self.fc2 = nn.Linear(16, 2)
        self.example_input_array = torch.randn(4, 8)

    def forward(self, x):
        return self.fc2(self.drop(self.fc1(x)))


def test_vs_seed_changes_dropout_masks_in_train_mode_only() -> None:
    args = ("compare", "tests.test_compare:Dropped", "--mode", "train")
    other = invoke_json(*args, "--vs", "seed=1")
    assert other["first_divergence"]["module"] == "drop"
    same = invoke_json(*args, "--vs", "seed=0")
    assert same["first_divergence"] is None
    evaluated = invoke_json("compare", "tests.test_compare:Dropped", "--vs", "seed=1")
    assert evaluated["first_divergence"] is None


def test_vs_threads_deterministic_compile_change_nothing_here_and_are_put_back() -> None:
    threads = torch.get_num_threads()
    det = torch.are_deterministic_algorithms_enabled()
    for vs in ("threads=1", "deterministic", "compile=eager"):
        report = invoke_json("compare", f"{M}:MLPNet", "--vs", vs)
        assert report["settings"]["vs"] == [vs]
        rows = report["calls"]
        assert all(r["partner"] == r["name"] for r in rows)
        assert all(r["max_abs"] is not None and r["max_abs"] <= 1e-6 for r in rows), vs
    assert torch.get_num_threads() == threads
    assert torch.are_deterministic_algorithms_enabled() == det


def test_vs_device_cuda_compares_or_refuses() -> None:
    result = invoke("compare", f"{M}:MLPNet", "--vs", "device=cuda", "--format", "json")
    if torch.cuda.is_available():
        assert result.exit_code == 0, result.stderr
        report = json.loads(result.stdout)
        assert report["settings"]["b"]["device"].startswith("cuda")
        assert all(r["rel_l2"] < 1e-3 for r in report["calls"])
    else:
        assert result.exit_code == 2
        assert len(result.stderr.strip().splitlines()) == 1


def test_a_module_called_twice_is_compared_call_by_call() -> None:
    report = invoke_json("compare", f"{M}:MLPNet", "--vs", "dtype=float64")
    acts = [r for r in report["calls"] if r["name"] == "act"]
    assert [(r["call"], r["partner_call"]) for r in acts] == [(0, 0), (1, 1)]
    assert acts[0]["output_shapes"] == acts[1]["output_shapes"] == [[4, 32]]


class Raises(Renamed):
    def forward(self, x):
        raise ValueError("no")


def test_a_side_that_raises_is_exit_4_naming_the_side() -> None:
    result = invoke("compare", f"{M}:MLPNet", "tests.test_compare:Raises", "-i", "4x16")
    assert result.exit_code == 4
    assert result.stderr.startswith("hookcli: error: B: forward failed")


@pytest.mark.parametrize(
    "a, b", [("resnet18", "--vs=dtype=bfloat16"), ("timm:resnet18", "resnet18")]
)
def test_other_model_forms_on_meta(a: str, b: str) -> None:
    pytest.importorskip("timm")
    report = invoke_json("compare", a, b, "--device", "meta")
    assert report["values_compared"] is False
    convs = [r for r in report["calls"] if r["type"] == "Conv2d"]
    assert len(convs) == 20 and all(r["partner"] is not None for r in convs)


def test_vs_weights_file_names_the_module_whose_weights_differ(tmp_path: Any) -> None:
    torch.manual_seed(0)
    state = MLPNet().state_dict()
    state["fc2.weight"] = state["fc2.weight"] + 0.01
    path = tmp_path / "other.pt"
    torch.save(state, path)
    report = invoke_json("compare", f"{M}:MLPNet", "--vs", f"weights={path}")
    assert report["first_divergence"]["module"] == "fc2"
    assert report["local_ranking"][0]["module"] == "fc2"
    rows = {r["name"]: r for r in report["calls"]}
    assert rows["fc1"]["max_abs"] == 0 and rows["fc3"]["local_max_abs"] == 0


@pytest.mark.parametrize("fmt", ["csv", "markdown"])
def test_csv_and_markdown_carry_the_call_rows(fmt: str) -> None:
    result = invoke("compare", f"{M}:MLPNet", "--vs", "dtype=float16", "--format", fmt)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    head = lines[0] if fmt == "csv" else next(ln for ln in lines if ln.startswith("| "))
    for key in ("name", "partner", "rel_l2", "local_rel_l2", "sqnr_db", "outputs"):
        assert key in head, key
    assert "fc3" in result.stdout


_DECODERS = ("compare", f"{M}:Decoder", f"{M}:Decoder", "--b-kwargs", "bug='gelu'")


@pytest.fixture
def handoffs(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every ``record.Handoff`` made (one per mode that runs A and B in step)."""
    from hookcli.compare import record

    made: list[Any] = []
    real = record.Handoff.__init__

    def init(self: record.Handoff, wanted: Any) -> None:
        real(self, wanted)
        made.append(self)

    monkeypatch.setattr(record.Handoff, "__init__", init)
    return made


def test_in_step_a_lends_its_outputs_and_keeps_no_copy(
    monkeypatch: pytest.MonkeyPatch, handoffs: list[Any]
) -> None:
    """Two models named alike run in step: every output of A that B measures is lent, not
    copied (issue 47's cost: no copy of a whole activation beyond one module's), and the
    figures are those of the run one after the other (itself checked against plain hooks
    above)."""
    from hookcli.compare import runner

    made = handoffs
    stepped = invoke_json(*_DECODERS)
    assert len(made) == 2  # the propagated mode and the local mode
    # A's pass ran in a greenlet beside B's: the grad modes they entered are left as found
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    assert all(h.copied == 0 and not h.items for h in made)
    monkeypatch.setattr(runner, "_can_step", lambda *a: False)
    apart = invoke_json(*_DECODERS)
    assert len(made) == 2
    keys = ("max_abs", "rel_l2", "cosine", "local_max_abs", "local_rel_l2", "local_cosine")
    for r, s in zip(stepped["calls"], apart["calls"], strict=True):
        assert [r[k] for k in keys] == [s[k] for k in keys], r["name"]
    assert stepped["first_divergence"] == apart["first_divergence"]


def test_under_a_profiler_a_and_b_run_one_after_the_other(handoffs: list[Any]) -> None:
    """A profiler keeps one frame stack per thread (cProfile crashes when a switch between
    two forwards crosses it): under one, compare does not run A and B in step, and its
    figures are the same."""
    import cProfile
    import sys

    made = handoffs
    stepped = invoke_json(*_DECODERS)
    assert len(made) == 2
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        profiled = invoke_json(*_DECODERS)
    finally:
        profiler.disable()
    assert sys.getprofile() is None
    assert len(made) == 2  # no run in step under the profiler
    assert profiled["first_divergence"] == stepped["first_divergence"]
    keys = ("max_abs", "rel_l2", "local_max_abs", "local_rel_l2")
    for r, s in zip(stepped["calls"], profiled["calls"], strict=True):
        assert [r[k] for k in keys] == [s[k] for k in keys], r["name"]


def test_ctrl_c_in_a_stops_b_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A KeyboardInterrupt raised in A's forward (run in step, in its greenlet) reaches the
    caller before B's forward goes on to its end, and both models are left as found."""
    from hookcli.api import compare
    from tests.test_compare_models import Decoder

    a, b = Decoder(), Decoder()
    calls_b: list[str] = []
    b.register_forward_hook(lambda *_: calls_b.append("root"))
    for name, m in b.named_modules():
        if name:
            m.register_forward_hook(lambda mod, i, o, name=name: calls_b.append(name))
    block = next(m for name, m in a.named_modules() if name.endswith("mlp"))

    def interrupt(*_: Any) -> None:
        raise KeyboardInterrupt

    handle = block.register_forward_hook(interrupt)
    before_a, before_b = len(a._forward_hooks), len(b._forward_hooks)
    x = torch.randint(0, 50, (2, 8))
    with pytest.raises(KeyboardInterrupt):
        compare(a, b, (x,))
    handle.remove()
    assert "root" not in calls_b  # B stopped before the end of its forward
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    assert len(a._forward_hooks) == before_a and len(b._forward_hooks) == before_b


class _Noisy(nn.Module):  # draws from the global generator in eval (as some models do)
    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        x = self.l1(x)
        x = x + torch.randn_like(x)
        x = self.l2(x)
        x = x + torch.randn_like(x)
        return self.l3(x)


class _Autocast(nn.Module):  # an autocast region of its own, around one child
    def __init__(self, on):
        super().__init__()
        self.on = on
        self.l1, self.l2, self.l3 = nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 64)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.on):
            x = self.l1(x)
        with warnings.catch_warnings():
            warnings.simplefilter("error" if self.on else "ignore")
            x = self.l2(x.float())
        return self.l3(x)


def _in_step_and_apart(
    monkeypatch: pytest.MonkeyPatch, a: nn.Module, b: nn.Module, x: torch.Tensor
) -> tuple[Any, Any]:
    from hookcli.api import compare
    from hookcli.compare import runner

    stepped = compare(a, b, (x,)).to_dict()
    with monkeypatch.context() as m:
        m.setattr(runner, "_can_step", lambda *_: False)
        apart = compare(a, b, (x,)).to_dict()
    return stepped, apart


def test_in_step_each_side_keeps_its_random_generator_autocast_and_warning_filters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A and B share one thread when in step: what one model's forward sets for the thread
    (draws from the random generator, an autocast region, warning filters) is its own, as
    when they run one after the other (the oracle here: a copy of A draws the same noise
    and matches A exactly; B's bf16 region is the first divergence)."""
    import copy

    torch.manual_seed(0)
    a = _Noisy().eval()
    stepped, apart = _in_step_and_apart(monkeypatch, a, copy.deepcopy(a), torch.randn(2, 8))
    assert [c["max_abs"] for c in stepped["calls"]] == [0.0] * 4
    assert stepped["first_divergence"] is None and apart["first_divergence"] is None
    filters = list(warnings.filters)
    a2 = _Autocast(False).eval()
    b2 = copy.deepcopy(a2)
    b2.on = True
    stepped, apart = _in_step_and_apart(monkeypatch, a2, b2, torch.randn(4, 64))
    assert stepped["first_divergence"]["module"] == "l1"
    for s, p in zip(stepped["calls"], apart["calls"], strict=True):
        assert s["max_abs"] == p["max_abs"], s["name"]
    assert list(warnings.filters) == filters
    assert not torch.is_autocast_enabled("cpu") and torch.is_grad_enabled()


def test_an_error_in_b_stops_a_where_it_is() -> None:
    """B fails at its first module: A's forward is not run on to its end (it had not
    started), the error names B, and both models are left as found."""
    from hookcli.api import compare
    from hookcli.errors import RunError
    from tests.test_compare_models import Decoder

    a, b = Decoder(), Decoder()
    ran_a: list[str] = []
    for name, m in a.named_modules():
        m.register_forward_hook(lambda *_, name=name: ran_a.append(name))

    def boom(*_: Any) -> None:
        raise ValueError("boom in B")

    first_b = next(m for name, m in b.named_modules() if name)
    handle = first_b.register_forward_pre_hook(boom)
    with pytest.raises(RunError, match="boom in B"):
        compare(a, b, (torch.randint(0, 50, (2, 8)),))
    handle.remove()
    assert "" not in ran_a  # A's root never returned
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()


class _Scaled(nn.Module):  # returns its child's output, scaled in place after the child
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        out = self.fc(x)
        if self.scale != 1.0:
            out.mul_(self.scale)
        return out


class _Stack(nn.Module):
    def __init__(self, scale=1.0):
        super().__init__()
        self.body = nn.Sequential(_Scaled(1.0), nn.ReLU(inplace=True), _Scaled(scale))

    def forward(self, x):
        return self.body(x)


def test_an_output_measured_already_is_measured_again_when_either_side_changed_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A container returning its last child's output (the same tensor) takes the child's
    figures, unless one side changed it in place since (here A's last block scales its
    child's output in place, B's does not): in step, every call's figures equal those of
    the run one after the other (A's outputs copied there, nothing taken as seen)."""
    import copy

    torch.manual_seed(0)
    a = _Stack(scale=3.0).eval()
    b = copy.deepcopy(a)
    b.body[2].scale = 1.0
    stepped, apart = _in_step_and_apart(monkeypatch, a, b, torch.randn(4, 16))
    for s, p in zip(stepped["calls"], apart["calls"], strict=True):
        assert (s["name"], s["max_abs"], s["rel_l2"]) == (p["name"], p["max_abs"], p["rel_l2"])
    by_name = {c["name"]: c for c in stepped["calls"]}
    assert by_name["body.2.fc"]["max_abs"] == 0.0  # the same child output, before the scale
    assert by_name["body.2"]["max_abs"] > 0.0  # A's scaled in place after it
    assert by_name["body"]["max_abs"] == by_name["body.2"]["max_abs"]
