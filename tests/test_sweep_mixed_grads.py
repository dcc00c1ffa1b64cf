"""Gradient probes on integer, bool, sparse, complex and quantized tensors (issue 28, B4),
and ``--columns kernel_size`` on a tensor ``kernel_size`` (issue 28, torchinfo finding).

Full backward hooks put a module's integer and bool inputs in ``grad_input`` (as
zero-filled tensors), sparse and complex tensors reach ``grad_input``, ``grad_output``
and parameter grads. Every figure is checked against plain autograd: per-parameter
``.grad`` norms, and each module call's grad_output and grad_input from tensor hooks on
its outputs and on clones of its inputs, all in float64 with the dense tensors.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
from torch import nn

import hookcli
from hookcli.grads.probe import GradProbe, joint_norm, norm_values, tensor_norm
from hookcli.options import HookKind
from tests.conftest import invoke, invoke_json
from tests.fixtures import mixed_inputs as mx

REL = 1e-5
ALL_KINDS = "pre,forward,backward-pre,backward,tensor"


def dense_norm(tensors: Sequence[torch.Tensor]) -> float | None:
    """L2 over every tensor in float64, densified; complex by modulus; None for none."""
    parts = []
    for t in tensors:
        t = t.detach()
        if t.layout != torch.strided:
            t = t.to_dense()
        if t.is_complex():
            t = torch.view_as_real(t.resolve_conj())
        parts.append(t.double().reshape(-1))
    return float(torch.cat(parts).norm()) if parts else None


def _grad_tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj] if obj.requires_grad else []
    if isinstance(obj, (tuple, list)):
        return [t for v in obj for t in _grad_tensors(v)]
    return []


def oracle(model: nn.Module, args: Sequence[Any]) -> dict[str, Any]:
    """Plain autograd: per-module-call grad_output (hooks on its outputs), grad_input
    (hooks on clones of its inputs that need grad: this module's share alone), and
    per-parameter grads; the model is called once per module here."""
    outs: dict[str, list[torch.Tensor]] = {}
    ins: dict[str, list[torch.Tensor]] = {}
    handles = []

    def pre(name: str) -> Callable[..., Any]:
        def hook(module: nn.Module, a: tuple[Any, ...]) -> tuple[Any, ...]:
            ins.setdefault(name, [])
            new = []
            for v in a:
                if isinstance(v, torch.Tensor) and v.requires_grad:
                    v = v.clone()
                    v.register_hook(lambda g, name=name: ins[name].append(g))
                new.append(v)
            return tuple(new)

        return hook

    def fwd(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, a: Any, out: Any) -> None:
            outs.setdefault(name, [])
            for t in _grad_tensors(out):
                t.register_hook(lambda g, name=name: outs[name].append(g))

        return hook

    for name, m in model.named_modules():
        handles.append(m.register_forward_pre_hook(pre(name)))
        handles.append(m.register_forward_hook(fwd(name)))
    model.train()
    out = model(*args)
    loss = out.sum()
    loss.backward()
    for h in handles:
        h.remove()
    params = {n: p for n, p in model.named_parameters()}
    return {
        "loss": loss.item(),
        "grad_output": {n: dense_norm(g) for n, g in outs.items()},
        "grad_input": {n: dense_norm(g) for n, g in ins.items()},
        "params": {n: dense_norm([p.grad]) for n, p in params.items() if p.grad is not None},
        "weights": {n: dense_norm([p]) for n, p in params.items()},
        "own": {
            n: [f"{n}.{k}" if n else k for k, _ in m.named_parameters(recurse=False)]
            for n, m in model.named_modules()
        },
    }


def close(got: float | None, want: float | None) -> bool:
    if want is None:
        return got is None
    return got is not None and math.isclose(got, want, rel_tol=REL, abs_tol=1e-9)


def check(report: dict[str, Any], want: dict[str, Any], output_grads: bool = True) -> None:
    """Every row, parameter and total of a grads report against the oracle."""
    assert report.get("error") is None, report.get("error")
    assert close(report["totals"]["loss"], want["loss"])
    rows = {r["name"]: r for r in report["layers"]}
    assert set(rows) == set(want["grad_output"]), (set(rows), set(want["grad_output"]))
    for name, row in rows.items():
        go, gi = want["grad_output"][name], want["grad_input"][name]
        assert close(row["grad_output_norm"], go), (name, row["grad_output_norm"], go)
        assert close(row["grad_input_norm"], gi), (name, row["grad_input_norm"], gi)
        if output_grads:
            assert close(row["output_grad_norm"], go), (name, row["output_grad_norm"], go)
        own = want["own"][name]
        if own:
            assert close(row["grad_norm"], dense_norm_of(want["params"], own)), name
            assert close(row["weight_norm"], dense_norm_of(want["weights"], own)), name
        assert row["unused_params"] == []
    params = {p["name"]: p for p in report["params"]}
    assert set(params) == set(want["params"])
    for name, p in params.items():
        assert close(p["grad_norm"], want["params"][name]), (name, p["grad_norm"])
        assert close(p["weight_norm"], want["weights"][name]), name
        assert p["nan_count"] == 0 and p["inf_count"] == 0
    assert close(report["totals"]["grad_norm"], dense_norm_of(want["params"], list(params)))
    assert report["totals"]["unused_params"] == []


def dense_norm_of(norms: dict[str, float], names: Sequence[str]) -> float:
    return math.sqrt(math.fsum(norms[n] ** 2 for n in names))


FIXTURES = [
    ("IndexNet", mx.IndexNet, mx.index_inputs),
    ("GCN", mx.GCN, mx.gcn_inputs),
    (
        "QuantNet",
        mx.QuantNet,
        lambda: [torch.randn(5, 4, generator=torch.Generator().manual_seed(0))],
    ),
]


# -- through the CLI ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["IndexNet", "GCN"])
def test_grads_cli_on_integer_bool_sparse_and_complex_tensors(name: str) -> None:
    """B4: `grads` ran `vector_norm` on the int64/bool tensors PyTorch puts in grad_input."""
    cls, inputs = {n: (c, f) for n, c, f in FIXTURES}[name]
    report = invoke_json(
        "grads",
        f"tests.fixtures.mixed_inputs:{name}",
        "--inputs-from",
        f"tests.fixtures.mixed_inputs:{inputs.__name__}",
        "--hooks",
        ALL_KINDS,
        "--per-param",
        "--fail-on",
        "nan,inf,unused,dead",
    )
    check(report, oracle(cls(), inputs()))
    assert [c["passed"] for c in report["checks"]] == [True] * 4


def test_grads_cli_with_integer_and_bool_inputs_from_i_specs() -> None:
    """`-i` integer and bool inputs, drawn as docs/reference.md "Seeding" says."""
    report = invoke_json(
        "grads",
        "tests.fixtures.mixed_inputs:IndexNet",
        "-i",
        "5x4",
        "-i",
        "int64:6:0..5",
        "-i",
        "bool:6",
        "--per-param",
    )
    g = torch.Generator().manual_seed(0)
    x = torch.randn((5, 4), generator=g)
    idx = torch.randint(0, 5, (6,), generator=g)
    mask = torch.randint(0, 2, (6,), generator=g).to(torch.bool)
    want = oracle(mx.IndexNet(), [x, idx, mask])
    assert report["inputs"][1]["dtype"] == "int64" and report["inputs"][2]["dtype"] == "bool"
    check(report, want, output_grads=False)


def test_default_grads_hooks_and_inspect_backward_run_on_an_integer_index() -> None:
    """The default kinds of `grads`, and `inspect --hooks pre,forward,backward`."""
    args = ("tests.fixtures.mixed_inputs:IndexNet", "--inputs-from")
    args += ("tests.fixtures.mixed_inputs:index_inputs",)
    want = oracle(mx.IndexNet(), mx.index_inputs())
    report = invoke_json("grads", *args)
    rows = {r["name"]: r for r in report["layers"]}
    for name in ("gather", "mask", "fc2"):
        assert close(rows[name]["grad_input_norm"], want["grad_input"][name]), name
        assert close(rows[name]["grad_output_norm"], want["grad_output"][name]), name
    assert report["totals"]["unused_params"] == []
    report = invoke_json("inspect", *args, "--hooks", "pre,forward,backward")
    rows = {r["name"]: r for r in report["layers"]}
    for name in ("gather", "mask", "counts"):
        assert close(rows[name]["grad_input_norm"], want["grad_input"][name]), name


def test_stats_backward_on_sparse_and_integer_tensors() -> None:
    """`stats --backward` took the sparse adjacency and sparse grads into aminmax and
    blamed the model; it leaves sparse tensors out and reports the dense ones."""
    for name, inputs in (("GCN", "gcn_inputs"), ("IndexNet", "index_inputs")):
        report = invoke_json(
            "stats",
            f"tests.fixtures.mixed_inputs:{name}",
            "--inputs-from",
            f"tests.fixtures.mixed_inputs:{inputs}",
            "--hooks",
            "forward,backward-pre,backward,tensor",
        )
        assert report.get("error") is None
    rows = {r["name"]: r for r in report["layers"]}
    want = mx.IndexNet()
    x = mx.index_inputs()[0]
    h = want.fc1(x)
    assert math.isclose(rows["fc1"]["mean"], float(h.mean()), rel_tol=1e-5, abs_tol=1e-7)


def test_a_quantized_tensor_between_modules() -> None:
    """torch's own full backward hooks zero-fill the missing grad of a quantized module
    output (no zero_ kernel): hookcli's hooks leave it None instead."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn((5, 4), generator=g)
    report = invoke_json(
        "grads",
        "tests.fixtures.mixed_inputs:QuantNet",
        "-i",
        "5x4",
        "--hooks",
        ALL_KINDS,
        "--per-param",
        "--fail-on",
        "nan,inf,unused,dead",
    )
    check(report, oracle(mx.QuantNet(), [x]))


def test_unused_is_only_reported_from_a_backward_that_completed() -> None:
    """A backward that raised with no module open (an op between fc2 and fc1) listed fc1's
    parameters as unused: they only had not been reached yet."""
    result = invoke(
        "grads", "tests.fixtures.mixed_inputs:BackwardRaises", "-i", "3x4", "--format", "json"
    )
    assert result.exit_code == 4, (result.exit_code, result.stderr)
    assert "the backward of this op is broken" in result.stderr
    report = json.loads(result.stdout)
    assert report["totals"]["unused_params"] is None
    assert all(r["unused_params"] == [] for r in report["layers"])
    result = invoke(
        "grads", "tests.fixtures.mixed_inputs:BackwardRaises", "-i", "3x4", "--fail-on", "unused"
    )
    assert result.exit_code == 4
    assert "fc1.weight" not in result.stdout + result.stderr


# -- through the API ----------------------------------------------------------------------


@pytest.mark.parametrize("name", [n for n, _, _ in FIXTURES])
def test_grads_api_matches_plain_autograd(name: str) -> None:
    cls, inputs = {n: (c, f) for n, c, f in FIXTURES}[name]
    args = inputs()
    report = hookcli.grads(cls(), *args, hooks=ALL_KINDS, per_param=True, fail_on="unused")
    assert report.passed
    check(report.to_dict(), oracle(cls(), args))


def test_api_inspect_and_stats_with_backward_hooks() -> None:
    args = mx.gcn_inputs()
    want = oracle(mx.GCN(), args)
    report = hookcli.inspect(mx.GCN(), *args, hooks="pre,forward,backward-pre,backward")
    rows = {r["name"]: r for r in report.to_dict()["layers"]}
    for name in rows:
        assert close(rows[name]["grad_output_norm"], want["grad_output"][name]), name
        assert close(rows[name]["grad_input_norm"], want["grad_input"][name]), name
    assert hookcli.stats(mx.GCN(), *args, backward=True).error is None


# -- the norms themselves -------------------------------------------------------------------


def test_norm_values_by_kind() -> None:
    """Integer, bool and quantized tensors have no gradient norm; sparse ones are taken
    over their coalesced values; complex by modulus; half and float8 widened."""
    assert norm_values(torch.tensor([1, 2])) is None
    assert norm_values(torch.tensor([True])) is None
    q = torch.quantize_per_tensor(torch.tensor([0.5, -1.0]), 0.1, 10, torch.quint8)
    assert norm_values(q) is None
    dup = torch.sparse_coo_tensor(
        torch.tensor([[0, 0, 2]]), torch.tensor([3.0, 1.0, 3.0]), (4,), check_invariants=True
    )
    assert not dup.is_coalesced()
    assert math.isclose(float(tensor_norm(dup)), math.hypot(4.0, 3.0), rel_tol=1e-6)
    csr = torch.tensor([[0.0, 3.0], [4.0, 0.0]]).to_sparse_csr()
    assert math.isclose(float(tensor_norm(csr)), 5.0, rel_tol=1e-6)
    z = torch.tensor([3 + 4j, 0 + 0j], dtype=torch.complex64)
    assert math.isclose(float(tensor_norm(z.conj())), 5.0, rel_tol=1e-6)
    assert math.isclose(float(tensor_norm(z.to(torch.complex32))), 5.0, rel_tol=1e-3)
    f8 = torch.tensor([3.0, 4.0]).to(torch.float8_e4m3fn)
    assert math.isclose(float(tensor_norm(f8)), 5.0, rel_tol=1e-6)
    with pytest.raises(TypeError):
        tensor_norm(torch.tensor([1, 2]))
    mixed = [torch.tensor([3.0]), None, torch.tensor([7]), q, torch.tensor([4j])]
    assert math.isclose(float(joint_norm(mixed)), 5.0, rel_tol=1e-6)  # type: ignore[arg-type]
    assert joint_norm([torch.tensor([1]), q, None]) is None


def test_probe_hooks_take_every_kind_of_tensor_in_every_position() -> None:
    """The probe's hooks, called as torch would with tensors of every kind in grad_output,
    grad_input, module outputs (forward flags) and parameter grads."""
    probe = GradProbe(
        {HookKind.BACKWARD_PRE, HookKind.BACKWARD, HookKind.TENSOR},
        per_param=True,
        watch_forward=True,
        flag_inf=True,
    )
    q = torch.quantize_per_tensor(torch.tensor([0.5, -1.0]), 0.1, 10, torch.quint8)
    sparse = torch.sparse_coo_tensor(
        torch.tensor([[1, 1]]), torch.tensor([1.0, 2.0]), (3,), check_invariants=True
    )
    empty_sparse = torch.sparse_coo_tensor(
        torch.zeros((1, 0), dtype=torch.long), torch.zeros(0), (3,), check_invariants=True
    )
    kinds = [
        torch.tensor([3, 4]),
        torch.tensor([True]),
        q,
        None,
        sparse,
        torch.tensor([4j]),
        torch.tensor([0.0]),
    ]
    stat = probe._stat(kinds)
    assert stat is not None
    assert math.isclose(float(stat[0]), 5.0, rel_tol=1e-6)  # 3 from the sparse, 4 complex
    assert stat[1] is not None and not bool(stat[1])
    assert probe._stat([torch.tensor([1]), q, None]) is None
    assert probe._flags_of(q) is None and probe._flags_of(torch.tensor([1])) is None
    flags = probe._flags_of(empty_sparse)
    assert flags is not None and flags.tolist() == [False, False, False]  # all zeros: dead
    inf_nan = torch.tensor([complex(float("inf"), 0.0), complex(0.0, float("nan"))])
    flags = probe._flags_of(inf_nan)
    assert flags is not None and flags.tolist() == [True, True, True]
    hook = probe._param_hook(0)
    nan = torch.tensor([float("nan")])
    hook(torch.sparse_coo_tensor(torch.tensor([[0]]), nan, (2,), check_invariants=True))
    assert probe._pcounts[0].tolist() == [1, 0]


# -- --columns kernel_size ------------------------------------------------------------------


def test_kernel_size_column_reads_a_tensor_kernel_size() -> None:
    """torchinfo finding: a 0-d tensor kernel_size (EncodecConv1d, MimiConv1d) gave null."""
    report = invoke_json(
        "inspect",
        "tests.fixtures.mixed_inputs:TensorKernelSizeConv",
        "-i",
        "1x1x16",
        "--columns",
        "kernel_size",
    )
    rows = {r["name"]: r for r in report["layers"]}
    model = mx.TensorKernelSizeConv()
    assert rows[""]["kernel_size"] == [int(model.kernel_size)]
    assert rows["conv"]["kernel_size"] == list(model.conv.kernel_size)
    result = invoke(
        "inspect",
        "tests.fixtures.mixed_inputs:TensorKernelSizeConv",
        "-i",
        "1x1x16",
        "--columns",
        "kernel_size",
    )
    assert result.exit_code == 0
    root = next(line for line in result.stdout.splitlines() if line.startswith("(root)"))
    assert root.split()[-1] == "3"


@pytest.mark.parametrize("no_forward", [False, True])
def test_kernel_size_column_on_tensors_lists_and_what_it_cannot_read(no_forward: bool) -> None:
    """A 1-d int32 tensor, a list and a tuple of 0-d tensors are read; a float, bool or
    2-d tensor is not a kernel size (null, as before)."""
    args = ["--no-forward"] if no_forward else ["-i", "1x1x16"]
    report = invoke_json(
        "inspect",
        "tests.fixtures.mixed_inputs:TensorKernelSizes",
        *args,
        "--columns",
        "kernel_size",
    )
    got = {r["name"]: r["kernel_size"] for r in report["layers"]}
    model = mx.TensorKernelSizes()
    assert got["pair"] == model.pair.kernel_size.tolist() == [3, 1]
    assert got["listed"] == [3]
    assert got["scalars"] == [int(v) for v in model.scalars.kernel_size] == [3, 2]
    assert got["floating"] is None and got["square"] is None and got["flag"] is None
    assert got[""] is None
    assert all(got[f"{n}.conv"] == [3] for n, _ in model.named_children())


def test_kernel_size_column_through_the_api() -> None:
    report = hookcli.inspect(
        mx.TensorKernelSizeConv(), torch.randn(1, 1, 16), columns="kernel_size"
    ).to_dict()
    assert report["layers"][0]["kernel_size"] == [3]


def test_an_integer_parameter_has_no_weight_norm() -> None:
    """A frozen integer parameter: its norm was taken with the float ones (vector_norm
    raised on Long); its weight_norm is null and the others' figures are unchanged."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn((3, 4), generator=g)
    report = invoke_json(
        "grads", "tests.fixtures.mixed_inputs:IntParam", "-i", "3x4", "--per-param"
    )
    want = oracle(mx.IntParam(), [x])
    params = {p["name"]: p for p in report["params"]}
    assert params["steps"]["weight_norm"] is None and params["steps"]["grad_norm"] is None
    assert params["steps"]["dtype"] == "int64" and params["steps"]["requires_grad"] is False
    fc = ["fc.weight", "fc.bias"]
    for name in fc:
        assert close(params[name]["grad_norm"], want["params"][name]), name
        assert close(params[name]["weight_norm"], want["weights"][name]), name
    rows = {r["name"]: r for r in report["layers"]}
    assert rows[""]["weight_norm"] is None  # the root owns only the frozen integer one
    assert close(report["totals"]["weight_norm"], dense_norm_of(want["weights"], fc))
    assert close(report["totals"]["grad_norm"], dense_norm_of(want["params"], fc))
    assert report["totals"]["unused_params"] == []
