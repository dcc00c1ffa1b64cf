"""hookcli's own FLOP formulas: closed forms per op, agreement with torch's registry
where the installed torch has a formula, and cpu = meta on attention models.

The figures must not depend on the torch version: every op hookcli counts has a
formula written in ``hookcli.cost.flops``, and each case below checks it against a
closed form derived from the op's shapes, on every torch of the matrix.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from hookcli.cost.flops import FORMULAS
from tests.conftest import invoke_json

aten = torch.ops.aten
AM = "tests.fixtures.attention_models"


def _torch_registry() -> dict[Any, Any]:
    try:
        from torch.utils.flop_counter import flop_registry
    except ImportError:  # pragma: no cover - every supported torch has it
        return {}
    return dict(flop_registry)


def meta(*shape: int) -> torch.Tensor:
    return torch.empty(*shape, device="meta")


# -- per-op cases: (op name, args, kwargs, out_val, closed form) ----------------------
def _conv_case(x, w, stride=1, padding=0, dilation=1, transposed=False, groups=1):
    nd = len(x) - 2
    xs, ws = meta(*x), meta(*w)
    out = aten.convolution(
        xs, ws, None, [stride] * nd, [padding] * nd, [dilation] * nd, transposed, [0] * nd, groups
    )
    spatial = x[2:] if transposed else tuple(out.shape[2:])
    kernel = 1
    for k in w[2:]:
        kernel *= k
    points = 1
    for p in spatial:
        points *= p
    # transposed weight: [C_in, C_out/groups, k]; plain: [C_out, C_in/groups, k]
    macs = x[0] * points * kernel * w[0] * w[1]
    args = (
        xs,
        ws,
        None,
        [stride] * nd,
        [padding] * nd,
        [dilation] * nd,
        transposed,
        [0] * nd,
        groups,
    )
    return args, out, 2 * macs


def _cases() -> list[tuple[str, str, Callable[[], tuple[tuple, dict, Any, int]]]]:
    cases: list[tuple[str, str, Callable[[], tuple[tuple, dict, Any, int]]]] = []

    def add(op: str, label: str, make: Callable[[], tuple[tuple, dict, Any, int]]) -> None:
        cases.append((op, label, make))

    add("mm", "5x7@7x3", lambda: ((meta(5, 7), meta(7, 3)), {}, None, 2 * 5 * 7 * 3))
    add(
        "addmm",
        "bias+5x7@7x3",
        lambda: ((meta(3), meta(5, 7), meta(7, 3)), {}, None, 2 * 5 * 7 * 3),
    )
    add("bmm", "4x5x7@4x7x3", lambda: ((meta(4, 5, 7), meta(4, 7, 3)), {}, None, 2 * 4 * 5 * 7 * 3))
    add(
        "baddbmm",
        "4x5x7@4x7x3",
        lambda: ((meta(4, 5, 3), meta(4, 5, 7), meta(4, 7, 3)), {}, None, 2 * 4 * 5 * 7 * 3),
    )
    add("mv", "6x9 @ 9", lambda: ((meta(6, 9), meta(9)), {}, None, 2 * 6 * 9))
    add("dot", "9.9", lambda: ((meta(9), meta(9)), {}, None, 2 * 9))
    add("addr", "6 x 9", lambda: ((meta(6, 9), meta(6), meta(9)), {}, None, 2 * 6 * 9))

    for label, conv in {
        "2d": dict(x=(2, 3, 16, 16), w=(8, 3, 3, 3), stride=2, padding=1),
        "grouped": dict(x=(2, 8, 9, 9), w=(16, 2, 3, 3), padding=2, dilation=2, groups=4),
        "depthwise": dict(x=(2, 8, 9, 9), w=(8, 1, 3, 3), padding=1, groups=8),
        "transposed": dict(x=(2, 16, 8, 8), w=(16, 4, 2, 2), stride=2, transposed=True),
        "1d": dict(x=(2, 4, 256), w=(6, 4, 5)),
        "3d": dict(x=(1, 2, 6, 6, 6), w=(4, 2, 3, 3, 3)),
    }.items():

        def make(conv: dict = conv) -> tuple[tuple, dict, Any, int]:
            args, out, flops = _conv_case(**conv)
            return args, {}, out, flops

        add("convolution", label, make)

        def make_u(conv: dict = conv) -> tuple[tuple, dict, Any, int]:
            args, out, flops = _conv_case(**conv)
            return (*args, False, False, True, True), {}, out, flops

        add("_convolution", label, make_u)

    def conv_backward(groups: int, transposed: bool) -> Callable[[], tuple[tuple, dict, Any, int]]:
        def make() -> tuple[tuple, dict, Any, int]:
            if transposed:
                x, w = (2, 8, 5, 5), (8, 6 // groups, 3, 3)
            else:
                x, w = (2, 8, 9, 9), (6, 8 // groups, 3, 3)
            args, out, fwd = _conv_case(x, w, padding=1, transposed=transposed, groups=groups)
            g = torch.empty(out.shape, device="meta")
            bw_args = (g, args[0], args[1], None, *args[3:], [True, True, False])
            grads = (torch.empty(x, device="meta"), torch.empty(w, device="meta"), None)
            # the input gradient and the weight gradient each take exactly the forward's MACs
            return bw_args, {}, grads, 2 * fwd

        return make

    for groups in (1, 4):
        for transposed in (False, True):
            add(
                "convolution_backward",
                f"groups={groups}{' transposed' if transposed else ''}",
                conv_backward(groups, transposed),
            )

    b, h, sq, sk, d, dv = 2, 4, 9, 11, 8, 6
    fwd = 2 * b * h * sq * sk * (d + dv)
    bwd = 2 * b * h * sq * sk * (3 * d + 2 * dv)

    def bhsd() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return meta(b, h, sq, d), meta(b, h, sk, d), meta(b, h, sk, dv), meta(b, h, sq, dv)

    def bshd() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return meta(b, sq, h, d), meta(b, sk, h, d), meta(b, sk, h, dv), meta(b, sq, h, dv)

    add("_scaled_dot_product_attention_math", "fwd", lambda: (bhsd()[:3], {}, None, fwd))
    add(
        "_scaled_dot_product_flash_attention_for_cpu",
        "fwd",
        lambda: ((*bhsd()[:3], 0.0, False), {}, None, fwd),
    )
    add(
        "_scaled_dot_product_flash_attention_for_cpu_backward",
        "bwd",
        lambda: ((bhsd()[3], *bhsd()[:3], bhsd()[3], meta(b, h, sq), 0.0, False), {}, None, bwd),
    )
    add(
        "_scaled_dot_product_flash_attention",
        "fwd",
        lambda: ((*bhsd()[:3], 0.0, False, False), {}, None, fwd),
    )
    add(
        "_scaled_dot_product_flash_attention_backward",
        "bwd",
        lambda: (
            (
                bhsd()[3],
                *bhsd()[:3],
                bhsd()[3],
                meta(b, h, sq),
                None,
                None,
                sq,
                sk,
                0.0,
                False,
                None,
                None,
            ),
            {},
            None,
            bwd,
        ),
    )
    add(
        "_scaled_dot_product_efficient_attention",
        "fwd",
        lambda: ((*bhsd()[:3], None, False), {}, None, fwd),
    )
    add(
        "_scaled_dot_product_efficient_attention_backward",
        "bwd",
        lambda: (
            (bhsd()[3], *bhsd()[:3], None, bhsd()[3], meta(b, h, sq), None, None, 0.0, [True] * 4),
            {},
            None,
            bwd,
        ),
    )
    add(
        "_scaled_dot_product_cudnn_attention",
        "fwd",
        lambda: ((*bhsd()[:3], None, False, 0.0, False, False), {}, None, fwd),
    )
    add(
        "_scaled_dot_product_cudnn_attention_backward",
        "bwd",
        lambda: (
            (
                bhsd()[3],
                *bhsd()[:3],
                bhsd()[3],
                meta(b, h, sq),
                None,
                None,
                None,
                None,
                None,
                sq,
                sk,
                0.0,
                False,
            ),
            {},
            None,
            bwd,
        ),
    )
    add(
        "_scaled_dot_product_fused_attention_overrideable",
        "fwd",
        lambda: ((*bhsd()[:3], None, 0.0, False, False), {}, None, fwd),
    )
    add(
        "_scaled_dot_product_fused_attention_overrideable_backward",
        "bwd",
        lambda: (
            (
                bhsd()[3],
                *bhsd()[:3],
                None,
                [True] * 4,
                bhsd()[3],
                meta(b, h, sq),
                None,
                None,
                sq,
                sk,
                0.0,
                False,
                None,
                None,
            ),
            {},
            None,
            bwd,
        ),
    )
    add(
        "_flash_attention_forward",
        "fwd [B,S,H,D]",
        lambda: ((*bshd()[:3], None, None, sq, sk, 0.0, False, False), {}, None, fwd),
    )
    add(
        "_flash_attention_backward",
        "bwd [B,S,H,D]",
        lambda: (
            (
                bshd()[3],
                *bshd()[:3],
                bshd()[3],
                meta(b, h, sq),
                None,
                None,
                sq,
                sk,
                0.0,
                False,
                None,
                None,
            ),
            {},
            None,
            bwd,
        ),
    )
    add(
        "_efficient_attention_forward",
        "fwd [B,S,H,D]",
        lambda: ((*bshd()[:3], None, None, None, sq, sk, 0.0, 0, False), {}, None, fwd),
    )
    add(
        "_efficient_attention_backward",
        "bwd [B,S,H,D]",
        lambda: (
            (
                bshd()[3],
                *bshd()[:3],
                None,
                bshd()[3],
                None,
                None,
                sq,
                sk,
                meta(b, h, sq),
                0.0,
                None,
                None,
                0,
                False,
            ),
            {},
            None,
            bwd,
        ),
    )
    # grouped-query heads: every query head counts
    add(
        "_scaled_dot_product_flash_attention_for_cpu",
        "fwd gqa",
        lambda: (
            (meta(b, h, sq, d), meta(b, 2, sk, d), meta(b, 2, sk, d), 0.0, False),
            {},
            None,
            2 * b * h * sq * sk * 2 * d,
        ),
    )
    return cases


CASES = _cases()
# Where hookcli corrects torch on purpose: torch (through 2.15) counts the weight
# gradient of a grouped convolution as if every input channel met every output channel.
# torch also reads aten._efficient_attention_forward/backward's dense [B, S, H, D]
# tensors as [B, H, S, D], which swaps heads and sequence (the kernel's layout is
# [B, S, H, D], as aten._scaled_dot_product_efficient_attention passes it).
LAYOUT_READ_WRONG_BEFORE_2_14 = {"_flash_attention_forward", "_flash_attention_backward"}
CORRECTED = {
    ("convolution_backward", "groups=4"),
    ("convolution_backward", "groups=4 transposed"),
    ("_efficient_attention_forward", "fwd [B,S,H,D]"),
    ("_efficient_attention_backward", "bwd [B,S,H,D]"),
}


@pytest.mark.parametrize(("op", "label", "make"), CASES, ids=[f"{c[0]}[{c[1]}]" for c in CASES])
def test_formula_equals_closed_form_and_torch(op: str, label: str, make: Callable) -> None:
    if not hasattr(aten, op):
        pytest.skip(f"this torch has no aten.{op}")
    packet = getattr(aten, op)
    args, kwargs, out, expected = make()
    ours = FORMULAS[packet](*args, **kwargs, out_val=out)
    assert ours == expected
    theirs = _torch_registry().get(packet)
    if theirs is None or (op, label) in CORRECTED:
        return
    try:
        figure = theirs(*args, **kwargs, out_val=out)
    except AssertionError:
        figure = None  # torch's own shape check refused its own kernel's layout
    if figure != ours and op in LAYOUT_READ_WRONG_BEFORE_2_14:
        # torch < 2.14 read these kernels' [B, S, H, D] tensors as [B, H, S, D]
        swapped = [
            a.transpose(1, 2) if isinstance(a, torch.Tensor) and a.dim() == 4 else a for a in args
        ]
        assert figure in (None, FORMULAS[packet](*swapped, **kwargs, out_val=out))
        return
    assert figure == ours, f"torch's formula for {op} disagrees"


def test_grouped_conv_backward_correction_is_exactly_the_groups_factor() -> None:
    """Where torch has a formula and hookcli corrects it, the difference is the weight
    gradient's factor ``groups`` and nothing else."""
    theirs = _torch_registry().get(aten.convolution_backward)
    if theirs is None:
        pytest.skip("this torch has no convolution_backward formula")
    for op, label, make in CASES:
        if op != "convolution_backward" or (op, label) not in CORRECTED:
            continue
        args, _kwargs, out, expected = make()
        groups = args[9]
        input_only = [*args[:10], [True, False, False]]
        weight_only = [*args[:10], [False, True, False]]
        torch_input = theirs(*input_only, out_val=out)
        torch_weight = theirs(*weight_only, out_val=out)
        assert torch_input + torch_weight // groups == expected


