"""`torch.autocast("tpu", dtype=torch.bfloat16)`: the AutocastPrivateUse1 kernels torch leaves out.

torch 2.13 registers autocast kernels for CUDA, CPU, XPU, MPS, MTIA and MAIA, none for a
PrivateUse1 backend, so without these an op under `torch.autocast("tpu")` fails with "Could
not run 'aten::matmul' with arguments from the 'Autocasttpu' backend". Every op falls through
the key except three lists, which follow torch's CUDA autocast (the rules users of an
accelerator know):

  - LOWER: matmuls, convolutions, attention: floating inputs (not float64) cast to the
    autocast dtype;
  - FLOAT32: ops whose range or accuracy suffers in 16 bits (exp, log, pow, norms, softmax-
    style reductions, losses): floating inputs cast to float32;
  - PROMOTE: ops of several tensors (cat, stack, addcmul, ...): their floating inputs cast to
    the widest floating dtype among them.

Not done (CUDA's autocast does it): the cache of weights cast within one autocast region, so a
weight used twice is cast twice (one small program each time; the casts are exact). A kernel
resolves its OpOverload at the first call, as the device's structured kernels do.
"""
from __future__ import annotations

import functools

import torch
from torch.utils import _pytree

from torchtpu.device import kernels

KEY = "AutocastPrivateUse1"
LOWER = ("_convolution", "_convolution.deprecated", "conv1d", "conv1d.padding", "conv2d", "conv2d.padding",
         "conv3d", "conv3d.padding", "conv_tbc", "conv_transpose1d", "conv_transpose2d.input",
         "conv_transpose3d.input", "convolution", "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm",
         "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
         "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell",
         "rnn_relu_cell", "_scaled_dot_product_flash_attention", "scaled_dot_product_attention")
FLOAT32 = ("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
           "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus",
           "layer_norm", "native_layer_norm", "group_norm", "frobenius_norm.dim", "nuclear_norm",
           "nuclear_norm.dim", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss",
           "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss",
           "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
           "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist",
           "cdist", "renorm", "logsumexp", "prod", "prod.dim_int", "cumprod", "cumsum", "softmax.int",
           "log_softmax.int", "cross_entropy_loss", "sum", "sum.dim_IntList", "norm.Scalar",
           "norm.ScalarOpt_dim", "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
           "upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d", "upsample_bicubic2d")
PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sampler", "index_put", "scatter_add",
           "tensordot", "cat", "stack", "index_copy")

_EXCLUDE = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)
_libraries: list = []


def register_fallthrough() -> None:
    """Every op falls through the key (registered with the device: one registration)."""
    lib = torch.library.Library("_", "IMPL")
    lib.fallback(torch.library.fallthrough_kernel, KEY)
    _libraries.append(lib)


def register() -> None:
    """Registers the three lists' kernels (with the device's kernels)."""
    lib = torch.library.Library("aten", "IMPL")
    for names, rule in ((LOWER, _lower), (FLOAT32, _float32), (PROMOTE, _promote)):
        for name in names:
            lib.impl(name, _Kernel(name, rule), KEY)
    _libraries.append(lib)


def _castable(x) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64


def _cast_all(args, kwargs, dtype):
    cast = lambda x: x.to(dtype) if _castable(x) and x.dtype != dtype else x  # noqa: E731
    return _pytree.tree_map(cast, args), _pytree.tree_map(cast, kwargs)


def _lower(args, kwargs):
    return _cast_all(args, kwargs, torch.get_autocast_dtype("tpu"))


def _float32(args, kwargs):
    return _cast_all(args, kwargs, torch.float32)


def _promote(args, kwargs):
    dtypes = [x.dtype for x in _pytree.tree_leaves((args, kwargs)) if _castable(x)]
    if len(set(dtypes)) < 2:
        return args, kwargs
    return _cast_all(args, kwargs, functools.reduce(torch.promote_types, dtypes))


class _Kernel:
    """One overload's autocast kernel: cast the inputs by `rule`, then run the op below the key."""

    __slots__ = ("name", "rule", "op")

    def __init__(self, name: str, rule):
        self.name, self.rule, self.op = name, rule, None

    def __call__(self, *args, **kwargs):
        if self.op is None:
            self.op = kernels.overload_named(self.name)
        args, kwargs = self.rule(args, kwargs)
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return self.op(*args, **kwargs)
