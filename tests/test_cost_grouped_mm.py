"""MoE experts' grouped matrix products are counted (issue 28: MoE types): on torch with
``_grouped_mm`` and through transformers' fallback op (torch 2.6), on the CPU and on
meta, forward and backward; the reference is FlopCounterMode on the same products done
one expert at a time with ``torch.mm``."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from tests.conftest import invoke_json
from tests.fixtures import grouped_mm as g

SPEC = "tests.fixtures.grouped_mm:Experts"
# the fallback op exists on every torch of the matrix; torch's own from 2.8 on
IMPLS = ["transformers", *(["aten"] if hasattr(torch, "_grouped_mm") else [])]


def reference(backward: bool) -> tuple[int, int]:
    """Forward and backward FLOPs of the loop of mm's, by FlopCounterMode. The input needs
    no gradient (as hookcli draws it): the backward is the weights' gradient."""
    torch.manual_seed(0)
    x = torch.randn(g.TOKENS, g.K)
    w = torch.randn(g.EXPERTS, g.K, g.N, requires_grad=True)
    with FlopCounterMode(display=False) as fwd:
        out = g.loop(x, w, g.offsets())
    with FlopCounterMode(display=False) as bwd:
        if backward:
            out.sum().backward()
    return fwd.get_total_flops(), bwd.get_total_flops()


def test_the_reference_counts_the_routed_rows_only() -> None:
    fwd, bwd = reference(backward=True)
    assert fwd == 2 * sum(g.COUNTS) * g.K * g.N  # 21 rows, not 24
    assert bwd == fwd  # the weights' gradient: one product per routed row


@pytest.mark.parametrize("impl", IMPLS)
def test_grouped_mm_flops_equal_the_loop_of_mm_on_cpu(impl: str) -> None:
    fwd, bwd = reference(backward=True)
    # --loss random: torch's own _grouped_mm backward on the CPU refuses the expanded
    # gradient that a sum's backward gives (plain PyTorch fails alike); a projection's is dense
    report = invoke_json("cost", SPEC, "-k", f"impl={impl}", "--backward", "--loss", "random")
    assert report["totals"]["flops"] == fwd
    # transformers' fallback backward computes the input's gradient too, needed or not
    # (its grouped_mm_fallback_backward op returns both): twice the weights' alone
    assert report["totals"]["backward_flops"] == (2 * bwd if impl == "transformers" else bwd)
    uncounted = {u["op"] for u in report["uncounted_ops"]}
    assert not any("grouped_mm" in op for op in uncounted), uncounted


@pytest.mark.parametrize("impl", IMPLS)
def test_on_meta_the_rows_are_counted_as_far_as_meta_knows_them(impl: str) -> None:
    """torch's _grouped_mm runs on meta group by group, with offsets meta keeps the values
    of (made from constants): the routed rows, as on the CPU. The fallback is one opaque
    op whose offsets meta cannot read: every row counts as routed (a top-k router routes
    them all), an upper bound."""
    report = invoke_json("cost", SPEC, "-k", f"impl={impl}", "--device", "meta")
    rows = sum(g.COUNTS) if impl == "aten" else g.TOKENS
    assert report["totals"]["flops"] == 2 * rows * g.K * g.N
