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


def _worker(target: str, cache_dir, *args, env=None, **popen):
    return subprocess.Popen([sys.executable, str(HERE / "cache_worker.py"), target, *args], cwd=HERE,
                            env=_env(cache_dir, **(env or {})), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)


def _result(proc, stderr: list | None = None) -> dict:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    if stderr is not None:
        stderr.append(err)
    return json.loads(out.strip().splitlines()[-1])


def _cli(cache_dir, *args, ok=True):
    out = subprocess.run([sys.executable, "-m", "torchtpu.cli", "cache", *args], capture_output=True, text=True,
                         env=_env(cache_dir), cwd=HERE, timeout=600)
    if ok:
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


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="no C++ compiler for the ATen kernels")
def test_aten_kernels_on_and_off_are_different_entries(tmp_path):
    """TORCHTPU_ATEN_KERNELS=0 lowers the same graph and options to XLA's convolutions: a process
    with it neither loads the entry whose custom calls it has no library for (that entry was
    reported bad and replaced) nor leaves its own XLA program for a process with the kernels."""
    err: list = []
    on = _result(_worker("cache_targets:cnn", tmp_path), err)
    off = _result(_worker("cache_targets:cnn", tmp_path, env={"TORCHTPU_ATEN_KERNELS": "0"}), err)
    again = _result(_worker("cache_targets:cnn", tmp_path), err)
    assert not any("is bad" in e for e in err), err
    assert on["stats"]["xla_compiles"] == 1 and off["stats"]["xla_compiles"] == 1
    assert again["stats"]["xla_compiles"] == 0 and again["stats"]["disk_hits"] == 1
    assert again["sums"] == on["sums"]  # the ATen program, not the one compiled without it
    assert off["max_error"] < 1e-4 and again["max_error"] < 1e-4
    assert len(list((tmp_path / "v1" / "entries").glob("*/*"))) == 2  # one entry each


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
    assert "3 input sets: 3 compiled, 0 already cached (first calls)" in out.stdout
    lines = out.stderr.splitlines()
    assert sum(line.startswith("first calls") and "compiled in" in line for line in lines) == 3
    assert sum(line.startswith("in order") for line in lines) == 3  # replayed once, in the parent
    assert "in order in one process: " in out.stdout
    run = _result(_worker("cache_targets:mlp_sets", tmp_path))
    assert run["stats"]["xla_compiles"] == 0 and run["stats"]["disk_hits"] == 3
    assert run["max_error"] < 1e-5
    again = _cli(tmp_path, "prewarm", "cache_targets:mlp_sets")
    assert "0 compiled, 3 already cached (first calls); in order in one process: 0 compiled, 3 already cached" \
        in again.stdout


def test_prewarm_replays_sets_in_order_so_one_process_compiles_nothing(tmp_path):
    """Two sequence lengths in ONE process: the second call gets Dynamo's automatic-dynamic graph,
    which only prewarm's in-order pass builds."""
    without = tmp_path / "without"
    out = _cli(without, "prewarm", "cache_targets:decoder_lengths", "--no-replay")
    assert "2 input sets: 2 compiled, 0 already cached (first calls)" in out.stdout
    assert "in order" not in out.stdout + out.stderr
    missed = _result(_worker("cache_targets:decoder_lengths", without, "--in-order"))
    assert missed["stats"]["xla_compiles"] >= 1  # the symbolic-size graph prewarm never built

    out = _cli(tmp_path / "with", "prewarm", "cache_targets:decoder_lengths")
    assert "in order in one process: 1 compiled, 1 already cached" in out.stdout
    assert "new Dynamo graph" in [line for line in out.stderr.splitlines() if line.startswith("in order")][1]
    served = _result(_worker("cache_targets:decoder_lengths", tmp_path / "with", "--in-order"))
    assert served["stats"]["xla_compiles"] == 0 and served["stats"]["dynamo_graphs"] == 2
    assert served["max_error"] < 1e-5 and not served["cache_warnings"]


def test_prewarm_precompile_writes_artifacts_a_fresh_process_loads(tmp_path):
    folder = tmp_path / "artifacts"
    out = _cli(tmp_path / "cache", "prewarm", "cache_targets:decoder_lengths", "--no-replay",
               "--precompile", str(folder))
    assert f"2 precompiled artifacts and manifest.json in {folder}" in out.stdout
    assert sum(line.startswith("precompile") and "wrote set-" in line for line in out.stderr.splitlines()) == 2
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json", "set-0.tpu", "set-1.tpu"]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["sets"] == [{"index": 0, "inputs": [{"shape": [2, 8], "dtype": "int64"}], "file": "set-0.tpu"},
                                {"index": 1, "inputs": [{"shape": [2, 12], "dtype": "int64"}], "file": "set-1.tpu"}]
    run = _result(_worker("cache_targets:decoder_lengths", tmp_path / "cache", "--precompiled", str(folder)))
    assert run["loaded"] == [True, True] and not run["warnings"], run["warnings"]
    assert run["stats"]["xla_compiles"] == 0 and run["stats"]["dynamo_graphs"] == 0
    assert run["stats"]["precompiled_loads"] == 2 and run["max_error"] < 1e-5


def test_prewarm_refuses_precompile_for_a_deviceless_tpu(tmp_path):
    out = _cli(tmp_path, "prewarm", "cache_targets:decoder_lengths", "--target", "tpu", "--topology", "v5e:2x2",
               "--precompile", str(tmp_path / "artifacts"), ok=False)
    assert out.returncode != 0
    assert "--precompile cannot be used with --target tpu" in out.stderr
    assert not (tmp_path / "artifacts").exists()


def _libtpu_reason() -> str | None:
    if importlib.util.find_spec("libtpu") is None:
        return "libtpu is not installed (pip install libtpu enables deviceless TPU compilation)"
    return None


@pytest.mark.skipif(_libtpu_reason() is not None, reason=str(_libtpu_reason()))
def test_deviceless_tpu_prewarm_of_a_transformer_block(tmp_path):
    out = _cli(tmp_path, "prewarm", "cache_targets:transformer_block", "--target", "tpu", "--topology", "v5e:2x2")
    assert "2 input sets: 2 compiled, 0 already cached (first calls)" in out.stdout
    # the in-order pass runs there too: set 1 after set 0 is Dynamo's automatic-dynamic graph
    assert "in order in one process: 1 compiled, 1 already cached" in out.stdout
    rows = json.loads(_cli(tmp_path, "ls", "--json").stdout)
    assert len(rows) == 3 and {r["platform"] for r in rows} == {"tpu"}
    assert all(r["target"] == "tpu TPU v5 lite x4" for r in rows)
    verified = _cli(tmp_path, "verify", "-v").stdout
    assert verified.count("executable not loadable without a tpu") == 3 and "3 entries ok, 0 bad" in verified
    again = _cli(tmp_path, "prewarm", "cache_targets:transformer_block", "--target", "tpu", "--topology", "v5e:2x2")
    assert "0 compiled, 2 already cached (first calls); in order in one process: 0 compiled, 2 already" \
        in again.stdout
