"""The runtime's call path: resident parameters never go stale, and the direct call path is
taken only when AOTAutograd's wrapper has nothing to do."""
from __future__ import annotations

import gc
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import torchtpu
from helpers import compile_tpu
from torchtpu import compiler, events  # noqa: F401  (the compiler package loads the runtime)
from torchtpu.runtime import residency
from torchtpu.runtime.executable import Executable


def test_resident_copy_is_reused_until_the_tensor_changes():
    gc.collect()  # earlier tests' dead models drop their entries now, not inside the count below
    t = torch.randn(4)
    puts = []

    def put(x):
        puts.append(x.clone())
        return puts[-1]

    first = residency.resident(t, "dev", put)
    assert residency.resident(t, "dev", put) is first and len(puts) == 1
    t.add_(1)  # bumps the version counter
    second = residency.resident(t, "dev", put)
    assert len(puts) == 2 and torch.equal(second, t)
    residency.resident(t, "other", put)  # another placement is another copy
    assert len(puts) == 3
    before = residency.size()
    del t
    gc.collect()
    assert residency.size() == before - 2  # both placements forgotten with the tensor


def test_cpu_parameters_are_reused_zero_copy_and_go_with_the_model():
    # On the CPU a parameter's or buffer's device array is a view of its own memory, made once;
    # the view must not keep the model alive: deleting the model drops its entries.
    import weakref

    residency.clear()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 4)).eval()
    model[1].running_mean.normal_()
    compiled = compile_tpu(model)
    x = torch.randn(3, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        held = residency.size()
        assert held >= 6  # two weights and biases, BatchNorm's affine and running statistics
        arrays = {id(a) for a in residency._entries_arrays()}
        torch.testing.assert_close(compiled(x), model(x))
        assert {id(a) for a in residency._entries_arrays()} == arrays  # reused, not imported again
        mean = model[1].running_mean  # a buffer: no autograd alias of its own
        array = next(a for a in residency._entries_arrays() if a.unsafe_buffer_pointer() == mean.data_ptr())
        mean.add_(1)  # an in-place update is seen: the array is a view of the buffer's memory ...
        torch.testing.assert_close(compiled(x), model(x))
        assert {id(a) for a in residency._entries_arrays()} == arrays  # ... kept, not imported again
    alive = weakref.ref(mean)
    del model, compiled, mean, array
    gc.collect()
    torch._dynamo.reset()
    gc.collect()
    assert alive() is None and residency.size() == 0


@pytest.fixture
def resident_parameters(monkeypatch, request):
    """Parameters as they are on an accelerator: copied to the device once, then reused; or, where
    a test parametrizes it (indirect) with False, the CPU's zero-copy views. Yields whether copied."""
    copied = getattr(request, "param", True)
    monkeypatch.setattr(Executable, "COPY_ON_CPU", copied)
    residency.clear()
    yield copied
    residency.clear()


def test_parameters_follow_optimizer_steps_and_load_state_dict(resident_parameters):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    compiled = compile_tpu(model)
    x = torch.randn(3, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        assert residency.size() == 4  # two weights, two biases
        copies = residency.size()
        torch.testing.assert_close(compiled(x), model(x))
        assert residency.size() == copies

    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model(x).sum().backward()
    opt.step()  # in-place updates: every parameter's version changes
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        fresh = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
        model.load_state_dict(fresh)
        torch.testing.assert_close(compiled(x), model(x))
        model[0].weight.copy_(torch.zeros(16, 8))
        torch.testing.assert_close(compiled(x), model(x))


@pytest.mark.parametrize("resident_parameters", [True, False], ids=["copied", "views"], indirect=True)
def test_training_step_with_resident_parameters_matches_eager(resident_parameters):
    """Copied as on an accelerator, or (the CPU) views of the parameters' own memory: those stay
    through every optimizer step, since the step updates the memory they alias."""
    copied = resident_parameters
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    reference = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    reference.load_state_dict(model.state_dict())
    compiled = compile_tpu(model)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model, reference)]
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    arrays = None
    for _ in range(5):
        for m, opt in zip((compiled, reference), opts):
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            opt.step()
        held = {id(a) for a in residency._entries_arrays()}
        assert copied or arrays is None or held == arrays  # views: the first step's, every step
        arrays = held
    assert residency.size() == 4  # the forward graph's parameters were resident
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_saved_parameters_and_inputs_are_the_callers_tensors():
    """A forward graph returns the parameters and inputs its backward saves; they come back as
    the caller's own tensors, not copies made by the program (runtime/passthrough.py): as in
    eager, an in-place change between forward and backward is then an error, not a stale copy."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    reference.load_state_dict(model.state_dict())
    compiled = compile_tpu(model)
    x = torch.randn(5, 8)
    out = compiled(x)
    saved = out.grad_fn.saved_tensors
    assert any(t is model[2].weight for t in saved)  # the second layer's weight, for the input grad
    assert any(t.data_ptr() == x.data_ptr() for t in saved)  # the input, for the first weight's grad
    for _ in range(3):  # the outputs the program still returns (activations) keep their places
        for m in (model, reference):
            m.zero_grad()
        compiled(x).square().sum().backward()
        reference(x).square().sum().backward()
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
    out = compiled(x)
    with torch.no_grad():
        model[2].weight.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_passthrough_split_takes_input_outputs_and_puts_them_back():
    from torchtpu.runtime import passthrough

    def f(a, b, n):
        return a, a * 2, b, a
    gm = torch.fx.symbolic_trace(f)
    for node, value in zip(gm.graph.find_nodes(op="placeholder"), (torch.ones(2), torch.zeros(3), 4)):
        node.meta["val"] = value
    pairs = passthrough.split(gm)
    assert pairs == ((0, 0), (2, 1), (3, 0))
    assert passthrough.shifted(3, pairs) == 1 and passthrough.shifted(None, pairs) is None
    a, b = torch.randn(2), torch.randn(3)

    def program(args):  # clears its argument list, as the compiled runners do
        out = [args[0] * 2]
        args.clear()
        return out
    got = passthrough.wrap(program, pairs)([a, b, 4])
    assert got[0] is a and got[2] is b and got[3] is a
    torch.testing.assert_close(got[1], a * 2)
    assert passthrough.wrap(program, ()) is program


class _Heads(torch.nn.Module):
    """A projection seen as attention heads (saved row-major), and convolutions ATen runs
    channels-last with a BatchNorm between them, whose activations XLA keeps channels-minor."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(32, 64)
        self.conv, self.norm, self.conv2 = (torch.nn.Conv2d(4, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                                            torch.nn.Conv2d(8, 8, 3, padding=1))

    def forward(self, x, image):
        q = self.proj(x).view(4, 10, 4, 16).permute(0, 2, 1, 3)
        attended = (q @ q.transpose(-1, -2)).softmax(-1) @ q
        features = self.conv2(torch.relu(self.norm(self.conv(image))))
        return attended.pow(2).mean() + features.pow(2).mean()


def test_saved_activations_keep_the_layout_xla_computes_them_in(monkeypatch):
    """The forward hands the saved activations XLA computes channels-minor back in that layout
    (strided tensors), and the backward is compiled to read it: no copy either side, torch's
    gradients (layout.BoundaryLayouts)."""
    from torchtpu.runtime import transfer

    imported = {"view": 0, "copy": 0}
    in_order = transfer.in_order

    def counting(t, order):
        out = in_order(t, order)
        imported["view" if out.data_ptr() == t.data_ptr() else "copy"] += 1
        return out

    monkeypatch.setattr(transfer, "in_order", counting)
    model = _Heads()
    reference = _Heads()
    x, image = torch.randn(4, 10, 32), torch.randn(2, 4, 12, 12)
    compiled = compile_tpu(model)
    for _ in range(2):
        for m in (model, reference):
            m.zero_grad()
        loss = compiled(x, image)
        saved = loss.grad_fn.saved_tensors
        loss.backward()
        reference(x, image).backward()
        torch.testing.assert_close(loss, reference(x, image))
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    assert any(t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()
               for t in saved)  # channels-minor, as XLA computed them
    assert imported["copy"] == 0 and imported["view"] >= 2, imported  # read in place by the backward


def test_an_input_in_another_layout_than_the_program_reads_is_copied_into_it():
    """PJRT does not check a buffer's layout against the program's: the import must give each
    input the layout its executable was compiled for, whatever the tensor's strides."""
    from torchtpu.runtime import transfer

    order = (0, 2, 1, 3)
    assert transfer.strides_in_order((2, 3, 4, 5), order) == (60, 5, 15, 1)
    laid_out = torch.randn(2, 4, 3, 5).permute(0, 2, 1, 3)  # dims 1 and 2 swapped in memory
    assert transfer.in_order(laid_out, order).data_ptr() == laid_out.data_ptr()
    for other in (torch.randn(2, 3, 4, 5), torch.randn(2, 5, 4, 3).permute(0, 3, 2, 1)):
        moved = transfer.in_order(other, order)
        assert moved.stride() == (60, 5, 15, 1) and torch.equal(moved, other)
    one = torch.randn(2, 1, 4, 5)  # a size-1 dim's stride is free: a view with the program's
    assert transfer.in_order(one, order).data_ptr() == one.data_ptr()


def _call_paths():
    return [e for e in events.events() if e["kind"] == "call_path"]


def test_plain_inference_graph_is_called_directly():
    before = len(_call_paths())
    f = compile_tpu(lambda x: x * 2 + 1)
    x = torch.randn(16)
    torch.testing.assert_close(f(x), x * 2 + 1)
    paths = _call_paths()[before:]
    assert [p["path"] for p in paths] == ["direct"]


@pytest.mark.parametrize("fn, reason", [
    (lambda x: x.add_(1) * 2, "an input is mutated"),
    (lambda x: (x.view(-1), x + 1), "an output aliases an input or another output"),
])
def test_wrapper_kept_where_it_has_work(fn, reason):
    before = len(_call_paths())
    x = torch.randn(4, 4)
    expected = fn(x.clone())
    got_in = x.clone()
    got = compile_tpu(fn)(got_in)
    torch.testing.assert_close(got, expected)
    if isinstance(got, tuple):  # the view is still a view of the input
        assert got[0].data_ptr() == got_in.data_ptr()
    else:  # the mutation reached the caller's tensor
        torch.testing.assert_close(got_in, x + 1)
    paths = _call_paths()[before:]
    assert [(p["path"], p.get("reason")) for p in paths] == [("aot_autograd", reason)]



def _outputs_of_several_kinds(x, i):
    return x * 2, (x > 0).sum(), x[i].to(torch.int32), (x + 1).unsqueeze(0)


@pytest.mark.parametrize("dynamic", [False, True])
def test_calls_after_the_first_rebuild_every_output_like_eager(dynamic):
    # An executable's first call splits PJRT's results generically and keeps one result handler
    # per result; later calls go through the handlers. Outputs of several dtypes and shapes, a
    # run-time index check's flag among the results, new shapes (a new executable, or with
    # dynamic=True another bucket or the same bucket with other true sizes).
    f = compile_tpu(_outputs_of_several_kinds, dynamic=dynamic)
    for n in (8, 8, 5, 8, 5, 3):
        x, i = torch.randn(n), torch.tensor([0, n - 1])
        for got, expected in zip(f(x, i), _outputs_of_several_kinds(x, i)):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)  # dtype and shape too
    with pytest.raises(IndexError):  # the check's flag still reaches the host through the handlers
        f(torch.randn(8), torch.tensor([8]))


