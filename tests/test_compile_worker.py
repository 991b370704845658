"""XLA:CPU compiles in a compiler process of their own (torchtpu/compiler/worker.py): results
equal an in-process compile's, XLA's errors come back as they would have been raised here, a
compiler process that dies raises a clear error and the next compile starts a new one, and one
that cannot start leaves the compiles in this process (counted, one warning)."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torchtpu
from torchtpu.compiler import frames, worker

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def fresh_worker(monkeypatch, tmp_path):
    """A fresh compiler process per test, an empty cache, Dynamo reset; COMMAND restored after."""
    monkeypatch.setenv("TORCHTPU_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(worker, "COMMAND", list(worker.COMMAND))
    worker.stop()
    torch._dynamo.reset()
    torchtpu.reset_stats()
    yield
    worker.stop()
    torch._dynamo.reset()


def _fake(tmp_path, body: str) -> list[str]:
    """A stand-in compiler process: a script that says it is ready, then runs `body`."""
    script = tmp_path / "fake_compiler.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {ROOT!r})
        from torchtpu.compiler import frames
        frames.write(sys.stdout.buffer, {{"ready": True}})
    """) + textwrap.dedent(body))
    return [sys.executable, str(script)]


def test_frames_round_trip_and_a_cut_frame_is_named():
    stream = io.BytesIO()
    frames.write(stream, {"ok": True, "n": 2}, [b"abc", b"", b"\x00" * 5])
    frames.write(stream, {"last": 1})
    stream.seek(0)
    assert frames.read(stream) == ({"ok": True, "n": 2}, [b"abc", b"", b"\x00" * 5])
    assert frames.read(stream) == ({"last": 1}, [])
    assert frames.read(stream) is None
    cut = io.BytesIO()
    frames.write(cut, {"x": 1}, [b"0123456789"])
    with pytest.raises(frames.Truncated, match="short of a frame"):
        frames.read(io.BytesIO(cut.getvalue()[:-3]))


MODEL = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.GELU(), torch.nn.Flatten(),
                            torch.nn.Linear(8 * 6 * 6, 5))
x = torch.randn(2, 3, 8, 8)
"""


def test_compiles_go_to_the_compiler_process_and_match_an_in_process_compile(fresh_worker, tmp_path):
    scope: dict = {}
    exec(MODEL, scope)
    model, x = scope["model"], scope["x"]
    got = torch.compile(model, backend="tpu", fullgraph=True)(x)
    stats = torchtpu.stats()
    assert stats["compile_worker_compiles"] == stats["xla_compiles"] >= 1
    proc = worker._state["proc"]
    assert proc.pid != os.getpid() and proc.poll() is None
    torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)
    # the same program compiled in a process that compiles in itself gives the same bits
    here = tmp_path / "in_process.pt"
    code = MODEL + textwrap.dedent(f"""
        import torchtpu
        out = torch.compile(model, backend="tpu", fullgraph=True)(x)
        assert "compile_worker_compiles" not in torchtpu.stats(), torchtpu.stats()
        torch.save(out, {str(here)!r})
    """)
    env = {**os.environ, "TORCHTPU_COMPILE_WORKER": "0", "PYTHONPATH": ROOT,
           "TORCHTPU_CACHE_DIR": str(tmp_path / "other")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=600)
    assert torch.equal(got, torch.load(here))


def test_xlas_compile_error_comes_back_as_it_would_be_raised_here(fresh_worker):
    f = torch.compile(lambda x: x.sin() * 2, backend="tpu", fullgraph=True,
                      options={"xla_options": {"xla_no_such_option": True}})
    with pytest.raises(Exception, match="xla_no_such_option"):
        f(torch.randn(3))
    assert worker._state["proc"].poll() is None  # the compiler process goes on
    g = torch.compile(lambda x: x.sin() * 3, backend="tpu", fullgraph=True)
    x = torch.randn(3)
    torch.testing.assert_close(g(x), x.sin() * 3)
    assert torchtpu.stats()["compile_worker_compiles"] == 1


def test_a_compiler_process_killed_mid_compile_raises_and_the_next_compile_starts_anew(fresh_worker, tmp_path):
    worker.COMMAND = _fake(tmp_path, """
        frames.read(sys.stdin.buffer)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    x = torch.randn(4)
    with pytest.raises(Exception) as info:
        torch.compile(lambda t: t.cos() + 1, backend="tpu", fullgraph=True)(x)
    message = str(info.value)
    assert "compiler process" in message and "SIGKILL" in message and "out of memory" in message
    assert torchtpu.stats()["compile_worker_deaths"] == 1
    worker.COMMAND = [sys.executable, "-m", "torchtpu.compiler.worker_main"]
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(lambda t: t.cos() + 2, backend="tpu", fullgraph=True)(x), x.cos() + 2)
    assert torchtpu.stats()["compile_worker_compiles"] == 1


