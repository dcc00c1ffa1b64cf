"""``--amp`` on meta (hookcli.memory.autocast) against a real torch.autocast on the CPU.

The emulation, given the CPU's policy, must make on meta what ``torch.autocast("cpu",
torch.bfloat16)`` makes on the CPU: every op's output dtype (the same ops, the casts
included: autocast's weight-cast cache makes one copy of a weight per region), and so
the same training-step peak, which the allocator oracle (tests/memory_oracle.py)
measures on the CPU. On meta, ``cost`` uses the CUDA policy: checked against torch's
dispatcher (the ops it has an AutocastCUDA kernel for) and on the command line.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from hookcli.cost.probe import _FusedAttentionOnMeta
from hookcli.memory import autocast
from hookcli.memory.autocast import cast_of, emulated, registered
from hookcli.memory.step import track_step
from tests.conftest import invoke_json, run_hookcli
from tests.fixtures import memory_models
from tests.memory_oracle import measure_step, steady_step

BF16 = torch.bfloat16


# ``torch.tensor(...)`` shows as lift_fresh on the CPU, not on meta (torch 2.6): not autocast
_DEVICE_OPS = (torch.ops.aten.lift_fresh, torch.ops.aten.lift_fresh_copy)


class _Ops(TorchDispatchMode):
    """Every aten op that runs, with its output dtypes, and the phase it ran in."""

    def __init__(self) -> None:
        super().__init__()
        self.phase = "forward"
        self.ops: dict[str, list[tuple[str, tuple[str, ...]]]] = {"forward": [], "backward": []}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in _DEVICE_OPS:
            return out
        outs = out if isinstance(out, (tuple, list)) else (out,)
        dtypes = tuple(str(o.dtype) for o in outs if isinstance(o, torch.Tensor))
        self.ops[self.phase].append((str(func.overloadpacket), dtypes))
        return out


def _hf_llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=memory_models.VOCAB,
        hidden_size=128,
        intermediate_size=352,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=memory_models.SEQ,
    )
    return LlamaForCausalLM(config)


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )


def _loss(output: Any) -> torch.Tensor:
    logits = getattr(output, "logits", None)
    return logits.sum() if logits is not None else memory_models.training_loss(output)


def _args(x: Any, device: str | None = None) -> tuple[torch.Tensor, ...]:
    """The forward's arguments: one input, or a tuple of them (the GPT's tokens and
    targets), moved to ``device``."""
    args = x if isinstance(x, tuple) else (x,)
    return tuple(a.to(device) for a in args) if device else args


def _image() -> torch.Tensor:
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))


MODELS: list[tuple[str, Callable[[], nn.Module], Callable[[], torch.Tensor], str]] = [
    ("llama", memory_models.llama, memory_models.tokens, "Block"),
    ("gpt", memory_models.gpt, memory_models.gpt_batch, "Block"),  # with targets: training
    ("hf_llama", _hf_llama, memory_models.tokens, "LlamaDecoderLayer"),
    ("cnn", _cnn, _image, ""),
]
IDS = [m[0] for m in MODELS]


def _cpu_and_meta(build: Callable[[], nn.Module]) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    cpu = build()
    with torch.device("meta"):
        meta = build()
    return cpu, meta


def _ops(model: nn.Module, x: Any, amp: Callable[[], Any], outer: Any) -> Any:
    rec = _Ops()
    with outer(), rec:
        with amp():
            loss = _loss(model(*_args(x)))
        rec.phase = "backward"
        loss.backward()
    return rec.ops


@pytest.mark.parametrize(("name", "build", "x", "block"), MODELS, ids=IDS)
def test_every_op_has_the_dtype_of_a_real_cpu_autocast(
    name: str, build: Any, x: Any, block: str
) -> None:
    """Forward: the same ops in the same order, each output of the same dtype (the casts
    of the weights included, once each); backward: the same ops and dtypes (autograd
    may order the gradients' casts differently)."""
    cpu, meta = _cpu_and_meta(build)
    inputs = x()
    real = _ops(cpu, inputs, lambda: torch.autocast("cpu", dtype=BF16), contextlib.nullcontext)
    emulated_ops = _ops(
        meta, _args(inputs, "meta"), lambda: emulated("cpu", BF16), _FusedAttentionOnMeta
    )
    assert emulated_ops["forward"] == real["forward"]
    assert Counter(emulated_ops["backward"]) == Counter(real["backward"])
    assert ("aten._to_copy", ("torch.bfloat16",)) in real["forward"]  # autocast did cast


def _peaks(build: Any, x: Any, **kw: Any) -> tuple[int, int, int]:
    """(meta with the emulation, the tracker on the CPU under torch.autocast counting
    tensors only, as on meta: no kernel measured, the oracle)."""
    from hookcli.memory.tracker import LiveBytes

    cpu, meta = _cpu_and_meta(build)

    def on_meta() -> Any:
        return emulated("cpu", BF16)

    tracked_meta = track_step(
        meta,
        _args(x, "meta"),
        {},
        _loss,
        forward_context=on_meta,
        run_context=_FusedAttentionOnMeta,
        recompute_context=on_meta,
        **kw,
    ).train.bytes
    LiveBytes.measure = False
    try:
        tracked_cpu = track_step(
            cpu,
            _args(x),
            {},
            _loss,
            forward_context=lambda: torch.autocast("cpu", dtype=BF16),
            **kw,
        ).train.bytes
    finally:
        LiveBytes.measure = True
    measured = measure_step(steady_step(cpu, _args(x), amp=BF16, loss=_loss, **kw)).peak_bytes
    return tracked_meta, tracked_cpu, measured


# How far under the allocator the bf16 step on meta may be (docs/cost.md, "--amp on meta"):
# the decoders a few percent; the small CNN by its convolution kernels' own buffers
# (104 KiB against a 0.5 MiB step: 21-23% measured), which meta, counting tensors, does
# not see. Never over.
UNDER = {"llama": 0.05, "gpt": 0.05, "hf_llama": 0.05, "cnn": 0.25}


@pytest.mark.parametrize(("name", "build", "x", "block"), MODELS, ids=IDS)
def test_the_step_peak_on_meta_is_that_of_a_real_cpu_autocast(
    name: str, build: Any, x: Any, block: str
) -> None:
    """The emulated step's peak on meta is the tracker's under a real CPU autocast, to
    the byte; against the allocator's peak it is under by at most ``UNDER[name]``, and
    not over (docs/cost.md)."""
    cases: list[dict[str, Any]] = [{"optimizer": "adam"}, {"optimizer": "sgd"}]
    if block:
        cases.append({"optimizer": "sgd", "checkpoint": block})
    for kw in cases:
        on_meta, on_cpu, measured = _peaks(build, x(), **kw)
        assert on_meta == on_cpu, kw
        error = (on_meta - measured) / measured
        assert -UNDER[name] <= error <= 0.001, (kw, on_meta, measured, error)


def test_the_cnns_gap_on_meta_is_its_kernels_buffers() -> None:
    """The CNN's bf16 step on meta is under the allocator by what its kernels take that
    no tensor holds: on the CPU, where the tracker measures those calls, the same step
    is the allocator's to 0.5%."""
    for kw in ({"optimizer": "adam"}, {"optimizer": "sgd"}):
        on_meta, _, measured = _peaks(_cnn, _image(), **kw)
        torch.manual_seed(0)
        cpu = _cnn()
        with_kernels = track_step(
            cpu,
            _args(_image()),
            {},
            _loss,
            forward_context=lambda: torch.autocast("cpu", BF16),
            **kw,
        ).train.bytes
        assert abs(with_kernels - measured) <= 0.005 * measured, (kw, with_kernels, measured)
        assert measured - on_meta >= 0.1 * measured, (kw, on_meta, measured)  # the gap is real


def test_a_weight_is_cast_once_per_region_and_the_copy_kept_until_it_ends() -> None:
    """Autocast's weight-cast cache: a Linear called twice in one region casts its weight
    once, and the copy lives until the region ends (one bfloat16 copy more than the
    parameters for the whole forward)."""
    torch.manual_seed(0)
    layer = nn.Linear(64, 64, bias=False)
    with torch.device("meta"):
        meta = nn.Linear(64, 64, bias=False)

    def casts(model: nn.Module, x: torch.Tensor, amp: Callable[[], Any]) -> int:
        rec = _Ops()
        with rec, amp():
            model(model(x))
        return sum(1 for op, _ in rec.ops["forward"] if op == "aten._to_copy")

    x = torch.randn(4, 64)
    real = casts(layer, x, lambda: torch.autocast("cpu", dtype=BF16))
    assert casts(meta, x.to("meta"), lambda: emulated("cpu", BF16)) == real == 2  # w, x
    with emulated("cuda", BF16) as mode:
        meta(torch.empty(4, 64, device="meta"))
        assert [c.dtype for _, c in mode.cache.values()] == [BF16]
        with emulated("cuda", BF16) as inner:  # nested: the same region, the same cache
            assert inner is mode
    assert not mode.cache


def _meta_out(fn: Callable[..., Any], *args: torch.Tensor, policy: str = "cpu") -> Any:
    with emulated(policy, BF16):
        return fn(*(a.to("meta") for a in args))


OPS: list[tuple[str, Callable[..., Any], tuple[tuple[int, ...], ...]]] = [
    ("mm", torch.mm, ((4, 8), (8, 4))),
    ("matmul", lambda a, b: a @ b, ((2, 4, 8), (8, 4))),
    ("linear", F.linear, ((4, 8), (3, 8))),
    ("bmm", torch.bmm, ((2, 4, 8), (2, 8, 4))),
    ("baddbmm", torch.baddbmm, ((2, 4, 4), (2, 4, 8), (2, 8, 4))),
    ("addmm", torch.addmm, ((4, 4), (4, 8), (8, 4))),
    ("conv2d", F.conv2d, ((1, 3, 8, 8), (4, 3, 3, 3))),
    ("sdpa", F.scaled_dot_product_attention, ((1, 2, 4, 8),) * 3),
    ("mse_loss", F.mse_loss, ((4, 8), (4, 8))),
    ("layer_norm", lambda a: F.layer_norm(a, (8,)), ((4, 8),)),
    ("softmax", lambda a: a.softmax(-1), ((4, 8),)),
    ("prod", torch.prod, ((4, 8),)),
    ("cat", lambda a, b: torch.cat([a, b.to(BF16)]), ((4, 8), (4, 8))),
    ("cross_entropy", lambda a: F.cross_entropy(a, a.new_zeros(4, dtype=torch.long)), ((4, 8),)),
]


@pytest.mark.parametrize(("name", "fn", "shapes"), OPS, ids=[o[0] for o in OPS])
def test_one_op_against_torch_autocast_on_the_cpu(name: str, fn: Any, shapes: Any) -> None:
    """Lower precision (matmuls, convolutions, attention), float32 (losses, prod), run as
    it is (layer_norm and softmax on the CPU), promote (cat): the dtype torch gives."""
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(s, generator=g) for s in shapes]
    with torch.autocast("cpu", dtype=BF16):
        real = fn(*args)
    assert _meta_out(fn, *args).dtype == real.dtype