def _runner_of(fn, *args):
    """(outputs, the CompiledGraph) of `fn` compiled by the tpu backend and called on `args`."""
    from torchtpu.backend import tpu_backend

    handed = []

    def keeping(gm, example_inputs):
        handed.append(tpu_backend(gm, example_inputs))
        return handed[-1]

    torch._dynamo.reset()
    out = torch.compile(fn, backend=keeping, fullgraph=True)(*args)
    return out, handed[0].runner


def test_kept_result_handlers_give_the_first_calls_arrays():
    x = torch.randn(6)
    _, graph = _runner_of(lambda x: (x * 2, (x > 0).sum(), x.to(torch.int64)), x)
    compiled = graph.executable_for(graph.fixed_signature)
    exe = Executable(compiled.xla_executable, compiled.layout, compiled.device)  # no handlers kept yet
    arrays = exe.input_arrays([x], frozenset(), x.device)
    first = exe.execute(arrays)  # the generic split
    assert exe._result_handlers is not None
    second = exe.execute(arrays)  # through the kept handlers
    assert len(first) == len(second) == 3
    for a, b in zip(first, second):
        assert (b.aval, b.sharding, b.committed, b.devices()) == (a.aval, a.sharding, a.committed, a.devices())
        assert (np.asarray(a) == np.asarray(b)).all()
    for got, expected in zip(exe.outputs(second, x.device), (x * 2, (x > 0).sum(), x.to(torch.int64))):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert exe.run_arrays(arrays)[1].aval == first[1].aval  # the eager device's path takes them too


