"""Compiles with and without shape bucketing, side by side: a 2-layer HF decoder called with a
random batch in [1, 8] and sequence length in [1, 512], nothing marked dynamic.

    python -m benchmarks.bucketing_bench [--calls 200] [--seed 0] [--model llama|mistral] [--policy pow2 ...]
    python -m benchmarks.bucketing_bench --zoo [--calls 24] [NAME ...]

`--model mistral` is a sliding-window decoder called with its KV cache on (as by default).

`--zoo` prints, for every text architecture of the model-coverage suite (tests/model_zoo.py),
the same table as its "shapes" mode: XLA compiles over two rounds of `--calls` random shapes,
bucketed or exact sizes with the bucketing pass's reason, and the worst error against eager.

Each policy runs in a fresh process with an empty compile cache; prints XLA compiles in a first
and a second pass (new random shapes), seconds, and the worst relative error against eager.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

POLICIES = {"pow2": "pow2", "multiple128": {"multiple": 128}, "off": "off"}


MODELS = {"llama": ("hf_llama", False), "mistral": ("hf_mistral", True)}  # name -> (builder, use_cache)


def random_decoder_calls(model, compiled, rng, calls: int, use_cache=False, batch=8, seq=512) -> float:
    """`calls` calls with batch in [1, `batch`] and sequence length in [1, `seq`]; the worst
    relative error of the compiled logits (and KV cache, with `use_cache`) against eager."""
    import torch

    worst = 0.0
    for _ in range(calls):
        ids = torch.randint(0, model.config.vocab_size, (rng.randint(1, batch), rng.randint(1, seq)))
        with torch.no_grad():
            out = compiled(input_ids=ids, use_cache=use_cache)
            ref = model(input_ids=ids, use_cache=use_cache)
        pairs = [(out.logits, ref.logits)]
        if use_cache:  # the cache is an output too: a sliding window's keeps only its last positions
            for a, b in zip(out.cache.layers, ref.cache.layers, strict=True):
                pairs += [(a.keys, b.keys), (a.values, b.values)]
        for a, b in pairs:
            if a.shape != b.shape:
                raise AssertionError(f"compiled shape {tuple(a.shape)}, eager {tuple(b.shape)}")
            worst = max(worst, ((a - b).abs().max() / b.abs().max()).item())
    return worst


def worker(policy, calls: int, seed: int, model_name: str = "llama") -> dict:
    import random

    import torch

    import torchtpu
    from benchmarks import models

    builder, use_cache = MODELS[model_name]
    torch.manual_seed(0)
    model = getattr(models, builder)()
    compiled = torch.compile(model, backend="tpu", options={"bucketing": policy})
    rng = random.Random(seed)
    result, worst = {}, 0.0
    for name in ("first", "second"):
        t0 = time.perf_counter()
        worst = max(worst, random_decoder_calls(model, compiled, rng, calls, use_cache))
        result[f"{name}_compiles"] = torchtpu.stats()["xla_compiles"] - sum(
            v for k, v in result.items() if k.endswith("_compiles"))
        result[f"{name}_s"] = round(time.perf_counter() - t0, 1)
    result["worst_rel_err"] = worst
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, help="calls per pass (default 200; 24 with --zoo)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", choices=sorted(MODELS), default="llama")
    parser.add_argument("--policy", action="append", choices=sorted(POLICIES),
                        help="run only these policies (repeatable; default all)")
    parser.add_argument("--zoo", action="store_true", help="the coverage suite's text architectures")
    parser.add_argument("names", nargs="*", help="with --zoo: only these architectures")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.zoo:
        zoo_table(args.names, args.calls or 24)
        return
    args.calls = args.calls or 200
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker), args.calls, args.seed, args.model)))
        return
    rows = {}
    for name in args.policy or POLICIES:
        policy = POLICIES[name]
        env = {**os.environ, "TORCHTPU_CACHE_DIR": tempfile.mkdtemp(prefix="tt-bucket-bench-"),
               "TORCHTPU_EVENT_LOG": "off"}
        cmd = [sys.executable, "-m", "benchmarks.bucketing_bench", "--calls", str(args.calls),
               "--seed", str(args.seed), "--model", args.model, "--worker", json.dumps(policy)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        rows[name] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{'bucketing':<12} {'compiles pass 1':>15} {'pass 2':>7} {'total':>6} {'pass 1 s':>9} "
          f"{'pass 2 s':>9} {'worst rel err':>14}")
    for name, r in rows.items():
        print(f"{name:<12} {r['first_compiles']:>15} {r['second_compiles']:>7} "
              f"{r['first_compiles'] + r['second_compiles']:>6} {r['first_s']:>9} {r['second_s']:>9} "
              f"{r['worst_rel_err']:>14.1e}")


def zoo_table(names, calls: int) -> None:
    """The coverage suite's shapes mode over the zoo's text models, one row each."""
    tests = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
    sys.path.insert(0, tests)
    os.environ["TORCHTPU_COVERAGE_SHAPES"] = str(calls)
    os.environ["TORCHTPU_COVERAGE_LENGTH"] = "512"
    os.environ["TORCHTPU_CACHE_DIR"] = tempfile.mkdtemp(prefix="tt-bucket-bench-")  # count compiles, not hits
    import model_coverage as cov
    import model_zoo

    print(f"{'architecture':<14} {'family':<20} {'pass 1':>6} {'pass 2':>6} {'status':<7} {'worst rel err':>13}  reason")
    for entry in model_zoo.ZOO:
        if not entry.text or (names and entry.name not in names):
            continue
        r = cov.run(entry, "shapes")
        first, second = r.compiles or ("—", "—")
        reason = "; ".join(r.refusals) or ("" if r.status == "pass" else r.detail)
        err = f"{r.error:.1e}" if r.error is not None else "—"
        print(f"{entry.name:<14} {entry.family:<20} {first:>6} {second:>6} {r.status:<7} {err:>13}  {reason[:160]}",
              flush=True)


if __name__ == "__main__":
    main()
