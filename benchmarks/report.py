"""The suite's results as a table with ratios, a JSON document and a PNG chart."""
from __future__ import annotations

import datetime
import math
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

# (label, workload, phase, key): one table section per entry, one row per model in it. A backend
# without that phase (only tpu has "precompiled") shows its best start instead: warm, else cold.
METRICS = (
    ("infer latency (ms)", "infer", "cold", "median_ms"),
    ("infer latency, min (ms)", "infer", "cold", "min_ms"),
    ("train step (ms)", "train", "cold", "median_ms"),
    ("train step, min (ms)", "train", "cold", "min_ms"),
    ("first call, cold (s)", "infer", "cold", "first_call_s"),
    ("first call, warm cache (s)", "infer", "warm", "first_call_s"),
    ("first train step, cold (s)", "train", "cold", "first_call_s"),
    ("first train step, warm (s)", "train", "warm", "first_call_s"),
    ("first call, tpu precompiled (s)", "infer", "precompiled", "first_call_s"),
    ("first train step, tpu precompiled (s)", "train", "precompiled", "first_call_s"),
    ("peak RSS, infer (MB)", "infer", "cold", "peak_rss_mb"),
    ("peak RSS, train (MB)", "train", "cold", "peak_rss_mb"),
    ("runtime floor RSS (MB)", "floor", "cold", "peak_rss_mb"),
    ("peak RSS beyond the floor, infer (MB)", "infer", "cold", "rss_beyond_floor_mb"),
    ("peak RSS beyond the floor, train (MB)", "train", "cold", "rss_beyond_floor_mb"),
    ("peak RSS beyond the floor, tpu precompiled, infer (MB)", "infer", "precompiled", "rss_beyond_floor_mb"),
    ("peak RSS beyond the floor, tpu precompiled, train (MB)", "train", "precompiled", "rss_beyond_floor_mb"),
    ("graph call (us)", "overhead", "cold", "median_us"),
    ("decode step (ms)", "decode", "cold", "median_ms"),
    ("first generate (s)", "decode", "cold", "first_call_s"),
)
RATIOS = (("tpu/eager", "tpu", "eager"), ("tpu/inductor", "tpu", "inductor"))
STAND_INS = {"precompiled": ("warm", "cold")}  # phase -> what other backends show in its rows


def geomean(values: list[float]) -> float | None:
    """The geometric mean of positive values; None for an empty list."""
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def sections(rows: list[dict], backends: list[str]) -> list[dict]:
    """The table's contents: per metric, per model, the value of each backend and the ratios.

    Args:
        rows: the cells as run_cells returned them.
        backends: the column order.
    Returns:
        [{"metric", "rows": [{"model", "values": {backend: v|None}, "ratios": {name: r|None},
          "missing": {backend: "n/a"|"error"}}], "geomeans": {name: g|None}}]; a section with
        no cells at all (a workload not run) is left out.
    """
    rows = beyond_floor(rows)
    index = {(r["workload"], r["model"], r["backend"], r["phase"]): r for r in rows}
    out = []
    for label, workload, phase, key in METRICS:
        models = list(dict.fromkeys(r["model"] for r in rows if r["workload"] == workload))
        if phase in STAND_INS and not any(r["workload"] == workload and r["phase"] == phase for r in rows):
            continue  # no precompiled cell was run: no section of stand-ins alone
        table_rows = []
        for model in models:
            cells = {b: _cell(index, workload, model, b, phase) for b in backends}
            values = {b: None if missed_warm(cell) else cell.get(key) for b, cell in cells.items()}
            ratios = {name: values[a] / values[b] if values.get(a) and values.get(b) else None
                      for name, a, b in RATIOS}
            missing = {b: "n/a" if "na" in cell else "error" if "error" in cell else "miss"
                       for b, cell in cells.items() if "na" in cell or "error" in cell or missed_warm(cell)}
            table_rows.append({"model": model, "values": values, "ratios": ratios, "missing": missing})
        if any(v is not None for r in table_rows for v in r["values"].values()) or \
                any(r["missing"] for r in table_rows):
            geo = {name: geomean([r["ratios"][name] for r in table_rows if r["ratios"][name]])
                   for name, _, _ in RATIOS}
            out.append({"metric": label, "rows": table_rows, "geomeans": geo})
    return out


def beyond_floor(rows: list[dict]) -> list[dict]:
    """The cells, each with rss_beyond_floor_mb where its backend's runtime floor was measured:
    its peak minus the resident set of that backend's runtime alone (the "floor" cells), so a
    runtime's fixed cost (JAX and PJRT for tpu) and what running the model adds read apart."""
    floors = {r["backend"]: r["peak_rss_mb"] for r in rows if r["workload"] == "floor" and "peak_rss_mb" in r}
    return [{**r, "rss_beyond_floor_mb": r["peak_rss_mb"] - floors[r["backend"]]}
            if r["workload"] in ("infer", "train") and "peak_rss_mb" in r and r["backend"] in floors else r
            for r in rows]


