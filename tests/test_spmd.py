"""Tensor and data parallelism over a mesh (torchtpu/spmd): numbers against eager PyTorch.

Checks that need several devices run in tests/spmd_worker.py processes with simulated CPU
devices (XLA_FLAGS=--xla_force_host_platform_device_count=8); this process keeps its one device.
"""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torchtpu
from helpers import compile_tpu, grads_of
from torchtpu import events
from torchtpu.options import Options
from torchtpu.spmd import count_collectives, plan

WORKER = Path(__file__).with_name("spmd_worker.py")
HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
HF_SPLIT = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"}


def _workers(devices: int, *argv_sets, timeout=300) -> list[dict]:
    """Runs one worker process per argv set (at once) and returns every RESULT line."""
    env = {**os.environ, "TORCHTPU_EVENT_LOG": "off"}
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(devices), *argv], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for argv in argv_sets]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"worker failed:\n{err[-4000:]}"
        results += [json.JSONDecoder().raw_decode(line[len("RESULT "):])[0]  # text printed after it is ignored
                    for line in out.splitlines() if line.startswith("RESULT ")]
    return results


@pytest.fixture(scope="module")
def mesh8() -> dict:
    scenarios = ["tp_inference", "tp_train", "dict_plan", "errors", "export_tpu"]
    scenarios += ["deviceless_tpu"] if HAS_LIBTPU else []
    return {r["scenario"]: r for r in _workers(8, scenarios)}


def test_hf_decoder_tp_auto_matches_eager(mesh8):
    r = mesh8["tp_inference"]
    assert r["mesh"] == {"dp": 2, "tp": 4}
    assert r["rel_error"] < 1e-5
    assert r["inputs"]["0"]["spec"] == ["dp"]  # the token ids: batch over dp
    assert r["collectives"].get("all-reduce", 0) + r["collectives"].get("reduce-scatter", 0) > 0


def test_sharded_weights_hold_a_quarter_per_device(mesh8):
    params = mesh8["tp_inference"]["params"]
    split = {name for name, p in params.items() if "tp" in p["spec"]}
    assert {name.split(".")[-2] for name in split} == HF_SPLIT and len(split) == 15  # 7 per layer + lm_head
    for name, p in params.items():
        assert p["shards"] is not None, f"{name} is not resident"
        per_device = p["whole"] // 4 if name in split else p["whole"]
        assert p["shards"] == [per_device] * 8, name  # no device holds a whole sharded weight


def test_parameters_are_placed_once(mesh8):
    r = mesh8["tp_inference"]
    assert r["resident_after_first"] == r["resident_after_second"] == 22  # 21 parameters + inv_freq
    assert r["second_ok"]


def test_training_step_gradients_match_eager(mesh8):
    r = mesh8["tp_train"]
    assert r["loss_rel_error"] < 1e-6
    assert len(r["grad_rel_errors"]) == 21
    assert max(r["grad_rel_errors"].values()) < 1e-5, r["grad_rel_errors"]
    assert sum(r["graphs"]["backward"].values()) > 0


