"""Bucketed eager programs (torchtpu/device/bucketed.py): a size that grows around a loop compiles
once per pow2 bucket on the tpu device, with torch's results."""
from __future__ import annotations

import copy
import io
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import helpers
import torchtpu
import torchtpu.device
from torchtpu import events
from torchtpu.device import bucketed
from torchtpu.device import graph as graphs
from torchtpu.device.storage import storage_of

TPU = "tpu"


def _count(name: str) -> int:
    return torchtpu.stats().get(name, 0)


def _programs() -> int:
    return _count("eager_programs") + _count("eager_bucketed_programs")


# --- a torch view as windows of its storage's dims ------------------------------------------------


@st.composite
def _views(draw):
    """A storage's dims and a view of it made by torch's view ops: (dims, view, window_made),
    window_made when only ops that keep the view a window of the dims were used."""
    true = draw(st.lists(st.integers(1, 5), min_size=1, max_size=4))
    base = torch.arange(math.prod(true)).reshape(true)
    x, window_made, merged = base, True, False
    if draw(st.booleans()) and base.dim() > 1:  # a whole-storage reshape that merges dims
        x, merged = (base.reshape(-1) if draw(st.booleans()) else base.reshape(true[0], -1)), True
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["narrow", "select", "permute", "expand", "step"]))
        d = draw(st.integers(0, x.dim() - 1)) if x.dim() else None
        if d is None:
            break
        if kind == "narrow" and x.shape[d] > 1:
            start = draw(st.integers(0, x.shape[d] - 1))
            x = x.narrow(d, start, draw(st.integers(1, x.shape[d] - start)))
            window_made = window_made and not merged  # part of a merged dim may cross rows
        elif kind == "select" and x.dim() > 1:
            x = x.select(d, draw(st.integers(0, x.shape[d] - 1)))
            window_made = window_made and not merged
        elif kind == "permute":
            x = x.permute(draw(st.permutations(range(x.dim()))))
        elif kind == "expand":
            x = x.unsqueeze(d).expand(*x.shape[:d], draw(st.integers(1, 3)), *x.shape[d:])
        elif kind == "step" and x.shape[d] > 2:
            x, window_made = x[(slice(None),) * d + (slice(None, None, 2),)], False
    return true, base, x, window_made


@settings(max_examples=300, deadline=None)
@given(_views())
def test_unravel_reads_the_elements_torch_reads(case):
    true, base, view, window_made = case
    found = bucketed.unravel(tuple(true), tuple(view.shape), view.stride(), view.storage_offset())
    if found is None:
        assert not window_made, (true, view.shape, view.stride(), view.storage_offset())
        return
    splits, groups, starts, lengths = found
    static = [("at", s, n) for s, n in zip(starts, lengths)]
    assert torch.equal(graphs._padded_view(base, groups, static, [], splits), view)
    # the same windows with every start a run-time input (torchtpu.window)
    runtime = [("from", d, n) for d, n in enumerate(lengths)]
    starts_t = [torch.tensor(s) for s in starts]
    assert torch.equal(graphs._padded_view(base, groups, runtime, starts_t, splits), view)


def test_unravel_refuses_what_is_no_window():
    assert bucketed.unravel((4, 6), (4, 2), (6, 4), 0) is None  # a step that does not divide the dim
    assert bucketed.unravel((4, 6), (4, 3), (6, 2), 0)[0] == [None, (3, 2)]  # one that does: a split
    assert bucketed.unravel((4, 6), (3, 3), (1, 1), 0) is None  # overlapping
    assert bucketed.unravel((4, 6), (2, 8), (12, 1), 2) is None  # a window across rows
    assert bucketed.unravel((4, 6), (24,), (1,), 0) == ([None, None], [("dims", (0, 1))], [0, 0], [4, 6])
    # [4, 1, n] seen as [2, 2, 1, n]: the first dim split
    assert bucketed.unravel((4, 1, 9), (2, 2, 1, 9), (18, 9, 9, 1), 0) == (
        [(2, 2), None, None], [("dims", (0,)), ("dims", (1,)), ("one",), ("dims", (3,))], [0, 0, 0, 0], [2, 2, 1, 9])


# --- a growing cache ------------------------------------------------------------------------------


def _attend(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) * 0.35, dim=-1) @ v


