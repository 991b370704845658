"""The benchmark suite's machinery: fresh-process cells, warm caches, ratios, JSON and PNG.

No speed is asserted here (timings come from `python -m benchmarks.suite`); what is checked is
that the cells compute the right thing, the warm cell really is warm, and the outputs are well
formed.
"""
from __future__ import annotations

import json
import math
import statistics
import sys
import types
from pathlib import Path

import pytest

from benchmarks import decode_cell, report, suite


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One small suite run: the tiny graph with eager and tpu (three fresh processes), and the
    two runtimes' floors (two more)."""
    out = tmp_path_factory.mktemp("suite") / "suite.json"
    suite.main(["--workloads", "overhead,floor", "--backends", "eager,tpu", "--reps", "20", "--warmup", "1",
                "--quick", "--out", str(out)])
    return out


def test_tiny_graph_cells_measure_and_match_eager(tiny_run):
    doc = json.loads(tiny_run.read_text())
    cells = {(c["backend"], c["phase"]): c for c in doc["cells"] if c["workload"] == "overhead"}
    assert sorted(cells) == [("eager", "cold"), ("tpu", "cold"), ("tpu", "warm")]
    for cell in cells.values():
        assert "error" not in cell, cell
        assert cell["median_us"] > 0 and cell["first_call_s"] > 0 and cell["peak_rss_mb"] > 0
        assert cell["samples"] == 20
    for phase in ("cold", "warm"):
        assert cells[("tpu", phase)]["max_abs_err"] <= 1e-6  # compiled x * 2 + 1 vs eager
        assert cells[("tpu", phase)]["device"] == "cpu"  # where its programs ran: no TPU here
    assert "device" not in cells[("eager", "cold")]
    assert "tpu programs on cpu; " in report.format_table(doc)
    # the cold process compiled and stored; the warm one, same cache folder, loaded it
    assert (cells[("tpu", "cold")]["xla_compiles"], cells[("tpu", "cold")]["disk_hits"]) == (1, 0)
    assert (cells[("tpu", "warm")]["xla_compiles"], cells[("tpu", "warm")]["disk_hits"]) == (0, 1)


def test_table_ratios_come_from_the_cells(tiny_run):
    doc = json.loads(tiny_run.read_text())
    (section,) = [s for s in doc["table"] if s["metric"] == "graph call (us)"]
    (row,) = section["rows"]  # a quick run times the tiny graph alone
    assert row["model"] == "tiny"
    tpu = next(c for c in doc["cells"] if c["backend"] == "tpu" and c["phase"] == "cold" and c["workload"] == "overhead")
    eager = next(c for c in doc["cells"] if c["backend"] == "eager" and c["workload"] == "overhead")
    assert row["values"] == {"eager": eager["median_us"], "tpu": tpu["median_us"]}
    assert row["ratios"]["tpu/eager"] == pytest.approx(tpu["median_us"] / eager["median_us"])
    assert row["ratios"]["tpu/inductor"] is None  # no inductor column in this run
    assert doc["machine"]["cores"] >= 1 and doc["date"]
    assert "tpu/eager" in report.format_table(doc)


def test_runtime_floors_are_measured_and_subtracted(tiny_run):
    doc = json.loads(tiny_run.read_text())
    floors = {c["backend"]: c for c in doc["cells"] if c["workload"] == "floor"}
    assert sorted(floors) == ["eager", "tpu"] and all("error" not in c for c in floors.values())
    # the tpu runtime holds JAX and a PJRT client on top of torch
    assert floors["tpu"]["peak_rss_mb"] > floors["eager"]["peak_rss_mb"] > 50
    (section,) = [s for s in doc["table"] if s["metric"] == "runtime floor RSS (MB)"]
    assert section["rows"][0]["values"]["tpu"] == floors["tpu"]["peak_rss_mb"]
    rows = [{"workload": "floor", "model": "runtime", "backend": b, "phase": "cold", "peak_rss_mb": mb}
            for b, mb in (("eager", 300.0), ("tpu", 500.0))]
    rows += [{"workload": "infer", "model": "m", "backend": b, "phase": "cold", "peak_rss_mb": mb}
             for b, mb in (("eager", 400.0), ("tpu", 650.0))]
    (beyond,) = [s for s in report.sections(rows, ["eager", "tpu"])
                 if s["metric"] == "peak RSS beyond the floor, infer (MB)"]
    assert beyond["rows"][0]["values"] == {"eager": 100.0, "tpu": 150.0}
    assert beyond["rows"][0]["ratios"]["tpu/eager"] == pytest.approx(1.5)


