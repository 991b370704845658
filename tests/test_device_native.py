"""The device's C++ registrations besides attention (device/native.cc): the device guard and
the metadata-only view kernels, in C++ where the library loads, Python's where it does not."""
from __future__ import annotations

import os

import helpers
import pytest
import torch

import torchtpu.device
from torchtpu.device import native, registration
from torchtpu.device.native import module as native_module

pytestmark = pytest.mark.skipif(not native.load(),
                                reason=f"the device's C++ registrations are not built: {native._state.get('why')}")


def _kernel_of(op: str) -> str:
    return next(line for line in torch._C._dispatch_dump(op).splitlines() if line.startswith("PrivateUse1:"))


def test_view_kernels_are_the_libraries_and_keep_torchs_view_semantics():
    for op in ("aten::as_strided", "aten::view", "aten::_reshape_alias", "aten::unfold", "aten::view_as_real",
               "aten::view_as_complex"):
        assert "native.cc" in _kernel_of(op), op
    x = torch.arange(24.0).to("tpu")
    v = x.view(4, 6).t()[1:3].unfold(1, 2, 2)
    ref = torch.arange(24.0).view(4, 6).t()[1:3].unfold(1, 2, 2)
    assert v.shape == ref.shape and v.stride() == ref.stride() and v.storage_offset() == ref.storage_offset()
    assert v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    base = torch.arange(24.0)
    base.view(4, 6).t()[1:3].unfold(1, 2, 2).mul_(-1)
    v.mul_(-1)  # through the view: the base sees it
    assert torch.equal(x.cpu(), base)
    c = torch.view_as_complex(torch.randn(3, 2).to("tpu"))
    assert c.dtype == torch.complex64 and torch.view_as_real(c).shape == (3, 2)


def test_autograd_runs_without_calling_the_python_guard(monkeypatch):
    calls = []
    python_type = registration._Guard.type_

    def counted(self):
        calls.append(1)
        return python_type(self)

    monkeypatch.setattr(registration._Guard, "type_", counted)
    w = torch.randn(8, 8, requires_grad=True)
    wt = w.detach().to("tpu").requires_grad_()
    (wt @ wt).tanh().sum().backward()
    (w @ w).tanh().sum().backward()
    torch.testing.assert_close(wt.grad.cpu(), w.grad, rtol=1e-5, atol=1e-5)
    assert torch.tensor(0.0, device="tpu").device == torch.device("tpu", 0)
    assert calls == []


def test_without_the_library_views_and_the_guard_are_pythons():
    script = ("import torch, torchtpu.device\n"
              "x = torch.arange(6.0).to('tpu')\n"
              "w = x.view(2, 3).t().contiguous().requires_grad_()\n"
              "(w * w).sum().backward()\n"
              "line = [l for l in torch._C._dispatch_dump('aten::as_strided').splitlines() if 'PrivateUse1' in l][0]\n"
              "print('kernels.py' in line, w.grad.cpu().reshape(-1).tolist())\n")
    out = helpers.run_python(script, env={**os.environ, "TORCHTPU_DEVICE_NATIVE": "0"}).split(maxsplit=1)
    assert out[0] == "True" and out[1].strip() == str((2 * torch.arange(6.0).view(2, 3).t().reshape(-1)).tolist())


def _recorded_event():
    event = torch.Event(device="tpu")
    event.record()  # (an event never recorded has nothing to wait for: torch returns at once)
    return event


def test_torchs_synchronize_calls_run_what_defer_mode_left_pending():
    from torchtpu.device import defer

    x = torch.arange(4.0).to("tpu")
    with torchtpu.eager_mode("defer"):
        for wait in (torch.accelerator.synchronize, torch.Stream(device="tpu").synchronize,
                     lambda: _recorded_event().synchronize()):
            y = x * 3 + 1
            assert defer.pending_ops() == 2
            wait()
            assert defer.pending_ops() == 0
            assert y.untyped_storage()._tpu.array.array is not None  # computed, not only launched
            assert y.cpu().tolist() == [1.0, 4.0, 7.0, 10.0]


def test_a_deferred_ops_error_reaches_torch_accelerator_synchronize():
    x = torch.arange(4.0).to("tpu")
    with torchtpu.eager_mode("defer"):
        x[torch.tensor([7]).to("tpu")]  # torch raises IndexError at the op; defer mode at the wait
        with pytest.raises(RuntimeError, match=r"(?s)IndexError.*index out of bounds.*aten.index.Tensor.*"
                                               r"test_device_native.py"):
            torch.accelerator.synchronize()
    torch.accelerator.synchronize()  # the error was raised once; nothing is left to wait for


def test_without_the_library_torchs_synchronize_is_torchs_unsupported_error():
    script = ("import torch, torchtpu.device\n"
              "torch.arange(3.0).to('tpu')\n"
              "try:\n"
              "    torch.accelerator.synchronize()\n"
              "except RuntimeError as e:\n"
              "    print(str(e).splitlines()[0])\n")
    out = helpers.run_python(script, env={**os.environ, "TORCHTPU_DEVICE_NATIVE": "0"})
    assert out.strip().endswith("Backend doesn't support synchronizing all streams on device.")


