"""Two or more sets of backend options on one model, in one process, calls alternated.

    python -m benchmarks.ab MODEL --variant NAME='{"xla_options": {...}}' --variant NAME='{}'
                            [--train] [--threads 1] [--rounds 6] [--calls 20] [--batch B] [--size S]
                            [--json PATH]

MODEL is a suite model (benchmarks/run.py `build`; "-bf16" for bfloat16). Each variant is a
`torch.compile(model, backend="tpu", options=...)` of its own, compiled first; then every round
times --calls calls of each variant (after 3 untimed ones), in alternating order, and the table
gives each variant's median of round medians and its ratio to the first variant. With --train a
call is the suite's training step (benchmarks/cells.py `train_loss` compiled with the variant's
options, its backward, and one eager AdamW step per variant), else an inference call under no_grad.

Why one process: on a shared VM two fresh processes of the same program differ by 5-10% (heap
layout, the neighbours' load), more than most changes under test. Why each variant needs options
of its own: Dynamo keeps one cache per code object, so a second `torch.compile` of the same model
with the same backend and options reuses the first one's graph, and after `torch._dynamo.reset()`
the first compiled module runs the last one's program. Options that differ are a different backend
to Dynamo's guards and a different key to torchtpu's cache (DECISIONS 111). A code change is
compared by giving it an option, or in two checkouts (`benchmarks/call_overhead.py` does that).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time


def _variant(text: str) -> tuple[str, dict]:
    name, _, options = text.partition("=")
    if not name or not options:
        raise argparse.ArgumentTypeError(f"--variant {text!r}: use NAME='{{...options...}}'")
    return name, json.loads(options)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--variant", type=_variant, action="append", required=True,
                   help="NAME='{json options}', at least two; the first is the baseline")
    p.add_argument("--threads", type=int, choices=[1], default=None,
                   help="one torch thread and one XLA thread (PJRT_NPROC=1); default: the libraries' own")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--calls", type=int, default=20, help="timed calls per variant per round")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--size", type=int, default=None)
    p.add_argument("--train", action="store_true", help="time training steps instead of inference calls")
    p.add_argument("--json", default=None, help="write the result here")
    args = p.parse_args(argv)
    variants = dict(args.variant)
    if len(variants) < 2:
        p.error("give at least two --variant, with different names")
    if args.threads == 1:
        os.environ["PJRT_NPROC"] = "1"  # before JAX starts its CPU client

    import torch

    from benchmarks.run import build
    from benchmarks.timing import median_ms

    if args.threads == 1:
        torch.set_num_threads(1)
    model, inputs = build(args.model, args.batch, args.size)
    compiled = {}
    with contextlib.nullcontext() if args.train else torch.no_grad():
        for name, options in variants.items():
            fn = _train_step(model, inputs, args.model, options) if args.train else _bound(
                torch.compile(model, backend="tpu", fullgraph=True, options=options), inputs)
            started = time.perf_counter()
            fn()
            print(f"compiled {name}: {time.perf_counter() - started:.1f} s", file=sys.stderr)
            compiled[name] = fn
        samples = {name: [] for name in compiled}
        for r in range(args.rounds):
            order = list(compiled.items())
            for name, fn in (order if r % 2 == 0 else order[::-1]):
                samples[name].append(median_ms(fn, warmup=3, runs=args.calls))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    base = medians[next(iter(medians))]
    threads = "one thread" if args.threads == 1 else "default threads"
    what = "training steps" if args.train else "calls"
    print(f"{args.model}, {threads}, {args.rounds} rounds of {args.calls} {what} (ms, median of round medians)")
    for name, value in medians.items():
        rounds = " ".join(f"{v:.2f}" for v in samples[name])
        print(f"  {name:12s} {value:8.3f}  {value / base:6.3f}x   rounds: {rounds}")
    result = {"model": args.model, "threads": threads, "workload": "train" if args.train else "infer",
              "variants": variants, "rounds_ms": samples, "median_ms": medians,
              "ratio": {n: v / base for n, v in medians.items()}}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


def _bound(fn, inputs):
    return lambda: fn(*inputs)


def _train_step(model, inputs, model_name: str, options: dict):
    """One variant's training step: the suite's loss compiled with these options, its backward and
    an AdamW step of the variant's own (the parameters are shared; their values do not change the
    time of a step)."""
    import torch

    from benchmarks.cells import target_for, train_loss

    model.train()
    args = (model, *inputs, target_for(model_name, model, inputs))
    compiled = torch.compile(train_loss, backend="tpu", fullgraph=True, options=options)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        compiled(*args).backward()
        opt.step()
    return step


if __name__ == "__main__":
    main()
