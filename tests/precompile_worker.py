"""A fresh process that loads precompiled artifacts (tests/test_precompile.py) and prints JSON.

    python precompile_worker.py DIR    DIR holds llama.tpu (inference), train.tpu (a loss and its
                                       backward), dynamic.tpu (sequence length symbolic) and
                                       bf16.tpu (the model in bfloat16)
"""
from __future__ import annotations

import json
import sys
import time
import warnings

t0 = time.perf_counter()
import torch  # noqa: E402

import torchtpu  # noqa: E402
from precompile_models import llama, loss_fn  # noqa: E402

folder = sys.argv[1]
out = {"warnings": []}
model = llama()
ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    start = time.perf_counter()
    run = torchtpu.precompile.load(f"{folder}/llama.tpu", model)
    logits = run(ids).logits
    out["inference_first_s"] = time.perf_counter() - start
    with torch.no_grad():
        out["inference_error"] = (logits - model(ids).logits).abs().max().item()
    out["after_inference"] = torchtpu.stats()

    train = torchtpu.precompile.load(f"{folder}/train.tpu")
    loss = train(model, ids)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    loss_fn(model, ids).backward()
    out["train_grad_error"] = max((g - p.grad).abs().max().item() for g, p in zip(grads, model.parameters()))
    out["after_train"] = torchtpu.stats()

    dynamic = torchtpu.precompile.load(f"{folder}/dynamic.tpu", model)
    errors = []
    for length in (16, 5, 27):
        x = torch.randint(0, 256, (2, length), generator=torch.Generator().manual_seed(length))
        with torch.no_grad():
            errors.append((dynamic(x).logits - model(x).logits).abs().max().item())
    out["dynamic_errors"] = errors
    out["after_dynamic"] = torchtpu.stats()

    half = llama().to(torch.bfloat16)
    bf16 = torchtpu.precompile.load(f"{folder}/bf16.tpu", half)
    with torch.no_grad():
        reference = model(ids).logits
        out["bf16_error_vs_f32"] = (bf16(ids).logits.float() - reference).abs().max().item()
        out["eager_bf16_error_vs_f32"] = (half(ids).logits.float() - reference).abs().max().item()
    out["after_bf16"] = torchtpu.stats()
out["loaded"] = [run.loaded, train.loaded, dynamic.loaded, bf16.loaded]
out["warnings"] = [str(w.message) for w in caught if "torchtpu" in str(w.message)]
print(json.dumps(out))
