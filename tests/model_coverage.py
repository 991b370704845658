"""The model-coverage suite: every zoo model (model_zoo.py) in three modes against eager.

Modes:
- "float32": the compiled float32 forward vs eager's, relative L2 error <= 1e-4.
- "bfloat16": the compiled bfloat16 forward judged against the float32 eager output of the
  same (bf16-rounded) weights: no worse than eager bf16 itself, i.e. its relative error is at
  most max(2e-2, 1.5 x eager-bf16's own).
- "train": float32, train mode (dropout off): forward + backward of a loss on the output;
  every parameter gradient vs eager's, relative L2 <= 1e-3, with a floor (1e-4 of the whole
  gradient's norm) for gradients that are zero in exact arithmetic.
- "shapes" (text models only): nothing marked dynamic, the model is called on a fixed set
  of random (batch, length) shapes, then on as many new ones; it passes when every graph
  after the first (static) one bucketed, both rounds together took at most
  SHAPES_MAX_COMPILES XLA compiles, and every output is within 1e-4 of eager. Otherwise it
  records why its graphs were compiled per exact size (the bucketing pass's refusal); its
  calls stop once past SHAPES_MAX_COMPILES, where the verdict can no longer change.
Every mode also counts host ops (ops the device cannot run, run eagerly between device
programs): a model that needs none must have none.

The expected-failure table coverage_expected.json keeps the failures the project chooses to
keep, each with its reason; an entry that passes fails its test, so the table stays true.
Regenerate it with: TORCHTPU_COVERAGE_REGEN=1 .venv/bin/python -m pytest tests/test_coverage.py
The whole table (model x mode: status, error, host ops, first-call seconds) is written by
`make coverage` to docs/coverage.md.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import time
from pathlib import Path

import torch
import torch._dynamo
from torch import nn
from torch.utils import _pytree as pytree

import torchtpu
from model_zoo import BY_NAME, Entry

TABLE = Path(__file__).with_name("coverage_expected.json")


def full() -> bool:
    """`make coverage`: more shapes, and the shapes mode of models unrolled per length too."""
    return os.environ.get("TORCHTPU_COVERAGE_FULL") == "1"



MODES = ("float32", "bfloat16", "train", "shapes")
# The "shapes" rounds: (batch, length) drawn in [1, SHAPES_BATCH] x [1, SHAPES_LENGTH] (capped
# at the model's positions); TORCHTPU_COVERAGE_SHAPES sets the calls per round (8; 24 in `make coverage`).
# TORCHTPU_COVERAGE_LENGTH sets SHAPES_LENGTH: 128 in `make test` (two or three buckets; what it
# guards, that every graph after the first buckets, shows at these lengths as at 512, with half
# the compiles), 512 in `make coverage` and the bucketing benchmark.
SHAPES_CALLS = int(os.environ.get("TORCHTPU_COVERAGE_SHAPES") or (24 if full() else 8))
SHAPES_LENGTH = int(os.environ.get("TORCHTPU_COVERAGE_LENGTH") or (512 if full() else 128))
SHAPES_BATCH, SHAPES_MAX_COMPILES = 8, 8
BATCH = 2
F32_TOL, GRAD_TOL, GRAD_FLOOR = 1e-4, 1e-3, 1e-4
BF16_FLOOR, BF16_FACTOR = 2e-2, 1.5


@dataclasses.dataclass
class Result:
    model: str
    mode: str
    status: str                 # "pass", "mismatch", "host_ops", "error", "exact" (shapes)
    detail: str = ""
    error: float | None = None  # the measured relative error (worst gradient in "train")
    bound: float | None = None  # what it had to stay under
    host_ops: int = 0
    first_call_s: float | None = None
    compiles: tuple[int, int] | None = None  # shapes mode: XLA compiles in each round
    refusals: tuple[str, ...] = ()            # shapes mode: why graphs compiled per exact size

    def row(self) -> dict:
        return dataclasses.asdict(self)


def regenerating() -> bool:
    return os.environ.get("TORCHTPU_COVERAGE_REGEN") == "1"


def load_table() -> dict:
    return json.loads(TABLE.read_text()) if TABLE.exists() else {}


def case_id(model: str, mode: str) -> str:
    return f"{model}/{mode}"


def build(entry: Entry, dtype=torch.float32, train=False) -> nn.Module:
    torch.manual_seed(0)
    model = entry.build()
    if entry.prepare is not None:
        entry.prepare(model)
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    return model.to(dtype).train(train)


def inputs_for(entry: Entry, dtype=torch.float32, batch=BATCH, length=None, seed=1) -> dict:
    kwargs = entry.inputs(torch.Generator().manual_seed(seed), batch, length or entry.length)
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in kwargs.items()}


def primary(out) -> torch.Tensor:
    """The model's main result: logits, last_hidden_state, sample or the tensor itself."""
    leaves = [x for x in pytree.tree_leaves(out.to_tuple() if hasattr(out, "to_tuple") else out)
              if isinstance(x, torch.Tensor) and x.is_floating_point()]
    return leaves[0]


