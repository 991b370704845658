"""The compilation cache in one process: keys, corruption, read-only storage, the CLI's checks."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import torchtpu
from benchmarks import models
from helpers import compile_tpu
from torchtpu.cache import entry as entries
from torchtpu.cache import tiers, warn
from torchtpu.cache.store import DiskStore

HERE = Path(__file__).parent
REPO = HERE.parent


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """An empty cache directory for this test, with the process's tiers and warnings reset."""
    root = tmp_path / "cache"
    monkeypatch.setenv("TORCHTPU_CACHE_DIR", str(root))
    tiers.MEMORY.clear()
    tiers._disk.clear()
    tiers._read_only.clear()
    warn._seen.clear()
    yield root
    tiers.MEMORY.clear()
    tiers._disk.clear()
    tiers._read_only.clear()


def _run_mlp():
    """Compiles an MLP after a Dynamo reset; returns (stats delta, max error, cache warnings)."""
    torch.manual_seed(0)
    model, x = models.MLP(), torch.randn(4, 32)
    torchtpu.reset_stats()
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        out = compile_tpu(model)(x)
    tiers.MEMORY.clear()  # the next run must go to disk
    err = (out - model(x)).abs().max().item()
    return torchtpu.stats(), err, [w for w in caught if issubclass(w.category, warn.CacheWarning)]


def _only_entry(root: Path) -> Path:
    (path,) = [p for shard in (root / "v1" / "entries").iterdir() for p in shard.iterdir()]
    return path


def test_second_compile_is_a_disk_hit(cache_dir):
    first, err1, w1 = _run_mlp()
    second, err2, w2 = _run_mlp()
    assert (first["xla_compiles"], first["disk_hits"]) == (1, 0)
    assert (second["xla_compiles"], second["disk_hits"]) == (0, 1)
    assert err1 < 1e-5 and err2 < 1e-5 and not w1 and not w2


def test_memory_tier_serves_the_same_graph_twice(cache_dir):
    torch.manual_seed(0)
    model, x = models.MLP(), torch.randn(4, 32)
    torchtpu.reset_stats()
    with torch.no_grad():
        compile_tpu(model)(x)
        out = compile_tpu(model)(x)
        torch.testing.assert_close(out, model(x))
    s = torchtpu.stats()
    assert (s["xla_compiles"], s["memory_hits"], s["disk_hits"]) == (1, 1, 0)


def _truncate(path: Path):
    blob = path / entries.EXECUTABLE
    blob.write_bytes(blob.read_bytes()[:-100])


def _flip_bit(path: Path):
    blob = path / entries.PROGRAM
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0x10
    blob.write_bytes(bytes(data))


def _delete(path: Path):
    (path / entries.EXECUTABLE).unlink()


def _version_mismatch(path: Path):
    meta = json.loads((path / entries.META).read_text())
    meta["versions"]["jaxlib"] = "0.0.1"
    (path / entries.META).write_bytes(entries.dumps_meta(entries.seal(meta)))  # a consistent, stale entry


@pytest.mark.parametrize("corrupt", [_truncate, _flip_bit, _delete, _version_mismatch], ids=lambda f: f.__name__)
def test_corrupt_entry_recompiles_warns_once_and_is_replaced(cache_dir, corrupt):
    _run_mlp()
    corrupt(_only_entry(cache_dir))
    again, err, caught = _run_mlp()
    assert again["xla_compiles"] == 1 and again["disk_hits"] == 0
    assert err < 1e-5
    assert len(caught) == 1, [str(w.message) for w in caught]
    third, err3, caught3 = _run_mlp()  # the bad entry was replaced by a sound one
    assert (third["xla_compiles"], third["disk_hits"]) == (0, 1)
    assert err3 < 1e-5 and not caught3


def test_key_ignores_names_and_stack_traces(cache_dir):
    from torchtpu.cache.canonical import canonical_graph

    def graph(name):
        g = torch.fx.Graph()
        x = g.placeholder(name)
        y = g.call_function(torch.ops.aten.relu.default, (x,))
        y.meta["stack_trace"] = f"File {name}.py"
        g.output((y,))
        return torch.fx.GraphModule(torch.nn.Module(), g)

    assert canonical_graph(graph("a")) == canonical_graph(graph("b"))


