"""FLOP formulas per aten op, all of them hookcli's own.

Counting convention (the one torchvision's published figures and
``torch.utils.flop_counter`` use): an op's FLOPs are those of its
multiply-accumulate work (matrix products, convolutions, attention, recurrent
cells), a multiply-add counting 2, so that MACs are exactly half the FLOPs. Ops
that move or create data (views, copies, concatenation, indexing, allocation,
random fills) count 0 by nature (``ZERO_FLOP_OPS``). Any other op that has no
formula (elementwise arithmetic, normalization, softmax, pooling, reductions) is
not guessed at: the caller lists it as uncounted.

Every formula here is written in this module and registered whatever the
installed torch has: a figure never depends on the torch version. torch's own
``flop_registry`` has differed between releases (2.14 has no formula for the CPU
flash-attention kernel, so attention counted 0 there); where it has a formula,
``tests/test_flops.py`` checks that hookcli's agrees with it, except where
hookcli corrects it (the weight gradient of a grouped convolution).

The formulas also make a fused kernel count what the decomposed math counts, so
the figure does not depend on the path PyTorch picks: a CPU LSTM runs one
``mkldnn_rnn_layer`` per layer where ``--device meta`` runs an ``addmm`` per
step, and both come out as ``steps*batch*(|W_ih| + |W_hh|)`` MACs; every
attention kernel counts ``QK^T`` and ``(attention)V``.

A formula receives the op's arguments as the dispatcher passes them (tensors,
lists, numbers) plus ``out_val``, the op's result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from hookcli.cost.quantized_flops import QUANTIZED_FORMULAS

aten = torch.ops.aten
Formula = Callable[..., int]
Shape = Sequence[int]


def _prod(shape: Shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _dims(x: Any) -> tuple[int, ...]:
    """The shape of a tensor, or a shape given as a sequence."""
    if isinstance(x, torch.Tensor):
        return tuple(x.shape)
    return tuple(int(d) for d in x)


def _arg(args: Sequence[Any], kwargs: dict[str, Any], pos: int, name: str, default: Any) -> Any:
    if len(args) > pos:
        return args[pos]
    return kwargs.get(name, default)


# -- matrix products ------------------------------------------------------------------


def mm_flops(a: Shape, b: Shape) -> int:
    """[m, k] @ [k, n]: 2*m*k*n."""
    m, k = a[-2], a[-1]
    return 2 * int(m) * int(k) * int(b[-1])


def bmm_flops(a: Shape, b: Shape) -> int:
    """[b, m, k] @ [b, k, n]: 2*b*m*k*n."""
    return 2 * int(a[0]) * int(a[1]) * int(a[2]) * int(b[2])


def _mm(a: Any, b: Any, *_: Any, **__: Any) -> int:
    return mm_flops(_dims(a), _dims(b))


def _routed_rows(offs: Any, rows: int) -> int:
    """The rows a grouped matmul multiplies: up to the last offset where its value is
    known (a real tensor), else all ``rows`` (on meta, every token is routed)."""
    if isinstance(offs, torch.Tensor) and offs.numel() and offs.device.type != "meta":
        try:
            return min(rows, int(offs[-1]))
        except (RuntimeError, ValueError):
            return rows
    return rows


def grouped_mm_flops(a: Shape, b: Shape, offs: Any = None) -> int:
    """``torch._grouped_mm`` (an MoE's experts, every expert one matrix): each group is one
    matrix product, so the FLOPs are those of the rows each group multiplies.

    - [s, k] @ [g, k, n] with offsets (the forward, and the input's gradient): row r of
      ``a`` meets its group's [k, n]: 2*s*k*n, s the routed rows;
    - [k, s] @ [s, n] with offsets (the weight's gradient): group i contracts its own
      rows: 2*k*s*n in all;
    - [g, m, k] @ [g, k, n] (no offsets): a batched product, 2*g*m*k*n;
    - [g, m, k] @ [k, n] with offsets: each group's [m, k] meets the same [k, n].
    """
    if len(a) == 2 and len(b) == 3:
        return 2 * _routed_rows(offs, int(a[0])) * int(a[1]) * int(b[2])
    if len(a) == 2 and len(b) == 2:
        return 2 * int(a[0]) * _routed_rows(offs, int(a[1])) * int(b[1])
    if len(a) == 3 and len(b) == 3:
        return 2 * int(a[0]) * int(a[1]) * int(a[2]) * int(b[2])
    if len(a) == 3 and len(b) == 2:
        return 2 * int(a[0]) * int(a[1]) * int(a[2]) * int(b[1])
    return 0


def _grouped_mm(a: Any, b: Any, offs: Any = None, *_: Any, **kw: Any) -> int:
    return grouped_mm_flops(_dims(a), _dims(b), kw.get("offs", offs))


def _grouped_mm_fallback(inp: Any, weight: Any, offs: Any = None, *_: Any, **__: Any) -> int:
    """transformers' ``grouped_mm_fallback`` custom op (its loop of ``torch.mm`` runs inside
    one opaque op, where torch lacks ``_grouped_mm``): [s, k] @ [g, k, n]."""
    return grouped_mm_flops(_dims(inp), _dims(weight), offs)


def _grouped_mm_fallback_backward(
    inp: Any, weight: Any, offs: Any = None, grad_out: Any = None, *_: Any, **__: Any
) -> int:
    """Its backward: the input's gradient and the weights' gradient, each one forward."""
    return 2 * grouped_mm_flops(_dims(inp), _dims(weight), offs)


def _addmm(_self: Any, a: Any, b: Any, *_: Any, **__: Any) -> int:
    return mm_flops(_dims(a), _dims(b))


def _bmm(a: Any, b: Any, *_: Any, **__: Any) -> int:
    return bmm_flops(_dims(a), _dims(b))


def _baddbmm(_self: Any, a: Any, b: Any, *_: Any, **__: Any) -> int:
    return bmm_flops(_dims(a), _dims(b))


def _addbmm(_self: Any, b1: Any, b2: Any, *_: Any, **__: Any) -> int:
    return bmm_flops(_dims(b1), _dims(b2))


def _mv(mat: Any, _vec: Any, *_: Any, **__: Any) -> int:
    return 2 * _prod(_dims(mat))


def _addmv(_self: Any, mat: Any, _vec: Any, *_: Any, **__: Any) -> int:
    return 2 * _prod(_dims(mat))


def _dot(a: Any, _b: Any, *_: Any, **__: Any) -> int:
    return 2 * _prod(_dims(a))


def _addr(_self: Any, v1: Any, v2: Any, *_: Any, **__: Any) -> int:
    return 2 * _prod(_dims(v1)) * _prod(_dims(v2))


# -- convolutions ---------------------------------------------------------------------


def conv_flops(x: Shape, w: Shape, out: Shape, transposed: bool = False) -> int:
    """2 * batch * (spatial points) * (kernel points) * w[0] * w[1].

    The spatial points are the output's for a convolution and the input's for a
    transposed one (each input point is spread over a kernel's worth of outputs).
    ``w`` is the weight as stored ([C_out, C_in/groups, *k], or [C_in, C_out/groups,
    *k] when transposed), so groups are already accounted for. Bias adds are not
    counted, as in torch's and torchvision's convention.
    """
    spatial = (x if transposed else out)[2:]
    return 2 * int(x[0]) * _prod(spatial) * _prod(w[2:]) * int(w[0]) * int(w[1])


def _out_shape(out_val: Any) -> tuple[int, ...]:
    return _dims(out_val[0] if isinstance(out_val, (tuple, list)) else out_val)


def _convolution(
    x: Any,
    w: Any,
    _bias: Any = None,
    _stride: Any = None,
    _padding: Any = None,
    _dilation: Any = None,
    transposed: bool = False,
    *_: Any,
    out_val: Any = None,
    **__: Any,
) -> int:
    """convolution, _convolution, convolution_overrideable: ``transposed`` is argument 6."""
    return conv_flops(_dims(x), _dims(w), _out_shape(out_val), bool(transposed))


def _conv_plain(x: Any, w: Any, *_: Any, out_val: Any = None, **__: Any) -> int:
    """Backend kernels that are never transposed (cudnn, mkldnn, slow, nnpack)."""
    return conv_flops(_dims(x), _dims(w), _out_shape(out_val), False)


def _conv_transposed(x: Any, w: Any, *_: Any, out_val: Any = None, **__: Any) -> int:
    """Backend kernels of transposed convolutions."""
    return conv_flops(_dims(x), _dims(w), _out_shape(out_val), True)


def _swap01(shape: Shape) -> tuple[int, ...]:
    return (int(shape[1]), int(shape[0]), *(int(d) for d in shape[2:]))


def _convolution_backward(
    grad_out: Any, x: Any, w: Any, *args: Any, out_val: Any = None, **kwargs: Any
) -> int:
    """The input gradient (a convolution of grad_out with the weight, the other way
    round) plus the weight gradient (a convolution of the input with grad_out).

    The weight gradient of a grouped convolution meets each input channel with
    the output channels of its group only: its count is divided by ``groups``.
    torch's formula (2.15) does not divide, and counted a depthwise conv's
    backward C times too large.
    """
    transposed = bool(_arg(args, kwargs, 4, "transposed", False))
    groups = int(_arg(args, kwargs, 6, "groups", 1))
    mask = list(_arg(args, kwargs, 7, "output_mask", [True, True, True]))
    g, xs, ws = _dims(grad_out), _dims(x), _dims(w)
    outs = out_val if isinstance(out_val, (tuple, list)) else (None, None, None)
    total = 0
    if mask[0]:
        gi = _dims(outs[0]) if outs[0] is not None else xs
        total += conv_flops(g, ws, gi, not transposed)
    if mask[1]:
        gw = _dims(outs[1]) if outs[1] is not None else ws
        if transposed:
            weight_term = conv_flops(_swap01(g), _swap01(xs), _swap01(gw), False)
        else:
            weight_term = conv_flops(_swap01(xs), _swap01(g), _swap01(gw), False)
        total += weight_term // groups
    return total


# -- attention ------------------------------------------------------------------------


def sdpa_flops(q: Shape, k: Shape, v: Shape) -> int:
    """Scaled dot-product attention on [..., S, D] tensors: ``QK^T`` and ``(attention)V``.

    Grouped-query attention (fewer key/value heads) counts every query head, as
    the kernels broadcast the key/value heads. Neither the causal mask nor the
    softmax is taken off or added, as in torch's convention.
    """
    bh, s_q, d_q = _prod(q[:-2]), int(q[-2]), int(q[-1])
    s_k, d_v = int(k[-2]), int(v[-1])
    return 2 * bh * s_q * s_k * (d_q + d_v)


def sdpa_backward_flops(q: Shape, k: Shape, v: Shape) -> int:
    """The backward of ``sdpa_flops``: the scores recomputed (``QK^T``), the gradients
    of the attention and of V, then of Q and of K: five products of the forward's sizes."""
    bh, s_q, d_q = _prod(q[:-2]), int(q[-2]), int(q[-1])
    s_k, d_v = int(k[-2]), int(v[-1])
    return 2 * bh * s_q * s_k * (3 * d_q + 2 * d_v)


def _bhsd(t: Any, seq_first: bool) -> tuple[int, ...]:
    """A [B, S, H, D] kernel tensor as [B, H, S, D]."""
    s = _dims(t)
    return (s[0], s[2], s[1], s[3]) if seq_first and len(s) == 4 else s


def _lengths(offsets: Any, max_len: Any) -> list[int]:
    """Per-sequence lengths of a packed (nested) batch; the maximum each where the
    offsets hold no values (meta, fake tensors)."""
    if isinstance(offsets, torch.Tensor) and offsets.device.type != "meta":
        try:
            return [int(n) for n in offsets.diff().tolist()]
        except (RuntimeError, NotImplementedError):
            pass
    return [int(max_len)] * (int(offsets.shape[0]) - 1)


def _packed_shapes(
    q: Any, k: Any, v: Any, cu_q: Any, cu_k: Any, max_q: Any, max_k: Any, seq_first: bool
) -> Iterator[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    """[B, H, S, D] shapes of a kernel's query, key and value, one per sequence when
    the batch is packed (cumulative sequence offsets given; heads and head size are the
    last two dims, of [T, H, D] for flash and [1, T, H, D] for efficient attention)."""
    if cu_q is None:
        yield _bhsd(q, seq_first), _bhsd(k, seq_first), _bhsd(v, seq_first)
        return
    qs, ks, vs = _dims(q), _dims(k), _dims(v)
    for lq, lk in zip(_lengths(cu_q, max_q), _lengths(cu_k, max_k), strict=False):
        yield (1, qs[-2], lq, qs[-1]), (1, ks[-2], lk, ks[-1]), (1, vs[-2], lk, vs[-1])


def _sdpa(q: Any, k: Any, v: Any, *_: Any, **__: Any) -> int:
    """The SDPA kernels on [B, H, S, D]: math, flash (CPU and CUDA), efficient, cudnn,
    overrideable."""
    return sdpa_flops(_dims(q), _dims(k), _dims(v))


def _sdpa_backward(_g: Any, q: Any, k: Any, v: Any, *_: Any, **__: Any) -> int:
    return sdpa_backward_flops(_dims(q), _dims(k), _dims(v))


def _packed_attention(flops: Formula, before: int, between: int) -> Formula:
    """The counter of a flash or efficient attention kernel: ``before`` arguments (the
    backward's grad), q, k, v, ``between`` more (bias, out, lse), then the offsets of a
    packed batch: cu_q, cu_k, max_q, max_k (absent: None, None, 0, 0)."""

    def count(*args: Any, **_: Any) -> int:
        q, k, v = args[before : before + 3]
        packing = list(args[before + 3 + between : before + 7 + between])
        cu_q, cu_k, max_q, max_k = packing + [None, None, 0, 0][len(packing) :]
        return sum(flops(*s) for s in _packed_shapes(q, k, v, cu_q, cu_k, max_q, max_k, True))

    return count


# aten._flash_attention_forward: [B, S, H, D], or packed [T, H, D] with offsets
_flash_forward = _packed_attention(sdpa_flops, 0, 0)
_flash_backward = _packed_attention(sdpa_backward_flops, 1, 2)  # grad; out, logsumexp
# aten._efficient_attention_forward: [B, S, H, D] (packed: [1, T, H, D], offsets given)
_efficient_forward = _packed_attention(sdpa_flops, 0, 1)  # bias
_efficient_backward = _packed_attention(sdpa_backward_flops, 1, 2)  # grad; bias, out


def _native_mha(q: Any, k: Any, v: Any, embed_dim: int, num_heads: int, *_: Any, **__: Any) -> int:
    """nn.MultiheadAttention's fast path: q/k/v projections, attention, output projection."""
    qs, ks = _dims(q), _dims(k)
    e = int(embed_dim)
    lq, lk = _prod(qs[:-1]), _prod(ks[:-1])  # batch * length
    batch = _prod(qs[:-2]) if len(qs) > 2 else 1
    len_q, len_k = int(qs[-2]) if len(qs) > 1 else 1, int(ks[-2]) if len(ks) > 1 else 1
    macs = lq * e * e + 2 * lk * e * e + 2 * batch * len_q * len_k * e + lq * e * e
    return 2 * macs


def _encoder_layer(src: Any, embed_dim: int, num_heads: int, *args: Any, **kwargs: Any) -> int:
    """nn.TransformerEncoderLayer's fast path: attention block plus the two FFN linears."""
    ffn1 = args[11] if len(args) > 11 else kwargs["ffn_weight_1"]
    s = _dims(src)
    e, ff = int(embed_dim), int(_dims(ffn1)[0])
    tokens = _prod(s[:-1])
    batch, length = (_prod(s[:-2]), int(s[-2])) if len(s) > 2 else (1, int(s[0]))
    macs = 4 * tokens * e * e + 2 * batch * length * length * e + 2 * tokens * e * ff
    return 2 * macs


# -- recurrent kernels ----------------------------------------------------------------


def _rnn_macs(steps_times_batch: int, weights: Sequence[torch.Tensor | None]) -> int:
    # every 2-D weight (W_ih, W_hh, W_hr) is applied once per step and sequence
    return steps_times_batch * sum(w.numel() for w in weights if w is not None and w.dim() == 2)


def _mkldnn_rnn(
    inp: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, *_: Any, **__: Any
) -> int:
    """One LSTM/GRU layer and direction on CPU (input [T, B, I] or batch first)."""
    return 2 * _rnn_macs(inp.numel() // inp.shape[-1], (w_ih, w_hh))


def _mkldnn_rnn_backward(
    inp: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, *_: Any, **__: Any
) -> int:
    # grads w.r.t. inputs and w.r.t. weights: twice the forward, as for mm
    return 2 * _mkldnn_rnn(inp, w_ih, w_hh)


def _cudnn_rnn(inp: torch.Tensor, weights: Sequence[torch.Tensor], *_: Any, **__: Any) -> int:
    """All layers and directions of a cuDNN RNN (packed input: [sum(batch_sizes), I])."""
    return 2 * _rnn_macs(inp.numel() // inp.shape[-1], weights)


def _cudnn_rnn_backward(
    inp: torch.Tensor, weights: Sequence[torch.Tensor], *_: Any, **__: Any
) -> int:
    return 2 * _cudnn_rnn(inp, weights)


# -- sparse operands ------------------------------------------------------------------


def is_sparse(t: Any) -> bool:
    """A tensor in a sparse layout (COO, CSR, CSC, BSR, BSC)."""
    return isinstance(t, torch.Tensor) and t.layout is not torch.strided


def stored(t: torch.Tensor) -> int:
    """The elements a sparse tensor stores (its nonzeros; block elements for BSR/BSC)."""
    try:
        values = t._values() if t.layout is torch.sparse_coo else t.values()
        return int(values.numel())
    except (RuntimeError, NotImplementedError):
        return 0


def _sparse_pair(a: torch.Tensor, b: torch.Tensor) -> int:
    """Multiply-adds of sparse @ sparse: for each inner index k, the nonzeros of column k
    of ``a`` times those of row k of ``b`` (2-D, values known); else the smaller of the two
    one-sided counts."""
    one_sided = min(stored(a) * int(b.shape[-1]), stored(b) * int(a.shape[-2]))
    if a.dim() != 2 or b.dim() != 2 or a.is_meta or b.is_meta:
        return one_sided
    try:
        cols = a.to_sparse_coo().coalesce().indices()[1]
        rows = b.to_sparse_coo().coalesce().indices()[0]
        k = int(a.shape[1])
        return int((torch.bincount(cols, minlength=k) * torch.bincount(rows, minlength=k)).sum())
    except (RuntimeError, NotImplementedError):
        return one_sided


def sparse_matmul_flops(a: Any, b: Any) -> int:
    """A matrix product with a sparse operand, counted by its nonzeros: sparse [m, k] @
    dense [k, n] is ``2 * nnz * n``; dense [m, k] @ sparse [k, n] is ``2 * m * nnz``
    (batched: the nonzeros of every batch)."""
    if is_sparse(a) and is_sparse(b):
        return 2 * _sparse_pair(a, b)
    if is_sparse(a):
        return 2 * stored(a) * int(b.shape[-1]) if b.dim() > 1 else 2 * stored(a)
    return 2 * stored(b) * int(a.shape[-2]) if a.dim() > 1 else 2 * stored(b)


# matrix products -> the positions of their two operands; a call with a sparse operand is
# counted by ``sparse_matmul_flops`` and listed as a sparse op
_SPARSE_OPERANDS: dict[str, tuple[int, int]] = {
    **dict.fromkeys(("mm", "bmm", "mv", "_sparse_mm", "smm", "hspmm"), (0, 1)),
    "_sparse_sparse_matmul": (0, 1),
    # the add- forms: the input to add first, then the two operands
    **dict.fromkeys(("addmm", "_addmm_activation", "_sparse_addmm", "sspaddmm", "addmv"), (1, 2)),
}
SPARSE_OPERANDS: dict[Any, tuple[int, int]] = {
    getattr(aten, n): pos for n, pos in _SPARSE_OPERANDS.items() if hasattr(aten, n)
}


def sparse_operands(packet: Any, args: Sequence[Any]) -> tuple[Any, Any] | None:
    """The two operands of a matrix product when one of them is sparse; else None."""
    pos = SPARSE_OPERANDS.get(packet)
    if pos is None or len(args) <= pos[1]:
        return None
    a, b = args[pos[0]], args[pos[1]]
    return (a, b) if is_sparse(a) or is_sparse(b) else None


# -- the table ------------------------------------------------------------------------

_TABLE: dict[str, Formula] = {
    # matrix products
    "mm": _mm,
    "_int_mm": _mm,
    "_scaled_mm": _mm,
    "addmm": _addmm,
    "_addmm_activation": _addmm,
    "bmm": _bmm,
    "baddbmm": _baddbmm,
    "addbmm": _addbmm,
    "mv": _mv,
    # products with a sparse operand (the probe counts these by their nonzeros)
    "_sparse_mm": _mm,
    "smm": _mm,
    "hspmm": _mm,
    "_sparse_sparse_matmul": _mm,
    "_sparse_addmm": _addmm,
    "sspaddmm": _addmm,
    "addmv": _addmv,
    "dot": _dot,
    "vdot": _dot,
    "addr": _addr,
    # convolutions
    "convolution": _convolution,
    "_convolution": _convolution,
    "convolution_overrideable": _convolution,
    "cudnn_convolution": _conv_plain,
    "mkldnn_convolution": _conv_plain,
    "miopen_convolution": _conv_plain,
    "miopen_depthwise_convolution": _conv_plain,
    "_slow_conv2d_forward": _conv_plain,
    "slow_conv3d_forward": _conv_plain,
    "slow_conv_dilated2d": _conv_plain,
    "slow_conv_dilated3d": _conv_plain,
    "_nnpack_spatial_convolution": _conv_plain,
    "thnn_conv2d": _conv_plain,
    "_conv_depthwise2d": _conv_plain,
    "conv_depthwise3d": _conv_plain,
    "cudnn_convolution_transpose": _conv_transposed,
    "miopen_convolution_transpose": _conv_transposed,
    "slow_conv_transpose2d": _conv_transposed,
    "slow_conv_transpose3d": _conv_transposed,
    "convolution_backward": _convolution_backward,
    # attention: every scaled-dot-product kernel, forward and backward
    "_scaled_dot_product_attention_math": _sdpa,
    "_scaled_dot_product_attention_math_for_mps": _sdpa,
    "_scaled_dot_product_flash_attention": _sdpa,
    "_scaled_dot_product_flash_attention_backward": _sdpa_backward,
    "_scaled_dot_product_flash_attention_for_cpu": _sdpa,
    "_scaled_dot_product_flash_attention_for_cpu_backward": _sdpa_backward,
    "_scaled_dot_product_efficient_attention": _sdpa,
    "_scaled_dot_product_efficient_attention_backward": _sdpa_backward,
    "_scaled_dot_product_cudnn_attention": _sdpa,
    "_scaled_dot_product_cudnn_attention_backward": _sdpa_backward,
    "_scaled_dot_product_fused_attention_overrideable": _sdpa,
    "_scaled_dot_product_fused_attention_overrideable_backward": _sdpa_backward,
    "_flash_attention_forward": _flash_forward,
    "_flash_attention_backward": _flash_backward,
    "_efficient_attention_forward": _efficient_forward,
    "_efficient_attention_backward": _efficient_backward,
    "_native_multi_head_attention": _native_mha,
    "_transformer_encoder_layer_fwd": _encoder_layer,
    # recurrent kernels
    "mkldnn_rnn_layer": _mkldnn_rnn,
    "mkldnn_rnn_layer_backward": _mkldnn_rnn_backward,
    "_cudnn_rnn": _cudnn_rnn,
    "_cudnn_rnn_backward": _cudnn_rnn_backward,
    "miopen_rnn": _cudnn_rnn,
    # grouped matrix products (MoE experts), torch 2.8 and later
    "_grouped_mm": _grouped_mm,
}

# Custom ops of other libraries, by qualified name: they exist once the library has
# registered them, so they are looked up by name (``formula_for``), not at import.
NAMED_FORMULAS: dict[str, Formula] = {
    "transformers.grouped_mm_fallback": _grouped_mm_fallback,
    "transformers.grouped_mm_fallback_backward": _grouped_mm_fallback_backward,
}

# Every formula hookcli counts with, keyed by overload packet; ops this torch lacks are
# left out. Nothing here comes from torch's ``flop_registry``.
FORMULAS: dict[Any, Formula] = {
    **{getattr(aten, name): fn for name, fn in _TABLE.items() if hasattr(aten, name)},
    **QUANTIZED_FORMULAS,  # quantized::conv2d, quantized::linear and their kin
}

# Ops that move, view, create or fill data: no arithmetic, 0 FLOPs by nature.
_ZERO_TEXT = """
view _unsafe_view reshape _reshape_alias view_as t transpose transpose_ permute expand expand_as
squeeze squeeze_ unsqueeze unsqueeze_ select slice narrow split split_with_sizes unsafe_split
unsafe_split_with_sizes chunk unsafe_chunk unbind flatten unflatten as_strided as_strided_ alias
detach detach_ lift_fresh lift_fresh_copy clone contiguous copy_ _to_copy to _copy_from
_copy_from_and_resize cat stack hstack vstack zeros ones empty empty_like empty_strided
zeros_like ones_like full full_like new_zeros new_empty new_empty_strided new_ones new_full
scalar_tensor arange linspace fill_ zero_ fill index_select gather embedding index _unsafe_index
index_put_ index_put _index_put_impl_ scatter scatter_ masked_fill masked_fill_ masked_scatter_
masked_select where constant_pad_nd pad reflection_pad1d reflection_pad2d reflection_pad3d
replication_pad1d replication_pad2d replication_pad3d repeat repeat_interleave roll flip tril
triu tril_ triu_ diagonal diag_embed movedim swapaxes unfold im2col pixel_shuffle
pixel_unshuffle channel_shuffle native_channel_shuffle _reshape_copy view_as_real
view_as_complex real imag _local_scalar_dense item set_ resize_ resize_as_ _neg_view _conj conj
resolve_conj resolve_neg bernoulli bernoulli_ rand rand_like randn randn_like randint
randint_like randperm normal normal_ uniform_ exponential_ multinomial select_scatter
slice_scatter diagonal_scatter as_strided_scatter _has_compatible_shallow_copy_type is_same_size
is_nonzero _assert_async _assert_tensor_metadata _functional_assert_async sym_constrain_range
_unsafe_index_put nonzero _unique2 unique_dim unique_consecutive sort_stable sym_is_contiguous
is_contiguous is_strides_like_format is_non_overlapping_and_dense size sym_size stride
sym_stride storage_offset sym_storage_offset numel sym_numel dim _fused_sdp_choice
"""
_ZERO_NAMES = _ZERO_TEXT.split()
ZERO_FLOP_OPS = frozenset(getattr(aten, n) for n in _ZERO_NAMES if hasattr(aten, n))


_BY_PACKET: dict[Any, Formula | None] = {}


def formula_for(packet: Any) -> Formula | None:
    """The formula for an op's overload packet: ``FORMULAS``, else a library's custom op
    in ``NAMED_FORMULAS`` (cached per packet), else None."""
    formula = FORMULAS.get(packet)
    if formula is not None:
        return formula
    try:
        return _BY_PACKET[packet]
    except KeyError:
        found = NAMED_FORMULAS.get(op_name(packet))
        _BY_PACKET[packet] = found
        return found


def op_name(packet: Any) -> str:
    """``aten.relu_`` for an overload packet (its qualified name with a dot)."""
    name = getattr(packet, "_qualified_op_name", None)
    return str(name).replace("::", ".") if name else str(packet)
