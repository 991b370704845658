"""The random rules against torch's distributions: the streams differ from eager torch's, so each
draw is checked by shape, dtype, support and moments (of 20000 samples, 5 standard errors)."""
from __future__ import annotations

import math

import pytest
import torch

from helpers import compile_tpu

N = 20000


def _draw(fn, *args):
    torch.manual_seed(0)
    expected = fn(*[a.clone() for a in args])
    actual = compile_tpu(fn, options={"fallback": "error"})(*[a.clone() for a in args])
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    return actual.double(), expected.double()


def _close_mean(actual, mean, std):
    assert abs(actual.mean().item() - mean) < 5 * std / math.sqrt(actual.numel()), actual.mean()


def test_log_normal_and_cauchy():
    x = torch.empty(N)
    a, _ = _draw(lambda t: t.log_normal_(0.5, 0.25), x)
    assert (a > 0).all()
    _close_mean(a.log(), 0.5, 0.25)
    _close_mean(a.log().square(), 0.5 ** 2 + 0.25 ** 2, 0.3)
    c, _ = _draw(lambda t: t.cauchy_(2.0, 0.5), x)
    assert abs(c.median().item() - 2.0) < 0.03  # the median (its standard error here: 0.006)
    assert abs((c - 2.0).abs().median().item() - 0.5) < 0.03  # half the samples within sigma


@pytest.mark.parametrize("p", [0.2, 0.9])
def test_geometric_counts_trials_from_one(p):
    a, e = _draw(lambda t: t.geometric_(p), torch.empty(N))
    assert a.min() >= 1 and torch.equal(a, a.round())
    _close_mean(a, 1 / p, math.sqrt(1 - p) / p)
    assert a.min() == e.min() == 1


def test_bernoulli_with_a_tensor_of_probabilities():
    p = torch.tensor([0.0, 0.25, 1.0]).repeat(N // 3)
    a, e = _draw(lambda t, q: t.bernoulli_(q), torch.empty(p.shape), p)
    assert torch.equal(a[0::3], e[0::3]) and torch.equal(a[2::3], e[2::3])  # p = 0 and p = 1
    _close_mean(a[1::3], 0.25, math.sqrt(0.25 * 0.75))
    b, _ = _draw(torch.bernoulli, p)  # the functional form with the probabilities as input
    assert torch.equal(b[0::3], e[0::3]) and torch.equal(b[2::3], e[2::3])


def test_poisson():
    rates = torch.tensor([0.0, 3.0, 40.0]).repeat(N // 3)
    a, e = _draw(torch.poisson, rates)
    assert torch.equal(a, a.round()) and (a[0::3] == 0).all()
    _close_mean(a[1::3], 3.0, math.sqrt(3.0))
    _close_mean(a[2::3], 40.0, math.sqrt(40.0))


def test_multinomial_with_and_without_replacement():
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3], [0.25, 0.25, 0.25, 0.25]])
    a, _ = _draw(lambda p: torch.multinomial(p, N, replacement=True), probs)
    assert a.shape == (2, N)
    for row, p in zip(a, probs):
        counts = torch.bincount(row.long(), minlength=4).double() / N
        assert (counts - p.double()).abs().max() < 0.02, counts
    rows = probs[0].repeat(N // 4, 1)
    d, _ = _draw(lambda p: torch.multinomial(p, 3), rows)
    assert (d != 1).all()  # a zero probability is never drawn
    assert (d.sort(dim=1).values.diff(dim=1) > 0).all()  # no repeats within a row
    firsts = torch.bincount(d[:, 0].long(), minlength=4).double() / len(rows)
    assert (firsts - probs[0].double()).abs().max() < 0.03, firsts  # the first draw follows p


def test_logcumsumexp_private_overload():
    x = torch.randn(3, 5)
    got = compile_tpu(lambda t: torch.ops.aten._logcumsumexp(t, 1), options={"fallback": "error"})(x)
    torch.testing.assert_close(got, torch.logcumsumexp(x, 1))