def test_a_compiler_process_that_cannot_start_leaves_compiles_here(fresh_worker, tmp_path, caplog):
    worker.COMMAND = [sys.executable, "-c", "import sys; sys.exit(3)"]
    x = torch.randn(4)
    with caplog.at_level("WARNING", logger="torchtpu.compiler"):
        got = torch.compile(lambda t: t.exp() - 1, backend="tpu", fullgraph=True)(x)
        torch.testing.assert_close(got, x.exp() - 1)
        torch.compile(lambda t: t.exp() - 2, backend="tpu", fullgraph=True)(x)
    stats = torchtpu.stats()
    assert stats["compile_worker_unavailable"] == 1 and stats["xla_compiles"] == 2
    assert "compile_worker_compiles" not in stats
    warnings = [r.message for r in caplog.records if "compiler process" in r.message]
    assert len(warnings) == 1 and "exited with status 3" in warnings[0]
    assert not worker.active()


def test_switched_off_compiles_here(fresh_worker, monkeypatch):
    monkeypatch.setenv("TORCHTPU_COMPILE_WORKER", "0")
    x = torch.randn(4)
    torch.testing.assert_close(torch.compile(lambda t: t * 5, backend="tpu", fullgraph=True)(x), x * 5)
    assert "proc" not in worker._state and "compile_worker_compiles" not in torchtpu.stats()


def test_a_warm_start_that_only_loads_starts_no_compiler_process(fresh_worker):
    from torchtpu.cache import tiers

    x = torch.randn(4, 4)
    torch.compile(lambda t: (t @ t).relu(), backend="tpu", fullgraph=True)(x)
    assert torchtpu.stats()["compile_worker_compiles"] == 1
    worker.stop()
    torch._dynamo.reset()
    tiers.MEMORY.clear()
    torchtpu.reset_stats()
    got = torch.compile(lambda t: (t @ t).relu(), backend="tpu", fullgraph=True)(x)
    torch.testing.assert_close(got, (x @ x).relu())
    stats = torchtpu.stats()
    assert stats["disk_hits"] == 1 and stats["xla_compiles"] == 0
    assert "proc" not in worker._state and worker.active()  # enabled, never started


def test_an_interrupted_compile_ends_its_compiler_process_and_the_next_starts_anew(fresh_worker, tmp_path):
    import signal

    worker.COMMAND = _fake(tmp_path, """
        import time
        frames.read(sys.stdin.buffer)
        time.sleep(600)
    """)

    class Interrupted(Exception):
        pass

    def interrupt(*_):
        raise Interrupted()

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.alarm(3)
    try:
        with pytest.raises(Exception) as info:
            torch.compile(lambda t: t.tan() + 1, backend="tpu", fullgraph=True)(torch.randn(4))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert "Interrupted" in repr(info.value) or isinstance(info.value.__cause__, Interrupted)
    assert "proc" not in worker._state  # killed: its late reply must not answer the next request
    worker.COMMAND = [sys.executable, "-m", "torchtpu.compiler.worker_main"]
    torch._dynamo.reset()
    x = torch.randn(4)
    torch.testing.assert_close(torch.compile(lambda t: t.tan() + 2, backend="tpu", fullgraph=True)(x), x.tan() + 2)
