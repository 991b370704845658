"""Run as a process by the cache tests: compile a prewarm target, run every input set, compare
with eager and print one JSON line (stats, max error, output sums, cache warnings)."""
from __future__ import annotations

import json
import sys
import warnings


def main(target: str) -> None:
    import torch
    import torch._dynamo

    import torchtpu
    from torchtpu.cache import prewarm
    from torchtpu.cache.warn import CacheWarning

    model, input_sets = prewarm.load_target(target)
    errors, sums = [], []
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for inputs in input_sets:  # each set as a fresh process's first call (what prewarm stores)
            torch._dynamo.reset()
            compiled = torch.compile(model, backend="tpu", fullgraph=True)
            out, ref = compiled(*inputs), model(*inputs)
            out, ref = getattr(out, "logits", out), getattr(ref, "logits", ref)
            errors.append((out - ref).abs().max().item())
            sums.append(out.double().sum().item())
    cache_warnings = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    print(json.dumps({"stats": torchtpu.stats(), "max_error": max(errors), "sums": sums,
                      "cache_warnings": cache_warnings}))


if __name__ == "__main__":
    main(sys.argv[1])