def test_the_cuda_policy_follows_torchs_dispatcher() -> None:
    """Every op torch has an AutocastCUDA kernel for is cast; the matmuls and
    convolutions to the autocast dtype, softmax and sum given a float32 result,
    norms and losses run in float32 (autocast_mode.h's lists)."""
    names = registered("cuda")
    assert {"mm", "linear", "softmax", "layer_norm"} <= names
    assert all(cast_of("cuda", n) is not None for n in names)
    for op in ("mm", "linear", "conv2d", "matmul", "bmm", "scaled_dot_product_attention"):
        assert cast_of("cuda", op) == "lower"
    for op in ("layer_norm", "exp", "rsqrt", "pow", "mse_loss", "group_norm"):
        assert cast_of("cuda", op) == "fp32"
    assert cast_of("cuda", "softmax") == cast_of("cuda", "sum") == "fp32_dtype"
    assert cast_of("cuda", "add") is None and cast_of("cpu", "layer_norm") is None
    # on meta with the CUDA policy: a softmax of bfloat16 logits is float32
    x = torch.empty(4, 8, device="meta", dtype=BF16)
    w = torch.empty(8, 8, device="meta")
    with emulated("cuda", BF16):
        assert F.linear(x.float(), w).dtype == BF16
        assert x.softmax(-1).dtype == torch.float32
        assert torch.rsqrt(x).dtype == torch.float32
        assert F.layer_norm(x, (8,)).dtype == torch.float32
    assert autocast.POLICIES == ("cuda", "cpu")