def test_wraps_tensor_maker_is_the_librarys_and_makes_pythons_tensor():
    from torchtpu.device import storage

    assert storage._make_tensor is not storage._python_make_tensor
    x = torch.arange(24.0).to("tpu")
    untyped = x.untyped_storage()
    for size, stride, offset, dtype in [([4, 6], [6, 1], 0, torch.float32), ([3, 2], [1, 5], 4, torch.float32),
                                        ([0, 7], [7, 1], 24, torch.float32), ([], [], 23, torch.float32),
                                        ([48], [1], 0, torch.bfloat16)]:
        made = [make(untyped, size, stride, offset, dtype)
                for make in (storage._make_tensor, storage._python_make_tensor)]
        for t in made:
            assert t.device == torch.device("tpu", 0) and t.dtype == dtype and not t.requires_grad
            assert list(t.shape) == size and list(t.stride()) == stride and t.storage_offset() == offset
            assert t.untyped_storage()._tpu is untyped._tpu and t.data_ptr() == made[1].data_ptr()
        assert torch._C._dispatch_keys(made[0]) == torch._C._dispatch_keys(made[1])
    view = storage._make_tensor(untyped, [3, 2], [1, 5], 4, torch.float32)
    assert view.cpu().tolist() == torch.arange(24.0).as_strided([3, 2], [1, 5], 4).tolist()
    for make in (storage._make_tensor, storage._python_make_tensor):  # torch's set_ bound, both ways
        with pytest.raises(RuntimeError, match="out of bounds"):
            make(untyped, [5, 6], [6, 1], 0, torch.float32)
    with pytest.raises(TypeError):
        storage._make_tensor(untyped, [2, "a"], [1, 1], 0, torch.float32)


def _python_marker(t, state):
    """call._State.tensor with the library's fast path switched off."""
    from torchtpu.device import call

    fast, call._fast_marker = call._fast_marker, None
    try:
        return state.tensor(t, None)
    finally:
        call._fast_marker = fast


def test_tensor_markers_are_pythons_and_leave_the_rest_to_python():
    from torchtpu.device import call

    assert call._fast_marker is not None
    x = torch.arange(24.0).to("tpu")
    others = [x.view(4, 6).t()[1:3], x[5], torch.ones(3, dtype=torch.bfloat16).to("tpu"), x.view(2, 12),
              torch.nn.Parameter(torch.ones(2).to("tpu"))]  # torch counts a Parameter as a plain tensor
    fast, slow = call._State(True), call._State(True)
    for t in others:
        marker = call._fast_marker(t, fast.index, fast.storages)
        assert marker == _python_marker(t, slow) and type(marker[3]) is torch.Size, marker
    assert fast.storages == slow.storages and fast.index == slow.index and len(fast.storages) == 3
    # not the common case: Python's path decides (and registers nothing here)
    class Sub(torch.Tensor):
        pass

    for t in (x.view(torch.int32), torch.ones(2, dtype=torch.float64).to("tpu"), torch.ones(2), 3.0,
              x.as_subclass(Sub)):
        assert call._fast_marker(t, fast.index, fast.storages) is None
    assert len(fast.storages) == 3


def test_the_user_frame_is_pythons():
    import threading

    from torchtpu.device import call

    def here():
        return call.user_frame(), call._python_user_frame()

    native, python = here()
    assert native == python and native[0] == __file__ and native[2] == "here"
    got = []
    thread = threading.Thread(target=lambda: got.append(call.user_frame()))  # outermost: threading's frame
    thread.start()
    thread.join()
    assert got[0][0] == __file__


def _python_describe(op, args, kwargs, lift=True):
    """call.describe with the library's fast paths switched off."""
    from torchtpu.device import call

    saved = call._fast_marker, call._fast_describe
    call._fast_marker = call._fast_describe = None
    try:
        return call.describe(op, args, kwargs, lift)
    finally:
        call._fast_marker, call._fast_describe = saved


