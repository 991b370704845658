"""Special functions (torch.special and friends) with torch's dtype rules.

Each computes in torch's compute dtype (float32 for bf16/f16) and the lowering casts the
result to torch's result dtype. Orthogonal polynomials follow torch's kernels: the same
special cases at |x| = 1, the same trigonometric forms for large n, and the same
three-term recurrences (run as a loop up to the largest n present).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.special as jss
from jax import lax
import numpy as np
import torch

from torchtpu.compiler.context import PROMOTE, as_dtype
from torchtpu.compiler.registry import op

aten = torch.ops.aten


def _float_args(ctx, *xs, n=None):
    compute, _ = ctx.promote(PROMOTE.INT_TO_FLOAT, args=ctx.node.args[: n or len(xs)])
    return [as_dtype(x, compute) for x in xs]


def _unary(fn):
    def rule(ctx, x):
        (x,) = _float_args(ctx, x, n=1)
        return fn(x)

    rule.__qualname__ = f"special[{getattr(fn, '__name__', fn)}]"
    return rule


def _spherical_j0(x):
    small = jnp.abs(x) < 0.5
    x2 = x * x
    series = 1 + x2 * (-1 / 6 + x2 * (1 / 120 + x2 * (-1 / 5040 + x2 * (1 / 362880 + x2 * (
        -1 / 39916800 + x2 * (1 / 6227020800))))))
    safe = jnp.where(small, jnp.ones_like(x), x)
    out = jnp.where(small, series, jnp.sin(safe) / safe)
    return jnp.where(jnp.isinf(x), jnp.zeros_like(x), out)


_UNARY = {

    aten.special_i0e.default: jss.i0e,
    aten.special_i1.default: jss.i1,
    aten.special_i1e.default: jss.i1e,
    aten.special_ndtri.default: jss.ndtri,
    aten.special_erfcx.default: jss.erfcx,
    aten.special_modified_bessel_i0.default: jss.i0,
    aten.special_modified_bessel_i1.default: jss.i1,
    aten.special_spherical_bessel_j0.default: _spherical_j0,
}
for _target, _fn in _UNARY.items():
    op(_target)(_unary(_fn))


@op(aten.special_log_ndtr.default)
def _log_ndtr(ctx, x):
    (x,) = _float_args(ctx, x, n=1)
    return jss.log_ndtr(x)


@op(aten.frexp.Tensor)
def _frexp(ctx, x):
    m, e = jnp.frexp(x)
    return m, e.astype(jnp.int32)


@op(aten.ldexp.Tensor)
def _ldexp(ctx, x, other):
    compute, _ = ctx.promote(PROMOTE.INT_TO_FLOAT, args=ctx.node.args[:2])
    return as_dtype(x, compute) * jnp.exp2(as_dtype(other, compute))


@op(aten.polygamma.default)
def _polygamma(ctx, n, x):
    compute, _ = ctx.promote(PROMOTE.INT_TO_FLOAT, args=ctx.node.args[1:2])
    x = as_dtype(x, compute)
    if n == 0:
        return lax.digamma(x)
    # psi^(n)(x) = (-1)^(n+1) n! zeta(n+1, x)
    sign = -1.0 if n % 2 == 0 else 1.0
    return sign * float(np.prod(np.arange(1, n + 1))) * hurwitz_zeta(jnp.asarray(n + 1, compute), x)


@op(aten.igamma.default)
def _igamma(ctx, a, x):
    a, x = _float_args(ctx, a, x)
    return jss.gammainc(a, x)


@op(aten.igammac.default)
def _igammac(ctx, a, x):
    a, x = _float_args(ctx, a, x)
    return jss.gammaincc(a, x)


@op(aten.special_zeta.default, aten.special_zeta.self_scalar, aten.special_zeta.other_scalar)
def _zeta(ctx, x, q):
    x, q = _float_args(ctx, x, q)
    return hurwitz_zeta(x, q)


_ZETA_A = (12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9, 7.47242496e10,
           -2.950130727918164224e12, 1.1646782814350067249e14, -4.5979787224074726105e15,
           1.8152105401943546773e17, -7.1661652561756670113e18)
_MACHEP = 1.11022302462515654042e-16


def hurwitz_zeta(x, q):
    """Cephes' zeta(x, q) as torch runs it (defined for negative non-integer q too)."""
    x, q = jnp.broadcast_arrays(x, q)
    dtype = x.dtype
    s = q ** -x
    a = q
    done = jnp.zeros(x.shape, jnp.bool_)
    b = jnp.zeros_like(x)

    def cond(state):
        i, a, s, b, done = state
        return jnp.any(~done & ((i < 9) | (a <= 9)))

    def body(state):
        i, a, s, b, done = state
        live = ~done & ((i < 9) | (a <= 9))
        a = jnp.where(live, a + 1, a)
        b = jnp.where(live, a ** -x, b)
        s = jnp.where(live, s + b, s)
        done = done | (live & (jnp.abs(b / s) < _MACHEP))
        return i + 1, a, s, b, done

    _, a, s, b, done = lax.while_loop(cond, body, (jnp.asarray(0), a, s, b, done))
    w = a
    tail = s + b * w / (x - 1) - 0.5 * b
    s = jnp.where(done, s, tail)
    fac = jnp.ones_like(x)
    k = jnp.zeros_like(x)
    for coef in _ZETA_A:
        fac = fac * (x + k)
        b = b / w
        t = fac * b / coef
        s = jnp.where(done, s, s + t)
        done = done | (jnp.abs(t / s) < _MACHEP)
        k = k + 1
        fac = fac * (x + k)
        b = b / w
        k = k + 1
    out = s
    out = jnp.where((q <= 0) & (x != jnp.floor(x)), jnp.asarray(jnp.nan, dtype), out)
    out = jnp.where((q <= 0) & (q == jnp.floor(q)), jnp.asarray(jnp.inf, dtype), out)
    out = jnp.where(x < 1, jnp.asarray(jnp.nan, dtype), out)
    return jnp.where(x == 1, jnp.asarray(jnp.inf, dtype), out)