_EXIT_CHECK = """
import atexit, sys
seen = {}

@atexit.register  # registered first, so it runs last: after torchtpu's own handler
def report():
    from torchtpu.runtime import executable
    print(sys.getrefcount(executable._recent_inputs) - seen["refs"], seen["views"], flush=True)

import torch
import torchtpu  # noqa: F401
from torchtpu.runtime import executable

x = torch.randn(4, 8)
torch.compile(lambda t: (t * 2).sum(0), backend="tpu", fullgraph=True)(x)
held = executable._recent_inputs
seen["refs"] = sys.getrefcount(held)
seen["views"] = any(a.unsafe_buffer_pointer() == x.data_ptr() for run, _ in held for a in run)
"""


def test_cpu_launch_parameters_outlive_the_interpreter(tmp_path):
    """On the CPU a program's parameters are views of torch tensors, and PJRT's worker thread
    drops its reference when a run ends. Were that the last reference while the interpreter
    finalizes, torch's deleter would take the GIL there and the process would abort
    ("terminate called without an active exception"). The last runs' parameters are held, and
    kept for good at exit, before the interpreter finalizes."""
    out = subprocess.run([sys.executable, "-c", _EXIT_CHECK], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TORCHTPU_CACHE_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-3000:]
    extra_refs, views = out.stdout.split()
    assert views == "True"  # what is held are the views of the caller's tensor
    assert extra_refs == "1"  # torchtpu's exit handler ran first and kept them


