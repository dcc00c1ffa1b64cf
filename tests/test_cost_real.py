"""cost on models as their projects write them (issue 29, point 6), from the command line.

Every figure is checked against an independent computation: the fixture's own tensors
(``adj._nnz()``, the attributes' storages), a real ``torch.optim`` step, ``sum(p.numel())``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import run_hookcli as hookcli
from tests.conftest import run_json as report
from tests.fixtures import cost_real

ROOT = Path(__file__).resolve().parent.parent
FIX = "tests/fixtures/cost_real.py"


# -- sparse matmuls by their nonzeros ----------------------------------------------------------


def test_sparse_gcn_counts_spmm_by_nonzeros() -> None:
    rep = report("cost", f"{FIX}:SparseGCN", "--backward")
    model = cost_real.SparseGCN()
    x, adj = model.example_input_array
    nodes, nnz = x.shape[0], adj._nnz()
    dims = [(model.gc1.weight.shape), (model.gc2.weight.shape)]
    dense_mm = sum(2 * nodes * i * o for i, o in dims)  # input @ weight, dense
    sparse_mm = sum(2 * nnz * o for _, o in dims)  # adj @ support: nnz * cols MACs
    assert rep["totals"]["flops"] == dense_mm + sparse_mm
    fwd = [s for s in rep["sparse_ops"] if s["phase"] == "forward"]
    assert len(fwd) == 1 and fwd[0]["calls"] == 2
    assert fwd[0]["nonzeros"] == 2 * nnz
    assert fwd[0]["flops"] == sparse_mm
    assert fwd[0]["dense_flops"] == sum(2 * nodes * nodes * o for _, o in dims)
    assert fwd[0]["modules"] == ["gc1", "gc2"]
    # backward: the gradient of support is adj^T @ grad, sparse again
    bwd = [s for s in rep["sparse_ops"] if s["phase"] == "backward"]
    assert bwd and bwd[0]["flops"] == sparse_mm
    # the dense part of the backward as FlopCounterMode counts it (two products per mm)
    from torch.utils.flop_counter import FlopCounterMode

    w = [model.gc1.weight, model.gc2.weight]
    h = torch.randn(nodes, dims[0][0])
    with FlopCounterMode(display=False) as fc:
        a = h @ w[0]
        b = torch.relu(a) @ w[1]
        b.sum().backward()
    dense_total = fc.get_total_flops()  # forward and backward of the dense products
    # backward: the dense products' (FlopCounterMode) plus adj^T @ grad by its nonzeros
    assert rep["totals"]["backward_flops"] == dense_total - dense_mm + sparse_mm
    text = hookcli("cost", f"{FIX}:SparseGCN").stdout
    assert "Sparse ops:" in text and "counted by their nonzeros" in text


def test_sparse_flops_formula_cases() -> None:
    from hookcli.cost.flops import sparse_matmul_flops

    adj = cost_real.ring_adjacency(10, hops=1)  # 30 nonzeros
    dense = torch.randn(10, 4)
    assert sparse_matmul_flops(adj, dense) == 2 * 30 * 4
    assert sparse_matmul_flops(dense.T, adj) == 2 * 4 * 30
    csr = adj.to_sparse_csr()
    assert sparse_matmul_flops(csr, dense) == 2 * 30 * 4
    # sparse @ sparse: per inner index, nonzeros of the column times those of the row
    a, b = adj.to_dense(), adj.to_dense()
    exact = int(((a != 0).sum(0) * (b != 0).sum(1)).sum())
    assert sparse_matmul_flops(adj, adj) == 2 * exact


# -- tensors in plain attributes (a KV cache) ------------------------------------------------


def _attribute_bytes(model: torch.nn.Module) -> int:
    seen: dict[int, int] = {}
    for m in model.modules():
        for k, v in vars(m).items():
            if isinstance(v, torch.Tensor) and k != "example_input_array":
                seen[v.untyped_storage().data_ptr()] = v.untyped_storage().nbytes()
    return sum(seen.values())


@pytest.mark.parametrize("dtype", [None, "float16"])
def test_kv_cache_is_its_own_line_not_activations(dtype: str | None) -> None:
    extra = ["--dtype", dtype] if dtype else []
    small = report("cost", f"{FIX}:LlamaLike", *extra)
    # 16x the cache slots: the caches grow 16x, the activations of 16 tokens do not
    big = report("cost", f"{FIX}:LlamaLike", "-k", "max_seq_len=1024", *extra)
    t, tb = small["totals"], big["totals"]
    model = cost_real.LlamaLike()
    if dtype:
        # llama's `self.cache_k.to(xq)` makes float16 caches in the run; the rope table stays
        for layer in model.layers:
            layer.attention.cache_k = layer.attention.cache_k.half()
            layer.attention.cache_v = layer.attention.cache_v.half()
    assert t["attribute_bytes"] == _attribute_bytes(model)
    assert tb["attribute_bytes"] > 8 * t["attribute_bytes"]
    assert tb["peak_activation_bytes"] == t["peak_activation_bytes"]
    assert tb["saved_bytes"] == t["saved_bytes"]
    for tot in (t, tb):
        assert tot["memory_parts"]["inference_bytes"] == (
            tot["param_bytes"] + tot["buffer_bytes"] + tot["attribute_bytes"]
            + tot["peak_activation_bytes"]
        )  # fmt: skip
    names = {(a["module"], a["attribute"]) for a in small["attribute_tensors"]}
    assert ("layers.0.attention", "cache_k") in names and ("(root)", "rope") in names
    assert all(a["attribute"] != "example_input_array" for a in small["attribute_tensors"])


def test_attribute_tensors_line_in_table() -> None:
    r = hookcli("cost", f"{FIX}:LlamaLike")
    assert r.returncode == 0, r.stderr
    assert "Attribute tensors:" in r.stdout and "cache_k" in r.stdout
    # held by the model at both peaks, never among the activations
    peaks = [ln for ln in r.stdout.splitlines() if ln.startswith("  alive at it:")]
    assert len(peaks) == 2 and all("attribute tensors" in ln for ln in peaks), peaks


def test_kv_cache_same_on_meta() -> None:
    cpu = report("cost", f"{FIX}:LlamaLike")["totals"]
    meta = report("cost", f"{FIX}:LlamaLike", "--device", "meta")["totals"]
    for key in ("attribute_bytes", "peak_activation_bytes", "saved_bytes", "flops"):
        assert meta[key] == cpu[key], key


# -- optimizer state in the dtype torch.optim keeps ---------------------------------------------


def _real_state_bytes(dtype: torch.dtype, make: Any) -> int:
    torch.manual_seed(0)
    model = cost_real.LlamaLike().to(dtype)
    opt = make(model.parameters())
    model(model.example_input_array).float().sum().backward()
    opt.step()
    return sum(
        v.numel() * v.element_size()
        for state in opt.state.values()
        for k, v in state.items()
        if isinstance(v, torch.Tensor) and k != "step"  # Adam's 0-d float32 step: left out
    )


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("optimizer", ["adam", "adamw", "sgd-momentum"])
def test_optimizer_state_in_param_dtype(dtype: str, optimizer: str) -> None:
    makers = {
        "adam": lambda p: torch.optim.Adam(p),
        "adamw": lambda p: torch.optim.AdamW(p),
        "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    }
    t = report("cost", f"{FIX}:LlamaLike", "--dtype", dtype, "--optimizer", optimizer)["totals"]
    assert t["optimizer_state_bytes"] == _real_state_bytes(getattr(torch, dtype), makers[optimizer])
    assert t["optimizer_state_dtypes"] == [dtype]


# -- legacy constructors on meta ------------------------------------------------------------------


def test_legacy_constructors_build_on_meta() -> None:
    from hookcli.metavalues import building_on_meta

    real_float = torch.FloatTensor
    with building_on_meta():
        a = torch.Tensor(3, 4)
        p = torch.nn.Parameter(torch.Tensor(5, 6))
        f = torch.FloatTensor(2, 3)
        n = torch.LongTensor(4)
        d = torch.Tensor([1.0, 2.0])
        s = torch.Tensor(torch.Size([2, 2]))
    for t in (a, p, f, n, d, s):
        assert t.device.type == "meta"
    assert (a.shape, p.shape, f.shape, n.dtype, d.shape) == (
        (3, 4),
        (5, 6),
        (2, 3),
        torch.int64,
        (2,),
    )
    assert isinstance(p, torch.nn.Parameter)
    # put back as found
    assert "__new__" not in torch.Tensor.__dict__ and torch.FloatTensor is real_float
    assert torch.Tensor(2).device.type == "cpu"


def test_legacy_llama_on_meta_under_memory_limit() -> None:
    """~4.3 GB of ``Parameter(torch.Tensor(r, c))``: built on meta, it fits a 5 GiB address
    space (torch itself takes ~4); built on the CPU, as before, it did not."""
    r = hookcli("params", f"{FIX}:llama_big", "--device", "meta", "-f", "json", limit=5 << 30)
    assert r.returncode == 0, r.stderr[-1000:]
    params = json.loads(r.stdout)["totals"]["params"]
    vocab, dim, layers = 32000, 4096, 4  # llama_big's sizes; never built here (4.3 GB)
    # embedding and output, 4 attention and 2 FFN (4x) matrices per layer, 2 LayerNorms
    # per layer and a final one (weight and bias each)
    assert params == 2 * vocab * dim + layers * (12 * dim * dim + 4 * dim) + 2 * dim


def test_legacy_params_counted_as_on_cpu() -> None:
    meta = report("params", f"{FIX}:SparseGCN", "--device", "meta")["totals"]
    assert meta["params"] == sum(p.numel() for p in cost_real.SparseGCN().parameters())


class _TiedView(torch.nn.Module):
    """A view of a parameter kept in an attribute, and a real cache."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.w_t = self.proj.weight.T  # the parameter's memory: not an attribute tensor
        self.cache = torch.zeros(4, 8)
        self.example_input_array = torch.randn(2, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.cache[: x.shape[0]] = x.detach()
        return self.proj(x) @ self.w_t


def test_attribute_view_of_a_parameter_not_counted_twice() -> None:
    from hookcli.api import cost

    rep = cost(_TiedView())
    assert rep.totals["attribute_bytes"] == 4 * 8 * 4  # the cache alone
    assert [a["attribute"] for a in rep.lists["attribute_tensors"]] == ["cache"]


@pytest.mark.parametrize("name", ["LlamaLike", "WhisperLike", "UNetLike"])
def test_flops_match_flop_counter_mode(name: str) -> None:
    """Forward FLOPs of the dense models against torch's FlopCounterMode, and backward
    FLOPs where no fused attention runs (cost's backward, as a training step's: no
    gradient for the inputs). Whisper's attention is counted by FlopCounterMode on the
    math path (its products, one by one), since torch's own formula for the CPU's fused
    kernel differs between releases; the fused backward recomputes the scores, which
    the math path does not, so its backward is not compared."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    rep = report("cost", f"{FIX}:{name}", "--backward")
    torch.manual_seed(0)
    model = getattr(cost_real, name)().eval()
    args = model.example_input_array
    args = args if isinstance(args, tuple) else (args,)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        out = model(*args)
    forward = fc.get_total_flops()
    assert rep["totals"]["flops"] == forward
    if name == "WhisperLike":
        return
    with FlopCounterMode(display=False) as fc:
        out = model(*args)
        getattr(out, "sample", out).float().sum().backward()
    assert rep["totals"]["backward_flops"] == fc.get_total_flops() - forward
