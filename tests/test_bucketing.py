"""Shape bucketing and pad safety: one program per bucket, and never a silently wrong number."""
from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

import torchtpu
from torchtpu import events
from torchtpu.options import Options
from torchtpu.passes.bucketing import bucket_for, paired_symbols

from benchmarks.bucketing_bench import random_decoder_calls
from helpers import compile_tpu


def test_bucket_policies():
    assert [bucket_for(n, "pow2") for n in (1, 7, 8, 9, 100, 512, 513)] == [8, 8, 8, 16, 128, 512, 1024]
    assert [bucket_for(n, {"multiple": 128}) for n in (1, 128, 129)] == [128, 128, 256]
    assert [bucket_for(n, {"sizes": (16, 64)}) for n in (3, 17, 65)] == [16, 64, 65]
    assert bucket_for(300, "pow2", upper=400) == 400
    assert bucket_for(5, "off") == 5
    assert [bucket_for(n, "pow2", least=128) for n in (1, 128, 129)] == [128, 128, 256]
    assert bucket_for(3, {"pow2": 4}, least=128) == 4  # an explicit minimum wins


def test_paired_sizes_share_a_minimum():
    """Dynamo may keep apart two symbols whose dims meet in an op (attention's key and value
    lengths, a KV cache's and its mask's): they get one minimum and one bound, else their
    buckets would differ. Contracted dims pair too."""
    def f(q, k, v, x, w):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)[0], torch.mm(x, w)

    example = [torch.randn(1, 2, 3, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 7, 8),
               torch.randn(4, 6), torch.randn(6, 9)]
    gm = make_fx(f, tracing_mode="symbolic")(*example)
    shapes = [n.meta["val"].shape for n in gm.graph.nodes if n.op == "placeholder"]
    k_len, v_len, contracted = shapes[1][2].node.expr, shapes[2][2].node.expr, shapes[3][1].node.expr
    symbols = {d.node.expr for shape in shapes for d in shape if isinstance(d, torch.SymInt)}
    classes = paired_symbols(gm, symbols)
    assert any({k_len, v_len} <= c for c in classes)
    assert any({contracted, shapes[4][0].node.expr} <= c for c in classes)
    assert len(k_len.free_symbols | v_len.free_symbols) == 2  # two symbols Dynamo did not merge


def test_bucketing_option_is_validated_and_keyed():
    assert Options.parse({"bucketing": {"sizes": [64, 16]}}).bucketing == {"sizes": (16, 64)}
    assert Options.parse({}).key_items() != Options.parse({"bucketing": "off"}).key_items()
    with pytest.raises(ValueError, match="bucketing"):
        Options.parse({"bucketing": "pow3"})


def _statuses(since):
    return [e for e in events.events()[since:] if e["kind"] == "bucketing"]


def _run(fn, *args, options=None, dims=None):
    """Compiles fn with every dim dynamic (or only `dims` of each input, via mark_dynamic);
    returns (outputs, eager outputs, bucketing events)."""
    since = len(events.events())
    if dims is not None:
        for a in args:
            torch._dynamo.mark_dynamic(a, dims)
    out = compile_tpu(fn, dynamic=None if dims is not None else True, options=options or {})(*args)
    return out, fn(*args), _statuses(since)


def _close(a, b):
    a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4, equal_nan=True)


def test_one_program_per_bucket():
    torchtpu.reset_stats()
    c = compile_tpu(lambda x: torch.softmax(x, -1).sum(-1) + x.mean(-1), dynamic=True)
    for n in (9, 10, 13, 16, 11, 17, 30, 128, 129, 200):
        x = torch.randn(3, n)
        _close(c(x), torch.softmax(x, -1).sum(-1) + x.mean(-1))
    assert torchtpu.stats()["xla_compiles"] == 2  # last-dim buckets 128 and 256


def test_bucketing_off_compiles_each_size():
    torchtpu.reset_stats()
    c = compile_tpu(lambda x: x.sum(-1), dynamic=True, options={"bucketing": "off"})
    for n in (9, 10, 13):
        c(torch.randn(2, n))
    assert torchtpu.stats()["xla_compiles"] == 3