def relative_error(actual: torch.Tensor, expected: torch.Tensor, floor: float = 0.0) -> float:
    actual, expected = actual.detach().double(), expected.detach().double()
    if not torch.isfinite(actual).all() and torch.isfinite(expected).all():
        return float("inf")
    diff = (actual - expected).nan_to_num().norm().item()
    return diff / max(expected.nan_to_num().norm().item(), floor, 1e-30)


def _compiled_call(model, kwargs):
    torch._dynamo.reset()
    torchtpu.reset_stats()
    compiled = torch.compile(model, backend="tpu", fullgraph=True)
    t0 = time.perf_counter()
    out = compiled(**kwargs)
    return out, time.perf_counter() - t0, torchtpu.stats()["fallback_ops"]


def applies(entry: Entry, mode: str) -> bool:
    return mode != "shapes" or entry.text


def run(entry: Entry, mode: str) -> Result:
    try:
        with torch._dynamo.config.patch(dict(entry.dynamo_config)):
            return {"float32": _float32, "bfloat16": _bfloat16, "train": _train, "shapes": _shapes}[mode](entry)
    except Exception as e:  # the suite reports it; the test decides
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return Result(entry.name, mode, "error", f"{type(e).__name__}: {first}"[:300])


def _judge(entry, mode, error, bound, host_ops, seconds) -> Result:
    if host_ops:
        status, detail = "host_ops", f"{host_ops} host ops"
    elif not error <= bound:
        status, detail = "mismatch", f"relative error {error:.3g} > {bound:.3g}"
    else:
        status, detail = "pass", ""
    return Result(entry.name, mode, status, detail, error, bound, host_ops, round(seconds, 2))


def _float32(entry: Entry) -> Result:
    model, kwargs = build(entry), inputs_for(entry)
    with torch.no_grad():
        expected = primary(model(**kwargs))
        out, seconds, host = _compiled_call(model, kwargs)
    return _judge(entry, "float32", relative_error(primary(out), expected), F32_TOL, host, seconds)


def _bfloat16(entry: Entry) -> Result:
    model = build(entry, torch.bfloat16)
    reference = copy.deepcopy(model).float()  # the same bf16-rounded weights, computed in f32
    kwargs = inputs_for(entry, torch.bfloat16)
    with torch.no_grad():
        expected = primary(reference(**{k: v.float() if v.is_floating_point() else v for k, v in kwargs.items()}))
        eager_error = relative_error(primary(model(**kwargs)), expected)
        out, seconds, host = _compiled_call(model, kwargs)
    bound = max(BF16_FLOOR, BF16_FACTOR * eager_error)
    return _judge(entry, "bfloat16", relative_error(primary(out), expected), bound, host, seconds)


def _loss(out) -> torch.Tensor:
    """A fixed random projection of the output. Not `out.pow(2).mean()`: after a final
    LayerNorm/RMSNorm that is constant, and every gradient upstream is rounding noise."""
    y = primary(out).float()
    return (y * torch.randn(y.shape, generator=torch.Generator().manual_seed(3))).mean()


def _train(entry: Entry) -> Result:
    model = build(entry, train=True)
    twin = copy.deepcopy(model)
    kwargs = inputs_for(entry)
    _loss(model(**kwargs)).backward()
    torch._dynamo.reset()
    torchtpu.reset_stats()
    compiled = torch.compile(twin, backend="tpu", fullgraph=True)
    t0 = time.perf_counter()
    _loss(compiled(**kwargs)).backward()
    seconds, host = time.perf_counter() - t0, torchtpu.stats()["fallback_ops"]
    expected = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    actual = {n: p.grad for n, p in twin.named_parameters()}
    if not expected:
        raise AssertionError("the loss reaches no parameter")
    floor = GRAD_FLOOR * torch.cat([g.double().flatten() for g in expected.values()]).norm().item()
    worst, worst_name = 0.0, ""
    for name, grad in expected.items():
        got = actual.get(name)
        err = float("inf") if got is None else relative_error(got, grad, floor)
        if not err <= worst:
            worst, worst_name = err, name
    result = _judge(entry, "train", worst, GRAD_TOL, host, seconds)
    if result.status == "mismatch":
        result.detail += f" (grad of {worst_name})"
    return result


