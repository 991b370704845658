"""BucketedGraph: runs a bucketed graph's programs on true-size arguments.

Pads each input up to its bucket (zeros at the end of each padded dim), passes the symbols'
true values as one int64 vector, calls the driver's runner (one executable per bucket), and
slices the outputs back to their true sizes.
"""
from __future__ import annotations

import math

import torch

from torchtpu import events
from torchtpu.compiler.dtypes import short_name
from torchtpu import plans
from torchtpu.plans import evaluate


def wrap(runner, gm: torch.fx.GraphModule, options=None):
    """`runner` itself for static or refused graphs, else a BucketedGraph, from the plan the
    bucketing pass left on `gm` (torchtpu/plans.py); records which, and why."""
    plan = gm.meta.get(plans.PLAN)
    name = getattr(runner, "name", "graph")
    cid = torch._guards.CompileContext.current_compile_id()
    common = {"graph": name, "compile_id": str(cid) if cid is not None else None}
    if plan is None:
        events.record("bucketing", status="static", **common)
        return runner
    if isinstance(plan, plans.Refusal):
        events.record("bucketing", status="exact", reason=plan.reason, decisions=plan.decisions, **common)
        return runner
    events.record("bucketing", status="bucketed", symbols=dict(zip(map(str, plan.symbols), plan.names)),
                  policy=plan.policy, pad_safety=plan.counts, decisions=plan.decisions, **common)
    return BucketedGraph(runner, plan)


class BucketedGraph:
    """Args:
        runner: the driver's CompiledGraph (one executable per concrete signature).
        plan: the BucketPlan the bucketing pass left on the graph.
    """

    _boxed_call = True

    def __init__(self, runner, plan: plans.BucketPlan):
        self.runner = runner
        self.plan = plan
        self.name = getattr(runner, "name", "graph")
        self.buckets: dict[tuple, str] = {}

    def __call__(self, args: list):
        plan = self.plan
        true = [int(_size_at(args, src)) for src in plan.sources]
        bucket = plans.buckets_for(true, plan)
        true_env, bucket_env = dict(zip(plan.symbols, true)), dict(zip(plan.symbols, bucket))
        for a, e in zip(args, plan.inputs):  # an int input that sizes no tensor input: not bucketed
            if e is not None and not isinstance(e, tuple) and e.is_Symbol and e not in true_env:
                true_env[e] = bucket_env[e] = int(a)
        key = tuple(bucket)
        if key not in self.buckets:
            self.buckets[key] = bucket_name(plan, args, bucket_env)
            events.record("bucket", graph=self.name, bucket=self.buckets[key],
                          sizes=dict(zip(plan.names, true)), buckets=dict(zip(plan.names, bucket)))
        padded = [_pad(a, exprs, bucket_env) for a, exprs in zip(args, plan.inputs)]
        padded.append(torch.tensor(true, dtype=torch.int64))
        args.clear()
        outs = self.runner(padded)
        return [_unpad(o, kind, true_env, bucket_env) for o, kind in zip(outs, plan.outputs)]


def _size_at(args, source):
    index, dim = source
    return args[index] if dim is None else args[index].shape[dim]


def _pad(value, exprs, env):
    if isinstance(exprs, tuple) and isinstance(value, torch.Tensor):
        target = [int(evaluate(e, env)) for e in exprs]
        if list(value.shape) == target:
            return value
        out = value.new_zeros(target)
        out[tuple(slice(0, s) for s in value.shape)] = value
        return out
    if exprs is not None and not isinstance(exprs, tuple):  # a SymInt input: its bucket value
        return int(evaluate(exprs, env))
    return value


def _unpad(value, kind, true_env, bucket_env):
    what, layout = kind
    if what == "size":
        return evaluate(layout, true_env)
    if what != "tensor" or not isinstance(value, torch.Tensor):
        return value
    padded = [[int(evaluate(f, bucket_env)) for f in dim] for dim in layout]
    real = [[int(evaluate(f, true_env)) for f in dim] for dim in layout]
    if padded == real:
        return value
    flat = [p for dim in padded for p in dim]
    t = value.reshape(flat)[tuple(slice(0, r) for dim in real for r in dim)]
    return t.reshape([math.prod(dim) for dim in real]).contiguous()


def bucket_name(plan, args, bucket_env) -> str:
    """Readable bucket name: the padded inputs' shapes, a bucketed dim as `s6≤64`, e.g. `i64[s6≤8,s81≤64]`."""
    names = []
    for a, exprs in zip(args, plan.inputs):
        if not (isinstance(exprs, tuple) and isinstance(a, torch.Tensor)):
            continue
        if not any(plans.is_padded_expr(e, plan) for e in exprs):
            continue
        dims = [f"{_label(e, plan)}≤{int(evaluate(e, bucket_env))}" if plans.is_padded_expr(e, plan)
                else str(int(e)) for e in exprs]
        names.append(f"{short_name(a.dtype)}[{','.join(dims)}]")
    return ", ".join(dict.fromkeys(names))


def _label(expr, plan) -> str:
    return str(expr)  # Dynamo's symbol name, as in its guard and recompile messages
