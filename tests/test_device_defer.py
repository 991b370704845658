"""Defer mode of the tpu device (torchtpu/device/defer.py): the device semantics of strict mode
(test_device.py's tests rerun under defer), flush points and their events, the steady state of a
loop (no new program), outputs only for values still held, errors naming the deferred op."""
from __future__ import annotations

import copy
import io
import os

import pytest
import torch

import helpers
import test_device as strict_tests
import torchtpu
import torchtpu.device
import torchtpu.inspect
from torchtpu import eager
from torchtpu.compiler import registry
from torchtpu.device import defer
from torchtpu.device.strict import NoDeviceKernel

TPU = "tpu"
HERE = os.path.basename(__file__)


@pytest.fixture(autouse=True)
def defer_mode():
    with torchtpu.eager_mode("defer"):
        yield
    assert defer.pending_ops() == 0  # leaving the mode ran what was pending


def _count(name: str) -> int:
    return torchtpu.stats().get(name, 0)


def _flushes(since: int = 0) -> list[dict]:
    return [e for e in torchtpu.inspect.events()[since:] if e["kind"] == "flush"]


def _mark() -> int:
    return len(torchtpu.inspect.events())


# --- strict mode's device semantics, deferred ----------------------------------------------------

for _name in ("test_target_program_prints_like_torch", "test_seeds_and_rng_state_reproduce", "test_factories_match_torch",
              "test_clones_and_casts_do_not_read_the_empty_destination", "test_transfers_copy_values_both_ways",
              "test_module_to_tpu_and_back", "test_write_through_a_slice_reaches_the_base",
              "test_base_write_reaches_views", "test_expand_then_clone_and_transposed_in_place",
              "test_views_share_storage_with_torch_semantics", "test_version_counters_and_autograd_see_in_place_writes",
              "test_conjugate_and_negative_views_are_values", "test_zero_size_and_scalars",
              "test_constants_keep_signed_zero_and_nan", "test_wrapped_numbers_keep_torch_promotion",
              "test_mixed_devices_raise_torchs_error", "test_op_without_a_rule_names_the_op",
              "test_host_only_ops_run_on_a_copy", "test_conv_net_forward_backward_and_scans_match_cpu",
              "test_linear_forward_backward_matches_cpu", "test_deepcopy_dtype_views_and_accumulating_index_put",
              "test_tiny_llama_forward_matches_cpu", "test_compiled_graphs_take_and_return_device_arrays",
              "test_memory_stats_count_live_storages", "test_group_norm_of_a_channels_last_input_matches_cpu",
              "test_slice_and_select_backward_are_one_op_each"):
    globals()[_name] = getattr(strict_tests, _name)


# --- the mode ------------------------------------------------------------------------------------


def test_mode_scopes_and_the_environment_default():
    assert eager.mode() == "defer"
    with torchtpu.eager_mode("strict"):
        assert eager.mode() == "strict"
        x = torch.ones(3, device=TPU) + 1  # strict: ran now, nothing pending
        assert defer.pending_ops() == 0
    assert eager.mode() == "defer"
    y = x * 3
    assert defer.pending_ops() == 1
    with pytest.raises(ValueError, match="expected one of strict, defer"):
        with torchtpu.eager_mode("lazy"):
            pass
    assert y.tolist() == [6.0, 6.0, 6.0]
    script = ("import sys, torchtpu\n"
              "assert 'jax' not in sys.modules\n"
              "print(torchtpu.eager.mode())\n")
    for value, expected in (("defer", "defer"), ("", "strict")):
        env = dict(os.environ, TORCHTPU_EAGER_MODE=value)
        assert helpers.run_python(script, env).strip() == expected


def test_ops_wait_for_a_read_then_run_as_one_program():
    a, b = torch.randn(5, 3, device=TPU), torch.randn(5, 3, device=TPU)
    host_a, host_b = a.cpu(), b.cpu()
    since, compiles = _mark(), _count("xla_compiles")
    c = (a + b) * 2
    c.sub_(a)
    view = c[1:, 2]
    view.mul_(10)  # a write through a view of a pending storage
    assert defer.pending_ops() == 4 and _count("xla_compiles") == compiles and _flushes(since) == []
    expected = (host_a + host_b) * 2 - host_a
    expected[1:, 2] *= 10
    assert torch.equal(c.cpu(), expected)  # reads the base: its storage was written through the view
    (flush,) = _flushes(since)
    assert flush["reason"] == "download" and flush["ops"] == 4 and flush["cache"] in ("compile", "cache")
    assert flush["source"].startswith(__file__) and flush["program"]
    assert flush["outputs"] == 1  # only c's storage is held (a + b and (a + b) * 2 are gone)