# -- the command line --------------------------------------------------------------------

DECODER = ("cost", "sample_models.decoder:Decoder", "--device", "meta")


def test_cost_amp_on_meta_emulates_the_cuda_policy() -> None:
    """--amp bf16 on meta: said in settings; a Linear's output is bfloat16, its weight's
    copy saved for backward (this small decoder saves more than in float32); with
    --checkpoint the step runs (the recomputation under the emulation too)."""
    fp32 = invoke_json(*DECODER, "--optimizer", "sgd", "--backward")
    bf16 = invoke_json(*DECODER, "--optimizer", "sgd", "--backward", "--amp", "bf16")
    assert bf16["settings"]["amp"] == "bf16" and bf16["settings"]["amp_policy"] == "cuda"
    assert "amp_policy" not in fp32["settings"]
    out = {r["name"]: r["output_bytes"] for r in fp32["layers"]}
    half = {r["name"]: r["output_bytes"] for r in bf16["layers"]}
    assert half["lm_head"] * 2 == out["lm_head"]  # a Linear's output: bfloat16
    # the bfloat16 copies of the weights, cast once, saved for backward
    assert bf16["totals"]["saved_bytes"] > fp32["totals"]["saved_bytes"]
    ck = invoke_json(*DECODER, "--optimizer", "sgd", "--amp", "fp16", "--checkpoint", "Block")
    assert ck["totals"]["step_checkpointed_modules"] > 0 and "step_peak_bytes" in ck["totals"]
    assert "step_peak_error" not in ck["totals"]