def _cell(index: dict, workload: str, model: str, backend: str, phase: str) -> dict:
    """The cell of that phase, or for a backend without the phase, its stand-in (STAND_INS)."""
    for candidate in (phase, *STAND_INS.get(phase, ())):
        cell = index.get((workload, model, backend, candidate))
        if cell is not None:
            return cell
    return {}


def missed_warm(cell: dict) -> str | None:
    """Why a "warm" or "precompiled" cell did not start warm (it compiled or traced anyway), or None.

    A cache key covers the compiler's own source, so editing it between the cold and the warm
    process makes the warm one compile again: its first call is then a cold one, not shown. A
    precompiled cell whose artifact was refused compiled normally instead.
    """
    if cell.get("phase") == "precompiled":
        if cell.get("precompiled_loaded") is False:
            return "the artifact was not used"
        if cell.get("xla_compiles") or cell.get("dynamo_graphs"):
            return f"xla_compiles={cell.get('xla_compiles')}, dynamo_graphs={cell.get('dynamo_graphs')}"
        return None
    if cell.get("phase") != "warm":
        return None
    if cell.get("xla_compiles"):
        return f"xla_compiles={cell['xla_compiles']}, disk_hits={cell.get('disk_hits')}"
    if cell.get("fxgraph_cache_hits") == 0:
        return "fxgraph_cache_hits=0"
    return None


def merge_cells(earlier: list[dict], newer: list[dict]) -> list[dict]:
    """earlier's cells with those newer measured again replaced (same workload, model, backend,
    phase), in earlier's order; newer's other cells are appended."""
    def key(c):
        return c["workload"], c["model"], c["backend"], c["phase"]

    fresh = {key(c): c for c in newer}
    merged = [fresh.pop(key(c), c) for c in earlier]
    return merged + list(fresh.values())


def notes(rows: list[dict], dropped: dict) -> list[str]:
    """One line per reason a cell has no number (n/a or error), cells with the same reason merged."""
    by_reason: dict[str, list[str]] = {}
    for r in rows:
        reason = r.get("na") or r.get("error")
        if reason:
            kind = "n/a" if "na" in r else "error"
            by_reason.setdefault(f"{kind}: {reason}", []).append(f"{r['workload']} {r['model']} {r['backend']} "
                                                                 f"{r['phase']}")
    lines = [f"{', '.join(cells)} -> {reason}" for reason, cells in by_reason.items()]
    lines += [f"{r['workload']} {r['model']} {r['backend']} {r['phase']} -> miss: compiled again ({missed_warm(r)}); "
              + ("the cache key changed between the two processes (e.g. the compiler's source was edited)"
                 if r["phase"] == "warm" else "the precompiled artifact did not serve the call")
              for r in rows if missed_warm(r)]
    if any(r.get("phase") == "precompiled" for r in rows):
        lines.append("first call, tpu precompiled: the other backends show their warm start (eager: its first call)")
    return lines + [f"{name}: {reason}" for name, reason in dropped.items()]


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict:
    """What the numbers were measured on (the CPU model, cores, memory, versions)."""
    cpu = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                if line.startswith("model name")), platform.processor())
    mem_kb = next((int(line.split()[1]) for line in _read("/proc/meminfo").splitlines()
                   if line.startswith("MemTotal")), 0)
    versions = {}
    for dist in ("torch", "jax", "jaxlib", "transformers"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    flags = next((set(line.split(":", 1)[1].split()) for line in _read("/proc/cpuinfo").splitlines()
                  if line.startswith("flags")), set())
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gb": round(mem_kb / 2**20, 1),
            "isa": [f for f in ISA_FLAGS if f in flags],
            "platform": platform.platform(), "python": platform.python_version(), "versions": versions}