def test_every_flush_point_has_its_reason():
    x = torch.randn(4, device=TPU)
    since = _mark()
    (x + 1).sum().item()
    float((x * 2).sum())
    bool((x > 100).any())
    torch.tensor([1.0]).to(TPU).add(1).tolist()
    print(x * 3, file=io.StringIO())
    buffer = io.BytesIO()
    torch.save(x - 1, buffer)
    torch.equal(x + 4, x)  # a host op: its arguments are read
    y = x + 5
    torchtpu.sync()
    z = x + 6
    torch.tpu.synchronize()
    w = torch.randn(3, device=TPU)
    torch.manual_seed(0)  # random ops pending: their key is drawn before the seed changes
    v = x + 7
    with torchtpu.eager_mode("strict"):
        pass
    reasons = [f["reason"] for f in _flushes(since)]
    assert reasons == ["item", "item", "item", "download", "download", "download", "host op aten.equal.default",
                       "sync", "synchronize", "rng state", "mode_exit"]
    buffer.seek(0)
    assert torch.equal(torch.load(buffer, map_location="cpu"), x.cpu() - 1)
    for t, k in ((y, 5), (z, 6), (v, 7)):
        assert torch.equal(t.cpu(), x.cpu() + k)
    assert w.shape == (3,)


def test_the_trie_of_sequences_is_bounded(monkeypatch):
    """Sequences that never repeat (a new size each step) would keep every program forever."""
    monkeypatch.setenv("TORCHTPU_DEFER_MAX_PROGRAMS", "3")
    torchtpu.sync()
    resets, since = _count("defer_trie_resets"), _mark()
    for n in range(1, 9):
        x = torch.arange(float(n)).to(TPU)
        assert ((x + 1) * 2).cpu().tolist() == [(i + 1) * 2 for i in range(n)]
        assert defer.executor._programs <= 3
    assert _count("defer_trie_resets") - resets >= 2
    reset = [e for e in torchtpu.inspect.events()[since:] if e["kind"] == "defer_reset"]
    assert reset and reset[0]["programs"] == 3 and reset[0]["limit"] == 3
    monkeypatch.delenv("TORCHTPU_DEFER_MAX_PROGRAMS")
    torchtpu.sync()
    resets = _count("defer_trie_resets")
    x = torch.ones(4).to(TPU)
    for _ in range(5):  # a loop whose sequence repeats: one program, kept
        assert ((x + 1) * 2).cpu().tolist() == [4.0] * 4
    assert _count("defer_trie_resets") == resets


def test_max_ops_and_backward_flush(monkeypatch):
    monkeypatch.setenv("TORCHTPU_DEFER_MAX_OPS", "3")
    torchtpu.sync()  # read at each flush
    x = torch.zeros(2, device=TPU)
    since = _mark()
    for _ in range(7):
        x = x + 1
    assert [f["ops"] for f in _flushes(since)] == [3, 3] and defer.pending_ops() == 2  # zeros and 7 adds
    assert x.tolist() == [7.0, 7.0]
    monkeypatch.delenv("TORCHTPU_DEFER_MAX_OPS")
    torchtpu.sync()
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2).to(TPU)
    since = _mark()
    lin(torch.randn(4, 3, device=TPU)).square().sum().backward()
    assert [f["reason"] for f in _flushes(since)] == ["backward"]
    assert defer.pending_ops() == 0 and lin.weight.grad.shape == (2, 3)


