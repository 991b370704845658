"""Run-time index checks: an out-of-range position raises torch's error, never silent garbage.

Each op family: in range, results are bit-identical to eager and to check_indices=False; out
of range (above, and below where torch rejects negatives), the call raises the error eager
raises, naming the ATen op and this file's line; what eager accepts (negative positions of
index/index_put/take) is accepted. Bucketed programs never flag their own padding.
"""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import torchtpu
from torchtpu import events
from torchtpu.cache import tiers
from torchtpu.compiler.checks import ProgramCheckError, ProgramIndexError
from torchtpu.options import Options

from helpers import compile_tpu, host_triple as triple

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # index_reduce is "beta"

X = torch.arange(15.0).reshape(5, 3)
W = torch.randn(10, 4, generator=torch.Generator().manual_seed(0))


def _line(fn) -> str:
    """How the error names fn's op: its file and the line of its (one-line) body."""
    return f'{__file__}", line {fn.__code__.co_firstlineno + 1}'


def _eager_error(fn, *args):
    try:
        fn(*args)
    except (IndexError, RuntimeError) as exc:
        return exc
    raise AssertionError("eager accepted the bad index")


def _same(a, b):
    a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), (x, y)


def _check(fn, good: tuple, bads: list[tuple], op: str, dynamic=False):
    """fn compiled with checks: bit-identical to eager and to checks-off on `good`; on each of
    `bads` it raises what eager raises, naming `op` and fn's line."""
    checked = compile_tpu(fn, dynamic=dynamic)
    _same(checked(*good), fn(*good))
    unchecked = compile_tpu(fn, dynamic=dynamic, options={"check_indices": False})
    _same(unchecked(*good), fn(*good))
    checked = compile_tpu(fn, dynamic=dynamic)
    for bad in bads:
        expected = _eager_error(fn, *bad)
        with pytest.raises(type(expected)) as caught:
            checked(*bad)
        assert isinstance(caught.value, (ProgramIndexError, ProgramCheckError))
        message = str(caught.value)
        assert _kind(expected) in message.splitlines()[0], (message, expected)
        assert op in message and _line(fn) in message, message


def _kind(exc) -> str:
    """torch's message up to the first number (the bad value, which one flag cannot carry)."""
    return re.split(r"[-\d]", str(exc).splitlines()[0])[0]


# --- one family each -----------------------------------------------------------------------


def embedding(i):
    return F.embedding(i, W)


def test_embedding():
    _check(embedding, (torch.tensor([[0, 9], [3, 3]]),), [(torch.tensor([[0, 10]]),), (torch.tensor([-1]),)],
           "aten.embedding.default")


def embedding_bag(i, offsets):
    return F.embedding_bag(i, W, offsets)


def test_embedding_bag():
    offsets = torch.tensor([0, 2])
    _check(embedding_bag, (torch.tensor([1, 9, 4]), offsets),
           [(torch.tensor([1, 10, 4]), offsets), (torch.tensor([1, -1, 4]), offsets)], "aten._embedding_bag")


def index_select(x, i):
    return x.index_select(0, i)


def test_index_select():
    _check(index_select, (X, torch.tensor([4, 0, 4])), [(X, torch.tensor([5])), (X, torch.tensor([0, -1]))],
           "aten.index_select.default")


def gather(x, i):
    return x.gather(1, i)


def test_gather():
    _check(gather, (X, torch.tensor([[2, 0]] * 5)), [(X, torch.tensor([[3]])), (X, torch.tensor([[0], [-1]]))],
           "aten.gather.default")


def advanced_index(x, i, j):
    return x[i, j]


def test_index_tensor_wraps_negatives_like_eager():
    _check(advanced_index, (X, torch.tensor([-5, 4, -1]), torch.tensor([-3, 2, 0])),
           [(X, torch.tensor([5, 0, 0]), torch.tensor([0, 0, 0])), (X, torch.tensor([-6]), torch.tensor([0])),
            (X, torch.tensor([0]), torch.tensor([3]))], "aten.index.Tensor")


def index_put(x, i, v):
    return x.index_put((i,), v)


