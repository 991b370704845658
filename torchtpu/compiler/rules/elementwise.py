"""Elementwise ops: unary math, binary arithmetic, comparisons, logic, activations.

Each computes in torch's compute dtype (float32 for bf16/f16: torch's "opmath") and the
lowering casts the result to torch's result dtype.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
import torch

from torchtpu.compiler.context import PROMOTE, as_dtype
from torchtpu.compiler.registry import op
from torchtpu.compiler.rules import trig

aten = torch.ops.aten


def _unary(fn, kind=PROMOTE.INT_TO_FLOAT, cpu_fn=None):
    """The rule of a unary op; `cpu_fn`, where given, is the op's form for the CPU target."""
    def rule(ctx, x, *args, **kwargs):
        compute, _ = ctx.promote(kind, args=ctx.node.args[:1])
        chosen = cpu_fn if cpu_fn is not None and ctx.platform == "cpu" else fn
        return chosen(as_dtype(x, compute), *args, **kwargs)

    rule.__qualname__ = f"unary[{getattr(fn, '__name__', fn)}]"
    return rule


def _digamma(x):
    # torch: digamma(±0) = ∓inf (the pole's side), where XLA gives NaN
    return jnp.where(x == 0, jnp.copysign(jnp.inf, -x), lax.digamma(x))


_FLOAT_UNARY = {
    "sin": jnp.sin, "cos": jnp.cos, "tan": jnp.tan, "asin": jnp.arcsin, "acos": jnp.arccos,
    "atan": jnp.arctan, "sinh": jnp.sinh, "cosh": jnp.cosh, "tanh": jnp.tanh,
    "asinh": jnp.arcsinh, "acosh": jnp.arccosh, "atanh": jnp.arctanh, "exp": jnp.exp,
    "exp2": jnp.exp2, "expm1": jnp.expm1, "log": jnp.log, "log10": jnp.log10,
    "log1p": jnp.log1p, "log2": jnp.log2, "sqrt": jnp.sqrt, "rsqrt": lax.rsqrt,
    "erf": lax.erf, "erfc": lax.erfc, "erfinv": lax.erf_inv, "sigmoid": jax.nn.sigmoid,
    "reciprocal": lambda x: 1 / x, "lgamma": lax.lgamma, "digamma": _digamma,
    "sinc": jnp.sinc, "i0": jnp.i0,
}
_CPU_FORMS = {"sin": trig.sin, "cos": trig.cos}  # XLA:CPU's are scalar libm calls (rules/trig.py)
for _name, _fn in _FLOAT_UNARY.items():
    op(getattr(aten, _name).default)(_unary(_fn, cpu_fn=_CPU_FORMS.get(_name)))


def _round_int_safe(fn):
    """ceil/floor/round/trunc are the identity on integers (torch keeps the dtype)."""
    return lambda x: x if jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_ else fn(x)


def _sign(x):
    return x if x.dtype == jnp.bool_ else jnp.sign(x)


_SAME_TYPE_UNARY = {
    "abs": jnp.abs, "neg": jnp.negative, "sign": _sign, "ceil": _round_int_safe(jnp.ceil),
    "floor": _round_int_safe(jnp.floor), "round": _round_int_safe(jnp.round),
    "trunc": _round_int_safe(jnp.trunc), "relu": lambda x: jnp.maximum(x, jnp.zeros((), x.dtype)),
    "bitwise_not": lambda x: jnp.logical_not(x) if x.dtype == jnp.bool_ else jnp.bitwise_not(x),
    "frac": lambda x: x - jnp.trunc(x), "sgn": _sign,
}
for _name, _fn in _SAME_TYPE_UNARY.items():
    op(getattr(aten, _name).default)(_unary(_fn, PROMOTE.DEFAULT))


@op(aten.round.decimals)
def _round_decimals(ctx, x, *, decimals=0):
    scale = 10.0 ** decimals
    return jnp.round(x * scale) / scale


@op(aten.signbit.default)
def _signbit(ctx, x):
    return jnp.signbit(x) if jnp.issubdtype(x.dtype, jnp.floating) else x < 0


@op(aten.isnan.default)
def _isnan(ctx, x):
    return jnp.isnan(x) if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.zeros(x.shape, jnp.bool_)


@op(aten.isinf.default)
def _isinf(ctx, x):
    return jnp.isinf(x) if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.zeros(x.shape, jnp.bool_)


@op(aten.logical_not.default)
def _logical_not(ctx, x):
    return jnp.logical_not(x.astype(jnp.bool_) if x.dtype != jnp.bool_ else x)