def test_report_groups_flushes_by_reason():
    x = torch.randn(3, device=TPU)
    torchtpu.sync()
    since = _mark()
    for _ in range(3):
        (x * 2).sum().item()
    torchtpu.sync()  # nothing pending: no flush
    y = x + 1
    torchtpu.sync()
    summary = torchtpu.inspect.summarize(torchtpu.inspect.events()[since:])["flushes"]
    assert list(summary) == ["item", "sync"]
    assert summary["item"]["flushes"] == 3 and summary["item"]["hit"] == 2 and summary["item"]["ops"] == 6
    assert summary["sync"]["flushes"] == 1 and summary["item"]["sources"][0].startswith(f"3x {__file__}")
    report = torchtpu.inspect.report()
    assert "defer-mode flushes by reason" in report
    assert any(line.split()[:1] == ["item"] for line in report.splitlines())
    assert torch.equal(y.cpu(), x.cpu() + 1)


# --- programs ------------------------------------------------------------------------------------


def test_a_loop_reaches_a_steady_state_with_changing_numbers():
    x = torch.randn(64, device=TPU)
    host = x.cpu()
    since = _mark()
    for step in range(6):
        if step == 2:
            compiles, graphs, built = _count("xla_compiles"), _count("defer_op_graphs"), _count("defer_programs")
        lr = 0.1 / (step + 1)
        x = x * (1 - lr) + lr
        x.add_(x.sin(), alpha=-lr)
        host = host * (1 - lr) + lr
        host.add_(host.sin(), alpha=-lr)
        assert x.sum().item() == pytest.approx(host.sum().item(), rel=1e-5)
    # no op traced, no fused graph built, nothing compiled: the trie found each flush's program
    assert _count("xla_compiles") == compiles and _count("defer_op_graphs") == graphs
    assert _count("defer_programs") == built
    assert [f["cache"] for f in _flushes(since)][2:] == ["hit"] * 4
    torch.testing.assert_close(x.cpu(), host, atol=1e-6, rtol=1e-5)


def test_a_known_sequence_reuses_its_program_across_processes(tmp_path):
    script = ("import torch, torchtpu, torchtpu.device, torchtpu.inspect\n"
              "with torchtpu.eager_mode('defer'):\n"
              "    x = torch.arange(6.0, device='tpu')\n"
              "    print((x * 2 + 1).sum().item(), torchtpu.stats()['xla_compiles'])\n")
    env = dict(os.environ, TORCHTPU_CACHE_DIR=str(tmp_path / "cache"))
    runs = [helpers.run_python(script, env) for _ in range(2)]
    (value, cold), (again, warm) = (map(float, r.split()) for r in runs)
    assert value == again == 36.0 and cold >= 1 and warm == 0


