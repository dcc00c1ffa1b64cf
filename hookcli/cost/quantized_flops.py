"""FLOP formulas for the quantized kernels (``torch.ops.quantized``): conv and linear.

A model converted with ``torch.ao.quantization`` runs ``quantized::conv2d`` and
``quantized::linear`` instead of ``aten.convolution``/``aten.addmm``; torch's flop
registry has no entry for them, so ``cost`` said "Forward FLOPs: 0". The work is the
same multiply-accumulates as the float layer's (int8 instead of float), counted with
the same convention as ``hookcli.cost.flops``: a multiply-add is 2 FLOPs.

- conv (1d/2d/3d, with or without the fused ReLU): MACs = output elements x
  (in_channels / groups) x kernel elements, i.e. ``out.numel() * prod(weight.shape[1:])``;
- transposed conv: MACs = input elements x (out_channels / groups) x kernel elements,
  i.e. ``x.numel() * prod(weight.shape[1:])`` (weight ``[Cin, Cout/groups, *k]``);
- linear (static, dynamic, fp16, with or without ReLU): MACs = output elements x
  in_features, i.e. ``out.numel() * x.shape[-1]``.

The weight's shape comes from the packed parameters (``unpack()``), the formulas get
the op's raw arguments (tensors and the packed object), like ``flops._raw``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Formula = Callable[..., int]

_CONV = ("conv1d", "conv2d", "conv3d", "conv1d_relu", "conv2d_relu", "conv3d_relu")
_CONV_TRANSPOSE = ("conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
_LINEAR = (
    "linear",
    "linear_relu",
    "linear_dynamic",
    "linear_relu_dynamic",
    "linear_dynamic_fp16",
    "linear_relu_dynamic_fp16",
)


def _numel(t: Any) -> int:
    return int(t.numel()) if isinstance(t, torch.Tensor) else 0


def _weight_tail(packed: Any) -> int:
    """prod(weight.shape[1:]) of a packed conv weight (0 when it cannot be unpacked)."""
    try:
        weight = packed.unpack()[0]
    except Exception:  # a packed object this torch cannot unpack: count nothing, not a guess
        return 0
    n = 1
    for d in tuple(weight.shape)[1:]:
        n *= int(d)
    return n


def _conv_flop(x: Any, packed: Any, *_: Any, out_val: Any = None, **__: Any) -> int:
    return 2 * _numel(out_val) * _weight_tail(packed)


def _conv_transpose_flop(x: Any, packed: Any, *_: Any, out_val: Any = None, **__: Any) -> int:
    return 2 * _numel(x) * _weight_tail(packed)


def _linear_flop(x: Any, packed: Any, *_: Any, out_val: Any = None, **__: Any) -> int:
    in_features = int(x.shape[-1]) if isinstance(x, torch.Tensor) and x.dim() else 0
    return 2 * _numel(out_val) * in_features


def _formulas() -> dict[Any, Formula]:
    ops = getattr(torch.ops, "quantized", None)
    out: dict[Any, Formula] = {}
    for names, fn in ((_CONV, _conv_flop), (_CONV_TRANSPOSE, _conv_transpose_flop)):
        for name in names:
            packet = _packet(ops, name)
            if packet is not None:
                out[packet] = fn
    for name in _LINEAR:
        packet = _packet(ops, name)
        if packet is not None:
            out[packet] = _linear_flop
    return out


def _packet(ops: Any, name: str) -> Any:
    try:
        return getattr(ops, name)
    except (AttributeError, RuntimeError):  # not in this torch build
        return None


QUANTIZED_FORMULAS: dict[Any, Formula] = _formulas()

__all__ = ["QUANTIZED_FORMULAS"]
