"""Focused numeric checks for the linalg, special, complex and FFT lowering rules."""
from __future__ import annotations

import torch

from helpers import assert_matches_eager


def _spd(n, batch=()):
    a = torch.randn(*batch, n, n, dtype=torch.float64)
    return (a @ a.mT + n * torch.eye(n, dtype=torch.float64)).float()


def test_cholesky_solve_inverse():
    torch.manual_seed(0)
    a, b = _spd(4, (2,)), torch.randn(2, 4, 3)

    def fn(a, b):
        # the *_ex forms: the checking forms add an effectful _linalg_check_errors node
        l = torch.linalg.cholesky_ex(a)[0]
        u = torch.linalg.cholesky_ex(a, upper=True)[0]
        return l, torch.cholesky_solve(b, l), torch.cholesky_solve(b, u, upper=True), torch.cholesky_inverse(l)

    assert_matches_eager(fn, a, b, rtol=1e-4, atol=1e-4)


def test_private_kernels_the_eager_device_reaches():
    torch.manual_seed(0)
    a, b = _spd(4, (2,)), torch.randn(2, 4, 3)
    n = torch.randn(5, 5)

    def fn(a, b, n):
        l = torch.linalg.cholesky_ex(a)[0]
        return (torch.ops.aten._cholesky_solve_helper(b, l, False),
                torch.ops.aten._cholesky_solve_helper(b, l.mT, True), torch.ops.aten._linalg_eigvals(n))

    assert_matches_eager(fn, a, b, n, rtol=1e-4, atol=1e-4)


def test_lu_family():
    torch.manual_seed(0)
    a, b = torch.randn(3, 4, 4), torch.randn(3, 4, 2)

    def fn(a, b):
        lu, piv, _ = torch.linalg.lu_factor_ex(a)
        p, l, u = torch.lu_unpack(lu, piv)
        return (lu, piv, p, l, u, torch.linalg.lu_solve(lu, piv, b),
                torch.linalg.lu_solve(lu, piv, b.mT, left=False),
                torch.linalg.lu_solve(lu, piv, b, adjoint=True), torch.linalg.solve_ex(a, b)[0],
                torch.linalg.inv_ex(a)[0], torch.linalg.det(a), *torch.linalg.slogdet(a))

    assert_matches_eager(fn, a, b, rtol=2e-4, atol=2e-4)


def test_triangular_solves():
    torch.manual_seed(0)
    a = torch.randn(2, 3, 3).triu() + 3 * torch.eye(3)
    b = torch.randn(2, 3, 4)

    def fn(a, b):
        return (torch.linalg.solve_triangular(a, b, upper=True),
                torch.linalg.solve_triangular(a.mT, b.mT, upper=False, left=False),
                torch.triangular_solve(b, a, upper=True, transpose=True)[0])

    assert_matches_eager(fn, a, b)


def test_qr_svd_eigh_values():
    torch.manual_seed(0)
    a = torch.randn(5, 3)
    s = _spd(4)

    def fn(a, s):
        q, r = torch.linalg.qr(a)
        return (q @ r, torch.linalg.svdvals(a), torch.linalg.eigvalsh(s),
                torch.linalg.pinv(a), torch.linalg.matrix_exp(s / 10))

    assert_matches_eager(fn, a, s, rtol=2e-4, atol=2e-4)


def test_norms_and_distances():
    torch.manual_seed(0)
    x, y = torch.randn(2, 30, 5), torch.randn(2, 7, 5)

    def fn(x, y):
        return (torch.linalg.vector_norm(x, 3.5, dim=(1, 2)), torch.linalg.vector_norm(x, float("inf")),
                torch.linalg.vector_norm(x, 0, dim=-1, keepdim=True), torch.cdist(x, y),
                torch.cdist(x, y, p=1), torch.cdist(y, y, p=float("inf")), torch.pdist(x[0], p=3),
                torch.linalg.cross(x[..., :3], x[..., 1:4]))

    assert_matches_eager(fn, x, y)


def test_special_functions():
    torch.manual_seed(0)
    x = torch.rand(64) * 8 + 0.1
    n = torch.randint(0, 12, (64,)).float()
    z = torch.linspace(-0.99, 0.99, 64)

    def fn(x, n, z):
        m, e = torch.frexp(x * 100)
        return (torch.polygamma(2, x), torch.polygamma(1, -(x.floor() + 0.5)), torch.special.zeta(x + 1, x),
                torch.special.i0e(x), torch.special.i1(x), torch.special.ndtri(z.abs()),
                torch.special.log_ndtr(z * 5), torch.special.erfcx(x), torch.igamma(x, n + 1),
                torch.igammac(x, n + 1), m, e, torch.ldexp(x, n),
                torch.special.chebyshev_polynomial_t(z, n), torch.special.legendre_polynomial_p(z, n),
                torch.special.spherical_bessel_j0(x - 4))

    assert_matches_eager(fn, x, n, z)


def test_complex_and_fft():
    torch.manual_seed(0)
    x = torch.randn(4, 6, 2)
    r = torch.randn(3, 8)

    def fn(x, r):
        c = torch.view_as_complex(x)
        f = torch.fft.fft2(c, norm="ortho")
        return (torch.view_as_real(f), c.real * 2, torch.angle(c), torch.angle(r),
                torch.view_as_real(torch.complex(r, r * 2)), torch.view_as_real(torch.polar(r.abs(), r)),
                torch.view_as_real(torch.fft.rfft(r, norm="forward")),
                torch.fft.irfft(torch.fft.rfft(r), n=8), torch.fft.hfft(c, n=9),
                torch.fft.ifft(r).real, torch.fft.ifft(r).imag)

    assert_matches_eager(fn, x, r)


def test_shrink_backward_zeroes_inside_the_band():
    x = torch.tensor([-1.0, -0.5, -0.2, 0.0, 0.5, 0.7])
    for shrink in (torch.ops.aten.hardshrink_backward, torch.ops.aten.softshrink_backward):
        out = assert_matches_eager(lambda g, t: shrink(g, t, 0.5), torch.arange(6.0) + 1, x)  # noqa: B023
        assert out.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0, 6.0]