def test_key_includes_constant_contents():
    from torchtpu.cache.canonical import canonical_graph

    def graph(value):
        root = torch.nn.Module()
        root.register_buffer("c", torch.full((3,), value))
        g = torch.fx.Graph()
        x = g.placeholder("x")
        c = g.get_attr("c")
        g.output((g.call_function(torch.ops.aten.add.Tensor, (x, c)),))
        return torch.fx.GraphModule(root, g)

    assert canonical_graph(graph(1.0)) != canonical_graph(graph(2.0))
    assert canonical_graph(graph(1.0)) == canonical_graph(graph(1.0))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.bool,
                                   torch.complex64, torch.uint16, torch.int64, torch.float32])
@pytest.mark.parametrize("shape", [(0,), (3,), (), (2, 0)])
def test_constant_digest_of_every_dtype(dtype, shape):
    from torchtpu.cache.canonical import constant_digest

    zeros, ones = torch.zeros(shape, dtype=dtype), torch.ones(shape, dtype=dtype)
    assert constant_digest(zeros) == constant_digest(zeros.clone())
    assert (constant_digest(zeros) != constant_digest(ones)) == (zeros.numel() > 0)
    assert constant_digest(zeros) != constant_digest(torch.zeros(shape, dtype=torch.uint8 if dtype != torch.uint8 else torch.int8))


def test_unkeyable_graph_bypasses_the_cache(cache_dir):
    from torchtpu.cache.canonical import Unkeyable, callable_name

    with pytest.raises(Unkeyable):
        callable_name(lambda x: x)


def test_lru_eviction_keeps_the_store_under_its_cap(cache_dir):
    for _ in range(1):
        _run_mlp()
    store = DiskStore(cache_dir)
    (digest,) = store.digests()
    size = sum(f.stat().st_size for f in _only_entry(cache_dir).iterdir())
    store.max_bytes = size - 1
    assert store.evict() == [digest] and store.digests() == []


def _cli(*args, env):
    return subprocess.run([sys.executable, "-m", "torchtpu.cli", "cache", *args], capture_output=True,
                          text=True, env=env, cwd=HERE, timeout=600)


def test_cli_ls_stats_explain_verify_clear(cache_dir):
    _run_mlp()
    _run_mlp()
    env = {**os.environ, "TORCHTPU_CACHE_DIR": str(cache_dir)}
    rows = json.loads(_cli("ls", "--json", env=env).stdout)
    assert len(rows) == 1 and rows[0]["platform"] == "cpu" and rows[0]["hits"] == 1
    stats = json.loads(_cli("stats", "--json", env=env).stdout)
    assert stats["entries"] == 1 and stats["events"]["disk_hit"] == {"cpu": 1}
    assert stats["events"]["miss"] == {"cpu": 1} and stats["events"]["store"] == {"cpu": 1}
    explained = _cli("explain", rows[0]["key"][:8], env=env).stdout
    for part in ("graph", "inputs", "options", "target", "torch", "jaxlib", "libtpu", "torchtpu_source"):
        assert f"  {part} " in explained
    _flip_bit(_only_entry(cache_dir))
    verified = _cli("verify", env=env).stdout
    assert "BAD" in verified and "0 entries ok, 1 bad removed" in verified
    _run_mlp()
    assert "removed 1 entries" in _cli("clear", "--platform", "cpu", env=env).stdout
    assert json.loads(_cli("ls", "--json", env=env).stdout) == []


def test_cli_help_on_every_command(capsys):
    """The command itself once in a fresh process (its imports), then each subcommand's help
    in this one (a fresh process per command cost ~5 s each, all of it importing torch)."""
    from torchtpu import cli

    out = subprocess.run([sys.executable, "-m", "torchtpu.cli", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "usage:" in out.stdout
    for args in (["cache"], ["cache", "ls"], ["cache", "stats"], ["cache", "verify"], ["cache", "clear"],
                 ["cache", "explain"], ["cache", "prewarm"]):
        with pytest.raises(SystemExit) as exit_:
            cli.main([*args, "--help"])
        assert exit_.value.code == 0 and "usage: torchtpu " + " ".join(args) in capsys.readouterr().out


def test_a_cache_dir_others_can_write_is_not_used(tmp_path):
    """An entry is machine code this process would run: a directory another user could have
    written to is refused, with the reason; a private one is used."""
    from torchtpu import paths
    from torchtpu.cache import tiers

    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    assert paths.untrusted(private) is None and tiers.trusted(private)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert "writable by other users" in paths.untrusted(shared)
    assert not tiers.trusted(shared)
    assert paths.untrusted(tmp_path / "absent") is None  # created private when first written