class _Run:
    """A stand-in for a run's result: ready when its run has finished."""

    def __init__(self, ready: bool):
        self.ready = ready

    def is_ready(self) -> bool:
        return self.ready


def test_cpu_runs_stay_held_while_in_flight():
    """A CPU run's parameters are let go once one of its results is ready and four later runs have
    launched, never while it still runs, however many runs launch after it (the eager device
    launches one per op without waiting)."""
    from torchtpu.runtime import executable

    kept = list(executable._recent_inputs)
    executable._recent_inputs.clear()
    try:
        slow = _Run(False)
        executable._hold_inputs(["slow"], slow)
        for i in range(10):
            executable._hold_inputs([i], _Run(True))
        assert [run for run, _ in executable._recent_inputs] == [("slow",), *((i,) for i in range(10))]
        slow.ready = True
        executable._hold_inputs(["next"], None)  # a run without results is held by count alone
        assert [run for run, _ in executable._recent_inputs] == [(7,), (8,), (9,), ("next",)]
        executable._hold_inputs(["last"], _Run(False))
        assert [run for run, _ in executable._recent_inputs] == [(8,), (9,), ("next",), ("last",)]
    finally:
        executable._recent_inputs.clear()
        executable._recent_inputs.extend(kept)


def _product_chain(x):
    return (x @ x).tanh() @ x  # 4 n^3 flops: 1.0e6 at n = 64, 8.4e6 at n = 128


