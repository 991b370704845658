"""Run as a process by the cache tests: compile a prewarm target, run every input set, compare
with eager and print one JSON line (stats, max error, output sums, cache warnings).

    python cache_worker.py TARGET                    each set as a fresh process's first call
    python cache_worker.py TARGET --in-order         all sets in order through ONE torch.compile
                                                     (no Dynamo reset between them), as a server
    python cache_worker.py TARGET --precompiled DIR  each set of DIR/manifest.json through
                                                     torchtpu.precompile.load(DIR/set-N.tpu, model)
"""
from __future__ import annotations

import json
import sys
import warnings


def main(target: str, mode: str = "first-calls", folder: str | None = None) -> None:
    import torch
    import torch._dynamo

    import torchtpu
    from torchtpu.cli import prewarm
    from torchtpu.cache.warn import CacheWarning

    model, input_sets = prewarm.load_target(target)
    errors, sums, loaded = [], [], []
    if mode == "in-order":
        torch._dynamo.reset()
        one = torch.compile(model, backend="tpu", fullgraph=True)
    if mode == "precompiled":
        manifest = json.loads(open(f"{folder}/{prewarm.MANIFEST}").read())
        runs = [(s["index"], f"{folder}/{s['file']}") for s in manifest["sets"]]
    else:
        runs = [(i, None) for i in range(len(input_sets))]
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for i, path in runs:
            inputs = input_sets[i]
            if mode == "in-order":
                compiled = one
            elif mode == "precompiled":
                from torchtpu.precompile import api as precompiling

                compiled = precompiling.load(path, model)
                loaded.append(compiled.loaded)
            else:  # each set as a fresh process's first call (what prewarm's first pass stores)
                torch._dynamo.reset()
                compiled = torch.compile(model, backend="tpu", fullgraph=True)
            out, ref = compiled(*inputs), model(*inputs)
            out, ref = getattr(out, "logits", out), getattr(ref, "logits", ref)
            errors.append((out - ref).abs().max().item())
            sums.append(out.double().sum().item())
    cache_warnings = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    other = [str(w.message) for w in caught if "torchtpu" in str(w.message) and str(w.message) not in cache_warnings]
    print(json.dumps({"stats": torchtpu.stats(), "max_error": max(errors), "sums": sums,
                      "cache_warnings": cache_warnings, "loaded": loaded, "warnings": other}))


if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--in-order" in argv:
        main(argv[0], "in-order")
    elif "--precompiled" in argv:
        main(argv[0], "precompiled", argv[argv.index("--precompiled") + 1])
    else:
        main(argv[0])