def test_every_counted_op_has_hookcli_s_own_formula() -> None:
    """No op in hookcli's counted list takes its formula from torch's registry, and
    every aten op torch's registry counts, hookcli counts too."""
    registry = _torch_registry()
    for packet, formula in FORMULAS.items():
        assert formula.__module__.startswith("hookcli."), packet
        assert formula is not registry.get(packet)
        assert not getattr(formula, "__wrapped__", None), packet
    missing = [
        str(k) for k in registry if isinstance(k, torch._ops.OpOverloadPacket) and k not in FORMULAS
    ]
    assert not missing, f"ops torch counts and hookcli does not: {missing}"
    # nor by way of a wrapper of hookcli's own: no hookcli code touches torch's counter
    import ast

    import hookcli

    def reads_torch_counter(tree: ast.AST) -> bool:
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and "flop_counter" in (node.module or ""):
                return True
            if isinstance(node, ast.Import) and any("flop_counter" in a.name for a in node.names):
                return True
            if isinstance(node, ast.Attribute) and node.attr in ("flop_registry", "flop_counter"):
                return True
            if isinstance(node, ast.Name) and node.id == "flop_registry":
                return True
        return False

    package = Path(hookcli.__file__).parent
    readers = [
        str(f.relative_to(package))
        for f in sorted(package.rglob("*.py"))
        if reads_torch_counter(ast.parse(f.read_text(encoding="utf-8")))
    ]
    assert not readers, f"hookcli modules that read torch's FLOP counter: {readers}"