# --- orthogonal polynomials -----------------------------------------------------------


def _recurrence(x, n, p1, step):
    """P_n(x) for integer tensor n >= 0 from P_0 = 1, P_1 = p1 and P_{j+1} = step(j, P_{j-1}, P_j)."""
    x, n = jnp.broadcast_arrays(x, n)
    p0 = jnp.ones_like(x)
    p1 = jnp.broadcast_to(p1, x.shape)
    top = jnp.max(n) if n.size else jnp.asarray(0, n.dtype)

    def cond(state):
        j, _, _ = state
        return j < top

    def body(state):
        j, p, q = state
        r = step(j.astype(x.dtype), p, q)
        live = (j + 1) <= n
        return j + 1, jnp.where(live, q, p), jnp.where(live, r, q)

    _, _, q = lax.while_loop(cond, body, (jnp.asarray(1, n.dtype), p0, p1))
    return jnp.where(n == 0, p0, q)


def _poly(fn):
    def rule(ctx, x, n):
        compute, _ = ctx.promote(PROMOTE.INT_TO_FLOAT, args=ctx.node.args[:2])
        x = as_dtype(x, compute)
        n = jnp.trunc(as_dtype(n, compute)).astype(jnp.int64) if not isinstance(n, (int, float)) \
            else jnp.asarray(int(n), jnp.int64)
        x, n = jnp.broadcast_arrays(x, n)
        return fn(x, n)

    rule.__qualname__ = f"polynomial[{fn.__name__}]"
    return rule


def _odd(n):
    return n % 2 != 0


def _cheb_t(x, n):
    rec = _recurrence(x, n, x, lambda j, p, q: (x + x) * q - p)
    trig = jnp.cos(n.astype(x.dtype) * jnp.arccos(jnp.clip(x, -1, 1)))
    out = jnp.where((n > 6) & (jnp.abs(x) < 1), trig, rec)
    edge = jnp.where((x > 0) | ~_odd(n), 1.0, -1.0).astype(x.dtype)
    out = jnp.where(jnp.abs(x) == 1, edge, out)
    return jnp.where(n < 0, jnp.zeros_like(x), out)