def test_amp_on_meta_is_refused_outside_cost() -> None:
    res = run_hookcli(
        "inspect", "sample_models.decoder:Decoder", "--device", "meta", "--amp", "bf16"
    )
    assert res.returncode == 2 and "cost emulates it" in res.stderr
    assert "Traceback" not in res.stderr


def test_the_issues_example_on_one_layer() -> None:
    """``cost hf:llama:causal-lm --device meta --amp bf16 --checkpoint LlamaDecoderLayer
    --fit SIZE`` (one layer of the 7B shape): the step runs on meta in train mode (the
    packed-sequence check transformers makes there reads values: hookcli's stand-ins)
    and --fit answers."""
    rep = invoke_json(
        "cost", "hf:llama:causal-lm", "-k", "num_hidden_layers=1", "--device", "meta",
        "-i", "int64:1x4096:0..32000", "--amp", "bf16", "--checkpoint", "LlamaDecoderLayer",
        "--fit", "24GiB",
    )  # fmt: skip
    t = rep["totals"]
    assert "step_peak_error" not in t, t.get("step_peak_error")
    assert t["step_checkpointed_modules"] == 1 and rep["settings"]["amp_policy"] == "cuda"
    assert t["fit_batch"] >= 1 and t["fit_peak_bytes"] <= 24 << 30 < t["fit_next_peak_bytes"]


def test_the_written_lists_are_torchs() -> None:
    """The op lists written in the module (used where the dispatcher lists none) are
    those torch's dispatcher has, but for ops torch 2.6 to 2.15 added or dropped."""
    drift = {"rms_norm", "cholesky", "qr", "linalg_matrix_sqrth"}
    for policy in autocast.POLICIES:
        written = (
            autocast._LOWER[policy]
            | autocast._PROMOTE[policy]
            | autocast._FP32_DTYPE[policy]
            | autocast._FP32[policy]
        )
        # the kernels cuDNN registers exist only where torch was built with it
        found = registered(policy) | {n for n in written if n.startswith(("cudnn", "_cudnn"))}
        assert written ^ found <= drift, (policy, sorted(written ^ found))
