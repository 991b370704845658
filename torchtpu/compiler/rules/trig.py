"""sin and cos on the CPU target as vectorizable arithmetic (docs/DECISIONS.md 112).

XLA:CPU computes `sine`/`cosine` with one scalar libm call per element (7 ns each on the
2-core AVX512 host, 13x torch's vectorized kernel), and its fusion counts them cheap, so a
rotary table's cos is recomputed inside every broadcast that reads it. Here the argument is
reduced by pi/2 in float64 (Cody-Waite, exact for |x| <= 2**19) and the quadrant's sine or
cosine comes from fdlibm's kernel polynomials in float64: adds, multiplies and selects that
XLA vectorizes, correctly rounded to float32 (0.50 ulp measured, torch's kernel 0.60). A
tensor holding a larger or non-finite value takes XLA's own op through a `cond` on its
largest magnitude, so every input keeps libm's answer there.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

# fdlibm (public domain): 2/pi, pi/2 as a 33-bit head and its tail, and the kernel
# polynomials of sin and cos on [-pi/4, pi/4].
_INV_PIO2 = 6.36619772367581382433e-01
_PIO2_HEAD = 1.57079632673412561417e+00
_PIO2_TAIL = 6.07710050650619224932e-11
_SIN = (-1.66666666666666324348e-01, 8.33333333332248946124e-03, -1.98412698298579493134e-04,
        2.75573137070700676789e-06, -2.50507602534068634195e-08, 1.58969099521155010221e-10)
_COS = (4.16666666666666019037e-02, -1.38888888888741095749e-03, 2.48015872894767294178e-05,
        -2.75573143513906633035e-07, 2.08757232129817482790e-09, -1.13596475577881948265e-11)
# n * _PIO2_HEAD is exact while n < 2**20; 2**19 leaves the rounding of n a bit to spare.
REDUCE_BOUND = float(2 ** 19)


def _horner(z, coefficients):
    acc = jnp.asarray(coefficients[-1], z.dtype)
    for c in coefficients[-2::-1]:
        acc = acc * z + c
    return acc


def _reduced(x, cos: bool):
    """sin or cos of float32 x with |x| <= REDUCE_BOUND, computed in float64."""
    xd = x.astype(jnp.float64)
    n = jnp.round(xd * _INV_PIO2)
    r = (xd - n * _PIO2_HEAD) - n * _PIO2_TAIL
    z = r * r
    sin_r = r + r * z * _horner(z, _SIN)
    cos_r = 1.0 - 0.5 * z + z * z * _horner(z, _COS)
    quadrant = (n.astype(jnp.int32) + (1 if cos else 0)) & 3
    value = jnp.where((quadrant & 1) == 0, sin_r, cos_r)
    value = jnp.where(quadrant >= 2, -value, value).astype(x.dtype)
    return value if cos else jnp.where(x == 0, x, value)  # sin(-0) is -0


def sin(x):
    return _dispatch(x, cos=False)


def cos(x):
    return _dispatch(x, cos=True)


def _dispatch(x, cos: bool):
    xla_op = jnp.cos if cos else jnp.sin
    if x.dtype != jnp.float32:  # float64 keeps XLA's op: its reduction would need more bits
        return xla_op(x)
    in_range = jnp.max(jnp.abs(x), initial=0.0) <= REDUCE_BOUND  # NaN compares False: XLA's op
    return lax.cond(in_range, lambda v: _reduced(v, cos), xla_op, x)