def test_describe_is_pythons_and_leaves_the_rest_to_python():
    from torchtpu.device import call

    assert call._fast_describe is not None
    aten = torch.ops.aten
    x = torch.arange(24.0).to("tpu")
    w = torch.nn.Parameter(torch.ones(4, 6).to("tpu"))
    b = torch.ones(3, dtype=torch.bfloat16).to("tpu")
    cases = [
        (aten.add.Tensor, (x, x), {}),
        (aten.add.Tensor, (x.view(4, 6), w), {"alpha": 0.5}),  # a LIFTED float
        (aten.add.Scalar, (x, 2), {"alpha": 3}),  # Scalars that stay constants
        (aten.mul.Tensor, (b, 0.9), {}),  # a wrapped number: a runtime scalar
        (aten.mul.Tensor, (x, 3), {}),
        (aten.add.Scalar, (x, -0.0), {}), (aten.add.Scalar, (x, 0.0), {}), (aten.add.Scalar, (x, float("nan")), {}),
        (aten.add.Scalar, (x, True), {}), (aten.add.Scalar, (x, 1 + 2j), {}),
        (aten.sum.dim_IntList, (x.view(4, 6), [1]), {"keepdim": True, "dtype": torch.float32}),
        (aten.view.default, (x, torch.Size([2, 12])), {}),
        (aten.cat.default, ([x[:4], w.view(-1)[:4], x[4:8]],), {"dim": 0}),
        (aten._foreach_add_.Scalar, ([x, w, b], 0.25), {}),
        (aten._foreach_mul_.ScalarList, ([x, w], [0.5, 2.0]), {}),
        (aten.zeros.default, ([2, 3],), {"dtype": torch.float32, "device": torch.device("tpu")}),
        (aten.clamp.default, (x,), {"min": None, "max": 1.5}),
    ]
    for op, args, kwargs in cases:
        for lift in (True, False):
            fast = call.describe(op, args, kwargs, lift)
            slow = _python_describe(op, args, kwargs, lift)
            assert fast.key == slow.key and hash(fast.key) == hash(slow.key), (op, fast.key, slow.key)
            assert fast.template == slow.template and fast.values == slow.values, op
            assert fast.storages == slow.storages and fast.scalars == slow.scalars and not fast.padded, op
    # Python's path decides (its own markers, or its error) where the common case does not hold
    codes = call.schema_of(aten.add.Tensor)
    native_describe = call._fast_describe
    for args in ((x, torch.ones(24, dtype=torch.float64).to("tpu")), (x, torch.tensor(2.0)), (x.view(torch.int32), x)):
        assert native_describe(codes.codes, codes.names, codes.defaults, 0, args, {}, True, torch.float32) is None
    assert call.describe(aten.add.Tensor, (x, torch.tensor(2.0)), {}).scalars[0].device.type == "cpu"
    with pytest.raises(NotImplementedError, match="Generator"):
        call.describe(aten.normal.float_Tensor, (0.0, x), {"generator": torch.Generator()})
    with pytest.raises(call.MixedDevices):
        call.describe(aten.add.Tensor, (x, torch.ones(24)), {})


def _deferred_steps(fn, *args):
    """fn(*args) in defer mode: its result on the host and the pending graph's records."""
    import torchtpu
    from torchtpu.device import defer

    with torchtpu.eager_mode("defer"):
        out = fn(*args)
        graph = defer.executor.graph
        records = [(r.entry.id, r.refs, r.first_value, r.where[1:]) for r in graph.records]
        hits, inputs = graph.hits, len(graph.inputs)
        host = [t.cpu() for t in out]
    return host, records, hits, inputs


def _ops(x, w):
    y = x @ w + 1.5  # a runtime scalar
    z = (y * x).relu_()  # in place: a written storage, the argument returned
    values, indices = torch.max(z, dim=1)  # two fresh results
    s = torch.sigmoid(z.t()[1:])  # a view of a pending value
    parts = [values * 1.0, s.sum(0)]
    torch._foreach_mul_(parts, [0.5, 2.0])  # a list of runtime scalars, no return
    return [y, z, values, indices, *parts]


def test_defer_records_a_known_op_as_python_does(monkeypatch):
    from torchtpu.device import defer

    assert defer._native_record is not None
    x, w = torch.randn(4, 4).to("tpu"), torch.randn(4, 4).to("tpu")
    _deferred_steps(_ops, x, w)  # every op key traced: the calls below are hits
    in_python = []
    python_run = defer.Defer.run
    monkeypatch.setattr(defer.Defer, "run", lambda self, op, *a: in_python.append(op) or python_run(self, op, *a))
    native = _deferred_steps(_ops, x, w)
    assert in_python == []  # every op was known: none took Python's path
    monkeypatch.undo()  # (the lambda would be the user's frame of Python's records)
    native = _deferred_steps(_ops, x, w)
    defer.use_native(native_module(), on=False)
    try:
        assert defer._native_record is None
        python = _deferred_steps(_ops, x, w)
    finally:
        defer.use_native(native_module())
    assert native[1:] == python[1:] and native[2] == len(native[1])
    expected = _ops(x.cpu(), w.cpu())
    for got_native, got_python, want in zip(native[0], python[0], expected):
        assert torch.equal(got_native, got_python)
        torch.testing.assert_close(got_native, want)


def test_storage_accounting_is_the_librarys():
    from torchtpu.device import storage

    assert storage._account is not storage._python_account
    before = torchtpu.device.module.memory_allocated()
    t = torch.empty(1000, device="tpu")
    assert torchtpu.device.module.memory_allocated() == before + 4000
    assert torchtpu.device.module.max_memory_allocated() >= before + 4000
    other = torch.empty(10, device="tpu")
    assert other.data_ptr() >= t.data_ptr() + 4000  # its own range
    del t
    assert torchtpu.device.module.memory_allocated() == before + 40
    torchtpu.device.module.reset_peak_memory_stats()
    assert torchtpu.device.module.max_memory_allocated() == before + 40
