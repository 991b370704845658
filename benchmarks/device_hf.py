"""Hugging Face flows on the eager tpu device: what docs/device.md reports for them.

    python -m benchmarks.device_hf [--flows logits,training,dynamic,static] [--new-tokens 6]

The tiny Llama of tests/test_device_hf.py (2 layers, hidden 32, vocab 128, a 6-token prompt).
Prints: the logits' relative error against the CPU (`.to("tpu")`, `device_map="tpu"`,
`torch.compile(backend="tpu")`); the three AdamW losses' largest difference from the CPU's and
the parameters' after them; then for greedy generate() with a dynamic and a static cache (the
static one decodes through transformers' own compile with backend="tpu"): the per-op programs
and Dynamo graphs each generated token added, the warm milliseconds per token, and whether the
tokens equal the CPU's. Flows in one process share programs (both generate flows run the same
bookkeeping ops on the growing token tensor): run each generate flow in its own process, with an
empty compile cache (TORCHTPU_CACHE_DIR), for per-token counts. Programs count the per-op
programs of both kinds (one per exact size, and one per size bucket: device/bucketed.py).
"""
from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time

import torch

import torchtpu
import torchtpu.device

TPU = "tpu"


def _llama(cache=None):
    from benchmarks.models import hf_llama

    torch.manual_seed(0)
    model = hf_llama(layers=2, vocab=128, hidden=32, heads=4, kv_heads=2)
    model.config.use_cache = model.generation_config.use_cache = True
    model.generation_config.cache_implementation = cache
    return model


def _error(got, expected) -> float:
    return ((got.cpu() - expected).abs().max() / expected.abs().max()).item()


def logits(ids) -> None:
    from transformers import AutoModelForCausalLM

    cpu = _llama()
    with torch.no_grad():
        expected = cpu(ids).logits
        moved = copy.deepcopy(cpu).to(TPU)
        print(f"logits, .to(tpu): relative error {_error(moved(ids.to(TPU)).logits, expected):.1e}")
        with tempfile.TemporaryDirectory() as d:
            cpu.save_pretrained(d)
            loaded = AutoModelForCausalLM.from_pretrained(d, device_map=TPU)
        print(f"logits, device_map=tpu: relative error {_error(loaded(ids.to(TPU)).logits, expected):.1e}")
        compiled = torch.compile(moved, backend=TPU, fullgraph=True)
        print(f"logits, compiled: relative error {_error(compiled(ids.to(TPU), use_cache=False).logits, expected):.1e}")


def training(ids) -> None:
    cpu = _llama().train()
    dev = copy.deepcopy(cpu).to(TPU)
    losses = {}
    for model in (cpu, dev):
        on = next(model.parameters()).device.type
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(3):
            optimizer.zero_grad()
            loss = model(ids.to(on), labels=ids.to(on), use_cache=False).loss
            loss.backward()
            optimizer.step()
            losses.setdefault(on, []).append(loss.item())
    loss_diff = max(abs(a - b) for a, b in zip(losses["cpu"], losses[TPU]))
    param_diff = max((p.detach().cpu() - q.detach()).abs().max().item() for p, q in zip(dev.parameters(),
                                                                                      cpu.parameters()))
    print(f"AdamW, 3 steps: losses {losses['cpu']}, largest loss difference {loss_diff:.1e}, "
          f"parameters {param_diff:.1e}")


class _Steps:
    def __init__(self):
        self.marks = []

    def __call__(self, input_ids, scores, **kwargs):
        s = torchtpu.stats()
        programs = s.get("eager_programs", 0) + s.get("eager_bucketed_programs", 0)
        self.marks.append((time.perf_counter(), programs, s.get("dynamo_graphs", 0)))
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def _generate(model, ids, new_tokens, steps=None):
    from transformers import StoppingCriteriaList

    with torch.no_grad():
        return model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                              stopping_criteria=StoppingCriteriaList([steps] if steps else []))


def generate(ids, new_tokens: int, cache: str) -> None:
    cpu = _llama(None if cache == "dynamic" else cache)
    expected = _generate(cpu, ids, new_tokens)
    model = copy.deepcopy(cpu).to(TPU)
    cold, warm = _Steps(), _Steps()
    got = _generate(model, ids.to(TPU), new_tokens, cold)
    _generate(model, ids.to(TPU), new_tokens, warm)
    per_token = [(b[1] - a[1], b[2] - a[2]) for a, b in zip(cold.marks, cold.marks[1:])]
    ms = statistics.median(1e3 * (b[0] - a[0]) for a, b in zip(warm.marks, warm.marks[1:]))
    s = torchtpu.stats()
    print(f"generate, {cache} cache: (programs, graphs) per decode step {per_token}; "
          f"warm {ms:.1f} ms per token; tokens equal the CPU's: {torch.equal(got.cpu(), expected)}; "
          f"per-op programs {s.get('eager_programs', 0)} exact and {s.get('eager_bucketed_programs', 0)} bucketed, "
          f"{s.get('eager_bucket_refusals', 0)} bucketing refusals, {s.get('eager_pads', 0)} storages padded, "
          f"{s.get('eager_unpads', 0)} unpadded")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flows", default="logits,training,dynamic,static")
    parser.add_argument("--new-tokens", type=int, default=6)
    args = parser.parse_args()
    ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(1))
    for flow in args.flows.split(","):
        if flow in ("dynamic", "static"):
            generate(ids, args.new_tokens, flow)
        else:
            {"logits": logits, "training": training}[flow](ids)


if __name__ == "__main__":
    main()
