"""The benchmark suite: eager, Inductor and backend="tpu" side by side, one fresh process per cell.

    python -m benchmarks.suite [--quick] [--out benchmarks/results/suite.json]     (or: make bench)

For each model (ten families: MODELS below, benchmarks/families.py) and backend it measures inference
latency (median of >= 30 calls after warm-up), a training step (forward + backward + AdamW),
the first call in a fresh process with empty caches (cold), again with the caches a
previous process left (warm) and, for tpu, from a precompiled artifact (torchtpu.precompile:
no tracing), and the peak RSS of each process; plus the per-call overhead on
a tiny graph (16 floats) and a small one (4096), and the decode step of generate. Prints a table with tpu/eager and tpu/inductor
ratios and their geometric means, and writes JSON and a PNG chart. See docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import decode_cell, report
from benchmarks.families import FAMILIES
from benchmarks.run import BF16, cache_env, run_fresh

# ten families: decoders (dense, sliding window, mixture of experts), an encoder, an
# encoder-decoder, a vision transformer, two CNNs, a diffusion transformer and a UNet
MODELS = ("hf_llama", "hf_mistral", "hf_qwen2_moe", "hf_bert", "hf_t5", "hf_vit", "cnn", "hf_resnet", "dit", "unet")
BACKENDS = ("eager", "inductor", "tpu")
WORKLOADS = ("infer", "train", "overhead", "decode", "floor")
# batch, size (sequence length, or image side for the CNN): the shapes the suite reports on
SHAPES = {"hf_llama": (8, 128), "hf_bert": (8, 128), "cnn": (32, 64)}
QUICK = {"models": "hf_llama", "reps": 5, "shapes": {"hf_llama": (2, 32)}}
OPTIONAL_BACKENDS = {"torchax": "torchax"}  # column name -> the module it needs
PRECOMPILED_WORKLOADS = ("infer", "train")  # the workloads with a "precompiled" phase (backend tpu)
DTYPES = ("float32", "bfloat16")
PHASES = ("cold", "warm", "precompiled")
FAMILY = {"hf_llama": "decoder, dense", "hf_bert": "encoder", "cnn": "CNN, grouped and depthwise",
          **{name: family for name, (_, family) in FAMILIES.items()}}


def model_rows(models: list[str], dtypes: list[str]) -> list[str]:
    """The model names the cells run: each model in each dtype, bfloat16 ones suffixed "-bf16"."""
    return [m + ("" if dtype == "float32" else BF16) for dtype in dtypes for m in models]


def plan(models, backends, workloads, reps: int, warmup: int, shapes: dict, quick: bool,
         phases=PHASES) -> list[dict]:
    """The cells to run, in order: each is the JSON spec one child process gets.

    A compiled cell runs twice with the same cache folders: "cold" (empty caches) then "warm"
    (the caches the cold process filled); a tpu model cell then runs a third time, "precompiled"
    (an artifact saved by an untimed process in between, loaded without tracing). Eager has no
    compile cache: it runs once.

    Args:
        models, backends, workloads: the names to cross.
        reps, warmup: steady-state samples and untimed calls (the tiny graph takes more).
        shapes: model -> (batch, size).
        quick: a smoke run (the tiny graph keeps `reps` instead of its default 2000).
        phases: the phases to run, from PHASES ("cold" alone: steady state, first call from empty
            caches and peak RSS, one process per cell).
    Returns:
        A list of spec dicts with "phase" and "tag" (the cache folders' name).
    """
    specs = []
    for workload in workloads:
        # the call-overhead graphs and generate_bench's own decoder are rows of their own, whatever
        # --models says; a quick run times the tiny graph alone
        names = models if workload in ("infer", "train") else {
            "overhead": ["tiny"] if quick else ["tiny", "small"], "decode": ["generate"],
            "floor": ["runtime"]}[workload]
        for model in names:
            for backend in backends:
                spec = {"workload": workload, "model": model, "backend": backend, "reps": reps,
                        "warmup": warmup, "quick": quick}
                if model in shapes:
                    spec["batch"], spec["size"] = shapes[model]
                tag = f"{workload}-{model}-{backend}"
                kinds = ("cold", "warm") if backend != "eager" and workload not in ("decode", "floor") else ("cold",)
                if backend == "tpu" and workload in PRECOMPILED_WORKLOADS:
                    kinds += ("precompiled",)
                specs += [{**spec, "phase": phase, "tag": tag} for phase in kinds if phase in phases]
    return specs


def run_cells(specs: list[dict], cache_root: str, timeout_s: float, threads: int | None = None,
              rounds: int = 1) -> list[dict]:
    """Runs each spec in a fresh child process; a failure becomes an "error" row, never a stop.

    threads=1 gives each child one torch thread and one XLA thread (generate_bench's setting).
    rounds > 1 runs the whole list that many times, round after round (each cell's processes
    spread over the run, not back to back), every round with its own empty caches, and gives
    one row per cell (`combine_rounds`).
    """
    rows = []
    decode_missing = _decode_missing()
    if any(spec["backend"] == "tpu" for spec in specs):
        _build_kernels()
    for round_ in range(rounds):
        for spec in specs:
            tag = spec["tag"] if rounds == 1 else f"{spec['tag']}-round{round_}"  # the round's own caches
            row = _run_cell(spec, tag, cache_root, timeout_s, threads, decode_missing)
            rows.append(row)
            where = f"round {round_ + 1}/{rounds} " if rounds > 1 else ""
            print(f"  {where}{spec['workload']:8} {spec['model']:9} {spec['backend']:9} {spec['phase']:5} "
                  f"{_brief(row)} ({row['wall_s']:.0f} s)", file=sys.stderr, flush=True)
    return combine_rounds(rows) if rounds > 1 else rows


def _run_cell(spec: dict, tag: str, cache_root: str, timeout_s: float, threads: int | None,
              decode_missing: str | None) -> dict:
    """One cell in a fresh child process (two for "precompiled"), its caches named by `tag`."""
    from benchmarks.generate_bench import single_thread_env

    source = report.source_version()  # per cell: other people may be editing the compiler meanwhile
    t0 = time.perf_counter()
    if spec["workload"] == "decode" and decode_missing:
        row = {**spec, "na": decode_missing}
    else:
        child = {k: v for k, v in spec.items() if k not in ("phase", "tag")}
        env = cache_env(cache_root, tag, caches_on=True)
        env = single_thread_env(env) if threads == 1 else env
        result = None
        if spec["phase"] == "precompiled":  # saved by an untimed process with the same caches first
            artifact = os.path.join(cache_root, f"{tag}.tpu-precompiled")
            saved = run_fresh(["-m", "benchmarks.cells", json.dumps({**child, "precompile_to": artifact})],
                              env, timeout_s)
            result = saved if "error" in saved else None
            child["precompiled"] = artifact
        if result is None:
            result = run_fresh(["-m", "benchmarks.cells", json.dumps(child)], env, timeout_s)
        row = {**spec, **result}
    row["wall_s"] = time.perf_counter() - t0
    row["measured_at"], row["source"] = time.strftime("%Y-%m-%dT%H:%M:%S%z"), source
    return row


# How a cell's rounds combine: the least of the minimums, the most of what counts compiles or
# errors (a warm round that compiled must show), the median of everything else measured.
LEAST = ("min_ms", "min_us")
MOST = ("xla_compiles", "dynamo_graphs", "max_abs_err", "wall_s")


def combine_rounds(rows: list[dict]) -> list[dict]:
    """One row per cell (workload, model, backend, phase) from its rounds, in first-seen order.

    A cell with an error or n/a in any round is that round's row. Otherwise numbers combine
    as LEAST/MOST say, the rest by median; "rounds" counts them and "round_values" keeps each
    round's value of the fields that were combined by median (the table's spread)."""
    import statistics

    by_cell: dict[tuple, list[dict]] = {}
    for row in rows:
        by_cell.setdefault((row["workload"], row["model"], row["backend"], row["phase"]), []).append(row)
    combined = []
    for runs in by_cell.values():
        bad = next((r for r in runs if "error" in r or "na" in r), None)
        if bad is not None:
            combined.append({**bad, "rounds": len(runs)})
            continue
        row, spread = dict(runs[0]), {}
        for field, first in runs[0].items():
            values = [r.get(field) for r in runs]
            if isinstance(first, bool) or not all(isinstance(v, (int, float)) for v in values):
                continue
            if field in LEAST:
                row[field] = min(values)
            elif field in MOST:
                row[field] = max(values)
            elif field not in ("reps", "warmup", "batch", "size", "samples"):
                row[field] = statistics.median(values)
                spread[field] = values
        row["rounds"], row["round_values"] = len(runs), spread
        combined.append(row)
    return combined


def _build_kernels() -> None:
    """Builds the CPU kernel library before any cell, as `make` does on install: a cold first
    call measures compiling the model, not the one-time build (kernels/aten_cpu.py)."""
    subprocess.run([sys.executable, "-m", "torchtpu.kernels.aten_cpu"], check=False, capture_output=True)


def _decode_missing() -> str | None:
    """Why no decode cell can run, decided here so that no process starts only to say so."""
    if importlib.util.find_spec(decode_cell.MODULE) is None:
        return f"{decode_cell.MODULE} does not exist yet"
    return None


def _brief(row: dict) -> str:
    if "error" in row or "na" in row:
        return f"{'error' if 'error' in row else 'n/a'}: {row.get('error') or row.get('na')}"
    if row["workload"] == "floor":
        return f"rss {row['peak_rss_mb']:.0f} MB"
    value = row.get("median_ms", row.get("median_us"))
    unit = "ms" if "median_ms" in row else "us"
    return f"first {row['first_call_s']:.2f} s, median {value:.3f} {unit}, rss {row['peak_rss_mb']:.0f} MB"


def backends_available(names: list[str]) -> tuple[list[str], dict]:
    """Drops optional backends whose module is missing; returns (kept, {dropped: reason})."""
    kept, dropped = [], {}
    for name in names:
        module = OPTIONAL_BACKENDS.get(name)
        if module is not None:
            dropped[name] = ("not measured: the suite has no adapter for it (see docs/benchmarks.md)"
                             if importlib.util.find_spec(module) else f"not measured: {module} is not installed")
            continue
        kept.append(name)
    return kept, dropped


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {MODELS}")
    p.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated; torchax is optional")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, from {WORKLOADS}")
    p.add_argument("--dtypes", default=",".join(DTYPES),
                   help="comma-separated, from float32,bfloat16: each model runs in each (bfloat16 rows read MODEL-bf16)")
    p.add_argument("--phases", default=",".join(PHASES),
                   help="comma-separated, from cold,warm,precompiled; cold alone measures steady state, first "
                        "call and RSS in one process per cell (warm needs cold before it)")
    p.add_argument("--reps", type=int, default=None,
                   help=f"steady-state samples per cell (default 30, {QUICK['reps']} with --quick)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls before the samples")
    p.add_argument("--quick", action="store_true",
                   help=f"smoke run: {QUICK['models']} only at {QUICK['shapes']['hf_llama']}, {QUICK['reps']} reps")
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/suite.json, "
                                               "suite-quick.json with --quick); the PNG goes beside it")
    p.add_argument("--update", action="store_true",
                   help="keep the other cells of the JSON at --out: this run's cells replace those with the "
                        "same workload, model, backend and phase (rerun part of the suite)")
    p.add_argument("--report", metavar="JSON", help="only print the table and redraw the chart of an earlier run")
    p.add_argument("--threads", type=int, choices=[1], default=None,
                   help="1: one torch and one XLA thread per cell, for a machine whose cores are shared "
                        "(a parallel region then waits for a descheduled thread)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every cell this many times, round after round, each round with empty caches; "
                        "a cell reports the median of its rounds (the minimum of minimums): steadier ratios "
                        "on a machine whose speed drifts")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per cell before it counts as an error")
    args = p.parse_args(argv)
    if args.reps is None:
        args.reps = QUICK["reps"] if args.quick else 30
    if args.quick and args.models == ",".join(MODELS):
        args.models = QUICK["models"]
    if args.quick and args.dtypes == ",".join(DTYPES):
        args.dtypes = "float32"
    args.out = Path(args.out or f"benchmarks/results/suite{'-quick' if args.quick else ''}.json")
    return args


def main(argv=None) -> dict:
    """Runs the suite; returns the JSON document it wrote."""
    args = parse_args(argv)
    if args.report:
        doc = json.loads(Path(args.report).read_text())
        doc["table"] = report.sections(doc["cells"], doc["backends"])  # the current table code
        doc["notes"] = report.notes(doc["cells"], doc.get("dropped", {}))
        print(report.format_table(doc))
        _chart(doc, Path(args.report).with_suffix(".png"))
        return doc
    models = args.models.split(",")
    workloads = args.workloads.split(",")
    dtypes = args.dtypes.split(",")
    phases = args.phases.split(",")
    for kind, names, known in (("models", models, MODELS), ("workloads", workloads, WORKLOADS),
                               ("dtypes", dtypes, DTYPES), ("phases", phases, PHASES)):
        if set(names) - set(known):
            raise SystemExit(f"unknown {kind} {sorted(set(names) - set(known))}: choose from {known}")
    models = model_rows(models, dtypes)
    backends, dropped = backends_available(args.backends.split(","))
    shapes = {**SHAPES, **(QUICK["shapes"] if args.quick else {})}
    shapes.update({m + BF16: shape for m, shape in shapes.items()})
    if "warm" in phases and "cold" not in phases:
        raise SystemExit("--phases: warm needs cold (the warm process reads the caches the cold one filled)")
    specs = plan(models, backends, workloads, args.reps, args.warmup, shapes, args.quick, phases)
    load_before = report.load_average()
    with tempfile.TemporaryDirectory(prefix="torchtpu-suite-") as cache_root:
        rows = run_cells(specs, cache_root, args.timeout, args.threads, args.rounds)
    if args.update and args.out.exists():
        earlier = json.loads(args.out.read_text())
        rows = report.merge_cells(earlier["cells"], rows)
        backends = [b for b in BACKENDS if b in set(backends) | set(earlier["backends"])]
    doc = report.document(rows, backends, dropped, vars(args), load_before)
    print(report.format_table(doc))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, default=str))
    print(f"wrote {args.out}")
    _chart(doc, args.out.with_suffix(".png"))
    return doc


def _chart(doc: dict, png: Path) -> None:
    if report.chart(doc, png):
        print(f"wrote {png}")
    else:
        print("no chart: matplotlib is not installed (pip install matplotlib); the table and JSON are complete")


if __name__ == "__main__":
    main()