# --- pad safety per op family (random lengths) -------------------------------------------------

MASKED = {
    "softmax": lambda x: torch.softmax(x, dim=1),
    "log_softmax": lambda x: torch.log_softmax(x, dim=1),
    "mean": lambda x: x.mean(1),
    "sum": lambda x: x.sum(1),
    "max": lambda x: x.max(1).values,
    "argmax": lambda x: x.argmax(1),
    "amin": lambda x: x.amin(1),
    "logsumexp": lambda x: torch.logsumexp(x, 1),
    "var": lambda x: x.var(1),
    "norm": lambda x: torch.linalg.vector_norm(x, dim=1),
    "inf_in_padding": lambda x: (1.0 / x).sum(1),  # padding is 0: 1/0 = inf must not leak
    "nan_in_padding": lambda x: torch.log(x * 0).sum(1) + x.sum(1),  # log(0) = -inf, 0 * -inf
    "matmul_over_padded": lambda x: x.transpose(0, 1) @ x,
    "cumsum": lambda x: torch.cumsum(x, 1),
    "cat_static_first": lambda x: torch.cat([x[:, :1], x], 1).sum(1),
    "cat_padded_first": lambda x: torch.cat([x, x], 1).sum(1),  # each piece at the true end of the last
    "cat_growing_cache": lambda x: torch.softmax(torch.cat([x, x[:, :1] * 3, x], 1), 1),  # a KV cache's append
    "last_positions_slice": lambda x: x[:, -1:] * 2,  # a slice from the true end
    "slice_from_the_end": lambda x: x[:, -7:] * 2,  # the last 7 true positions, or all when shorter
    "strided_slice_between_ends": lambda x: x[:, -9:-1:3].sum(1),  # both ends from the true end
    "last_position": lambda x: x[:, -1] * 2,  # a select at the true end
    "gather_negative_position": lambda x: x[:, torch.tensor([-1, 0, -2])] + 1,
    "size_as_value": lambda x: x.sum(1) + x.shape[1],  # the true size, not the bucket's
    "index_copy_padded_index": lambda x: torch.ones(x.shape[0], 64).index_copy(1, torch.arange(x.shape[1]), x),
    "index_put_negative_position": lambda x: _write_first_and_last(x).sum(1),
}


def _write_into_static(x):
    y = torch.ones(x.shape[0], 64)
    y[:, :x.shape[1]] = x  # the columns past the true size must stay ones
    return y


def _write_first_and_last(x):
    y = x.clone()
    y[:, torch.tensor([-1, 0])] = 5.0  # index_put into the padded dim, -1 from its true end
    return y
REFUSED = {
    "layernorm_over_padded": (lambda x: F.layer_norm(x, x.shape[1:]), "normalises over a padded dim"),
    "cat_along_merged_padded": (lambda x: torch.cat([x.reshape(-1), x.reshape(-1)]).sum(), "merged padded dim"),
    "slice_from_the_end_to_a_fixed_position": (lambda x: x[:, -40:1] * 2, "counted from the end"),
    "flip": (lambda x: x.flip(1)[:, 0], "not known to be pad-safe"),
    "padded_slice_into_static_dim": (lambda x: _write_into_static(x), "touches a padded dim"),
}


@pytest.mark.parametrize("name", sorted(MASKED))
@settings(max_examples=4, deadline=None)
@given(n=st.integers(2, 40), b=st.integers(2, 5))
def test_masked_ops_are_correct(name, n, b):
    x = torch.rand(b, n) + 0.1
    out, ref, statuses = _run(MASKED[name], x)
    _close(out, ref)
    assert [s["status"] for s in statuses] == ["bucketed"], statuses


@pytest.mark.parametrize("name", sorted(REFUSED))
@settings(max_examples=3, deadline=None)
@given(n=st.integers(2, 39))  # under 40: at n=40, x[:, -40:1] is x[:, 0:1], which buckets (rightly)
def test_unsafe_ops_are_refused_with_a_reason(name, n):
    fn, why = REFUSED[name]
    x = torch.rand(3, n) + 0.1
    out, ref, statuses = _run(fn, x)
    _close(out, ref)
    assert [s["status"] for s in statuses] == ["exact"]
    assert why in statuses[0]["reason"]


