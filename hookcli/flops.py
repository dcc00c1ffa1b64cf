"""FLOP formulas per aten op: torch's ``flop_registry`` plus the ops it lacks that matter.

Counting convention (torch's, and the one torchvision's published figures use):
an op's FLOPs are those of its multiply-accumulate work (matrix products,
convolutions, attention, recurrent cells), a multiply-add counting 2, so that
MACs are exactly half the FLOPs. Ops that move or create data (views, copies,
concatenation, indexing, allocation, random fills) count 0 by nature
(``ZERO_FLOP_OPS``). Any other op that has no formula (elementwise arithmetic,
normalization, softmax, pooling, reductions) is not guessed at: the caller lists
it as uncounted.

The extra formulas make a fused kernel count what the decomposed math counts,
so the figure does not depend on the path PyTorch picks: a CPU LSTM runs one
``mkldnn_rnn_layer`` per layer where ``--device meta`` runs an ``addmm`` per
step, and both come out as ``steps*batch*(|W_ih| + |W_hh|)`` MACs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.flop_counter import (
    flop_registry,
    sdpa_backward_flop_count,
    sdpa_flop_count,
    shape_wrapper,
)

aten = torch.ops.aten
Formula = Callable[..., int]


def _prod(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _mv_flop(mat_shape: Sequence[int], vec_shape: Sequence[int], *_: Any, **__: Any) -> int:
    return 2 * _prod(mat_shape)


def _addmv_flop(
    _self: Any, mat_shape: Sequence[int], vec_shape: Sequence[int], *_: Any, **__: Any
) -> int:
    return 2 * _prod(mat_shape)


def _dot_flop(a_shape: Sequence[int], b_shape: Sequence[int], *_: Any, **__: Any) -> int:
    return 2 * _prod(a_shape)


def _addr_flop(_self: Any, v1: Sequence[int], v2: Sequence[int], *_: Any, **__: Any) -> int:
    return 2 * _prod(v1) * _prod(v2)


def _addbmm_flop(_self: Any, b1: Sequence[int], b2: Sequence[int], *_: Any, **__: Any) -> int:
    b, n, m = b1
    return 2 * int(b) * int(n) * int(m) * int(b2[-1])


def _addmm_flop(_self: Any, a: Sequence[int], b: Sequence[int], *_: Any, **__: Any) -> int:
    return 2 * int(a[0]) * int(a[1]) * int(b[1])


def _int_mm_flop(a: Sequence[int], b: Sequence[int], *_: Any, **__: Any) -> int:
    return 2 * int(a[0]) * int(a[1]) * int(b[1])


def _rnn_macs(steps_times_batch: int, weights: Sequence[torch.Tensor | None]) -> int:
    # every 2-D weight (W_ih, W_hh, W_hr) is applied once per step and sequence
    return steps_times_batch * sum(w.numel() for w in weights if w is not None and w.dim() == 2)


def _mkldnn_rnn_flop(
    inp: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, *_: Any, **__: Any
) -> int:
    """One LSTM/GRU layer and direction on CPU (input [T, B, I] or batch first)."""
    return 2 * _rnn_macs(inp.numel() // inp.shape[-1], (w_ih, w_hh))


def _mkldnn_rnn_backward_flop(
    inp: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, *_: Any, **__: Any
) -> int:
    # grads w.r.t. inputs and w.r.t. weights: twice the forward, as for mm
    return 2 * _mkldnn_rnn_flop(inp, w_ih, w_hh)


def _cudnn_rnn_flop(inp: torch.Tensor, weights: Sequence[torch.Tensor], *_: Any, **__: Any) -> int:
    """All layers and directions of a cuDNN RNN (packed input: [sum(batch_sizes), I])."""
    return 2 * _rnn_macs(inp.numel() // inp.shape[-1], weights)


def _cudnn_rnn_backward_flop(
    inp: torch.Tensor, weights: Sequence[torch.Tensor], *_: Any, **__: Any
) -> int:
    return 2 * _cudnn_rnn_flop(inp, weights)


def _native_mha_flop(
    q: Sequence[int],
    k: Sequence[int],
    v: Sequence[int],
    embed_dim: int,
    num_heads: int,
    *_: Any,
    **__: Any,
) -> int:
    """nn.MultiheadAttention's fast path: q/k/v projections, attention, output projection."""
    e = int(embed_dim)
    lq, lk = _prod(q[:-1]), _prod(k[:-1])  # batch * length
    batch = _prod(q[:-2]) if len(q) > 2 else 1
    len_q, len_k = int(q[-2]) if len(q) > 1 else 1, int(k[-2]) if len(k) > 1 else 1
    macs = lq * e * e + 2 * lk * e * e + 2 * batch * len_q * len_k * e + lq * e * e
    return 2 * macs


def _encoder_layer_flop(
    src: Sequence[int], embed_dim: int, num_heads: int, *args: Any, **kwargs: Any
) -> int:
    """nn.TransformerEncoderLayer's fast path: attention block plus the two FFN linears."""
    ffn1 = args[11] if len(args) > 11 else kwargs["ffn_weight_1"]
    e, ff = int(embed_dim), int(ffn1[0])
    tokens = _prod(src[:-1])
    batch, length = (_prod(src[:-2]), int(src[-2])) if len(src) > 2 else (1, int(src[0]))
    macs = 4 * tokens * e * e + 2 * batch * length * length * e + 2 * tokens * e * ff
    return 2 * macs