def test_short_graphs_over_cpu_tensors_run_inline_from_a_compile_and_from_the_disk(tmp_path, monkeypatch):
    """A graph whose tensors are torch CPU tensors runs on the calling thread when XLA counts fewer
    than INLINE_FLOPS in it, whether its executable was just compiled or loaded from the disk cache
    (with the count its entry keeps, or counted on loading an entry without it): its results are
    ready when `execute` returns, where PJRT would hand a program of this size to its worker
    thread. A longer program keeps PJRT's handoff."""
    from torchtpu.cache import entry as entries, tiers
    from torchtpu.runtime import executable

    monkeypatch.setenv("TORCHTPU_CACHE_DIR", str(tmp_path / "cache"))
    tiers.MEMORY.clear()
    tiers._disk.clear()
    try:
        for n, inline in ((64, True), (128, False)):
            x = torch.randn(n, n)
            for source in ("compile", "disk", "disk without the count"):
                torchtpu.reset_stats()
                out, graph = _runner_of(_product_chain, x)
                torch.testing.assert_close(out, _product_chain(x), rtol=1e-4, atol=1e-2)
                assert torchtpu.stats()["xla_compiles" if source == "compile" else "disk_hits"] == 1, source
                exe = graph.executable_for(graph.fixed_signature)
                assert graph.waits and exe.inline == inline, (n, source)
                assert executable.short(exe.flops()) == inline
                if inline:
                    arrays = exe.input_arrays([x], frozenset(), x.device)
                    for _ in range(20):
                        assert all(r.is_ready() for r in exe.execute(arrays)), source
                tiers.MEMORY.clear()  # the next round loads the entry the first one stored
                if source == "disk":  # an entry written before entries kept the count
                    store = tiers.disk()
                    (digest,) = [d for d in store.digests() if store.get(d).meta["inputs"] == f"(f32[{n},{n}])"]
                    found = store.get(digest)
                    assert found.meta.pop("flops") == exe.flops()
                    store.remove(digest)
                    store.put(digest, entries.Entry(entries.seal(found.meta), found.blobs))
    finally:
        tiers.MEMORY.clear()
        tiers._disk.clear()


def test_programs_calling_aten_kernels_keep_the_handoff():
    """XLA counts no flops in ATen's custom calls, so a convolution program has no full count and is
    never taken for a short one (run inline, its kernels measured slower in training steps)."""
    from torchtpu.kernels import aten_cpu

    assert aten_cpu.available(), "make builds the ATen CPU kernels"
    conv = torch.nn.Conv2d(3, 8, 3).eval()
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        out, graph = _runner_of(conv, x)
        torch.testing.assert_close(out, conv(x), rtol=1e-4, atol=1e-4)
    exe = graph.executable_for(graph.fixed_signature)
    assert graph.waits and exe.flops() is None and not exe.inline


def test_a_loaded_cpu_executable_is_never_serialized_again():
    """XLA:CPU serializes an executable it loaded from bytes without its kernels' code (those bytes
    load, then fail at the first run), so only the bytes it was loaded from may reach the cache:
    a compile that loads its executable again to run inline stores the compiled bytes."""
    import jax

    x = torch.randn(64, 64)
    _, graph = _runner_of(_product_chain, x)
    exe = graph.executable_for(graph.fixed_signature)
    with pytest.raises(RuntimeError, match="cannot be serialized again"):
        exe.serialize()
    fresh = jax.jit(lambda a: jax.numpy.tanh(a @ a) @ a).lower(x.numpy()).compile()._executable.xla_executable
    blob = fresh.serialize()
    for inline in (True, False):
        loaded = Executable.deserialize(blob, exe.layout, exe.device, inline=inline)
        assert loaded.inline == inline
        (got,) = loaded.run([x])
        torch.testing.assert_close(got, _product_chain(x), rtol=1e-4, atol=1e-3)


def test_graphs_over_tpu_tensors_keep_the_asynchronous_launch():
    """The eager device's tensors hold device arrays that need not be ready: a graph over them
    (and the device's own programs) keeps PJRT's handoff, so the caller runs on meanwhile."""
    from torchtpu.compiler.driver import on_host

    x = torch.randn(64, 64)  # short: inline if its caller waited
    out, graph = _runner_of(_product_chain, x.to("tpu"))
    torch.testing.assert_close(out.cpu(), _product_chain(x), rtol=1e-4, atol=1e-3)
    assert not graph.waits and not graph.executable_for(graph.fixed_signature).inline
    assert on_host([x, 3, torch.tensor(1)]) and not on_host([x, x.to("tpu")])