# --- binary -----------------------------------------------------------------------------


def _binary(fn, kind=PROMOTE.DEFAULT):
    def rule(ctx, a, b, **kwargs):
        compute, _ = ctx.promote(kind, args=ctx.node.args[:2])
        return fn(as_dtype(a, compute), as_dtype(b, compute), **kwargs)

    rule.__qualname__ = f"binary[{getattr(fn, '__name__', fn)}]"
    return rule


def _add(a, b, alpha=1):
    return a + (b if alpha == 1 else b * as_dtype(alpha, b.dtype))


def _sub(a, b, alpha=1):
    if a.dtype == jnp.bool_:
        raise TypeError("subtraction of bool tensors is not supported (as in torch)")
    return a - (b if alpha == 1 else b * as_dtype(alpha, b.dtype))


def _mul(a, b):
    return jnp.logical_and(a, b) if a.dtype == jnp.bool_ else a * b


def _true_div(a, b):
    return a / b


def _div_mode(a, b, rounding_mode=None):
    if rounding_mode is None:
        return a / b
    if rounding_mode == "trunc":
        return lax.div(a, b) if jnp.issubdtype(a.dtype, jnp.integer) else jnp.trunc(a / b)
    if rounding_mode == "floor":
        return jnp.floor_divide(a, b)
    raise ValueError(f"rounding_mode={rounding_mode!r}")


def _remainder(a, b):
    return jnp.remainder(a, b)


def _fmod(a, b):
    return jnp.fmod(a, b)


@op(aten.pow.Tensor_Scalar)
def _pow_scalar(ctx, x, exponent):
    compute, _ = ctx.promote(PROMOTE.BOOL_TO_LONG, args=ctx.node.args[:2])
    x = as_dtype(x, compute)
    if not isinstance(exponent, bool) and isinstance(exponent, (int, float)) and exponent in range(9):
        # Multiplications, as torch computes small integral powers; XLA's CPU pow is exp(log(x) * e).
        return lax.integer_pow(x, int(exponent))
    return jnp.power(x, as_dtype(exponent, compute))


def _logical(fn):
    return lambda a, b: fn(a.astype(jnp.bool_), b.astype(jnp.bool_))


def _bitwise(fn, logical):
    return lambda a, b: logical(a, b) if a.dtype == jnp.bool_ else fn(a, b)


_BINARY = [
    ((aten.add.Tensor, aten.add.Scalar), _add, PROMOTE.DEFAULT),
    ((aten.sub.Tensor, aten.sub.Scalar), _sub, PROMOTE.DEFAULT),
    ((aten.mul.Tensor, aten.mul.Scalar), _mul, PROMOTE.DEFAULT),
    ((aten.div.Tensor, aten.div.Scalar), _true_div, PROMOTE.INT_TO_FLOAT),
    ((aten.div.Tensor_mode, aten.div.Scalar_mode), _div_mode, PROMOTE.DEFAULT),
    ((aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor), _remainder, PROMOTE.DEFAULT),
    ((aten.fmod.Tensor, aten.fmod.Scalar), _fmod, PROMOTE.DEFAULT),
    ((aten.pow.Tensor_Tensor, aten.pow.Scalar), jnp.power, PROMOTE.BOOL_TO_LONG),
    ((aten.atan2.default,), jnp.arctan2, PROMOTE.INT_TO_FLOAT),
    ((aten.maximum.default,), jnp.maximum, PROMOTE.DEFAULT),
    ((aten.minimum.default,), jnp.minimum, PROMOTE.DEFAULT),
    ((aten.fmax.default,), jnp.fmax, PROMOTE.DEFAULT),
    ((aten.fmin.default,), jnp.fmin, PROMOTE.DEFAULT),
    ((aten.hypot.default,), jnp.hypot, PROMOTE.DEFAULT),
    ((aten.copysign.Tensor, aten.copysign.Scalar), jnp.copysign, PROMOTE.INT_TO_FLOAT),
    ((aten.nextafter.default,), jnp.nextafter, PROMOTE.DEFAULT),
    ((aten.bitwise_and.Tensor, aten.bitwise_and.Scalar), _bitwise(jnp.bitwise_and, jnp.logical_and), PROMOTE.DEFAULT),
    ((aten.bitwise_or.Tensor, aten.bitwise_or.Scalar), _bitwise(jnp.bitwise_or, jnp.logical_or), PROMOTE.DEFAULT),
    ((aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar), _bitwise(jnp.bitwise_xor, jnp.logical_xor), PROMOTE.DEFAULT),
    ((aten.bitwise_left_shift.Tensor,), jnp.left_shift, PROMOTE.DEFAULT),
    ((aten.bitwise_right_shift.Tensor,), jnp.right_shift, PROMOTE.DEFAULT),
    ((aten.logical_and.default,), _logical(jnp.logical_and), PROMOTE.DEFAULT),
    ((aten.logical_or.default,), _logical(jnp.logical_or), PROMOTE.DEFAULT),
    ((aten.logical_xor.default,), _logical(jnp.logical_xor), PROMOTE.DEFAULT),
    ((aten.eq.Tensor, aten.eq.Scalar), jnp.equal, PROMOTE.ALWAYS_BOOL),
    ((aten.ne.Tensor, aten.ne.Scalar), jnp.not_equal, PROMOTE.ALWAYS_BOOL),
    ((aten.lt.Tensor, aten.lt.Scalar), jnp.less, PROMOTE.ALWAYS_BOOL),
    ((aten.le.Tensor, aten.le.Scalar), jnp.less_equal, PROMOTE.ALWAYS_BOOL),
    ((aten.gt.Tensor, aten.gt.Scalar), jnp.greater, PROMOTE.ALWAYS_BOOL),
    ((aten.ge.Tensor, aten.ge.Scalar), jnp.greater_equal, PROMOTE.ALWAYS_BOOL),
]
for _targets, _fn, _kind in _BINARY:
    op(*_targets)(_binary(_fn, _kind))


