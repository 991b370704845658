"""Matrix factorizations and solvers with torch.linalg semantics.

Outputs follow torch: LU pivots are 1-based int32 (LAPACK's), info tensors are int32,
outputs torch leaves empty (mode="r" Q, compute_uv=False U/Vh, unpack_data=False) are
empty here too. Results that are only unique up to sign or phase (QR, eigh, SVD) come from
the platform's LAPACK-style kernels; on CPU they usually match torch's signs, elsewhere
they may legitimately differ.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
from jax import lax
import torch

from torchtpu.compiler import dtypes
from torchtpu.compiler.registry import op

aten = torch.ops.aten
HIGHEST = lax.Precision.HIGHEST


# --- helpers -------------------------------------------------------------------------


def mT(x):
    return jnp.swapaxes(x, -1, -2)


def mH(x):
    x = mT(x)
    return jnp.conj(x) if jnp.iscomplexobj(x) else x


def mm(a, b):
    return jnp.matmul(a, b, precision=HIGHEST)


def _float(ctx, x):
    """x in the (float or complex) dtype torch computes this node in."""
    val = ctx.val
    if isinstance(val, (tuple, list)):
        val = next(v for v in val if isinstance(v, torch.Tensor))
    want = dtypes.to_jax(val.dtype)
    if jnp.iscomplexobj(x) and not jnp.issubdtype(want, jnp.complexfloating):
        return x
    return x.astype(want) if x.dtype != want else x


def _empty_like_meta(ctx, i):
    v = ctx.val[i]
    return jnp.zeros(tuple(int(s) for s in v.shape), dtypes.to_jax(v.dtype))


def _bcast_batch(*xs, core=2):
    batch = jnp.broadcast_shapes(*(x.shape[:-core] for x in xs))
    return [jnp.broadcast_to(x, batch + x.shape[-core:]) for x in xs]


def _tri_solve(a, b, *, left=True, lower=True, unit=False, transpose_a=False, conjugate_a=False):
    """op(A) X = B (left) or X op(A) = B, with batch broadcasting."""
    a, b = _bcast_batch(a, b)
    return lax.linalg.triangular_solve(a, b, left_side=left, lower=lower, transpose_a=transpose_a,
                                       conjugate_a=conjugate_a, unit_diagonal=unit)


def _lu(a):
    """(LU, 1-based int32 pivots, permutation) of a (..., m, n)."""
    lu, piv, perm = lax.linalg.lu(a)
    return lu, piv.astype(jnp.int32) + 1, perm


def _perm_matrix(perm, m, dtype):
    # A = P L U with (P^T A)[i] = A[perm[i]]: P[perm[i], i] = 1.
    return mT(jax.nn.one_hot(perm, m, dtype=dtype))


def _lu_solve(lu, perm, b, adjoint=False):
    """Solves A X = B (or A^H X = B) for A = P L U given by (lu, perm)."""
    lu, b = _bcast_batch(lu, b)
    perm = jnp.broadcast_to(perm, lu.shape[:-1])
    if not adjoint:
        pb = jnp.take_along_axis(b, perm[..., :, None], axis=-2)
        y = lax.linalg.triangular_solve(lu, pb, left_side=True, lower=True, unit_diagonal=True)
        return lax.linalg.triangular_solve(lu, y, left_side=True, lower=False)
    y = lax.linalg.triangular_solve(lu, b, left_side=True, lower=False, transpose_a=True,
                                    conjugate_a=True)
    z = lax.linalg.triangular_solve(lu, y, left_side=True, lower=True, unit_diagonal=True,
                                    transpose_a=True, conjugate_a=True)
    inv = jnp.argsort(perm, axis=-1)
    return jnp.take_along_axis(z, inv[..., :, None], axis=-2)


def _info_from_nan(x):
    """0 where a factorization produced finite numbers, else 1 (torch reports the minor)."""
    bad = jnp.any(~jnp.isfinite(x), axis=(-2, -1))
    return bad.astype(jnp.int32)


@op(aten._linalg_check_errors.default)
def _check_errors(ctx, info, api_name, *, is_matrix):
    """torch raises on a nonzero info; a compiled program cannot raise, so this is a no-op
    (failures show as NaN/inf in the results, as with check_errors=False)."""
    return None


# --- Cholesky ------------------------------------------------------------------------


def _cholesky(a, upper):
    if upper:
        return mH(lax.linalg.cholesky(mH(a), symmetrize_input=False))
    return lax.linalg.cholesky(a, symmetrize_input=False)


def _tril_nan(l, upper):
    # XLA's Cholesky leaves garbage above the diagonal on failure; torch returns a triangle.
    return jnp.triu(l) if upper else jnp.tril(l)


@op(aten.cholesky.default)
def _cholesky_rule(ctx, a, upper=False):
    a = _float(ctx, a)
    return _tril_nan(_cholesky(a, upper), upper)


@op(aten.linalg_cholesky_ex.default)
def _cholesky_ex(ctx, a, *, upper=False, check_errors=False):
    a = _float(ctx, a)
    l = _tril_nan(_cholesky(a, upper), upper)
    return l, _info_from_nan(l)


@op(aten.cholesky_solve.default, aten._cholesky_solve_helper.default)  # the eager device: the helper
def _cholesky_solve(ctx, b, l, upper=False):
    b, l = _float(ctx, b), _float(ctx, l)
    if upper:  # A = U^H U
        y = _tri_solve(l, b, lower=False, transpose_a=True, conjugate_a=True)
        return _tri_solve(l, y, lower=False)
    y = _tri_solve(l, b, lower=True)
    return _tri_solve(l, y, lower=True, transpose_a=True, conjugate_a=True)


@op(aten.cholesky_inverse.default)
def _cholesky_inverse(ctx, l, upper=False):
    l = _float(ctx, l)
    eye = jnp.broadcast_to(jnp.eye(l.shape[-1], dtype=l.dtype), l.shape)
    return _cholesky_solve(ctx, eye, l, upper)


# --- triangular solves -----------------------------------------------------------------


@op(aten.triangular_solve.default)
def _triangular_solve(ctx, b, a, upper=True, transpose=False, unitriangular=False):
    b, a = _float(ctx, b), _float(ctx, a)
    x = _tri_solve(a, b, lower=not upper, unit=unitriangular, transpose_a=transpose)
    return x, jnp.broadcast_to(a, tuple(ctx.val[1].shape))


@op(aten.linalg_solve_triangular.default)
def _solve_triangular(ctx, a, b, *, upper, left=True, unitriangular=False):
    a, b = _float(ctx, a), _float(ctx, b)
    return _tri_solve(a, b, left=left, lower=not upper, unit=unitriangular)


# --- LU --------------------------------------------------------------------------------


@op(aten.linalg_lu_factor_ex.default)
def _lu_factor_ex(ctx, a, *, pivot=True, check_errors=False):
    if not pivot:
        raise NotImplementedError("linalg.lu_factor(pivot=False) has no XLA kernel")
    lu, piv, _ = _lu(_float(ctx, a))
    return lu, piv, jnp.zeros(lu.shape[:-2], jnp.int32)


def _unpack(lu, perm, dtype):
    m, n = lu.shape[-2:]
    k = min(m, n)
    L = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
    U = jnp.triu(lu[..., :k, :])
    P = _perm_matrix(perm, m, dtype)
    return P, L, U


@op(aten.linalg_lu.default)
def _linalg_lu(ctx, a, *, pivot=True):
    if not pivot:
        raise NotImplementedError("linalg.lu(pivot=False) has no XLA kernel")
    a = _float(ctx, a)
    lu, _, perm = _lu(a)
    return _unpack(lu, perm, a.dtype)


def _pivots_to_perm(piv, m):
    return lax.linalg.lu_pivots_to_permutation(piv.astype(jnp.int32) - 1, m)


@op(aten.lu_unpack.default)
def _lu_unpack(ctx, lu, piv, unpack_data=True, unpack_pivots=True):
    m = lu.shape[-2]
    perm = _pivots_to_perm(piv, m)
    P, L, U = _unpack(lu, perm, lu.dtype)
    P = jnp.broadcast_to(P, tuple(ctx.val[0].shape)) if unpack_pivots else _empty_like_meta(ctx, 0)
    if not unpack_data:
        L, U = _empty_like_meta(ctx, 1), _empty_like_meta(ctx, 2)
    return P, L, U


@op(aten.linalg_lu_solve.default)
def _linalg_lu_solve(ctx, lu, piv, b, *, left=True, adjoint=False):
    lu, b = _float(ctx, lu), _float(ctx, b)
    perm = _pivots_to_perm(piv, lu.shape[-2])
    if left:
        return _lu_solve(lu, perm, b, adjoint)
    # X A = B  <=>  A^H X^H = B^H ; X A^H = B  <=>  A X^H = B^H
    return mH(_lu_solve(lu, perm, mH(b), not adjoint))


def _is_vector_rhs(a, b):
    return b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])


@op(aten._linalg_solve_ex.default)
def _linalg_solve_ex(ctx, a, b, *, left=True, check_errors=False):
    a, b = _float(ctx, a), _float(ctx, b)
    vector = _is_vector_rhs(a, b)
    if vector:
        b = b[..., None]
    a_ = a if left else mT(a)
    lu, piv, perm = _lu(a_)
    if left:
        x = _lu_solve(lu, perm, b)
    else:  # X A = B <=> A^T X^T = B^T
        x = mT(_lu_solve(lu, perm, mT(b)))
    if vector:
        x = x[..., 0]
    x = jnp.broadcast_to(x, tuple(ctx.val[0].shape))
    return x, lu, piv, jnp.zeros(lu.shape[:-2], jnp.int32)


@op(aten.linalg_inv_ex.default)
def _inv_ex(ctx, a, *, check_errors=False):
    a = _float(ctx, a)
    inv = jnp.linalg.inv(a) if a.shape[-1] else a
    return inv, jnp.zeros(a.shape[:-2], jnp.int32)


# --- determinants ------------------------------------------------------------------------


def _det_parts(a):
    lu, piv, perm = _lu(a)
    n = a.shape[-1]
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    swaps = jnp.sum(piv != jnp.arange(1, n + 1, dtype=jnp.int32), axis=-1)
    parity = jnp.where(swaps % 2 == 0, 1, -1).astype(a.dtype)
    return lu, piv, diag, parity


@op(aten._linalg_det.default)
def _det(ctx, a):
    a = _float(ctx, a)
    lu, piv, diag, parity = _det_parts(a)
    return parity * jnp.prod(diag, axis=-1), lu, piv


@op(aten._linalg_slogdet.default)
def _slogdet(ctx, a):
    a = _float(ctx, a)
    lu, piv, diag, parity = _det_parts(a)
    absd = jnp.abs(diag)
    logabs = jnp.sum(jnp.log(absd), axis=-1)
    if jnp.iscomplexobj(a):
        sign = parity * jnp.prod(diag / absd.astype(diag.dtype), axis=-1)
    else:
        sign = parity * jnp.prod(jnp.sign(diag), axis=-1)
    return sign, logabs, lu, piv


# --- QR / eigh / SVD ------------------------------------------------------------------------


@op(aten.linalg_qr.default)
def _qr(ctx, a, mode="reduced"):
    a = _float(ctx, a)
    if mode == "r":
        return _empty_like_meta(ctx, 0), jnp.linalg.qr(a, mode="r")
    q, r = jnp.linalg.qr(a, mode=mode)
    return q, r


@op(aten.geqrf.default)
def _geqrf(ctx, a):
    from jax._src.lax.linalg import geqrf  # not re-exported by jax.lax.linalg
    return geqrf(_float(ctx, a))


@op(aten.linalg_householder_product.default)
def _householder_product(ctx, a, tau):
    a, tau = _float(ctx, a), _float(ctx, tau)
    return lax.linalg.householder_product(a, tau)


@op(aten.ormqr.default)
def _ormqr(ctx, a, tau, c, left=True, transpose=False):
    a, tau, c = _float(ctx, a), _float(ctx, tau), _float(ctx, c)
    m, k = a.shape[-2:]
    # the full m x m Q: pad the reflectors with zero ones (tau = 0 is the identity)
    a_full = jnp.concatenate([a, jnp.zeros(a.shape[:-1] + (m - k,), a.dtype)], axis=-1)[..., :m]
    tau_full = jnp.concatenate([tau, jnp.zeros(tau.shape[:-1] + (max(m - tau.shape[-1], 0),), tau.dtype)],
                               axis=-1)[..., :m]
    q = lax.linalg.householder_product(a_full, tau_full)
    if transpose:
        q = mH(q)
    q, c = _bcast_batch(q, c)
    return mm(q, c) if left else mm(c, q)


@op(aten._linalg_eigh.default)
def _eigh(ctx, a, UPLO="L", compute_v=True):
    a = _float(ctx, a)
    v, w = lax.linalg.eigh(a, lower=(UPLO.upper() == "L"), symmetrize_input=False)
    if not compute_v:
        return w, _empty_like_meta(ctx, 1)
    return w, v


@op(aten.linalg_eig.default)
def _eig(ctx, a):
    if ctx.platform != "cpu":
        raise NotImplementedError("linalg.eig (non-symmetric eigenproblem) has an XLA kernel on CPU only")
    vals, vecs = lax.linalg.eig(a, compute_left_eigenvectors=False)
    return vals, vecs


@op(aten._linalg_eigvals.default)
def _eigvals(ctx, a):
    return _eig(ctx, a)[0]


@op(aten._linalg_svd.default)
def _svd(ctx, a, full_matrices=False, compute_uv=True, *, driver=None):
    a = _float(ctx, a)
    if not compute_uv:
        s = jnp.linalg.svd(a, compute_uv=False)
        return _empty_like_meta(ctx, 0), s, _empty_like_meta(ctx, 2)
    u, s, vh = jnp.linalg.svd(a, full_matrices=full_matrices)
    return u, s, vh


def _pinv(ctx, a, atol, rtol, hermitian):
    a = _float(ctx, a)
    m, n = a.shape[-2:]
    real = jnp.finfo(a.dtype).dtype
    if hermitian:
        v, w = lax.linalg.eigh(a, lower=True, symmetrize_input=False)
        s = jnp.abs(w)
        u, vh = v, mH(v * jnp.sign(w).astype(v.dtype)[..., None, :])
    else:
        u, s, vh = jnp.linalg.svd(a, full_matrices=False)
    smax = jnp.max(s, axis=-1, keepdims=True) if s.shape[-1] else jnp.zeros(s.shape[:-1] + (1,), real)
    if rtol is None:
        default = jnp.finfo(real).eps * max(m, n)
        if atol is None:
            rtol = default
        elif isinstance(atol, (int, float)):
            rtol = default if atol <= 0 else 0.0
        else:
            rtol = jnp.where(atol > 0, 0.0, default)
    atol = 0.0 if atol is None else atol
    atol = jnp.asarray(atol, real)[..., None] if not isinstance(atol, float) else atol
    rtol = jnp.asarray(rtol, real)[..., None] if not isinstance(rtol, float) else rtol
    cutoff = jnp.maximum(atol, rtol * smax)
    keep = s > cutoff
    sinv = jnp.where(keep, 1 / jnp.where(keep, s, 1), 0).astype(a.dtype)
    return mm(mH(vh) * sinv[..., None, :], mH(u))


@op(aten.linalg_pinv.atol_rtol_tensor, aten.linalg_pinv.atol_rtol_float)
def _pinv_rule(ctx, a, *, atol=None, rtol=None, hermitian=False):
    return _pinv(ctx, a, atol, rtol, hermitian)


@op(aten.linalg_matrix_exp.default)
def _matrix_exp(ctx, a):
    a = _float(ctx, a)
    if a.shape[-1] == 0:
        return a
    if a.dtype in (jnp.bfloat16, jnp.float16):
        a = a.astype(jnp.float32)  # expm has no low-precision kernel; torch's opmath is float32
    flat = a.reshape((-1,) + a.shape[-2:])
    out = jax.vmap(lambda m: jsl.expm(m))(flat) if flat.shape[0] else flat
    return out.reshape(a.shape)
