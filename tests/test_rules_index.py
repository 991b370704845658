"""Focused checks of the indexing and sorting rules (rules/index.py, rules/sort.py)."""
from __future__ import annotations

import math

import torch

from helpers import assert_matches_eager, compile_tpu

NAN = float("nan")


def test_index_put_accumulate_sums_duplicates():
    def fn(x, i, v):
        return x.index_put((i,), v, accumulate=True)

    x = torch.zeros(4)
    i = torch.tensor([1, 1, -1, 1])
    v = torch.tensor([1.0, 2.0, 3.0, 4.0])
    out = assert_matches_eager(fn, x, i, v)
    assert out.tolist() == [0.0, 7.0, 0.0, 3.0]


def test_index_put_impl_the_backward_of_indexing_calls():
    def fn(x, i, v):
        return torch.ops.aten._index_put_impl(x, (i,), v, True, True), torch.ops.aten._index_put_impl(x, (i,), v)

    assert_matches_eager(fn, torch.zeros(4, 2), torch.tensor([3, 0, 3]), torch.randn(3, 2))


def test_index_put_bool_mask_with_scalar():
    def fn(x, m):
        x = x.clone()
        x[m] = -1.0
        return x

    x = torch.arange(6.0).reshape(2, 3)
    m = torch.tensor([[True, False, True], [False, True, False]])
    out = assert_matches_eager(fn, x, m)
    assert out.tolist() == [[-1.0, 1.0, -1.0], [3.0, -1.0, 5.0]]


def test_advanced_index_negative_and_none():
    def fn(x, i, j):
        return x[:, i, j], x[i, :, j]

    x = torch.arange(24.0).reshape(2, 3, 4)
    i = torch.tensor([-1, 0])
    j = torch.tensor([-1, 1])
    (a, b) = assert_matches_eager(fn, x, i, j)
    assert a.tolist() == [[11.0, 1.0], [23.0, 13.0]]
    assert b.shape == (2, 3)
    assert b[0].tolist() == [15.0, 19.0, 23.0]


def test_gather_and_scatter_reduce_exclude_self():
    def fn(x, i, s):
        return torch.gather(x, 1, i), x.scatter_reduce(1, i, s, "amax", include_self=False)

    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    i = torch.tensor([[2, 2], [0, 1]])
    s = torch.tensor([[-5.0, -7.0], [9.0, 0.0]])
    g, r = assert_matches_eager(fn, x, i, s)
    assert g.tolist() == [[3.0, 3.0], [4.0, 5.0]]
    assert r.tolist() == [[1.0, 2.0, -5.0], [9.0, 0.0, 6.0]]


def test_scatter_reduce_mean_integer_floors():
    def fn(x, i, s):
        return x.scatter_reduce(0, i, s, "mean", include_self=False)

    out = assert_matches_eager(fn, torch.tensor([0, 0]), torch.tensor([0, 0]), torch.tensor([-3, 0]))
    assert out.tolist() == [-2, 0]


def test_sort_nan_largest_and_stable():
    def fn(x):
        return torch.sort(x, stable=True), torch.sort(x, descending=True, stable=True)

    x = torch.tensor([2.0, NAN, 1.0, 2.0, -math.inf, NAN])
    (va, ia), (vd, id_) = assert_matches_eager(fn, x)
    assert ia.tolist() == [4, 2, 0, 3, 1, 5]
    assert id_.tolist() == [1, 5, 0, 3, 2, 4]
    assert ia.dtype == torch.int64 and math.isnan(vd[0].item())


def test_topk_largest_and_smallest():
    def fn(x):
        return torch.topk(x, 2, dim=1), torch.topk(x, 2, dim=1, largest=False)

    x = torch.tensor([[3.0, 1.0, 4.0, 1.5], [9.0, 2.0, 6.0, 5.0]])
    (v, i), (vs, is_) = assert_matches_eager(fn, x)
    assert v.tolist() == [[4.0, 3.0], [9.0, 6.0]] and i.tolist() == [[2, 0], [0, 2]]
    assert vs.tolist() == [[1.0, 1.5], [2.0, 5.0]] and is_.tolist() == [[1, 3], [1, 3]]


def test_median_nan_and_nanmedian():
    def fn(x):
        return torch.median(x, dim=1), torch.nanmedian(x, dim=1), torch.median(x[0])

    x = torch.tensor([[3.0, 1.0, 2.0, 5.0], [1.0, NAN, 0.0, 7.0]])
    (m, mi), (n, ni), whole = assert_matches_eager(fn, x)
    assert m[0].item() == 2.0 and mi[0].item() == 2 and math.isnan(m[1].item()) and mi[1].item() == 1
    assert n.tolist() == [2.0, 1.0] and ni.tolist() == [2, 0]
    assert whole.item() == 2.0


def test_searchsorted_bucketize():
    def fn(seq, v):
        return (torch.searchsorted(seq, v), torch.searchsorted(seq, v, right=True),
                torch.bucketize(v, seq[0]))

    seq = torch.tensor([[1.0, 2.0, 2.0, 5.0], [0.0, 0.5, 3.0, 4.0]])
    v = torch.tensor([[2.0, 6.0], [0.5, -1.0]])
    left, right, buckets = assert_matches_eager(fn, seq, v)
    assert left.tolist() == [[1, 4], [1, 0]]
    assert right.tolist() == [[3, 4], [2, 0]]
    assert buckets.tolist() == [[1, 4], [0, 0]]


def test_masked_scatter_takes_source_in_order():
    def fn(x, m, s):
        return x.masked_scatter(m, s)

    x = torch.zeros(2, 3)
    m = torch.tensor([[False, True, True], [True, False, False]])
    s = torch.arange(1.0, 7.0).reshape(2, 3)
    out = assert_matches_eager(fn, x, m, s)
    assert out.tolist() == [[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]]


def test_bool_scatter_add_is_or():
    fn = compile_tpu(lambda x, i, s: x.scatter_add(0, i, s))
    x = torch.tensor([False, False, True])
    out = fn(x, torch.tensor([0, 0, 1]), torch.tensor([True, True, False]))
    assert out.tolist() == [True, False, True]