@op(aten.atan2.out)
def _atan2_out(ctx, a, b, *, out=None):
    # An out= overload in the core set; functional graphs return the value instead.
    compute, _ = ctx.promote(PROMOTE.INT_TO_FLOAT, args=ctx.node.args[:2])
    return jnp.arctan2(as_dtype(a, compute), as_dtype(b, compute))


@op(aten.where.self)
def _where(ctx, cond, a, b):
    compute, _ = ctx.promote(PROMOTE.NO_OPMATH, args=ctx.node.args[1:])
    return jnp.where(cond.astype(jnp.bool_), as_dtype(a, compute), as_dtype(b, compute))


@op(aten.clamp.default, aten.clamp.Tensor)
def _clamp(ctx, x, min=None, max=None):
    compute, _ = ctx.promote(PROMOTE.DEFAULT)
    x = as_dtype(x, compute)
    # torch: clamp(x, min, max) = min(max(x, min), max); NaN in x propagates.
    if min is not None:
        x = jnp.maximum(x, as_dtype(min, compute))
    if max is not None:
        x = jnp.minimum(x, as_dtype(max, compute))
    return x


@op(aten.hardtanh.default)
def _hardtanh(ctx, x, min_val=-1.0, max_val=1.0):
    return jnp.clip(x, as_dtype(min_val, x.dtype), as_dtype(max_val, x.dtype))


@op(aten.leaky_relu.default)
def _leaky_relu(ctx, x, negative_slope=0.01):
    return jnp.where(x > 0, x, x * as_dtype(negative_slope, x.dtype))


@op(aten.elu.default)
def _elu(ctx, x, alpha=1.0, scale=1.0, input_scale=1.0):
    compute, _ = ctx.promote(PROMOTE.DEFAULT, args=ctx.node.args[:1])
    x = x.astype(compute)
    neg = alpha * jnp.expm1(x * input_scale)
    return scale * jnp.where(x > 0, x, neg)


@op(aten.gelu.default)
def _gelu(ctx, x, approximate="none"):
    compute, _ = ctx.promote(PROMOTE.DEFAULT, args=ctx.node.args[:1])
    x = x.astype(compute)
    if approximate == "tanh":
        inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        return 0.5 * x * (1 + jnp.tanh(inner))
    return 0.5 * x * (1 + lax.erf(x * 0.7071067811865476))


@op(aten.gelu_backward.default)
def _gelu_backward(ctx, grad, x, approximate="none"):
    compute, _ = ctx.promote(PROMOTE.DEFAULT, args=ctx.node.args[:2])
    grad, x = grad.astype(compute), x.astype(compute)
    if approximate == "tanh":
        k = 0.7978845608028654
        inner = k * (x + 0.044715 * x ** 3)
        t = jnp.tanh(inner)
        d_inner = k * (1 + 3 * 0.044715 * x * x)
        return grad * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * d_inner)
    cdf = 0.5 * (1 + lax.erf(x * 0.7071067811865476))
    pdf = jnp.exp(-0.5 * x * x) * 0.3989422804014327
    return grad * (cdf + x * pdf)