def test_index_put():
    v = torch.ones(2, 3)
    _check(index_put, (X, torch.tensor([-5, 4]), v), [(X, torch.tensor([0, 5]), v), (X, torch.tensor([-6, 0]), v)],
           "aten.index_put.default")


def index_copy(x, i, v):
    return x.index_copy(0, i, v)


def index_add(x, i, v):
    return x.index_add(0, i, v)


def index_fill(x, i):
    return x.index_fill(0, i, -1.0)


def test_index_copy_and_add_reject_negatives_where_index_put_wraps():
    v = torch.ones(2, 3)
    bad = [(X, torch.tensor([0, 5]), v), (X, torch.tensor([-1, 0]), v)]
    _check(index_copy, (X, torch.tensor([4, 0]), v), bad, "aten.index_copy.default (lowered as aten.index_put")
    _check(index_add, (X, torch.tensor([4, 4]), v), bad, "aten.index_add.default (lowered as aten.index_put")
    _check(index_fill, (X, torch.tensor([-1, 0])), [(X, torch.tensor([5])), (X, torch.tensor([-6]))],
           "aten.index_fill")


def kv_cache_update(cache, pos, kv):
    return cache.index_copy_(1, pos, kv)


def test_kv_cache_update_in_place():
    """generate()'s static-cache write (index_copy_ at cache_position)."""
    cache, kv = torch.zeros(1, 6, 2), torch.ones(1, 2, 2)
    good = (cache, torch.tensor([4, 5]), kv)
    checked = compile_tpu(kv_cache_update)
    _same(checked(cache.clone(), *good[1:]), kv_cache_update(cache.clone(), *good[1:]))
    keep = cache.clone()
    with pytest.raises(IndexError, match="index_copy_") as caught:
        checked(keep, torch.tensor([5, 6]), kv)
    assert _line(kv_cache_update) in str(caught.value)
    assert torch.equal(keep, cache)  # nothing written back, as in eager


def scatter_src(x, i, s):
    return x.scatter(1, i, s)


def scatter_value(x, i, s):
    return x.scatter(1, i, 7.0)


def scatter_add(x, i, s):
    return x.scatter_add(1, i, s)


def scatter_amax(x, i, s):
    return x.scatter_reduce(1, i, s, "amax", include_self=False)


@pytest.mark.parametrize("fn", [scatter_src, scatter_value, scatter_add, scatter_amax], ids=lambda f: f.__name__)
def test_scatter(fn):
    s = torch.full((5, 2), -2.0)
    good = (X, torch.tensor([[2, 0]] * 5), s)
    _check(fn, good, [(X, torch.tensor([[0, 3]] * 5), s), (X, torch.tensor([[-1, 0]] * 5), s)], "aten.scatter")


def index_reduce(x, i, v):
    return x.index_reduce(0, i, v, "prod")


def test_index_reduce():
    v = torch.full((2, 3), 2.0)
    _check(index_reduce, (X, torch.tensor([1, 1]), v), [(X, torch.tensor([5, 0]), v), (X, torch.tensor([-1, 0]), v)],
           "aten.index_reduce.default")


def take(x, i):
    return x.take(i)


def put(x, i):
    return x.put(i, torch.ones(i.shape))


@pytest.mark.parametrize("fn", [take, put], ids=lambda f: f.__name__)
def test_take_and_put_wrap_negatives_like_eager(fn):
    _check(fn, (X, torch.tensor([-15, 14, 0])), [(X, torch.tensor([15])), (X, torch.tensor([-16]))],
           f"aten.{fn.__name__}.default")


def one_hot(i):
    return F.one_hot(i, 5)


def test_one_hot_is_one_program():
    torchtpu.reset_stats()
    _check(one_hot, (torch.tensor([0, 4, 2]),), [(torch.tensor([5]),), (torch.tensor([-1, 0]),)], "one_hot")
    assert torchtpu.stats().get("device_regions", 0) == 0  # the asserts run on the device, no host split


def cross_entropy(x, t):
    return F.cross_entropy(x, t)