@pytest.mark.parametrize("causal", [True, False])
@settings(max_examples=4, deadline=None)
@given(n=st.integers(2, 40))
def test_attention_over_padded_keys(causal, n):
    q, k, v = (torch.randn(2, 2, n, 8) for _ in range(3))
    attend = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
    out, ref, statuses = _run(attend, q, k, v, dims=2)  # a dynamic head dim would be a size used as a value
    _close(out, ref)
    assert [s["status"] for s in statuses] == ["bucketed"]
    masked = {d["why"] for d in statuses[0]["decisions"]}
    # q and k lengths are separate symbols here, so even causal attention masks padded keys
    assert masked == {"attention over padded keys"}, masked


# --- a 2-layer HF decoder over random shapes, nothing marked ----------------------------------------


def test_hf_decoder_random_shapes_compile_per_bucket():
    from benchmarks.models import hf_llama

    torch.manual_seed(0)
    model = hf_llama()
    torchtpu.reset_stats()
    since = len(events.events())
    compiled = compile_tpu(model, fullgraph=False)
    rng = random.Random(0)
    err1 = random_decoder_calls(model, compiled, rng, 20)
    first = torchtpu.stats()["xla_compiles"]
    err2 = random_decoder_calls(model, compiled, rng, 20)
    total = torchtpu.stats()["xla_compiles"]
    evs = events.events()[since:]
    buckets = {(e["graph"], e["bucket"]) for e in evs if e["kind"] == "bucket"}
    static = [e for e in evs if e["kind"] == "bucketing" and e["status"] != "bucketed"]
    print(f"xla compiles: first pass {first}, second pass {total - first}, buckets {len(buckets)}")
    assert max(err1, err2) < 1e-4
    assert all(e["status"] == "static" for e in static), static  # no dynamic graph was refused
    assert total == len(buckets) + len(static)  # exactly one program per bucket (+ the first, static call)
    assert total <= 12


def test_slice_from_the_end_of_a_padded_dim():
    """x[:, -k:] takes the last k true positions (all of them when fewer), not the bucket's:
    one program serves every length of a bucket."""
    fn = lambda x: x[:, -5:] * 2 + x[:, -6:-1:2].sum(1, keepdim=True)  # noqa: E731
    torchtpu.reset_stats()
    since = len(events.events())
    c = compile_tpu(fn, dynamic=True)
    for n in (9, 30, 100, 120):
        x = torch.rand(2, n) + 0.1
        _close(c(x), fn(x))
    assert torchtpu.stats()["xla_compiles"] == 1  # one bucket (128)
    for n in (4, 3, 2):  # shorter than the slices: Dynamo's other graphs
        x = torch.rand(2, n) + 0.1
        _close(c(x), fn(x))
    statuses = _statuses(since)
    assert {s["status"] for s in statuses} == {"bucketed"}, statuses
    assert torchtpu.stats()["xla_compiles"] <= len(statuses)  # one bucket each (two may share a program)
    whys = {d["why"] for s in statuses for d in s["decisions"]}
    assert "slice counted from the end: taken from the true end" in whys, whys


def test_sliding_window_decoder_random_shapes_compile_per_bucket():
    """Mistral's KV cache keeps the last sliding_window - 1 positions, a slice counted from the
    end of the padded sequence; the window's mask bites at these lengths."""
    from benchmarks.models import hf_mistral

    torch.manual_seed(0)
    model = hf_mistral(sliding_window=8)
    torchtpu.reset_stats()
    since = len(events.events())
    compiled = compile_tpu(model, fullgraph=False)
    rng = random.Random(3)  # its first 12 shapes meet each of Dynamo's graphs: batch 1 or not, seq < 7 or not
    err1 = random_decoder_calls(model, compiled, rng, 12, use_cache=True, batch=4, seq=128)
    first = torchtpu.stats()["xla_compiles"]
    err2 = random_decoder_calls(model, compiled, rng, 12, use_cache=True, batch=4, seq=128)
    total = torchtpu.stats()["xla_compiles"]
    evs = events.events()[since:]
    static = [e for e in evs if e["kind"] == "bucketing" and e["status"] != "bucketed"]
    print(f"xla compiles: first pass {first}, second pass {total - first}")
    assert max(err1, err2) < 1e-4  # logits and the KV cache
    assert all(e["status"] == "static" for e in static), static  # no dynamic graph was refused
    assert first <= 8
    assert total == first  # new shapes, no new program


