"""``--amp`` on meta: torch.autocast's casts, emulated where torch has no autocast.

torch.autocast casts per device (cpu, cuda, ...): its kernels only touch tensors on their
own device, so on meta it does nothing. ``AutocastOnMeta`` does what it would do on a
real device, with that device's *policy* (``POLICIES``: "cuda", what people plan GPU
memory for, or "cpu", which the tests check against a real CPU autocast):

- which ops autocast handles: the aten ops torch's dispatcher has an autocast kernel for
  on that device (``torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCUDA")``
  or ``"AutocastCPU"``), read from the torch that runs (where it lists none, those
  written here: ``_FP32`` and the lists below, as torch 2.6 to 2.15 register them);
- what each does, written here from torch's source (aten/src/ATen/autocast_mode.h and
  autocast_mode.cpp, torch 2.6 to 2.15): the matmul and convolution family
  (``_LOWER``) runs in the autocast dtype, its float32 operands cast; a few ops
  (``_PROMOTE``) cast every operand to the widest floating dtype among them; some
  reductions (``_FP32_DTYPE``, CUDA) are asked for a float32 result; every other op with
  a kernel casts its floating operands to float32.

The cast copies of float32 leaf tensors that require grad (parameters) made for the
autocast dtype are cached, as autocast's weight-cast cache does: made once per autocast
region (the outermost ``with``) and alive until it ends, which costs memory.

It is a ``TorchFunctionMode``: autocast sits above autograd, so its casts must be seen
by autograd (their copies saved for backward, gradients cast back). It sees the Python
calls the model makes (``F.linear``, ``torch.matmul``, ``x @ w``, ``Tensor.softmax``)
by the aten op they are named after, but not the calls a torch function makes inside
itself (a C++ composite's ops; those of a Python one such as ``F.interpolate``, as
the mode is off while it runs one); those whose insides autocast casts are named in
``_COMPOSITES`` with the policy of the ops that decide their result. A model's own
``torch.autocast(..., enabled=False)`` regions are not seen on meta (transformers
skips them there, as torch has no meta autocast).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from hookcli.attention import SwapsAttention

POLICIES = ("cuda", "cpu")


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Run in the autocast dtype (lower_precision_fp), from autocast_mode.h's
# AT_FORALL_LOWER_PRECISION_FP (CUDA) and autocast_mode.cpp's KERNEL_CPU(...,
# lower_precision_fp) entries.
_LOWER = {
    "cuda": _names(
        "_convolution conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d "
        "conv_transpose3d convolution prelu addmm addmv addr matmul einsum mm mv "
        "linalg_vecdot linear addbmm baddbmm bmm chain_matmul linalg_multi_dot "
        "_thnn_fused_lstm_cell _thnn_fused_gru_cell lstm_cell gru_cell rnn_tanh_cell "
        "rnn_relu_cell _scaled_dot_product_flash_attention scaled_dot_product_attention "
        "cudnn_convolution cudnn_convolution_transpose _cudnn_rnn"
    ),
    "cpu": _names(
        "conv1d conv2d conv3d bmm mm linalg_vecdot baddbmm addmm addbmm linear "
        "_convolution matmul conv_tbc mkldnn_rnn_layer conv_transpose1d conv_transpose2d "
        "conv_transpose3d prelu scaled_dot_product_attention _native_multi_head_attention "
        "_addmm_activation"
    ),
}
# Every floating operand cast to the widest floating dtype among them (promote):
# AT_FORALL_PROMOTE (CUDA); KERNEL_CPU(stack|cat|index_copy, promote).
_PROMOTE = {
    "cuda": _names(
        "addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot scatter_add"
    ),
    "cpu": _names("stack cat index_copy"),
}
# Asked for a float32 result (dtype=float32) rather than cast: AT_FORALL_FP32_SET_OPT_DTYPE
# and AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE (norm) on CUDA.
_FP32_DTYPE = {
    "cuda": _names(
        "prod softmax log_softmax cumprod cumsum linalg_vector_norm linalg_matrix_norm sum norm"
    ),
    "cpu": frozenset[str](),
}
# Run in float32 (fp32), the rest of the ops with an autocast kernel: AT_FORALL_FP32 (CUDA),
# KERNEL_CPU(..., fp32); as torch 2.6 to 2.15 register them (rms_norm not on 2.6, cholesky
# and qr up to 2.6). Used where the dispatcher lists none (``registered``).
_FP32 = {
    "cuda": _names(
        "_upsample_bicubic2d_aa _upsample_bilinear2d_aa _upsample_nearest_exact1d "
        "_upsample_nearest_exact2d _upsample_nearest_exact3d acos asin binary_cross_entropy "
        "binary_cross_entropy_with_logits cdist cosh cosine_embedding_loss cosine_similarity "
        "dist erfinv exp expm1 frobenius_norm group_norm hinge_embedding_loss huber_loss "
        "kl_div l1_loss layer_norm log log10 log1p log2 logsumexp margin_ranking_loss "
        "mse_loss multi_margin_loss multilabel_margin_loss native_layer_norm nll_loss "
        "nll_loss2d nuclear_norm pdist poisson_nll_loss pow reciprocal renorm rms_norm rsqrt "
        "sinh smooth_l1_loss soft_margin_loss softplus tan triplet_margin_loss "
        "upsample_bicubic2d upsample_bilinear2d upsample_linear1d upsample_nearest1d "
        "upsample_nearest2d upsample_nearest3d upsample_trilinear3d"
    ),
    "cpu": _names(
        "_grid_sampler_2d_cpu_fallback _lu_with_info adaptive_avg_pool3d adaptive_max_pool3d "
        "avg_pool3d binary_cross_entropy binary_cross_entropy_with_logits cdist "
        "cholesky cholesky_inverse cholesky_solve cosine_embedding_loss cross_entropy_loss "
        "ctc_loss fake_quantize_per_tensor_affine fft_fft fft_fft2 fft_fftn fft_hfft fft_ifft "
        "fft_ifft2 fft_ifftn fft_ihfft fft_irfft fft_irfft2 fft_irfftn fft_rfft fft_rfft2 "
        "fft_rfftn fractional_max_pool2d fractional_max_pool3d geqrf grid_sampler "
        "grid_sampler_2d grid_sampler_3d hinge_embedding_loss huber_loss inverse kl_div "
        "l1_loss linalg_cholesky linalg_cholesky_ex linalg_cond linalg_eig linalg_eigh "
        "linalg_eigvals linalg_eigvalsh linalg_householder_product linalg_inv linalg_inv_ex "
        "linalg_lstsq linalg_matrix_rank linalg_qr linalg_solve linalg_svd linalg_svdvals "
        "linalg_tensorinv linalg_tensorsolve lu_solve margin_ranking_loss max_pool3d "
        "max_unpool2d max_unpool3d mse_loss multi_margin_loss multilabel_margin_loss "
        "multilabel_margin_loss_forward nanquantile nll_loss nll_loss2d orgqr ormqr "
        "pinverse poisson_nll_loss polar prod qr quantile reflection_pad1d reflection_pad2d "
        "replication_pad1d replication_pad2d replication_pad3d smooth_l1_loss "
        "soft_margin_loss stft svd trace triangular_solve triplet_margin_loss view_as_complex"
    ),
}
# Composites with no autocast kernel of their own whose insides autocast casts: C++ ones
# (the mode sees the call only) and torch's Python functions (the mode is off while it
# runs one, so their own calls are not seen): the policy of the ops that decide their
# result.
_COMPOSITES = {
    "cuda": {
        "cross_entropy_loss": "fp32",  # log_softmax, nll_loss
        "cross_entropy": "fp32",
        "interpolate": "fp32",  # upsample_*
        "normalize": "fp32",  # norm
        "multi_head_attention_forward": "lower",  # linear, bmm or sdpa
    },
    "cpu": {
        "einsum": "lower",  # bmm
        "chain_matmul": "lower",  # mm
        "linalg_multi_dot": "lower",  # mm
        "cross_entropy": "fp32",  # F.cross_entropy: cross_entropy_loss has a CPU kernel
        "multi_head_attention_forward": "lower",  # linear, bmm or sdpa
    },
}
# The Python names of ops whose aten name differs.
_ALIASES = {"multi_dot": "linalg_multi_dot", "vector_norm": "linalg_vector_norm"}


@functools.cache
def registered(policy: str) -> frozenset[str]:
    """The aten ops (overload names dropped) with an autocast kernel on the policy's device:
    those torch's dispatcher has in the torch that runs (``rms_norm`` on torch 2.14, not 2.6,
    ...); those written here where it lists none (a build without the listing)."""
    key = {"cuda": "AutocastCUDA", "cpu": "AutocastCPU"}[policy]
    listing = getattr(torch._C, "_dispatch_get_registrations_for_dispatch_key", None)
    names = listing(key) if listing is not None else []
    found = {n.removeprefix("aten::").split(".")[0] for n in names if n.startswith("aten::")}
    if found:
        return frozenset(found)
    return _LOWER[policy] | _PROMOTE[policy] | _FP32_DTYPE[policy] | _FP32[policy]


@functools.cache
def cast_of(policy: str, name: str) -> str | None:
    """What autocast does to the op ``name`` under ``policy``: "lower", "fp32",
    "fp32_dtype", "promote", or None (it runs as it is)."""
    name = _ALIASES.get(name, name)
    composite = _COMPOSITES[policy].get(name)
    if composite is not None:
        return composite
    if name not in registered(policy):
        return None
    if name in _LOWER[policy]:
        return "lower"
    if name in _PROMOTE[policy]:
        return "promote"
    if name in _FP32_DTYPE[policy]:
        return "fp32_dtype"
    return "fp32"


def _name(func: Any) -> str:
    """The aten name of a torch function: ``__matmul__``/``__rmatmul__`` -> ``matmul``,
    ``linalg.vector_norm`` -> ``linalg_vector_norm``; in-place ones (``pow_``,
    ``__ipow__``) keep their name, which no autocast kernel has."""
    name = getattr(func, "__name__", "") or ""
    if name.startswith("__") and name.endswith("__"):
        inner = name[2:-2]
        if inner.startswith("i") and inner[1:] in ("pow", "matmul"):
            return name
        for base in ("matmul", "pow"):
            if inner in (base, "r" + base):
                return base
        return name
    module = getattr(func, "__module__", "") or ""
    if module.endswith("linalg") and not name.startswith("linalg_"):
        return "linalg_" + name
    return name


class AutocastOnMeta(SwapsAttention, TorchFunctionMode):
    """torch.autocast's casts with ``policy``'s op lists, on meta (see the module's doc).

    Enter it through ``emulated()``: nested regions share one weight-cast cache."""

    def __init__(self, policy: str, dtype: torch.dtype) -> None:
        super().__init__()
        if policy not in POLICIES:
            raise ValueError(f"autocast policy must be one of {POLICIES}, got {policy!r}")
        self.policy, self.dtype = policy, dtype
        self.cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._inside = False

    # -- casts -------------------------------------------------------------------------

    def _eligible(self, t: Any) -> bool:
        return (
            isinstance(t, torch.Tensor)
            and t.is_floating_point()
            and t.dtype is not torch.float64
            and t.device.type == "meta"
        )

    def _cast(self, t: Any, dtype: torch.dtype) -> Any:
        if not self._eligible(t) or t.dtype is dtype:
            return t
        cacheable = (
            dtype is self.dtype
            and t.dtype is torch.float32
            and t.requires_grad
            and t.is_leaf
            and not t._is_view()
        )
        if cacheable:
            hit = self.cache.get(id(t))
            if hit is not None and hit[0] is t:
                return hit[1]
        out = t.to(dtype)
        if cacheable:
            self.cache[id(t)] = (t, out)
        return out

    def _apply(self, how: str, args: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        if how == "fp32_dtype":
            if kwargs.get("dtype") is None and any(
                self._eligible(t) for t in pytree.tree_leaves((args, kwargs))
            ):
                kwargs = {**kwargs, "dtype": torch.float32}
            return args, kwargs
        if how == "lower":
            dtype = self.dtype
        elif how == "fp32":
            dtype = torch.float32
        else:  # promote: the widest floating dtype among the operands
            dtype = self.dtype
            for t in pytree.tree_leaves((args, kwargs)):
                if self._eligible(t) and t.dtype is torch.float32:
                    dtype = torch.float32
        return pytree.tree_map(lambda t: self._cast(t, dtype), (args, kwargs))

    def _run(self, how: str | None, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        if how is None:
            return func(*args, **kwargs)
        args, kwargs = self._apply(how, args, kwargs)
        self._inside = True  # the op's own calls are not cast again (autocast's key is off)
        try:
            return func(*args, **kwargs)
        finally:
            self._inside = False

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self._inside:
            return func(*args, **kwargs)
        return self._run(cast_of(self.policy, _name(func)), func, args, kwargs)

    # -- scaled_dot_product_attention through a module attribute -----------------------

    def _attention(self, *args: Any, **kwargs: Any) -> Any:
        # what was there may be a Python function put there by another mode (cost's
        # kernel choice on meta), which no torch function mode sees
        how = cast_of(self.policy, "scaled_dot_product_attention")
        return self._run(how, self._replaced, args, kwargs)


_current: AutocastOnMeta | None = None


@contextlib.contextmanager
def emulated(policy: str, dtype: torch.dtype) -> Iterator[AutocastOnMeta]:
    """An autocast region on meta; inside another one, that one goes on (one cache, kept
    until the outermost region ends, as torch.autocast's nesting does)."""
    global _current
    if _current is not None:
        yield _current
        return
    mode = AutocastOnMeta(policy, dtype)
    _current = mode
    try:
        with mode:
            yield mode
    finally:
        _current = None
        mode.cache.clear()