def test_nll_loss_targets():
    """cross_entropy's gather of the target: torch's IndexError, ignore_index (-100) allowed."""
    _check(cross_entropy, (X, torch.tensor([0, 2, -100, 1, 1])),
           [(X, torch.tensor([0, 3, 0, 0, 0])), (X, torch.tensor([0, -1, 0, 0, 0]))],
           "aten.nll_loss_forward.default (lowered as aten.gather")


def take_along_dim(x, i):
    return torch.take_along_dim(x, i, 1)


def test_take_along_dim_wraps_like_eager():
    """Eager's take_along_dim does not check: positions wrap modulo the size, and so do ours."""
    i = torch.tensor([[3], [-1], [7], [0], [2]])
    _same(compile_tpu(take_along_dim)(X, i), take_along_dim(X, i))


# --- the option, the cache, the first failing check -------------------------------------------


def test_option_is_validated_and_keyed():
    assert Options.parse({}).check_indices is True
    assert Options.parse({}).key_items() != Options.parse({"check_indices": False}).key_items()
    with pytest.raises(ValueError, match="check_indices"):
        Options.parse({"check_indices": "yes"})


def test_checks_off_raise_nothing():
    out = compile_tpu(embedding, options={"check_indices": False})(torch.tensor([12]))
    assert out.shape == (1, 4)  # whatever XLA's clamped gather gives: the checks are off


def two_embeddings(i, j):
    return F.embedding(i, W), F.embedding(j, W)


def test_first_failing_check_is_named():
    c = compile_tpu(two_embeddings)
    with pytest.raises(IndexError) as caught:
        c(torch.tensor([1]), torch.tensor([10]))
    assert "%embedding_1" in str(caught.value)
    with pytest.raises(IndexError) as caught:
        c(torch.tensor([10]), torch.tensor([10]))
    assert "%embedding :" in str(caught.value)


def first_copy(x, i):
    return x.index_select(0, i) * 2


def second_copy(x, i):
    return x.index_select(0, i) * 2


def test_a_cached_program_names_its_own_graphs_line():
    """Two graphs with one canonical text share a program (the second from the disk entry, its
    checks in the entry's JSON); each error names the line of the graph that ran."""
    compiles = []
    for fn in (first_copy, second_copy):
        tiers.MEMORY.clear()
        torchtpu.reset_stats()
        with pytest.raises(IndexError) as caught:
            compile_tpu(fn)(X, torch.tensor([5]))
        compiles.append(torchtpu.stats().get("xla_compiles", 0))
        assert _line(fn) in str(caught.value)
    assert compiles[1] == 0


# --- bucketed programs --------------------------------------------------------------------


def _bucketed_since(since) -> bool:
    return any(e["kind"] == "bucketing" and e["status"] == "bucketed" for e in events.events()[since:])


def flipped_ids(ids):
    return F.embedding(10 - ids, W)


def test_bucketing_does_not_flag_padded_index_entries():
    """Padded entries of 10 - ids are 10 (out of range): never an error; a real bad one is."""
    since = len(events.events())
    ids = torch.tensor([[1, 4, 10, 2, 3]])
    torch._dynamo.mark_dynamic(ids, 1)
    c = compile_tpu(flipped_ids, dynamic=None)
    _same(c(ids), flipped_ids(ids))
    assert _bucketed_since(since)
    for n in (3, 6, 7):  # one bucket (8), each with a different amount of padding
        _same(c(ids[:, :1].repeat(1, n)), flipped_ids(ids[:, :1].repeat(1, n)))
    with pytest.raises(IndexError, match="index out of range in self") as caught:
        c(torch.tensor([[1, 4, 0, 2, 3, 1]]))
    assert _line(flipped_ids) in str(caught.value)


def rows(x, i):
    return x[i]


def test_bucketing_checks_against_the_true_size():
    """x has 5 real rows in a bucket of 8: row 6 is out of range, as in eager."""
    since = len(events.events())
    x = torch.randn(5, 3)
    torch._dynamo.mark_dynamic(x, 0)
    c = compile_tpu(rows, dynamic=None)
    _same(c(x, torch.tensor([4, -5])), rows(x, torch.tensor([4, -5])))
    assert _bucketed_since(since)
    for bad in ([5], [6], [-6]):
        with pytest.raises(IndexError, match="index out of bounds for dimension 0") as caught:
            c(x, torch.tensor(bad))
        assert _line(rows) in str(caught.value)