# --- splits and slices of the unpadded side (fused QKV projections) ----------------------------

SPLITS = {
    "split_unpadded_dim": lambda x: sum(p.sum(-1) for p in x.split([2, 4, 6], -1)),
    "chunk_unpadded_dim": lambda x: torch.stack(x.chunk(3, -1)).sum(0),
    "unbind_unpadded_dim": lambda x: sum(x.unbind(-1)),
    "split_padded_dim_static_front": lambda x: torch.split(x, [1, x.shape[1] - 1], 1)[1].sum(1),
    "view_after_slice_of_unpadded_dim": lambda x: x[..., :8].reshape(x.shape[0], x.shape[1], 2, 4).sum(-1),
}


@pytest.mark.parametrize("name", sorted(SPLITS))
@pytest.mark.parametrize("n", [3, 37])
def test_splits_are_harmless(name, n):
    x = torch.rand(3, n, 12) + 0.1
    out, ref, statuses = _run(SPLITS[name], x, dims=1)
    _close(out, ref)
    assert [s["status"] for s in statuses] == ["bucketed"], statuses


def test_split_of_a_padded_dim_with_a_dynamic_front_is_refused():
    fn = lambda x: torch.split(x, [x.shape[1] - 1, 1], 1)[0].sum(1)  # noqa: E731
    out, ref, statuses = _run(fn, torch.rand(3, 21, 12), dims=1)
    _close(out, ref)
    assert [s["status"] for s in statuses] == ["exact"]
    assert "every piece but the last has a static size" in statuses[0]["reason"]


def test_repeat_by_a_padded_size():
    """ALiBi's slopes x positions, tiled batch times: the copies of real positions stay real."""
    fn = lambda x: (torch.arange(x.shape[1]) * torch.ones(4, 1, 1)).repeat(x.shape[0], 2, 1).sum(1) + x.sum()  # noqa: E731
    for b, n in ((2, 5), (3, 21)):
        x = torch.rand(b, n)
        out, ref, statuses = _run(fn, x)
        _close(out, ref)
        assert [s["status"] for s in statuses] == ["bucketed"], statuses


def _route(x):
    """A router: the top 2 of 4 experts per (padded) token, their indices then gathered by."""
    weights, experts = torch.softmax(x @ torch.ones(x.shape[-1], 4).cumsum(1), -1).topk(2, -1)
    table = torch.arange(8.0).view(4, 2)
    return weights.sum(-1) + table[experts].sum((-1, -2)) + torch.gather(x, 1, experts[..., :1] * 0)[..., 0]


@pytest.mark.parametrize("n", [3, 37])
def test_topk_along_an_unpadded_dim_is_harmless(n):
    x = torch.rand(n, 6)
    out, ref, statuses = _run(_route, x, dims=0)
    _close(out, ref)
    assert [s["status"] for s in statuses] == ["bucketed"], statuses


def test_sort_along_a_padded_dim_is_refused():
    fn = lambda x: x.sort(0).values[0] + x.topk(2, 0).values.sum(0)  # noqa: E731
    out, ref, statuses = _run(fn, torch.rand(21, 6), dims=0)
    _close(out, ref)
    assert [s["status"] for s in statuses] == ["exact"]
    assert "along the padded dim 0" in statuses[0]["reason"]