def test_png_is_written_and_readable(tiny_run):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    png = tiny_run.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size < 200_000
    height, width, _ = plt.imread(png).shape
    assert height > 100 and width > 100


def test_without_matplotlib_the_suite_says_so_and_keeps_its_table(tiny_run, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what `import matplotlib` meets where it is absent
    doc = suite.main(["--report", str(tiny_run)])
    out = capsys.readouterr().out
    assert "no chart: matplotlib is not installed" in out and "graph call (us)" in out
    assert doc["table"]


def test_the_footer_names_the_device_the_tpu_programs_ran_on():
    doc = json.loads((Path(__file__).parent.parent / "benchmarks/results/suite.json").read_text())
    for cell in doc["cells"]:
        cell.pop("device", None)
    assert "tpu programs on" not in report.format_table(doc)  # a document from before the field
    next(c for c in doc["cells"] if c["backend"] == "tpu")["device"] = "TPU v5 lite"
    assert "tpu programs on TPU v5 lite; " in report.format_table(doc)


def test_geomean_over_models():
    rows = [{"workload": "infer", "model": m, "backend": b, "phase": "cold", "median_ms": v}
            for m, vals in {"a": (2.0, 4.0, 1.0), "b": (8.0, 1.0, 2.0)}.items()
            for b, v in zip(("eager", "inductor", "tpu"), vals)]
    (sec,) = report.sections(rows, ["eager", "inductor", "tpu"])
    assert [r["ratios"]["tpu/eager"] for r in sec["rows"]] == [0.5, 0.25]
    assert sec["geomeans"]["tpu/eager"] == pytest.approx(math.sqrt(0.5 * 0.25))
    assert sec["geomeans"]["tpu/inductor"] == pytest.approx(math.sqrt(0.25 * 2.0))


def test_plan_runs_compiled_cells_cold_then_warm_in_one_cache():
    specs = suite.plan(["cnn"], ["eager", "tpu"], ["infer"], reps=30, warmup=3, shapes=suite.SHAPES, quick=False)
    assert [(s["backend"], s["phase"]) for s in specs] == [
        ("eager", "cold"), ("tpu", "cold"), ("tpu", "warm"), ("tpu", "precompiled")]
    assert specs[1]["tag"] == specs[2]["tag"] == specs[3]["tag"] != specs[0]["tag"]
    assert (specs[0]["batch"], specs[0]["size"]) == suite.SHAPES["cnn"]


def test_plan_keeps_only_the_phases_asked_for():
    specs = suite.plan(["cnn", "hf_vit"], ["eager", "tpu"], ["infer", "train"], reps=30, warmup=3, shapes={},
                       quick=False, phases=("cold",))
    assert [(s["workload"], s["model"], s["backend"], s["phase"]) for s in specs] == [
        (w, m, b, "cold") for w in ("infer", "train") for m in ("cnn", "hf_vit") for b in ("eager", "tpu")]
    with pytest.raises(SystemExit, match="warm needs cold"):
        suite.main(["--phases", "warm", "--models", "cnn", "--out", "/nonexistent/x.json"])


def test_decode_cell_without_and_with_generate_bench(monkeypatch):
    monkeypatch.setattr(decode_cell, "MODULE", "benchmarks.no_such_generate_bench")
    assert "does not exist" in decode_cell.decode_step("tpu")["na"]

    calls = []
    fake = types.ModuleType("benchmarks.fake_generate_bench")
    fake.measure = lambda backend, quick=False: calls.append((backend, quick)) or {
        "decode_step_ms": 3.5, "first_call_s": 2.0, "tokens_per_s": 9.0, "tokens": [1, 2]}
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    monkeypatch.setattr(decode_cell, "MODULE", fake.__name__)
    assert decode_cell.decode_step("tpu", quick=True) == {"median_ms": 3.5, "first_call_s": 2.0, "tokens_per_s": 9.0}
    assert calls == [("tpu", True)]


def test_merge_replaces_cells_measured_again_and_keeps_the_rest():
    def cell(model, backend, value):
        return {"workload": "infer", "model": model, "backend": backend, "phase": "cold", "median_ms": value}

    earlier = [cell("a", "eager", 1.0), cell("a", "tpu", 2.0), cell("b", "tpu", 3.0)]
    merged = report.merge_cells(earlier, [cell("a", "tpu", 5.0), cell("c", "tpu", 7.0)])
    assert [(c["model"], c["backend"], c["median_ms"]) for c in merged] == [
        ("a", "eager", 1.0), ("a", "tpu", 5.0), ("b", "tpu", 3.0), ("c", "tpu", 7.0)]


def test_rounds_combine_into_one_row_per_cell():
    def cell(backend, phase, median, least, compiles, **extra):
        return {"workload": "infer", "model": "m", "backend": backend, "phase": phase, "median_ms": median,
                "min_ms": least, "xla_compiles": compiles, "reps": 30, **extra}

    rows = [cell("tpu", "cold", 9.0, 8.0, 1), cell("tpu", "warm", 5.0, 4.0, 0), cell("eager", "cold", 6.0, 5.5, 0),
            cell("tpu", "cold", 7.0, 6.5, 1), cell("tpu", "warm", 6.0, 3.0, 1), cell("eager", "cold", 2.0, 1.0, 0),
            cell("tpu", "cold", 8.0, 7.0, 1), cell("tpu", "warm", 4.0, 3.5, 0),
            cell("eager", "cold", 1.0, 1.0, 0, error="killed")]
    tpu_cold, tpu_warm, eager = suite.combine_rounds(rows)
    assert (tpu_cold["median_ms"], tpu_cold["min_ms"], tpu_cold["rounds"]) == (8.0, 6.5, 3)
    assert tpu_cold["round_values"]["median_ms"] == [9.0, 7.0, 8.0] and tpu_cold["reps"] == 30
    # a warm round that compiled shows as compiled (the table then reports no warm number)
    assert (tpu_warm["median_ms"], tpu_warm["min_ms"], tpu_warm["xla_compiles"]) == (5.0, 3.0, 1)
    assert eager["error"] == "killed" and eager["rounds"] == 3  # an error in any round is the cell's


def test_a_run_in_rounds_gives_one_cell_per_cell_with_each_rounds_value(tmp_path):
    out = tmp_path / "suite.json"
    doc = suite.main(["--workloads", "overhead", "--backends", "eager", "--reps", "5", "--warmup", "1", "--quick",
                      "--rounds", "2", "--out", str(out)])
    (cell,) = doc["cells"]
    assert "error" not in cell, cell
    assert cell["rounds"] == 2 and len(cell["round_values"]["median_us"]) == 2
    assert cell["median_us"] == pytest.approx(sum(cell["round_values"]["median_us"]) / 2)
    assert "2 rounds" in report.format_table(doc)


def test_one_thread_cells_give_xla_one_thread():
    """--threads 1: torch one thread and XLA:CPU's pool one thread (its Eigen flag alone left
    the pool as wide as the machine)."""
    import os
    import subprocess

    from benchmarks.generate_bench import single_thread_env

    script = ("import os, torch, jax, jax.numpy as jnp\n"
              "if os.environ.get('TORCHTPU_BENCH_THREADS'): torch.set_num_threads(1)\n"
              "x = jnp.ones((256, 256)); (x @ x).block_until_ready()\n"
              "names = [open(f'/proc/self/task/{t}/comm').read() for t in os.listdir('/proc/self/task')]\n"
              "print(torch.get_num_threads(), sum(n.startswith('tf_XLAEigen') for n in names))\n")
    env = {**{k: v for k, v in os.environ.items() if k not in ("PJRT_NPROC", "NPROC")}, "JAX_PLATFORMS": "cpu"}
    counts = {}
    for name, e in (("default", env), ("one", single_thread_env(env))):
        out = subprocess.run([sys.executable, "-c", script], env=e, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        counts[name] = tuple(int(v) for v in out.stdout.split()[-2:])
    assert counts["one"] == (1, 1), counts  # one pool thread (PJRT_NPROC=1)
    assert counts["default"][1] == len(os.sched_getaffinity(0)), counts  # the pool as wide as the machine


def test_a_warm_cell_that_compiled_is_not_reported_as_warm():
    rows = [{"workload": "infer", "model": "m", "backend": "tpu", "phase": phase, "first_call_s": s,
             "xla_compiles": n, "disk_hits": 1 - n} for phase, s, n in (("cold", 9.0, 1), ("warm", 8.0, 1))]
    warm = next(s for s in report.sections(rows, ["tpu"]) if s["metric"] == "first call, warm cache (s)")
    assert warm["rows"][0]["values"] == {"tpu": None} and warm["rows"][0]["missing"] == {"tpu": "miss"}
    assert any("compiled again" in n for n in report.notes(rows, {}))
    rows[1].update(xla_compiles=0, disk_hits=1)
    warm = next(s for s in report.sections(rows, ["tpu"]) if s["metric"] == "first call, warm cache (s)")
    assert warm["rows"][0]["values"] == {"tpu": 8.0}


@pytest.fixture(scope="module")
def precompiled_run(tmp_path_factory):
    """The CNN's inference cells with eager and tpu: cold, warm, and loaded from an artifact."""
    out = tmp_path_factory.mktemp("suite") / "suite.json"
    suite.main(["--models", "cnn", "--workloads", "infer", "--backends", "eager,tpu", "--dtypes", "float32", "--reps", "3",
                "--warmup", "1", "--out", str(out)])
    return json.loads(out.read_text())


def test_a_precompiled_cell_loads_its_artifact_without_tracing_or_compiling(precompiled_run):
    cells = {(c["backend"], c["phase"]): c for c in precompiled_run["cells"]}
    pre = cells[("tpu", "precompiled")]
    assert "error" not in pre, pre
    assert pre["precompiled_loaded"] is True
    assert (pre["xla_compiles"], pre["dynamo_graphs"]) == (0, 0) and pre["disk_hits"] >= 1
    assert cells[("tpu", "warm")]["dynamo_graphs"] == 1  # the warm cache still traces
    assert pre["max_abs_err"] <= 1e-4  # against eager, as every compiled cell
    (sec,) = [s for s in precompiled_run["table"] if s["metric"] == "first call, tpu precompiled (s)"]
    # tpu's own precompiled start, beside eager's first call (eager has no warm phase)
    assert sec["rows"][0]["values"] == {"eager": cells[("eager", "cold")]["first_call_s"],
                                        "tpu": pre["first_call_s"]}


def test_a_precompiled_cell_that_compiled_is_a_miss():
    rows = [{"workload": "infer", "model": "m", "backend": "tpu", "phase": "precompiled", "first_call_s": 3.0,
             "xla_compiles": 0, "dynamo_graphs": 1, "precompiled_loaded": False}]
    (sec,) = [s for s in report.sections(rows, ["tpu"]) if s["metric"] == "first call, tpu precompiled (s)"]
    assert sec["rows"][0]["missing"] == {"tpu": "miss"}
    assert any("did not serve" in n for n in report.notes(rows, {}))
    rows[0].update(precompiled_loaded=True, dynamo_graphs=0)
    (sec,) = [s for s in report.sections(rows, ["tpu"]) if s["metric"] == "first call, tpu precompiled (s)"]
    assert sec["rows"][0]["values"] == {"tpu": 3.0}


def test_a_precompiled_start_has_its_own_memory_row_beside_the_others_best_start():
    """A process that loads an artifact traces and compiles nothing: its
    memory is reported apart from the cold cell's, and eager's row shows its only start."""
    rows = [{"workload": "floor", "model": "runtime", "backend": b, "phase": "cold", "peak_rss_mb": f}
            for b, f in (("eager", 200.0), ("tpu", 400.0))]
    rows += [{"workload": "infer", "model": "m", "backend": "eager", "phase": "cold", "peak_rss_mb": 300.0},
             {"workload": "infer", "model": "m", "backend": "tpu", "phase": "cold", "peak_rss_mb": 700.0},
             {"workload": "infer", "model": "m", "backend": "tpu", "phase": "precompiled", "peak_rss_mb": 520.0,
              "first_call_s": 1.0, "xla_compiles": 0, "dynamo_graphs": 0, "precompiled_loaded": True}]
    secs = {s["metric"]: s for s in report.sections(rows, ["eager", "tpu"])}
    assert secs["peak RSS beyond the floor, infer (MB)"]["rows"][0]["values"] == {"eager": 100.0, "tpu": 300.0}
    pre = secs["peak RSS beyond the floor, tpu precompiled, infer (MB)"]
    assert pre["rows"][0]["values"] == {"eager": 100.0, "tpu": 120.0}
    assert pre["geomeans"]["tpu/eager"] == pytest.approx(1.2)


@pytest.mark.parametrize("name", suite.MODELS)
def test_every_suite_model_runs_a_forward_and_a_training_loss(name):
    import torch

    from benchmarks import cells
    from benchmarks.run import build

    model, inputs = build(name, 2, 32 if name in ("hf_vit", "cnn", "hf_resnet") else 16)
    target = cells.target_for(name, model, inputs)
    loss = cells.train_loss(model.train(), *inputs, target)
    loss.backward()
    assert loss.ndim == 0 and torch.isfinite(loss)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    half, half_inputs = build(name + "-bf16", 2, 32 if name in ("hf_vit", "cnn", "hf_resnet") else 16)
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    assert all(x.dtype in (torch.bfloat16, torch.int64) for x in half_inputs)


def test_the_suite_covers_eight_families_in_both_dtypes():
    assert len({suite.FAMILY[m] for m in suite.MODELS}) >= 8  # distinct families, not variants
    args = suite.parse_args(["--models", "cnn,dit", "--workloads", "infer"])
    assert suite.model_rows(args.models.split(","), args.dtypes.split(",")) == ["cnn", "dit", "cnn-bf16", "dit-bf16"]
    specs = suite.plan(["cnn-bf16"], ["tpu"], ["infer"], reps=3, warmup=1, shapes={}, quick=False)
    assert {s["model"] for s in specs} == {"cnn-bf16"} and len({s["tag"] for s in specs}) == 1


def test_device_ops_benchmark_times_every_case_in_every_column():
    from benchmarks import device_ops

    results = device_ops.measure(["strict", "defer"], calls=20, rounds=2)
    assert sorted(results) == sorted(["add", "add_ready", "add_", "mul_number", "sum_item"])
    for columns in results.values():
        assert sorted(columns) == ["cpu", "defer", "strict"]
        assert all(0 < c["best_us"] <= c["median_us"] for c in columns.values())
    assert "add_ready" in device_ops.table(results)


def test_the_footer_names_the_cpu_features_that_move_bfloat16():
    isa = report.machine()["isa"]
    assert isinstance(isa, list) and set(isa) <= set(report.ISA_FLAGS)
    doc = json.loads((Path(__file__).parent.parent / "benchmarks/results/suite.json").read_text())

    def machine_line() -> str:  # the footer's machine line; the notes follow it
        lines = report.format_table(doc).splitlines()
        (line,) = [ln for ln in lines if f"{doc['machine']['cores']} cores" in ln]
        return line

    doc["machine"]["isa"] = ["avx2"]
    assert "ISA avx2 (no AVX512), " in machine_line()
    doc["machine"]["isa"] = ["avx2", "avx512f", "avx512_bf16"]
    assert "ISA avx2+avx512f+avx512_bf16, " in machine_line()
    del doc["machine"]["isa"]  # a document from before the field
    assert "ISA" not in machine_line()


def test_device_memory_mapped_into_the_process_is_not_counted_as_host_memory(tmp_path):
    """A TPU process's resident set includes the chip's memory window (8 GiB on a v5e): the
    cells subtract it, so a peak RSS is host memory on every platform."""
    from benchmarks import cells

    smaps = tmp_path / "smaps"
    smaps.write_text(
        "55d0a000-55d0b000 r-xp 00000000 08:01 123 /usr/bin/python3.11\n"
        "Size:                  4 kB\nRss:                   4 kB\n"
        "7f0000000000-7f0200000000 rw-s 00000000 00:0e 99 anon_inode:[vfio-device]\n"
        "Size:            8388608 kB\nRss:             8388608 kB\nVmFlags: rd wr sh mr mw me ms\n"
        "7f3000000000-7f3000100000 rw-p 00000000 00:00 0 \n"
        "Size:               1024 kB\nRss:                512 kB\n"
        "7f4000000000-7f4000001000 rw-s 00000000 00:05 7 /dev/accel0\n"
        "Size:                  4 kB\nRss:                   4 kB\n"
        "7f5000000000-7f5000001000 rw-s 00000000 00:05 8 /dev/shm/torch_123\n"
        "Size:                  4 kB\nRss:                   4 kB\n")
    assert cells.device_mapped_kb(str(smaps)) == 8388608 + 4
    assert cells.device_mapped_kb(str(tmp_path / "missing")) == 0
    assert cells.device_mapped_kb() == 0  # this process, on the CPU platform: nothing mapped


def test_module_profile_captures_blocks_without_the_kv_cache_they_would_grow():
    """A block timed with the model's KV cache would append to it every call; the profile
    hands it None instead, and keeps every other argument as the forward passed it."""
    import torch
    from transformers import DynamicCache

    from benchmarks import module_profile

    class Block(torch.nn.Module):
        def forward(self, x, cache=None, scale=1.0):
            return x * scale

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            return self.block(x, cache=DynamicCache(), scale=2.0)

    x = torch.ones(2)
    [(name, module, args, kwargs)] = module_profile.capture(Model(), (x,), depth=1)
    assert name == "block" and args[0] is x
    assert kwargs == {"cache": None, "scale": 2.0}


def test_memory_phases_split_a_cold_process_into_what_every_process_pays_and_what_the_model_adds():
    """benchmarks.memory_phases: fresh processes (eager, tpu) record their resident set and
    high-water mark after each phase; the tpu one compiled the model itself (a cold start)."""
    from benchmarks import memory_phases

    rows = memory_phases.run(["mlp"], "train")
    by = {r["backend"]: r for r in rows}
    assert "error" not in by["tpu"] and "error" not in by["eager"], rows
    assert [p["phase"] for p in by["tpu"]["phases"]] == memory_phases.TPU_PHASES
    assert [p["phase"] for p in by["eager"]["phases"]] == memory_phases.EAGER_PHASES
    assert by["tpu"]["model_xla_compiles"] >= 2  # the step's forward and backward, not cache hits
    for row in rows:
        hwm = [p["hwm"] for p in row["phases"]]
        assert hwm == sorted(hwm) and all(p["rss"] <= p["hwm"] + 1 for p in row["phases"])
    s = memory_phases.summary(by["tpu"])
    at = {p["phase"]: p for p in by["tpu"]["phases"]}
    assert s["peak beyond floor"] == at["steady"]["hwm"] - at["runtime"]["rss"] > s["fixed"] > 0
    table = memory_phases.format_table(rows + [{"model": "cnn", "backend": "tpu", "error": "boom"}])
    assert "mlp eager" in table and "mlp tpu" in table and "error: cnn tpu: boom" in table
    (line,) = [ln for ln in table.splitlines() if ln.split("|")[0].strip() == "mlp"]  # the summary row
    assert f"{s['peak beyond floor']:.0f}" in line


@pytest.mark.parametrize("backend", ["tpu", "inductor"])
def test_a_floor_cell_holds_the_runtime_and_not_torchs_compiler(backend):
    """tpu's floor is torch, torchtpu, JAX and the PJRT client; Inductor's the code cache its
    generated code imports (which brings Dynamo). Neither holds AOTAutograd, and tpu's not Dynamo:
    reading the compile counters imports Dynamo (~85 MB here), which is for model cells, or the
    floor hides that much of a cold start; the two floors are defined alike (runtime, no compiler)."""
    import subprocess

    script = ("import json, sys; from benchmarks import cells; "
              f"row = cells.measure({{'workload': 'floor', 'backend': '{backend}', 'reps': 1, 'warmup': 0}}); "
              "print(json.dumps([row, 'torch._dynamo' in sys.modules, 'torch._functorch.aot_autograd' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).parent.parent)
    row, dynamo_imported, aot_imported = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["peak_rss_mb"] > 0 and "xla_compiles" not in row and "fxgraph_cache_hits" not in row
    assert aot_imported is False
    assert dynamo_imported is (backend == "inductor")
    if backend == "tpu":
        assert row["device"] == "cpu"


def test_the_overhead_workload_times_a_tiny_and_a_small_graph():
    """Two rows: 16 floats (the fixed cost of a call) and 4096 (above PJRT's cheap-computation
    bound, where the CPU client hands the program to a worker thread); a quick run the first."""
    from benchmarks import cells

    full = suite.plan(["hf_llama"], ["eager", "tpu"], ["overhead"], 5, 1, {}, quick=False, phases=("cold",))
    quick = suite.plan(["hf_llama"], ["eager", "tpu"], ["overhead"], 5, 1, {}, quick=True, phases=("cold",))
    assert [(s["model"], s["backend"]) for s in full] == [
        ("tiny", "eager"), ("tiny", "tpu"), ("small", "eager"), ("small", "tpu")]
    assert {s["model"] for s in quick} == {"tiny"}
    result = cells.overhead({"workload": "overhead", "model": "small", "backend": "eager", "reps": 5,
                             "warmup": 1, "quick": True})
    assert result["numel"] == 4096 and result["median_us"] > 0 and result["samples"] == 5


def _programs():
    """Programs handed to the backend so far: each compile or cache hit is one."""
    import torchtpu

    stats = torchtpu.stats()
    return stats["xla_compiles"] + stats["disk_hits"] + stats["memory_hits"]


def test_ab_compiles_each_variant_as_its_own_program(tmp_path):
    # the pitfall it exists for: two torch.compile calls of one model with the same backend and
    # options share Dynamo's cache entry, so both would run one program (DECISIONS 111)
    from benchmarks import ab

    before = _programs()
    out = tmp_path / "ab.json"
    result = ab.main(["mlp", "--rounds", "2", "--calls", "2", "--batch", "4", "--json", str(out),
                      "--variant", "base={}", "--variant",
                      'dumped={"xla_options": {"xla_dump_to": "' + str(tmp_path / "dump") + '"}}'])
    assert _programs() - before == 2
    assert any((tmp_path / "dump").iterdir())  # the second variant's program is the one XLA dumped
    assert json.loads(out.read_text())["ratio"]["base"] == 1.0
    assert set(result["rounds_ms"]) == {"base", "dumped"} and all(len(v) == 2 for v in result["rounds_ms"].values())
    with pytest.raises(SystemExit):
        ab.main(["mlp", "--variant", "base={}"])  # one variant: nothing to compare


@pytest.fixture
def seen(monkeypatch):
    """The model benchmarks.run.build makes next, and its parameters as built."""
    import benchmarks.run

    build, seen = benchmarks.run.build, {}

    def recording_build(*a):
        seen["model"], inputs = build(*a)
        seen["start"] = {n: p.detach().clone() for n, p in seen["model"].named_parameters()}
        return seen["model"], inputs

    monkeypatch.setattr(benchmarks.run, "build", recording_build)
    return seen


def test_ab_train_times_steps_that_train(seen):
    """--train: each variant's step is the suite's compiled loss, its backward and an optimizer step."""
    import torch

    from benchmarks import ab

    before = _programs()
    result = ab.main(["mlp", "--train", "--rounds", "2", "--calls", "2", "--batch", "4",
                      "--variant", "base={}", "--variant", 'strict={"mode": "strict"}'])
    assert _programs() - before >= 4  # a forward and a backward program per variant, at least
    assert result["workload"] == "train" and set(result["median_ms"]) == {"base", "strict"}
    moved = [n for n, p in seen["model"].named_parameters() if not torch.equal(p.detach(), seen["start"][n])]
    assert moved and seen["model"].training  # the steps updated the parameters


def test_side_by_side_times_every_backend_in_one_process_per_model(tmp_path):
    """benchmarks/side.py: a fresh process per model, each backend's output checked against
    eager's, every ratio from medians of rounds taken in that one process."""
    from benchmarks import side

    out = tmp_path / "side.json"
    doc = side.main(["--models", "mlp", "--backends", "eager,tpu", "--rounds", "3", "--calls", "2",
                     "--batch", "4", "--out", str(out)])
    (row,) = doc["rows"]
    assert "error" not in row, row
    assert set(row["median_ms"]) == {"eager", "tpu"}
    assert all(len(v) == 3 and min(v) > 0 for v in row["rounds_ms"].values())
    assert row["median_ms"]["tpu"] == statistics.median(row["rounds_ms"]["tpu"])
    assert row["max_abs_err"]["tpu"] < 1e-4
    ratio = row["median_ms"]["tpu"] / row["median_ms"]["eager"]
    assert f"{ratio:.2f}x" in doc["table"] and "geomean" in doc["table"] and "default threads" in doc["table"]
    assert json.loads(out.read_text())["rows"][0]["median_ms"] == row["median_ms"]


def test_side_by_side_train_steps_update_the_parameters(seen):
    import torch

    from benchmarks import side

    row = side.measure("mlp", ["eager", "tpu"], rounds=2, calls=2, train=True, batch=4)
    # (no program count: an earlier test may have compiled this loss already, and Dynamo reuses it)
    assert set(row["median_ms"]) == {"eager", "tpu"} and row["max_abs_err"] == {}
    moved = [n for n, p in seen["model"].named_parameters() if not torch.equal(p.detach(), seen["start"][n])]
    assert moved and seen["model"].training