def test_mlp_adamw_matches_cpu_and_strict_with_no_compiles_after_warm_up():
    torch.manual_seed(0)
    cpu = strict_tests._mlp()
    models = {"cpu": cpu, "strict": copy.deepcopy(cpu).to(TPU), "defer": copy.deepcopy(cpu).to(TPU)}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-2) for k, m in models.items()}
    x, y = torch.randn(32, 8), torch.randn(32, 4)
    losses = {k: [] for k in models}
    for step in range(5):
        for k, m in models.items():
            if k == "defer" and step == 3:
                compiles, graphs = _count("xla_compiles"), _count("defer_op_graphs")
            with torchtpu.eager_mode("strict" if k == "strict" else "defer"):
                on = next(m.parameters()).device
                opts[k].zero_grad()
                loss = torch.nn.functional.mse_loss(m(x.to(on)), y.to(on))
                loss.backward()
                opts[k].step()
                losses[k].append(loss.item())
    assert _count("xla_compiles") == compiles and _count("defer_op_graphs") == graphs  # steps 4 and 5
    torch.testing.assert_close(losses["defer"], losses["cpu"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(losses["defer"], losses["strict"], atol=1e-6, rtol=1e-6)
    for p, q in zip(models["defer"].parameters(), cpu.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), atol=1e-5, rtol=1e-5)


def test_random_ops_reproduce_under_a_seed():
    torch.manual_seed(7)
    a = torch.randn(16, device=TPU) * 1
    torch.manual_seed(7)  # runs a's graph before reseeding
    b = torch.randn(16, device=TPU) * 1
    assert torch.equal(a.cpu(), b.cpu())
    c = torch.rand(1000, device=TPU).cpu()
    assert 0 <= c.min() and c.max() < 1 and 0.4 < c.mean() < 0.6


# --- errors --------------------------------------------------------------------------------------


def _line_of(text: str) -> int:
    with open(__file__, encoding="utf-8") as f:
        return next(i for i, line in enumerate(f, 1) if text in line and "_line_of" not in line)


def test_a_failing_check_names_the_deferred_op_and_its_line():
    x = torch.ones(3, device=TPU)
    torchtpu.sync()
    bad = x[torch.tensor([5], device=TPU)] * 2  # the out-of-range index
    with pytest.raises(IndexError, match="out of bounds") as info:
        bad.cpu()
    line = _line_of("# the out-of-range index")
    assert f"{HERE}\", line {line}" in str(info.value) and "aten.index" in str(info.value)
    with pytest.raises(RuntimeError, match="never computed"):
        bad.cpu()  # its graph failed: the value stays unknown, and says why
    w = torch.full((3,), 5.0, device=TPU)
    torchtpu.sync()  # w's array: an input of the next graph
    for attempt in range(2):  # the second time the sequence's program is known
        y = x + 1
        if attempt:
            with pytest.raises(RuntimeError, match="never computed"):
                w + bad  # not recorded, and neither is w as an input of the pending graph
        assert torch.equal(y.cpu(), torch.full((3,), 2.0))  # later graphs run


def test_a_flush_does_not_wait_for_its_checks_and_a_read_does(monkeypatch):
    from torchtpu.runtime.executable import Executable

    reads = []
    verify = Executable.verify
    monkeypatch.setattr(Executable, "verify", lambda self, flag: (reads.append(1), verify(self, flag))[1])
    table = torch.randn(10, 4, device=TPU, requires_grad=True)
    idx = torch.tensor([1, 7, 3], device=TPU)
    torchtpu.sync()
    loss = torch.nn.functional.embedding(idx, table).square().sum()
    loss.backward()  # flushes: the program is launched, its check flag not read
    assert reads == [] and defer.pending_ops() == 0
    grad = table.grad * 1  # recorded on the unread program's values
    assert reads == []
    ref = torch.zeros(10, 4)
    ref[[1, 7, 3]] = 2 * table.detach().cpu()[[1, 7, 3]]
    torch.testing.assert_close(grad.cpu(), ref)  # the read verifies what it was computed from
    assert reads == [1]
    torch.testing.assert_close(loss.cpu(), table.detach().cpu()[[1, 7, 3]].square().sum())
    assert reads == [1]  # read once


def test_an_unread_failed_check_raises_at_sync():
    x = torch.ones(3, device=TPU)
    torchtpu.sync()
    x[torch.tensor([5], device=TPU)]  # the index nobody reads
    with pytest.raises(IndexError, match="out of bounds") as info:
        torchtpu.sync()
    assert f"{HERE}\", line {_line_of('# the index nobody reads')}" in str(info.value)
    torchtpu.sync()  # reported once


def test_a_failed_check_surfaces_at_the_next_flush_and_poisons_what_was_computed_from_it(monkeypatch):
    x = torch.ones(3, device=TPU)
    monkeypatch.setenv("TORCHTPU_DEFER_MAX_OPS", "1")  # every op flushes the one before
    torchtpu.sync()
    bad = x[torch.tensor([5], device=TPU)]
    derived = bad * 3  # flushes bad's graph (its check unread) and reads its values
    with pytest.raises(IndexError, match="out of bounds"):
        derived.cpu()  # this flush reads the earlier program's check
    with pytest.raises(IndexError, match="out of bounds"):
        derived.cpu()  # computed from the failed program's values: the same error
    with pytest.raises(RuntimeError, match="never computed"):
        derived.cpu()
    y = x + 1
    assert torch.equal(y.cpu(), torch.full((3,), 2.0))  # graphs that did not read it are fine


def test_a_lowering_error_at_the_flush_names_the_op_and_its_line(monkeypatch):
    def broken(ctx, *args, **kwargs):
        raise ValueError("broken on purpose")

    monkeypatch.setitem(registry._RULES, torch.ops.aten.atan2.default, broken)
    x = torch.full((3, 7, 5), 0.5, device=TPU)
    y = torch.atan2(x, x + 1)  # the op whose lowering fails
    with pytest.raises(NoDeviceKernel, match="lowering aten.atan2.default failed") as info:
        y.cpu()
    assert f"{HERE}\", line {_line_of('# the op whose lowering fails')}" in str(info.value)
    assert "deferred aten.atan2.default" in str(info.value)