def test_every_case_op_is_registered_on_this_torch() -> None:
    for op, _, _ in CASES:
        if hasattr(aten, op):
            assert getattr(aten, op) in FORMULAS, op


# -- cpu and meta agree --------------------------------------------------------------
def _totals(spec: str, device: str, *extra: str) -> dict:
    return invoke_json("cost", spec, "--device", device, "-d", "0", *extra)["totals"]


def test_bare_sdpa_macs_on_cpu_and_meta() -> None:
    expected = 2 * 2 * 4 * 64 * 64 * 32
    for device in ("cpu", "meta"):
        totals = _totals(f"{AM}:BareSDPA", device)
        assert totals["macs"] == expected, device
        assert totals["uncounted_op_count"] == 0, device


@pytest.mark.parametrize("variant", ["none", "causal", "bool", "float", "gqa"])
def test_attention_saved_bytes_and_peaks_equal_on_cpu_and_meta(variant: str) -> None:
    """Meta picks the CPU's kernel, so what autograd saves is the same on both."""
    spec = f"{AM}:MaskedSDPA"
    cpu = _totals(spec, "cpu", "-k", f"variant={variant!r}", "--backward")
    on_meta = _totals(spec, "meta", "-k", f"variant={variant!r}", "--backward")
    for key in ("macs", "flops", "backward_flops", "saved_bytes", "peak_activation_bytes"):
        assert cpu[key] == on_meta[key], (variant, key, cpu[key], on_meta[key])
    # the attention's MACs: QK^T and (attention)V over 4 query heads, 12 x 12, head dim 4
    b, s, dim, heads, hd = 2, 12, 16, 4, 4
    kv = 2 * (2 if variant == "gqa" else 4) * hd
    linear = b * s * dim * dim + b * s * dim * kv
    assert cpu["macs"] == linear + 2 * b * heads * s * s * hd