def test_repeat_of_a_constant_by_a_padded_size():
    slopes = torch.tensor([[0.5], [0.25]])
    fn = lambda x: slopes.repeat(x.shape[0], x.shape[1]).view(x.shape[0], 2, x.shape[1]).sum(1) + x  # noqa: E731
    out, ref, statuses = _run(fn, torch.rand(3, 7))
    _close(out, ref)
    assert [s["status"] for s in statuses] == ["bucketed"], statuses


def test_repeats_tiled_in_different_orders_are_refused():
    """(b copies of 2 rows) + (2 copies of b rows): the real rows sit at different positions."""
    slopes = torch.tensor([[0.5], [0.25]])
    fn = lambda x: slopes.repeat(x.shape[0], x.shape[1]) + x.repeat(2, 1)  # noqa: E731
    out, ref, statuses = _run(fn, torch.rand(3, 7))
    _close(out, ref)
    assert [s["status"] for s in statuses] == ["exact"]
    assert "merged from padded dims in different orders" in statuses[0]["reason"]


def test_batchnorm_training_over_padded_image_sizes():
    """BatchNorm's backward scales by 1 / (elements per channel), a SymFloat size expression
    (FloatTrueDiv of IntTrueDiv) that must take the call's true sizes: outputs, gradients and
    running statistics match eager at every image size; the forward runs at exact sizes and the
    backward once per bucket."""
    import copy

    torch.manual_seed(0)
    ref = torch.nn.BatchNorm2d(8)
    model = copy.deepcopy(ref)
    compiled = compile_tpu(model)
    torchtpu.reset_stats()
    since = len(events.events())
    for hw in [(16, 16), (20, 24), (28, 30), (30, 26)]:
        x = torch.randn(4, 8, *hw)
        weights = torch.randn(4, 8, *hw)
        x_ref, x_tpu = x.clone().requires_grad_(), x.clone().requires_grad_()
        y_ref, y_tpu = ref(x_ref), compiled(x_tpu)
        (y_ref * weights).sum().backward()
        (y_tpu * weights).sum().backward()
        _close(y_tpu, y_ref)
        torch.testing.assert_close(x_tpu.grad, x_ref.grad, rtol=1e-4, atol=1e-4)
        for name in ("weight", "bias"):
            got, want = getattr(model, name).grad, getattr(ref, name).grad
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)
        torch.testing.assert_close(model.running_mean, ref.running_mean)
        torch.testing.assert_close(model.running_var, ref.running_var)
        ref.zero_grad(), model.zero_grad()
    statuses = _statuses(since)
    # The forward normalises over the padded dims, so it runs at exact sizes (a counted refusal);
    # its backward takes the saved statistics and is bucketed.
    assert [s["status"] for s in statuses] == ["static", "static", "exact", "bucketed"]
    assert "normalises over a padded dim" in statuses[2]["reason"]
    # 16x16: forward and backward; then a forward per size and one backward for the bucket
    assert torchtpu.stats()["xla_compiles"] == 2 + 3 + 1


@pytest.mark.parametrize("expr, env, want", [
    ("FloatTrueDiv(1.0, IntTrueDiv(512*s0*s1, 16))", {"s0": 2, "s1": 3}, 1.0 / 192),
    ("ToFloat(s0) * 0.5", {"s0": 5}, 2.5),
    ("s0**(-2)", {"s0": 4}, 1 / 16),
    ("PowByNatural(s0, 3) + FloorDiv(s1, 2)", {"s0": 2, "s1": 7}, 11),
])
def test_size_expressions_evaluate(expr, env, want):
    """Size expressions of SymInt and SymFloat arithmetic (torch's sympy functions) evaluate at
    given sizes, as the padding hooks evaluate them at a call's true sizes."""
    import sympy
    from torch.utils._sympy import functions

    from torchtpu.plans import evaluate

    names = {n: getattr(functions, n) for n in ("FloatTrueDiv", "IntTrueDiv", "ToFloat", "PowByNatural", "FloorDiv")}
    symbols = {n: sympy.Symbol(n, integer=True, positive=True) for n in env}
    parsed = sympy.sympify(expr, locals={**names, **symbols})
    assert evaluate(parsed, {symbols[n]: v for n, v in env.items()}) == pytest.approx(want)
