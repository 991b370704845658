"""The cost of run-time index checks: options={"check_indices": True} (default) vs False.

    python -m benchmarks.index_check_bench [--models tiny,decoder,hf_llama] [--rounds 7] [--runs 30]

Each model is compiled twice in this process, with and without checks, under torch.no_grad();
both are timed in alternating rounds (the median of each round), so load on a shared machine
hits both alike; differences are paired within a round, then the median over rounds is kept. Prints per model: ms with checks, ms without,
the difference in %, ms with checks but the flag never read, and so what reading the flag back
(the host sync each checked call makes) costs apart from computing it.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics

import torch
import torch._dynamo
from torch import nn

import torchtpu
from benchmarks import models
from benchmarks.timing import samples_ms
from torchtpu.runtime import transfer


class TinyEmbedding(nn.Module):
    """A tiny graph around one embedding: the call overhead is most of its time."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(256, 16)

    def forward(self, ids):
        return self.emb(ids) * 2


def build(name: str):
    """(module, input) of each benchmarked model."""
    torch.manual_seed(0)
    if name == "tiny":
        return TinyEmbedding().eval(), torch.randint(0, 256, (1, 8))
    if name == "decoder":
        return models.TinyDecoder().eval(), torch.randint(0, 128, (8, 64))
    if name == "hf_llama":
        return models.hf_llama(), torch.randint(0, 256, (8, 128))
    raise ValueError(f"unknown model {name!r}")


@contextlib.contextmanager
def flag_not_read():
    """The checked program, its flag never read: what the read (the host sync) costs apart."""
    read = transfer.scalar
    transfer.scalar = lambda array: 0
    try:
        yield
    finally:
        transfer.scalar = read


def bench(name: str, rounds: int, runs: int) -> dict:
    model, x = build(name)
    bad = x.clone()
    bad.view(-1)[0] = 10_000  # past every vocabulary: only the checked program may raise
    calls = {}
    with torch.no_grad():
        torch._dynamo.reset()
        for label, check in (("checked", True), ("unchecked", False)):
            compiled = torch.compile(model, backend="tpu", fullgraph=True, options={"check_indices": check})
            compiled(x)
            calls[label] = compiled
        try:
            calls["checked"](bad)
            raise AssertionError("the checked program did not raise")
        except IndexError:
            pass
        calls["unchecked"](bad)
        graphs = torchtpu.stats().get("dynamo_graphs", 0)
        times = {"checked": [], "not_read": [], "unchecked": []}
        fastest = {label: float("inf") for label in times}
        for _ in range(rounds):
            for label in times:
                fn = calls["unchecked" if label == "unchecked" else "checked"]
                with flag_not_read() if label == "not_read" else contextlib.nullcontext():
                    samples = samples_ms(lambda: fn(x), warmup=3, runs=runs)
                times[label].append(statistics.median(samples))
                fastest[label] = min(fastest[label], *samples)
        assert torchtpu.stats().get("dynamo_graphs", 0) == graphs, "a call recompiled while timing"
    ms = {label: statistics.median(t) for label, t in times.items()}
    # paired within each round (the three ran back to back), then the median over rounds
    diff = statistics.median(c / u - 1 for c, u in zip(times["checked"], times["unchecked"]))
    read = statistics.median(c - n for c, n in zip(times["checked"], times["not_read"]))
    return {"model": name, **{f"{label}_ms": v for label, v in ms.items()}, "diff_pct": diff * 100,
            "read_us": read * 1e3, "min_diff_pct": (fastest["checked"] / fastest["unchecked"] - 1) * 100,
            "min_checked_ms": fastest["checked"], "min_unchecked_ms": fastest["unchecked"]}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="tiny,decoder,hf_llama")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads first")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"{'model':10} {'checks ms':>10} {'no checks ms':>13} {'diff':>8} {'unread flag ms':>15} {'read us':>8}"
          f" | {'min checks':>10} {'min no checks':>13} {'diff':>8}")
    for name in args.models.split(","):
        r = bench(name, args.rounds, args.runs)
        print(f"{r['model']:10} {r['checked_ms']:10.3f} {r['unchecked_ms']:13.3f} {r['diff_pct']:+7.1f}% "
              f"{r['not_read_ms']:15.3f} {r['read_us']:8.1f} | {r['min_checked_ms']:10.3f} "
              f"{r['min_unchecked_ms']:13.3f} {r['min_diff_pct']:+7.1f}%")


if __name__ == "__main__":
    main()