def test_dict_plan_over_one_tp_axis(mesh8):
    r = mesh8["dict_plan"]
    assert r["mesh"] == {"tp": 8}
    assert r["rel_error"] < 1e-5
    assert r["argmax_equal"] and r["argmax_dtype"] == "torch.int64"
    p = r["params"]
    assert p["emb.weight"]["spec"] == ["tp", None]  # rowwise embedding: vocabulary rows split
    assert p["up.weight"]["spec"] == ["tp", None] and p["up.bias"]["spec"] == ["tp"]
    assert p["down.weight"]["spec"] == [None, "tp"] and p["down.bias"]["spec"] == []
    assert p["head.weight"]["spec"] == []
    for name in ("emb.weight", "up.weight", "up.bias", "down.weight"):
        assert p[name]["shards"] == [p[name]["whole"] // 8] * 8, name


def test_errors_name_the_problem(mesh8):
    r = mesh8["errors"]
    assert "mesh {'dp': 16} needs 16 devices, this process sees 8" in r["too_many_devices"]
    assert "tp_plan='auto' but Linear declares no tensor-parallel plan" in r["auto_without_plan"]


def test_export_keeps_sharding_annotations(mesh8):
    r = mesh8["export_tpu"]
    assert r["nr_devices"] == 8 and r["platforms"] == ["tpu"]
    sig = r["main_signature"]
    assert '[{"dp"}, {}]' in sig  # the ids
    assert '[{"tp"}, {}]' in sig and '[{}, {"tp"}]' in sig and '[{"tp"}]' in sig  # up, down, up.bias


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed: no deviceless TPU compile")
def test_deviceless_tpu_compile_of_a_sharded_program(mesh8):
    r = mesh8["deviceless_tpu"]
    assert not r["ran"] and r["platform"] == "tpu" and r["mesh"] == {"dp": 2, "tp": 2}
    assert r["q_proj"] == ["tp", None]
    assert r["collectives"].get("all-reduce", 0) >= 2  # rowwise o_proj/down_proj: partial sums reduced
    assert r["kernels"] == ["xla"]  # XLA does not partition Mosaic calls: XLA's attention on a mesh


def test_two_processes_match_single_process(mesh8):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = _workers(4, ["multiprocess", "0", str(port)], ["multiprocess", "1", str(port)])
    assert sorted(r["process"] for r in results) == [0, 1]
    single = mesh8["tp_inference"]["sum"]
    for r in results:
        assert (r["processes"], r["devices"], r["local_devices"]) == (2, 8, 4)
        assert r["rel_error"] < 1e-5
        assert abs(r["sum"] - single) <= 1e-5 * abs(single)


# --- in this process (one device): options, plans, and the sharded path on a 1x1 mesh ---

@pytest.mark.parametrize("options, message", [
    ({"mesh": {"pp": 2}}, "unknown axis ['pp']"),
    ({"mesh": {"tp": 0}}, "mesh['tp']=0"),
    ({"mesh": {"tp": -1, "dp": -1}}, "at most one axis may be -1"),
    ({"tp_plan": "auto"}, "tp_plan needs a mesh"),
    ({"mesh": {"tp": 2}, "tp_plan": {"q_proj": "diagonal"}}, "styles are"),
])
def test_bad_options_are_errors(options, message):
    with pytest.raises(ValueError) as info:
        Options.parse(options)
    assert message in str(info.value)


def test_mesh_changes_the_key_items():
    plain = Options.parse({}).key_items()
    sharded = Options.parse({"mesh": {"dp": 2, "tp": 4}, "tp_plan": {"a": "colwise"}}).key_items()
    assert sharded[: len(plain)] == plain and dict(sharded)["mesh"] == '[["dp", 2], ["tp", 4]]'
    assert Options.parse({"mesh": {"tp": 4}, "tp_plan": "auto"}).key_items() != sharded


def test_plan_patterns_match_whole_name_components():
    rules = {"layers.*.mlp.up_proj": "colwise", "up_proj": "rowwise", "proj": "replicate"}
    assert plan.style_for("model.layers.3.mlp.up_proj", rules) == ("layers.*.mlp.up_proj", "colwise")
    assert plan.style_for("model.extra.up_proj", rules) == ("up_proj", "rowwise")
    assert plan.style_for("model.layers.3.mlp.q_proj", rules) is None  # "proj" is not "q_proj"
    assert plan.style_for("model.layers.3.4.mlp.up_proj", {"layers.*.mlp.up_proj": "colwise"}) is None


def test_partition_specs_per_style():
    spec = lambda *a: tuple(plan.partition_spec(*a)[0])  # noqa: E731
    assert spec("colwise", "weight", (8, 4), False, 4) == ("tp", None)
    assert spec("colwise", "bias", (8,), False, 4) == ("tp",)
    assert spec("rowwise", "weight", (8, 4), False, 4) == (None, "tp")
    assert spec("rowwise", "bias", (8,), False, 4) == ()
    assert spec("colwise", "weight", (8, 4), True, 4) == (None, "tp")  # embedding: [rows, dim]
    assert spec("sequence", "weight", (8,), False, 4) == ()
    assert plan.partition_spec("colwise", "weight", (6, 4), False, 4) == (plan.P(), "colwise: dim 0 of size 6 "
                                                                         "does not split 4 ways, replicated")


def test_auto_plan_reads_the_hf_model():
    from benchmarks import models

    rules = plan.auto_plan(models.hf_llama(layers=1))
    assert rules["model.layers.*.self_attn.q_proj"] == "colwise"
    assert rules["model.layers.*.mlp.down_proj"] == "rowwise"
    assert rules["lm_head"] == "colwise"  # the class's _tp_plan: colwise_gather_output


def test_count_collectives_counts_async_pairs_once():
    hlo = ("%all-reduce-start = f32[4]{0} all-reduce-start(f32[4]{0} %p), to_apply=%add\n"
           "%all-reduce-done = f32[4]{0} all-reduce-done(f32[4]{0} %all-reduce-start)\n"
           "%ag = f32[8,4]{1,0} all-gather(f32[2,4]{1,0} %x), dimensions={0}\n"
           "%fusion = f32[4]{0} fusion(f32[4]{0} %all-reduce-done), calls=%all-gather.clone\n")
    assert count_collectives(hlo) == {"all-reduce": 1, "all-gather": 1}


def test_one_device_mesh_runs_the_sharded_path_and_names_parameters():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(6, 8)
    eager = copy.deepcopy(model)
    eager(x).pow(2).sum().backward()
    events.clear()
    torchtpu.reset_stats()
    compiled = compile_tpu(model, options={"mesh": {"dp": 1, "tp": 1}, "tp_plan": {"0": "colwise", "2": "rowwise"}})
    out = compiled(x)
    out.pow(2).sum().backward()
    torch.testing.assert_close(out, eager(x), rtol=1e-5, atol=1e-6)
    for name, grad in grads_of(eager).items():
        torch.testing.assert_close(grads_of(model)[name], grad, rtol=1e-5, atol=1e-6)
    spmd_events = {e["graph"].split("_")[0]: e for e in events.events() if e["kind"] == "spmd"}
    assert spmd_events["forward"]["params"]["0.weight"]["spec"] == ["tp", None]
    assert spmd_events["forward"]["params"]["2.weight"]["spec"] == [None, "tp"]
    assert "2.weight" in spmd_events["backward"]["params"]  # a saved primal keeps its name
    assert torchtpu.stats()["cache_bypass"] == 2  # sharded programs are not cached (docs/spmd.md)


def test_single_device_executables_keep_each_result_on_their_device():
    (r,) = _workers(2, ["executable_per_device"])
    assert sorted(r["executables"]) == ["cpu:0", "cpu:1"]
    for device, calls in r["executables"].items():
        assert calls["devices"] == [[device, device]] * 3
        assert calls["values"] == [[[1.0, 3.0, 5.0, 7.0, 9.0, 11.0], 15.0]] * 3
        assert calls["torch"] == [[1.0, 3.0, 5.0, 7.0, 9.0, 11.0], 15.0]
