"""The compilation cache across processes: cold/warm, 8 at once, read-only, prewarm, deviceless TPU."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def _env(cache_dir, **extra):
    return {**os.environ, "TORCHTPU_CACHE_DIR": str(cache_dir), **extra}


def _worker(target: str, cache_dir, **popen):
    return subprocess.Popen([sys.executable, str(HERE / "cache_worker.py"), target], cwd=HERE,
                            env=_env(cache_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def _result(proc) -> dict:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _cli(cache_dir, *args):
    out = subprocess.run([sys.executable, "-m", "torchtpu.cli", "cache", *args], capture_output=True, text=True,
                         env=_env(cache_dir), cwd=HERE, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_fresh_process_loads_llama_without_compiling(tmp_path):
    cold = _result(_worker("cache_targets:llama", tmp_path))
    warm = _result(_worker("cache_targets:llama", tmp_path))
    assert cold["stats"]["xla_compiles"] >= 1 and cold["stats"]["disk_hits"] == 0
    assert warm["stats"]["xla_compiles"] == 0 and warm["stats"]["disk_hits"] > 0
    assert warm["max_error"] < 1e-4 and cold["max_error"] < 1e-4
    assert warm["sums"] == cold["sums"]  # the very same executable


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="no C++ compiler for the ATen kernels")
def test_fresh_process_runs_a_cached_program_that_calls_aten(tmp_path):
    """The CNN's convolutions are custom calls into ATen (kernels/aten_cpu.py): a warm process
    registers the library before it loads the executable, and gets the same numbers."""
    cold = _result(_worker("cache_targets:cnn", tmp_path))
    warm = _result(_worker("cache_targets:cnn", tmp_path))
    assert cold["stats"]["xla_compiles"] == 1 and warm["stats"]["xla_compiles"] == 0
    assert warm["stats"]["disk_hits"] == 1 and warm["sums"] == cold["sums"]
    assert warm["max_error"] < 1e-4


def test_eight_processes_share_one_cache_dir(tmp_path):
    targets = ["cache_targets:mlp_sets"] * 4 + ["cache_targets:transformer_block"] * 4
    procs = [_worker(t, tmp_path) for t in targets]
    results = [_result(p) for p in procs]
    assert all(r["max_error"] < 1e-4 for r in results)
    assert all(not r["cache_warnings"] for r in results)
    verified = _cli(tmp_path, "verify").stdout
    assert "5 entries ok, 0 bad removed" in verified  # 3 MLP signatures + 2 block signatures, each once
    assert _result(_worker("cache_targets:transformer_block", tmp_path))["stats"]["xla_compiles"] == 0


def test_read_only_cache_dir_compiles_with_one_warning(tmp_path):
    if os.geteuid() == 0:  # root writes through any mode bits; /proc's directories refuse even root
        root = Path("/proc/self/fdinfo")
    else:
        root = tmp_path / "ro"
        root.mkdir()
        os.chmod(root, 0o555)
    result = _result(_worker("cache_targets:mlp_sets", root))
    assert result["max_error"] < 1e-4
    assert result["stats"]["xla_compiles"] == 3 and result["stats"]["disk_hits"] == 0
    assert len(result["cache_warnings"]) == 1 and "cannot write" in result["cache_warnings"][0]
    assert not (root / "v1").exists()


def test_prewarm_then_run_compiles_nothing(tmp_path):
    out = _cli(tmp_path, "prewarm", "cache_targets:mlp_sets", "--jobs", "2")
    assert "3 input sets: 3 compiled, 0 already cached" in out.stdout
    assert out.stderr.count("compiled in") == 3
    run = _result(_worker("cache_targets:mlp_sets", tmp_path))
    assert run["stats"]["xla_compiles"] == 0 and run["stats"]["disk_hits"] == 3
    assert run["max_error"] < 1e-5
    again = _cli(tmp_path, "prewarm", "cache_targets:mlp_sets")
    assert "0 compiled, 3 already cached" in again.stdout


def _libtpu_reason() -> str | None:
    if importlib.util.find_spec("libtpu") is None:
        return "libtpu is not installed (pip install libtpu enables deviceless TPU compilation)"
    return None


@pytest.mark.skipif(_libtpu_reason() is not None, reason=str(_libtpu_reason()))
def test_deviceless_tpu_prewarm_of_a_transformer_block(tmp_path):
    out = _cli(tmp_path, "prewarm", "cache_targets:transformer_block", "--target", "tpu", "--topology", "v5e:2x2")
    assert "2 input sets: 2 compiled, 0 already cached" in out.stdout
    rows = json.loads(_cli(tmp_path, "ls", "--json").stdout)
    assert len(rows) == 2 and {r["platform"] for r in rows} == {"tpu"}
    assert all(r["target"] == "tpu TPU v5 lite x4" for r in rows)
    verified = _cli(tmp_path, "verify", "-v").stdout
    assert verified.count("executable not loadable without a tpu") == 2 and "2 entries ok, 0 bad" in verified
    again = _cli(tmp_path, "prewarm", "cache_targets:transformer_block", "--target", "tpu", "--topology", "v5e:2x2")
    assert "0 compiled, 2 already cached" in again.stdout