def _shapes(entry: Entry) -> Result:
    import random

    from torchtpu import events

    model, rng = build(entry), random.Random(0)
    positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    limit = min(entry.max_length or SHAPES_LENGTH, positions or SHAPES_LENGTH)
    torch._dynamo.reset()
    torchtpu.reset_stats()
    events.clear()
    compiled = torch.compile(model, backend="tpu", fullgraph=True)
    t0, worst, compiles, start = time.perf_counter(), 0.0, [], torchtpu.stats()["xla_compiles"]
    with torch.no_grad():
        for _round in range(2):
            before = torchtpu.stats()["xla_compiles"]
            for _ in range(SHAPES_CALLS):
                if torchtpu.stats()["xla_compiles"] - start > SHAPES_MAX_COMPILES:
                    break  # compiled past the bound: the verdict is "exact" whatever follows
                batch, length = rng.randint(1, SHAPES_BATCH), rng.randint(1, limit)
                kwargs = entry.inputs(torch.Generator().manual_seed(rng.randrange(1 << 30)), batch, length)
                worst = max(worst, relative_error(primary(compiled(**kwargs)), primary(model(**kwargs))))
            compiles.append(torchtpu.stats()["xla_compiles"] - before)
    statuses = [e for e in events.events() if e["kind"] == "bucketing"]
    refusals = sorted({e["reason"] for e in statuses if e["status"] == "exact"})
    host = torchtpu.stats()["fallback_ops"]
    result = _judge(entry, "shapes", worst, F32_TOL, host, time.perf_counter() - t0)
    result.compiles, result.refusals = tuple(compiles), tuple(refusals)
    result.detail = f"compiles {compiles[0]} then {compiles[1]}" + (f"; {result.detail}" if result.detail else "")
    if result.status == "pass" and (refusals or sum(compiles) > SHAPES_MAX_COMPILES):
        result.status = "exact"
        result.detail += "; exact sizes: " + ("; ".join(refusals) if refusals else "too many buckets")
    return result


def expected_failure(table: dict, model: str, mode: str) -> dict | None:
    return table.get(case_id(model, mode))


def write_table(results: list[Result]) -> None:
    """Entry by entry, so a run over a subset updates just the cases it ran."""
    table = load_table()
    for r in results:
        if r.status == "pass":
            table.pop(case_id(r.model, r.mode), None)
        else:
            old = table.get(case_id(r.model, r.mode), {})
            table[case_id(r.model, r.mode)] = {"status": r.status, "detail": r.detail,
                                               "reason": old.get("reason", "TODO: why this is kept")}
    TABLE.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")


def check(result: Result, table: dict) -> None:
    """Raises AssertionError unless the result is a pass, or the failure the table expects."""
    expected = expected_failure(table, result.model, result.mode)
    where = case_id(result.model, result.mode)
    if expected is None:
        assert result.status == "pass", f"{where}: {result.status}: {result.detail}"
        return
    assert result.status != "pass", f"{where} passes now: remove it from {TABLE.name} (or regenerate)"
    assert result.status == expected["status"], (
        f"{where}: {result.status} ({result.detail}), the table expects {expected['status']}")


def models() -> list[str]:
    return list(BY_NAME)


def render(results: list[Result], table: dict) -> str:
    """docs/coverage.md: model x mode, with the counts per mode and each kept failure's reason."""
    by = {(r.model, r.mode): r for r in results}
    lines = ["| model | family | " + " | ".join(MODES) + " | seconds: first call per mode (shapes: both rounds) |",
             "|---|---|" + "---|" * len(MODES) + "---|"]
    for name in dict.fromkeys(r.model for r in results):
        cells = []
        for mode in MODES:
            r = by.get((name, mode))
            if r is None:
                cells.append("—")
            elif r.status == "pass":
                cells.append(f"pass ({r.error:.1e})")
            else:
                cells.append(f"**{r.status}**: {r.detail}")
        seconds = " / ".join("—" if by.get((name, m)) is None or by[(name, m)].first_call_s is None
                             else f"{by[(name, m)].first_call_s:.1f}" for m in MODES)
        lines.append(f"| {name} | {BY_NAME[name].family} | " + " | ".join(cells) + f" | {seconds} |")
    counts = []
    for mode in MODES:
        ran = [r for r in results if r.mode == mode]
        counts.append(f"- {mode}: {sum(r.status == 'pass' for r in ran)}/{len(ran)} pass, "
                      f"{sum(r.host_ops for r in ran)} host ops in all")
    kept = [f"- `{k}`: {v['status']} — {v['reason']}" for k, v in sorted(table.items())]
    return "\n".join(lines + [""] + counts + ([""] + ["Kept failures (tests/coverage_expected.json):"] + kept
                                                if kept else []))


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Run the model-coverage suite and print its table.")
    parser.add_argument("models", nargs="*", help="zoo names (default: all)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--write", metavar="MD", help="also write the table into this markdown file "
                        "(between the <!-- coverage --> markers)")
    args = parser.parse_args(argv)
    results = []
    for name in args.models or models():
        for mode in args.modes.split(","):
            if not applies(BY_NAME[name], mode) or (mode == "shapes" and BY_NAME[name].unrolled and not full()):
                continue
            results.append(run(BY_NAME[name], mode))
            r = results[-1]
            print(f"{name:14s} {mode:9s} {r.status:9s} {r.detail}", flush=True)
    text = render(results, load_table())
    print(text)
    if args.write:
        path = Path(args.write)
        doc = path.read_text()
        start, end = "<!-- coverage -->", "<!-- /coverage -->"
        head, rest = doc.split(start, 1)
        path.write_text(head + start + "\n" + text + "\n" + end + rest.split(end, 1)[1])
    table = load_table()
    return int(any(_check_failed(r, table) for r in results))


def _check_failed(result, table) -> bool:
    try:
        check(result, table)
    except AssertionError as e:
        print(f"FAIL {e}")
        return True
    return False


if __name__ == "__main__":
    import sys

    sys.exit(main())