def _cheb_u(x, n):
    rec = _recurrence(x, n, x + x, lambda j, p, q: (x + x) * q - p)
    nf = n.astype(x.dtype)
    t = jnp.arccos(jnp.clip(x, -1, 1))
    s = jnp.sin(t)
    trig = jnp.where(s != 0, jnp.sin((nf + 1) * t) / jnp.where(s != 0, s, 1), (nf + 1) * jnp.cos((nf + 1) * t) * x)
    out = jnp.where((n > 8) & (jnp.abs(x) < 1), trig, rec)
    edge = jnp.where((x > 0) | ~_odd(n), nf + 1, -(nf + 1))
    out = jnp.where(jnp.abs(x) == 1, edge, out)
    return jnp.where(n < 0, jnp.zeros_like(x), out)


def _cheb_v(x, n):
    rec = _recurrence(x, n, x + x - 1, lambda j, p, q: (x + x) * q - p)
    nf = n.astype(x.dtype)
    t = jnp.arccos(jnp.clip(x, -1, 1))
    c = jnp.cos(t / 2)
    big = jnp.where(~_odd(n), nf + nf + 1, -(nf + nf + 1))
    trig = jnp.where(jnp.sin(t / 2) != 1, jnp.cos((nf + 0.5) * t) / jnp.where(c != 0, c, 1), big)
    out = jnp.where((n > 8) & (jnp.abs(x) < 1), trig, rec)
    edge = jnp.where(x > 0, jnp.ones_like(x), big)
    out = jnp.where(jnp.abs(x) == 1, edge, out)
    return jnp.where(n < 0, jnp.zeros_like(x), out)


def _cheb_w(x, n):
    rec = _recurrence(x, n, x + x + 1, lambda j, p, q: (x + x) * q - p)
    nf = n.astype(x.dtype)
    t = jnp.arccos(jnp.clip(x, -1, 1))
    s = jnp.sin(t / 2)
    edge = jnp.where(x > 0, nf + nf + 1, jnp.where(~_odd(n), 1.0, -1.0).astype(x.dtype))
    trig = jnp.where(jnp.cos(t / 2) != 1, jnp.sin((nf + 0.5) * t) / jnp.where(s != 0, s, 1), edge)
    out = jnp.where((n > 8) & (jnp.abs(x) < 1), trig, rec)
    out = jnp.where(jnp.abs(x) == 1, edge, out)
    return jnp.where(n < 0, jnp.zeros_like(x), out)


def _shifted(fn):
    def shifted(x, n):
        return fn(x + x - 1, n)

    shifted.__name__ = f"shifted_{fn.__name__}"
    return shifted


def _hermite_h(x, n):
    out = _recurrence(x, n, x + x, lambda j, p, q: (x + x) * q - (j + j) * p)
    return jnp.where(n < 0, jnp.zeros_like(x), out)


def _hermite_he(x, n):
    out = _recurrence(x, n, x, lambda j, p, q: x * q - j * p)
    return jnp.where(n < 0, jnp.zeros_like(x), out)


def _laguerre_l(x, n):
    out = _recurrence(x, n, 1 - x, lambda j, p, q: ((j + j + (1 - x)) * q - j * p) / (j + 1))
    out = jnp.where(x == 0, jnp.ones_like(x), out)
    return jnp.where(n < 0, jnp.zeros_like(x), out)


def _legendre_p(x, n):
    out = _recurrence(x, n, x, lambda j, p, q: ((j + j + 1) * x * q - j * p) / (j + 1))
    edge = jnp.where((x > 0) | (n == 0) | ~_odd(n), 1.0, -1.0).astype(x.dtype)
    out = jnp.where(jnp.abs(x) == 1, edge, out)
    return jnp.where(n < 0, jnp.zeros_like(x), out)


_POLYNOMIALS = {
    "chebyshev_polynomial_t": _cheb_t, "chebyshev_polynomial_u": _cheb_u,
    "chebyshev_polynomial_v": _cheb_v, "chebyshev_polynomial_w": _cheb_w,
    "shifted_chebyshev_polynomial_t": _shifted(_cheb_t), "shifted_chebyshev_polynomial_u": _shifted(_cheb_u),
    "shifted_chebyshev_polynomial_v": _shifted(_cheb_v), "shifted_chebyshev_polynomial_w": _shifted(_cheb_w),
    "hermite_polynomial_h": _hermite_h, "hermite_polynomial_he": _hermite_he,
    "laguerre_polynomial_l": _laguerre_l, "legendre_polynomial_p": _legendre_p,
}
for _name, _fn in _POLYNOMIALS.items():
    op(getattr(aten, f"special_{_name}"))(_poly(_fn))
