"""Hugging Face `generate()` with a static KV cache, the model's forward compiled with backend="tpu".

Greedy decoding must pick exactly eager's tokens, and the number of programs must not grow
with the number of decode steps: one for the prefill (prompt length), one for every decode
step (one token against the whole static cache; the cache position is a tensor, not a
Python int, so it does not specialise the graph).
"""
from __future__ import annotations

import pytest
import torch

import torchtpu
from torchtpu import events
from helpers import compile_tpu

pytest.importorskip("transformers", reason="Hugging Face generate() needs transformers")

NEW_TOKENS = 32


def _llama():
    from benchmarks.models import hf_llama

    torch.manual_seed(0)
    model = hf_llama(layers=2, vocab=256, hidden=64, heads=4, kv_heads=2)  # GQA: 4 query heads, 2 kv heads
    model.config.use_cache = True  # hf_llama builds with use_cache=False (forward-only benchmarks)
    model.generation_config.use_cache = True
    model.generation_config.cache_implementation = "static"
    return model


def _generate(model, ids):
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)


def _programs(before: dict, after: dict) -> int:
    """Executables this process obtained between two stats(): compiled, or found in a cache tier."""
    return sum(after[k] - before[k] for k in ("xla_compiles", "memory_hits", "disk_hits"))


@pytest.fixture(scope="module")
def model_and_eager():
    model = _llama()
    prompts = [torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(s)) for s in (1, 2)]
    expected = [_generate(model, p) for p in prompts]
    return model, prompts, expected


def test_static_cache_generate_matches_eager_with_two_programs(model_and_eager):
    model, prompts, expected = model_and_eager
    eager_forward = model.forward
    decode_calls = []

    compiled = compile_tpu(eager_forward)

    def forward(*args, **kwargs):
        decode_calls.append(kwargs["input_ids"].shape[1] == 1)
        return compiled(*args, **kwargs)

    model.forward = forward
    try:
        before = torchtpu.stats()
        out = _generate(model, prompts[0])
        first = torchtpu.stats()
        out2 = _generate(model, prompts[1])  # a fresh StaticCache of the same size: nothing new to compile
        second = torchtpu.stats()
    finally:
        model.forward = eager_forward

    assert out.shape == (1, 8 + NEW_TOKENS)
    assert torch.equal(out, expected[0]), f"tokens differ from eager:\n{out}\n{expected[0]}"
    assert torch.equal(out2, expected[1]), f"tokens differ from eager:\n{out2}\n{expected[1]}"
    assert decode_calls.count(True) == 2 * (NEW_TOKENS - 1) and decode_calls.count(False) == 2
    # one Dynamo graph and one program for the prefill, one of each for all 31 decode steps
    assert first["dynamo_graphs"] - before["dynamo_graphs"] == 2
    assert _programs(before, first) == 2
    assert first["xla_compiles"] - before["xla_compiles"] <= 2
    assert second["dynamo_graphs"] == first["dynamo_graphs"]
    assert _programs(first, second) == 0
    assert first["fallback_ops"] == before["fallback_ops"]


def test_static_cache_is_updated_in_place_like_eager():
    """After one compiled prefill step the cache tensors hold eager's keys and values."""
    from transformers import StaticCache

    model = _llama()
    ids = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(3))
    caches = [StaticCache(config=model.config, max_cache_len=16) for _ in range(2)]
    position = torch.arange(6)
    with torch.no_grad():
        ref = model(input_ids=ids, cache=caches[0], use_cache=True, cache_position=position).logits
        out = compile_tpu(model.forward)(input_ids=ids, cache=caches[1], use_cache=True,
                                         cache_position=position).logits
    torch.testing.assert_close(out, ref, rtol=1.3e-4, atol=1e-4)
    for eager_layer, tpu_layer in zip(caches[0].layers, caches[1].layers):
        torch.testing.assert_close(tpu_layer.keys, eager_layer.keys, rtol=1.3e-4, atol=1e-4)
        torch.testing.assert_close(tpu_layer.values, eager_layer.values, rtol=1.3e-4, atol=1e-4)
        assert int(tpu_layer.cumulative_length) == int(eager_layer.cumulative_length) == 6
        assert tpu_layer.keys[:, :, 6:].abs().sum() == 0  # the rest of the static cache untouched



def test_new_prompt_lengths_compile_per_bucket_not_per_length():
    """A static cache sized by generate() (prompt + new tokens) changes size with the prompt: the
    second distinct length makes Dynamo's graphs dynamic, and both are bucketed: the prefill
    pads the prompt (its length, used as a value, enters as the true size; the last position
    is sliced from the true end), the decode step pads the cache (index_put writes real
    positions only). Prompt 12: prefill bucket 128 and cache 43 -> 128, two programs; prompt 5:
    the same two programs."""
    model = _llama()
    eager_forward = model.forward
    model.forward = compile_tpu(eager_forward)
    counts, since = [], len(events.events())
    try:
        for length, seed in ((8, 4), (12, 5), (5, 6)):
            ids = torch.randint(0, 256, (1, length), generator=torch.Generator().manual_seed(seed))
            before = torchtpu.stats()
            out = _generate(model, ids)
            after = torchtpu.stats()
            counts.append((after["dynamo_graphs"] - before["dynamo_graphs"], _programs(before, after)))
            model.forward, compiled = eager_forward, model.forward
            expected = _generate(model, ids)
            model.forward = compiled
            assert torch.equal(out, expected), f"prompt {length}: tokens differ from eager"
    finally:
        model.forward = eager_forward
    assert counts == [(2, 2), (2, 2), (0, 0)]
    statuses = [e["status"] for e in events.events()[since:] if e["kind"] == "bucketing"]
    assert statuses == ["static", "static", "bucketed", "bucketed"], statuses


def test_bfloat16_generate_matches_eager_and_buckets():
    """The dtype TPU users run: a bf16 model generates eager-bf16's tokens, and a second prompt
    length reuses bucketed programs (bf16 prefill and decode graphs bucket like f32 ones)."""
    model = _llama().to(torch.bfloat16)
    eager_forward = model.forward
    compiled = compile_tpu(eager_forward)
    since, outputs = len(events.events()), []
    for length, seed in ((8, 7), (12, 8), (5, 9)):
        ids = torch.randint(0, 256, (1, length), generator=torch.Generator().manual_seed(seed))
        expected = _generate(model, ids)
        model.forward = compiled
        try:
            before = torchtpu.stats()
            outputs.append((_generate(model, ids), expected, torchtpu.stats()["xla_compiles"] - before["xla_compiles"]))
        finally:
            model.forward = eager_forward
    for out, expected, _ in outputs:
        assert torch.equal(out, expected), f"bf16 tokens differ from eager:\n{out}\n{expected}"
    assert outputs[2][2] == 0, "the third prompt length compiled again: its graphs did not bucket"
    statuses = [e["status"] for e in events.events()[since:] if e["kind"] == "bucketing"]
    assert statuses.count("bucketed") == 2, statuses