def _new_programs_allowed(lengths, behind: int = 2) -> set:
    """Steps that may compile: the first three (the third pads), and those where a length the
    step reads or writes (from `behind` before the step's length to it) moved to another bucket."""
    allowed = {0, 1, 2}
    for i, n in enumerate(lengths):
        if len({bucketed.bucket(m) for m in range(n - behind, n + 1)}) > 1:
            allowed.add(i)
    return allowed


def test_a_growing_cache_compiles_per_bucket_and_matches_the_cpu():
    torch.manual_seed(0)
    k, v, q = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 1, 8)
    ids = torch.randint(0, 100, (2, 5))
    kd, vd, qd, idsd = k.to(TPU), v.to(TPU), q.to(TPU), ids.to(TPU)
    hits, steps, lengths = _count("eager_bucketed_hits"), [], []
    for step in range(40):
        new_k, new_v = torch.randn(2, 2, 1, 8), torch.randn(2, 2, 1, 8)
        before = _programs()
        k, v = torch.cat([k, new_k], 2), torch.cat([v, new_v], 2)
        kd, vd = torch.cat([kd, new_k.to(TPU)], 2), torch.cat([vd, new_v.to(TPU)], 2)
        out, outd = _attend(q, k, v), _attend(qd, kd, vd)
        ids = torch.cat([ids, ids[:, -1:] + 1], 1)  # the newest token: a view at a new offset
        idsd = torch.cat([idsd, idsd[:, -1:] + 1], 1)
        torch.testing.assert_close(outd.cpu(), out, atol=1e-6, rtol=1e-5)
        assert torch.equal(idsd.cpu(), ids)
        steps.append(_programs() - before)
        lengths.append(k.shape[2])
    compiled_at = {i for i, n in enumerate(steps) if n}
    assert compiled_at <= _new_programs_allowed(lengths), (steps, lengths)
    assert storage_of(kd).padding is not None and storage_of(idsd).padding is not None
    assert _count("eager_bucketed_hits") - hits >= 8 * 25  # the steps within a bucket ran bucketed programs
    assert sum(steps) <= 50, steps


def _grown(length: int = 12):
    """A cache grown on the CPU and on the device to `length` positions (the device's padded)."""
    torch.manual_seed(1)
    k = torch.randn(2, 3, 4, 8)
    kd = k.to(TPU)
    while k.shape[2] < length:
        new = torch.randn(2, 3, 1, 8)
        k, kd = torch.cat([k, new], 2), torch.cat([kd, new.to(TPU)], 2)
    assert storage_of(kd).padding is not None
    return k, kd


def test_padded_tensors_read_write_and_move_like_exact_ones():
    k, kd = _grown()
    assert str(kd) == str(k)[:-1] + ", device='tpu:0')"
    assert kd.sum().item() == pytest.approx(k.sum().item(), rel=1e-5)  # summed in another order
    assert torch.equal(kd[1, 2, 5].cpu(), k[1, 2, 5]) and torch.equal(kd[:, :, 3:9].cpu(), k[:, :, 3:9])
    clone, deep = kd.clone(), copy.deepcopy(kd)
    assert storage_of(clone).padding is not None and storage_of(deep).padding is not None  # share the padded array
    buffer = io.BytesIO()
    torch.save(kd, buffer)
    buffer.seek(0)
    assert torch.equal(torch.load(buffer, map_location="cpu"), k)
    assert torch.equal(kd.view(torch.int32).cpu(), k.view(torch.int32))
    assert torch.equal(torch.compile(lambda x: x * 2, backend="tpu")(kd).cpu(), k * 2)
    with torchtpu.eager_mode("defer"):
        assert torch.equal((kd * 3).cpu(), k * 3)
    kd.add_(1)
    kd[:, :, 0] = 0.5  # a write through a window of the grown dim: run exactly
    kd[:, :, -1] = -0.5  # ... at a position counted from the end
    k.add_(1)
    k[:, :, 0], k[:, :, -1] = 0.5, -0.5
    assert torch.equal(kd.cpu(), k)


def test_clones_keep_their_values_after_the_source_is_written():
    k, kd = _grown()
    clone, deep = kd.clone(), copy.deepcopy(kd)
    kd.mul_(2)
    assert torch.equal(clone.cpu(), k) and torch.equal(deep.cpu(), k) and torch.equal(kd.cpu(), k * 2)