# the CPU features that move eager's bfloat16 (and float32) kernels by several times
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def source_version() -> str:
    """The commit the compiler was measured at, "+edits" when torchtpu/ differs from it."""
    root = Path(__file__).parent.parent

    def git(*args):
        out = subprocess.run(["git", *args], capture_output=True, text=True, cwd=root)
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "--short", "HEAD")
    if commit is None:
        return "unknown (not a git checkout)"
    return commit + ("+edits" if git("status", "--porcelain", "torchtpu") else "")


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def document(rows: list[dict], backends: list[str], dropped: dict, args: dict, load_before: list) -> dict:
    """The JSON document: when and where, every cell as measured, and the table with ratios."""
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": machine(), "source": source_version(), "load_average": {"before": load_before, "after": load_average()},
            "args": {k: str(v) for k, v in args.items()}, "backends": backends,
            "dropped": dropped, "cells": rows, "table": sections(rows, backends), "notes": notes(rows, dropped)}


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def format_table(doc: dict) -> str:
    """The table as text: metric | model | one column per backend | ratios, geomeans per metric."""
    backends = doc["backends"]
    ratio_names = [name for name, a, b in RATIOS if a in backends and b in backends]
    w = max([27, *(len(sec["metric"]) for sec in doc["table"])])
    mw = max([9, *(len(row["model"]) for sec in doc["table"] for row in sec["rows"])])
    head = [f"{'metric':{w}}", f"{'model':{mw}}", *(f"{b:>9}" for b in backends), *(f"{n:>12}" for n in ratio_names)]
    lines = [" | ".join(head), "-" * len(" | ".join(head))]
    for sec in doc["table"]:
        for i, row in enumerate(sec["rows"]):
            cells = [f"{sec['metric'] if i == 0 else '':{w}}", f"{row['model']:{mw}}",
                     *(f"{row['missing'].get(b) or _num(row['values'][b]):>9}" for b in backends),
                     *(f"{_ratio(row['ratios'][n]):>12}" for n in ratio_names)]
            lines.append(" | ".join(cells))
        if len(sec["rows"]) > 1:
            cells = [f"{'':{w}}", f"{'geomean':{mw}}", *(f"{'':>9}" for _ in backends),
                     *(f"{_ratio(sec['geomeans'][n]):>12}" for n in ratio_names)]
            lines.append(" | ".join(cells))
    m, load = doc["machine"], doc["load_average"]
    sources = sorted({c["source"] for c in doc["cells"] if c.get("source")}) or [doc.get("source", "?")]
    threads = doc.get("args", {}).get("threads")
    threads = "one torch and one XLA thread per cell" if threads == "1" else "default thread settings"
    rounds = int(doc.get("args", {}).get("rounds") or 1)
    if rounds > 1:
        threads += f", {rounds} rounds (each cell the median of its rounds, min: the least)"
    isa = ""
    if "isa" in m:  # older documents do not record it
        isa = f"ISA {'+'.join(m['isa']) or 'baseline'}{'' if 'avx512f' in m['isa'] else ' (no AVX512)'}, "
    ran_on = sorted({c["device"] for c in doc["cells"] if c.get("device")})
    ran_on = f"tpu programs on {' and '.join(ran_on)}; " if ran_on else ""
    lines.append(f"\n{doc['date']}  torchtpu {', '.join(sources)}  {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB, "
                 f"{isa}{ran_on}{threads}; "
                 f"load average before {load['before']}, after {load['after']}")
    lines += [f"note: {n}" for n in doc["notes"]]
    return "\n".join(lines)


def _ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def chart(doc: dict, path: Path) -> Path | None:
    """A PNG: one panel per metric, a group of bars (one per backend) per model, log scale.
    None, drawing nothing, where matplotlib is not installed (the JSON and table are the results)."""
    try:
        import matplotlib
    except ImportError:
        return None

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    secs = [s for s in doc["table"] if any((v or 0) > 0 for r in s["rows"] for v in r["values"].values())]
    cols = min(4, max(1, len(secs)))
    rows = math.ceil(len(secs) / cols) or 1
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    width = 0.8 / max(1, len(doc["backends"]))
    for ax, sec in zip(axes.flat, secs):
        for j, backend in enumerate(doc["backends"]):
            xs = [i + j * width for i, r in enumerate(sec["rows"]) if (r["values"][backend] or 0) > 0]
            ys = [r["values"][backend] for r in sec["rows"] if (r["values"][backend] or 0) > 0]
            ax.bar(xs, ys, width, label=backend)
        ax.set_xticks([i + width * (len(doc["backends"]) - 1) / 2 for i in range(len(sec["rows"]))])
        ax.set_xticklabels([r["model"] for r in sec["rows"]], fontsize=8)
        ax.set_yscale("log")
        lowest = min(v for r in sec["rows"] for v in r["values"].values() if (v or 0) > 0)
        ax.set_ylim(bottom=lowest / 2)  # a log axis otherwise cuts the smallest bar to a sliver
        ax.set_title(sec["metric"], fontsize=9)
    for ax in list(axes.flat)[len(secs):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"torchtpu benchmark suite, {doc['date']} ({doc['machine']['cores']} cores; lower is better)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    plt.close(fig)
    return path
