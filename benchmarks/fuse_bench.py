"""Strict (one program per ATen op) vs DeferAndFuse (the default), side by side.

    python -m benchmarks.fuse_bench [--models decoder,cnn,host_mid] [--runs 20] [--json PATH]

Each model is compiled twice in this process, with options={"mode": "strict"} and with the
defaults, under torch.no_grad(); both are timed in alternating rounds (the median of each
round, the best round kept) so load on a shared machine hits both alike. Prints per model:
strict ms, fused ms, the speedup (strict / fused), the device programs each ran, then the
geometric mean of the speedups.
"""
from __future__ import annotations

import argparse
import json
import math
import time
import warnings

import torch
import torch._dynamo
from torch import nn

from benchmarks import models
from benchmarks.timing import median_ms

MODES = {"strict": {"mode": "strict"}, "fused": {}}


class HostInTheMiddle(nn.Module):
    """An MLP with a data-dependent row selection (nonzero, a host op) in the middle."""

    def __init__(self, d=256, hidden=512):
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(d, hidden), nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x):
        h = torch.relu(self.l1(x))
        keep = torch.nonzero(h.sum(1) > h.sum(1).mean()).squeeze(1)  # host: its size depends on the data
        side = torch.tanh(self.l2(x))                               # independent: joins region 0
        return self.l3(h[keep] * 2).sum(0) + self.l3(side).sum(0)


def build(name: str):
    torch.manual_seed(0)
    if name == "decoder":
        return models.TinyDecoder(vocab=512, dim=128, heads=4, layers=2, max_len=128).eval(), (
            torch.randint(0, 512, (8, 128)),)
    if name == "cnn":
        return models.CNN().eval(), (torch.randn(32, 3, 64, 64),)
    if name == "host_mid":
        return HostInTheMiddle().eval(), (torch.randn(64, 256),)
    raise SystemExit(f"unknown model {name}")


def compile_mode(model, inputs, mode: str):
    """Compiles `model` in `mode`; returns (callable, first-call seconds, device programs)."""
    import torchtpu
    from torchtpu import events

    torch._dynamo.reset()
    torchtpu.reset_stats()
    fn = torch.compile(model, backend="tpu", fullgraph=True, options=MODES[mode])
    t0 = time.perf_counter()
    fn(*inputs)
    first = time.perf_counter() - t0
    plans = [e for e in events.events() if e["kind"] == "defer_and_fuse"]
    partitioned = mode == "strict" or torchtpu.stats()["device_regions"]
    programs = plans[-1]["device_regions"] if partitioned else 1  # not partitioned: one program
    return fn, first, programs


def measure(name: str, runs: int, rounds: int = 3) -> dict:
    """Both modes of one model: checked against eager, then timed in alternating rounds."""
    model, inputs = build(name)
    row = {"model": name}
    with torch.no_grad(), torch._dynamo.config.patch(capture_scalar_outputs=True,
                                                     capture_dynamic_output_shape_ops=True):
        expected = model(*inputs)
        fns = {}
        for mode in MODES:
            fn, first, programs = compile_mode(model, inputs, mode)
            torch.testing.assert_close(fn(*inputs), expected, rtol=1e-3, atol=1e-3)
            fns[mode] = fn
            row[f"{mode}_first_s"], row[f"{mode}_programs"] = first, programs
        best = {mode: math.inf for mode in MODES}
        for _ in range(rounds):
            for mode, fn in fns.items():
                best[mode] = min(best[mode], median_ms(lambda: fn(*inputs), warmup=2, runs=runs))
    row.update({f"{mode}_ms": ms for mode, ms in best.items()})
    row["speedup"] = best["strict"] / best["fused"]
    return row


def table(rows: list[dict]) -> str:
    head = (f"{'model':9} | {'strict ms':>9} | {'fused ms':>8} | {'strict/fused':>12} | "
            f"{'programs strict':>15} | {'programs fused':>14} | {'first s strict':>14} | {'first s fused':>13}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['model']:9} | {r['strict_ms']:9.2f} | {r['fused_ms']:8.2f} | {r['speedup']:11.2f}x | "
                     f"{r['strict_programs']:15d} | {r['fused_programs']:14d} | "
                     f"{r['strict_first_s']:14.2f} | {r['fused_first_s']:13.2f}")
    geomean = math.exp(sum(math.log(r["speedup"]) for r in rows) / len(rows))
    lines.append(f"geomean speedup of DeferAndFuse over strict: {geomean:.2f}x")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="decoder,cnn,host_mid")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    rows = [measure(name, args.runs) for name in args.models.split(",")]
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