def cache_write(cache, kv, start):
    return cache.index_copy(1, torch.arange(kv.shape[1]) + start, kv)


def test_bucketed_kv_cache_write_ignores_padded_positions():
    """A prompt of 5 at position 10 of a 16-long cache: bucket 8 puts padded positions at 15..17."""
    since = len(events.events())
    cache, kv = torch.zeros(1, 16, 2), torch.randn(1, 5, 2)
    torch._dynamo.mark_dynamic(kv, 1)
    c = compile_tpu(cache_write, dynamic=None)
    _same(c(cache, kv, 10), cache_write(cache, kv, 10))
    assert _bucketed_since(since)
    with pytest.raises(IndexError, match="index_copy_"):
        c(cache, torch.randn(1, 7, 2), 10)


# --- DeferAndFuse regions -----------------------------------------------------------------


def around_a_host_op(x, i):
    y = triple(x.index_select(0, i))
    return y.gather(1, i[:, None] - 2)  # after the host op: in the second program


@pytest.mark.parametrize("mode", ["fused", "strict"])
def test_defer_and_fuse_regions(mode):
    c = compile_tpu(around_a_host_op, options={"mode": mode})
    i = torch.tensor([4, 2, 3])
    _same(c(X, i), around_a_host_op(X, i))
    with pytest.raises(IndexError, match="index out of range in self") as caught:
        c(X, torch.tensor([5]))
    assert "aten.index_select.default" in str(caught.value)
    assert f"line {around_a_host_op.__code__.co_firstlineno + 1}" in str(caught.value)
    with pytest.raises(RuntimeError, match="index out of bounds for dimension 1 with size 3") as caught:
        c(X, torch.tensor([0]))
    assert "aten.gather.default" in str(caught.value)
    assert f"line {around_a_host_op.__code__.co_firstlineno + 2}" in str(caught.value)


def select_then_host(x, i):
    return triple(x.index_select(0, i))


def select_then_host_elsewhere(x, i):
    return triple(x.index_select(0, i))


def test_strict_mode_shared_program_names_the_callers_line():
    """Strict mode compiles one program per op and signature for the whole process: the second
    function runs the first one's index_select program, and its error names its own line."""
    for fn in (select_then_host, select_then_host_elsewhere):
        with pytest.raises(IndexError) as caught:
            compile_tpu(fn, options={"mode": "strict"})(X, torch.tensor([5]))
        assert _line(fn) in str(caught.value)


# --- the model ---------------------------------------------------------------------


def test_llama_out_of_range_token_raises_like_eager():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 256, (2, 8))
    bad = ids.clone()
    bad[1, 3] = 300
    with torch.no_grad():
        with pytest.raises(IndexError, match="index out of range in self"):
            model(input_ids=bad)
        checked = compile_tpu(model)
        logits = checked(input_ids=ids).logits
        with pytest.raises(IndexError, match="index out of range in self") as caught:
            checked(input_ids=bad)  # the user's line: this one
        unchecked = compile_tpu(model, options={"check_indices": False})
        assert torch.equal(logits, unchecked(input_ids=ids).logits)
        assert torch.isfinite(logits).all()
    message = str(caught.value)
    assert "aten.embedding.default" in message and "modeling_llama.py" in message and "embed_tokens" in message
    assert any(str(entry.path) == __file__ and "checked(input_ids=bad)" in str(entry.statement)
               for entry in caught.traceback)


def test_training_forward_checks_and_grads_unchanged():
    emb = torch.nn.Embedding(10, 4)

    def loss(i):
        return (emb(i) ** 2).sum()

    grads = []
    for options in ({}, {"check_indices": False}):
        emb.weight.grad = None
        compile_tpu(loss, options=options)(torch.tensor([1, 9, 1])).backward()
        grads.append(emb.weight.grad.clone())
    assert torch.equal(grads[0], grads[1])
    with pytest.raises(IndexError, match="index out of range in self") as caught:
        compile_tpu(loss)(torch.tensor([1, 10]))
    assert _line(loss) in str(caught.value)