def _sdpa_overrideable_flop(q: Any, k: Any, v: Any, *_: Any, **__: Any) -> int:
    return int(sdpa_flop_count(q, k, v))


def _sdpa_overrideable_backward_flop(g: Any, q: Any, k: Any, v: Any, *_: Any, **__: Any) -> int:
    return int(sdpa_backward_flop_count(g, q, k, v))


def _shape(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.shape
    if isinstance(x, (list, tuple)) and any(isinstance(i, torch.Tensor) for i in x):
        return type(x)(i.shape if isinstance(i, torch.Tensor) else i for i in x)
    return x


def _fast_shapes(fn: Callable[..., Any]) -> Formula:
    """Like torch's ``shape_wrapper``, one level deep: ops take tensors or lists of them,
    and a pytree walk per op call cost more than the formula itself."""

    def f(*args: Any, out_val: Any = None, **kwargs: Any) -> int:
        return fn(
            *[_shape(a) for a in args],
            out_shape=_shape(out_val),
            **{k: _shape(v) for k, v in kwargs.items()},
        )

    return f


def _unwrapped(fn: Formula) -> Formula:
    """A registered formula with torch's pytree shape wrapper swapped for the fast one."""
    inner = getattr(fn, "__wrapped__", None)
    if inner is not None and fn.__code__ is shape_wrapper(lambda: 0).__code__:
        return _fast_shapes(inner)
    return fn


def _raw(fn: Callable[..., Any]) -> Formula:
    """A formula that receives tensors (like torch's ``get_raw=True``)."""

    def f(*args: Any, out_val: Any = None, **kwargs: Any) -> int:
        return fn(*args, **kwargs)

    return f


def _extra() -> dict[Any, Formula]:
    shaped: dict[str, Callable[..., Any]] = {
        "mv": _mv_flop,
        "addmv": _addmv_flop,
        "dot": _dot_flop,
        "vdot": _dot_flop,
        "addr": _addr_flop,
        "addbmm": _addbmm_flop,
        "_addmm_activation": _addmm_flop,
        "_int_mm": _int_mm_flop,
        "_native_multi_head_attention": _native_mha_flop,
        "_transformer_encoder_layer_fwd": _encoder_layer_flop,
        "_scaled_dot_product_fused_attention_overrideable": _sdpa_overrideable_flop,
        "_scaled_dot_product_fused_attention_overrideable_backward": (
            _sdpa_overrideable_backward_flop
        ),
    }
    raw: dict[str, Callable[..., Any]] = {
        "mkldnn_rnn_layer": _mkldnn_rnn_flop,
        "mkldnn_rnn_layer_backward": _mkldnn_rnn_backward_flop,
        "_cudnn_rnn": _cudnn_rnn_flop,
        "_cudnn_rnn_backward": _cudnn_rnn_backward_flop,
        "miopen_rnn": _cudnn_rnn_flop,
    }
    out: dict[Any, Formula] = {}
    for name, fn in shaped.items():
        if hasattr(aten, name):
            out[getattr(aten, name)] = _fast_shapes(fn)
    for name, fn in raw.items():
        if hasattr(aten, name):
            out[getattr(aten, name)] = _raw(fn)
    return out


def _conv_backward_flop(*args: Any, out_val: Any = None, **kwargs: Any) -> int:
    """torch's convolution_backward formula with the weight-gradient term divided by groups.

    torch's formula (2.15) counts the weight gradient of a grouped convolution
    as if every input channel met every output channel: a depthwise conv's
    backward came out C times too large. The input-gradient term is right as is.
    """
    base = flop_registry[aten.convolution_backward]
    groups, mask = int(args[9]), list(args[10])
    grad_input = [*args[:10], [mask[0], False, False], *args[11:]]
    grad_weight = [*args[:10], [False, mask[1], False], *args[11:]]
    return (
        int(base(*grad_input, out_val=out_val)) + int(base(*grad_weight, out_val=out_val)) // groups
    )


# torch's formulas win where both exist (they are the reference figures), except
# where hookcli corrects one.
FORMULAS: dict[Any, Formula] = {
    **_extra(),
    **{k: _unwrapped(v) for k, v in flop_registry.items()},
    aten.convolution_backward: _conv_backward_flop,
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
sym_stride storage_offset sym_storage_offset numel sym_numel dim
"""
_ZERO_NAMES = _ZERO_TEXT.split()
ZERO_FLOP_OPS = frozenset(getattr(aten, n) for n in _ZERO_NAMES if hasattr(aten, n))


def op_name(packet: Any) -> str:
    """``aten.relu_`` for an overload packet (its qualified name with a dot)."""
    name = getattr(packet, "_qualified_op_name", None)
    return str(name).replace("::", ".") if name else str(packet)


from hookcli.quantized_flops import QUANTIZED_FORMULAS  # noqa: E402 (quantized::conv2d, linear)

FORMULAS.update(QUANTIZED_FORMULAS)