@pytest.mark.slow
def test_vit_b_16_macs_equal_on_cpu_and_meta_and_published() -> None:
    cpu = _totals("vit_b_16", "cpu")
    on_meta = _totals("vit_b_16", "meta")
    for key in ("macs", "flops", "saved_bytes", "peak_activation_bytes"):
        assert cpu[key] == on_meta[key], key
    from torchvision.models import ViT_B_16_Weights

    published = ViT_B_16_Weights.IMAGENET1K_V1.meta["_ops"] * 1e9  # GFLOPS as MACs
    assert abs(cpu["macs"] - published) / published < 0.005


def _decoder_closed_form(
    seq: int, layers: int, d: int = 4096, ff: int = 11008, vocab: int = 32000
) -> int:
    per_layer = seq * (4 * d * d + 3 * d * ff) + 2 * seq * seq * d
    return layers * per_layer + seq * d * vocab


@pytest.mark.slow
def test_7b_decoder_layer_equal_on_cpu_and_meta() -> None:
    """One decoder layer of the 7B shape on the CPU (1.9 GB, under a memory cap in a
    subprocess) and on meta: equal FLOPs, saved bytes and peaks, and the closed form."""
    code = (
        "import resource, sys, json\n"
        "resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))\n"
        "from hookcli.cli import main\n"
        "sys.argv = ['hookcli', 'cost', 'tests.fixtures.cost_models:llama_7b_cpu', '-k', 'seq=32',"
        " '-k', 'layers=1', '-d', '0', '-f', 'json']\n"
        "main()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env={**__import__("os").environ, "HOOKCLI_FULL_EXIT": "1"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    import json

    cpu = json.loads(out.stdout)["totals"]
    on_meta = invoke_json(
        "cost",
        "tests.fixtures.cost_models:llama_7b_meta",
        "-k",
        "seq=32",
        "-k",
        "layers=1",
        "--device",
        "meta",
        "-d",
        "0",
    )["totals"]
    for key in ("macs", "flops", "saved_bytes", "peak_activation_bytes"):
        assert cpu[key] == on_meta[key], key
    assert cpu["macs"] == _decoder_closed_form(32, 1)


def test_7b_decoder_on_meta_equals_closed_form_at_full_depth() -> None:
    totals = invoke_json(
        "cost",
        "tests.fixtures.cost_models:llama_7b_meta",
        "-k",
        "seq=128",
        "--device",
        "meta",
        "-d",
        "0",
    )["totals"]
    assert totals["macs"] == _decoder_closed_form(128, 32)


def test_backward_booked_by_graph_walk_where_torch_has_no_node_creation_hook(monkeypatch) -> None:
    """torch < 2.12-ish has no ``node_creation_hook``: cost then books each call's autograd
    nodes by walking its graph. Per row, that gives what the hook gives (and the attention
    backward, 5 products of the forward's sizes, is booked on the attention module)."""
    spec = "sample_models.decoder:Decoder"
    with_hook = invoke_json("cost", spec, "--backward")
    monkeypatch.delattr(torch.autograd.graph, "node_creation_hook", raising=False)
    walked = invoke_json("cost", spec, "--backward")
    assert walked["totals"]["backward_flops"] == with_hook["totals"]["backward_flops"]
    for a, b in zip(walked["layers"], with_hook["layers"], strict=True):
        assert (a["name"], a["own_backward_flops"]) == (b["name"], b["own_backward_flops"])
    attn = next(r for r in walked["layers"] if r["name"] == "layers.0.self_attn")
    assert attn["own_backward_flops"] > 0