def test_an_op_that_is_not_pad_safe_runs_exactly_and_says_why():
    k, kd = _grown()
    refusals, since = _count("eager_bucket_refusals"), len(events.events())
    torch.testing.assert_close(torch.nn.functional.layer_norm(kd, kd.shape[-2:]).cpu(),
                               torch.nn.functional.layer_norm(k, k.shape[-2:]), atol=1e-5, rtol=1e-5)
    assert torch.equal(kd.flip(2).cpu(), k.flip(2))
    assert _count("eager_bucket_refusals") >= refusals + 2
    reasons = [e["reason"] for e in events.events()[since:] if e["kind"] == "eager_bucketing"]
    assert any("flip" in r for r in reasons) and any("normalises over a padded dim" in r for r in reasons), reasons


def test_layers_of_different_widths_stay_exact():
    torch.manual_seed(0)
    widths = [8, 16, 32, 64, 16]
    layers = [m for a, b in zip(widths, widths[1:]) for m in (torch.nn.Linear(a, b), torch.nn.ReLU())]
    model = torch.nn.Sequential(*layers)
    dev = copy.deepcopy(model).to(TPU)
    before = (_count("eager_bucketed_programs"), _count("eager_pads"), _count("eager_bucket_refusals"))
    for _ in range(3):
        x = torch.randn(4, 8)
        torch.testing.assert_close(dev(x.to(TPU)).cpu(), model(x), atol=1e-5, rtol=1e-5)
    assert (_count("eager_bucketed_programs"), _count("eager_pads"), _count("eager_bucket_refusals")) == before


def test_generate_with_the_dynamic_cache_compiles_only_at_new_buckets():
    from transformers import StoppingCriteriaList

    from benchmarks.models import hf_llama

    torch.manual_seed(0)
    cpu = hf_llama(layers=2, vocab=128, hidden=32, heads=4, kv_heads=2)
    cpu.config.use_cache = cpu.generation_config.use_cache = True  # transformers' default: a DynamicCache
    cpu.generation_config.cache_implementation = None
    dev = copy.deepcopy(cpu).to(TPU)
    ids = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(1))
    marks = []

    def mark(input_ids, scores, **kwargs):
        marks.append((input_ids.shape[1], _programs()))
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    # 6 -> 20 tokens: the cache crosses into the 16 and the 32 bucket
    kwargs = dict(max_new_tokens=14, min_new_tokens=14, do_sample=False, attention_mask=torch.ones_like(ids))
    with torch.no_grad():
        expected = cpu.generate(ids, **kwargs)
        got = dev.generate(ids.to(TPU), stopping_criteria=StoppingCriteriaList([mark]),
                           **{**kwargs, "attention_mask": kwargs["attention_mask"].to(TPU)})
    assert torch.equal(got.cpu(), expected)
    lengths = [n for n, _ in marks[1:]]  # the token list's; the cache is one shorter
    compiled = {i for i, ((_, a), (_, b)) in enumerate(zip(marks, marks[1:])) if b > a}
    last = {len(lengths) - 1}  # generate()'s end of generation makes one more tensor (a `full`)
    assert compiled <= _new_programs_allowed(lengths, behind=3) | last, (marks, lengths)


def test_bucketing_off_compiles_every_size():
    script = (
        "import torch, torchtpu, torchtpu.device\n"
        "k = torch.randn(1, 2, 4, 8, device='tpu'); q = torch.randn(1, 2, 1, 8, device='tpu')\n"
        "counts = []\n"
        "for _ in range(8):\n"
        "    k = torch.cat([k, torch.randn(1, 2, 1, 8, device='tpu')], 2)\n"
        "    (q @ k.transpose(-1, -2)).softmax(-1).sum().item()\n"
        "    s = torchtpu.stats(); counts.append(s.get('eager_programs', 0))\n"
        "print(s.get('eager_bucketed_programs', 0), counts[-1] - counts[-2], counts[-2] - counts[-3])\n"
    )
    off = helpers.run_python(script, env={"TORCHTPU_EAGER_BUCKETING": "off", "TORCHTPU_CACHE_DIR": "off"})
    on = helpers.run_python(script, env={"TORCHTPU_CACHE_DIR": "off"})
    assert off.split() == ["0", "4", "4"]  # every new length: cat, matmul, softmax, sum
    assert on.split()[1:] == ["0", "0"] and int(on.split()[0]) > 0, on
