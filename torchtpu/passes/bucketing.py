"""Shape bucketing: a graph with symbolic sizes gets one program per bucket of sizes.

The pass picks the symbols to bucket (those that size a tensor input), runs the pad-safety
analysis, and — when every op is harmless or maskable — marks the masked nodes
(`meta["torchtpu_mask"]`), appends one placeholder, `torchtpu_true_sizes` (int64[k]: the
true value of each bucketed symbol, so masks and divisors use them at run time), and leaves a
BucketPlan in `gm.meta["torchtpu_bucketing"]` (torchtpu/plans.py), which the driver hands to the
runtime (runtime/bucketed.py: a BucketedGraph pads inputs and slices outputs). When bucketing
is off or unsafe the plan is a Refusal with the reason, and the graph is compiled per exact
size as before.
"""
from __future__ import annotations

import torch

from torchtpu.options import BUCKETING_MIN, BUCKETING_MIN_LAST
from torchtpu.passes import pad_safety
from torchtpu.plans import LAYOUT, MASK, PLAN, TRUE_SIZES, BucketPlan, Refusal, bucket_for, buckets_for  # noqa: F401

def paired_symbols(gm: torch.fx.GraphModule, symbols: set) -> list[set]:
    """Classes of symbols whose dims meet in some op: at the same position from the right in
    two operands of one op (broadcasting, attention's keys and values), or contracted against
    each other. Dynamo may keep two such symbols apart (a KV cache's length and its attention
    mask's), yet their sizes are equal whenever the graph runs, so they must get equal buckets:
    one minimum and one bound per class. A class too many only pads more, never wrongly."""
    parent = {s: s for s in symbols}

    def find(s):
        while parent[s] is not s:
            s = parent[s]
        return s

    def union(a, b):
        if a in parent and b in parent:
            parent[find(a)] = find(b)

    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        shapes = [v.shape for v in (a.meta.get("val") for a in [node, *node.all_input_nodes])
                  if isinstance(v, torch.Tensor)]
        for k in range(1, max((len(sh) for sh in shapes), default=0) + 1):
            dims = {pad_safety.expr_of(sh[-k]) for sh in shapes if len(sh) >= k}
            syms = [d for d in dims if d.is_Symbol]
            for a in syms[1:]:
                union(a, syms[0])
        if node.target in pad_safety.CONTRACTIONS:  # mm's K of one operand against K of the other
            (i, d), (j, e) = pad_safety.CONTRACTIONS[node.target]
            a, b = node.args[i].meta["val"].shape[d], node.args[j].meta["val"].shape[e]
            union(pad_safety.expr_of(a), pad_safety.expr_of(b))
    classes: dict = {}
    for s in symbols:
        classes.setdefault(find(s), set()).add(s)
    return list(classes.values())


def _per_class(order, classes, values, pick):
    """Each symbol's value replaced by `pick` (min or max) over its class, None ignored."""
    of = {s: c for c in classes for s in c}
    by_symbol = dict(zip(order, values))
    out = []
    for s in order:
        known = [by_symbol[t] for t in of.get(s, {s}) if by_symbol.get(t) is not None]
        out.append(pick(known) if known else None)
    return out


def bucket_shapes(gm: torch.fx.GraphModule, options) -> torch.fx.GraphModule:
    """The pass (see module docstring). Leaves static graphs untouched."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    vals = [n.meta.get("val") for n in placeholders]
    symbols, sources, last = _symbols(vals)
    if not symbols:
        return gm
    policy = getattr(options, "bucketing", "pow2")
    if policy == "off":
        gm.meta[PLAN] = Refusal("bucketing is off (option bucketing='off')")
        return gm
    unbacked = sorted(str(s) for s in symbols if s not in sources)
    if unbacked:
        gm.meta[PLAN] = Refusal(f"sizes {unbacked} are not sizes of an input tensor")
        return gm
    analysis = pad_safety.analyze(gm, set(symbols))
    if analysis.unsafe is not None:
        u = analysis.unsafe
        gm.meta[PLAN] = Refusal(f"{u.op} at node {u.node}: {u.why}", pad_safety.describe(analysis))
        return gm
    order = sorted(symbols, key=lambda s: sources[s])
    for node, mask in analysis.masks.items():
        node.meta[MASK] = mask
    for node, layout in analysis.layouts.items():  # index checks skip padded entries (compiler/checks.py)
        node.meta[LAYOUT] = layout
    _add_true_sizes(gm, placeholders, vals, len(order))
    shape_env = _shape_env(vals)
    classes = paired_symbols(gm, set(order))
    gm.meta[PLAN] = BucketPlan(
        symbols=order,
        sources=[sources[s] for s in order],
        names=[_source_name(shape_env, s) for s in order],
        upper=_per_class(order, classes, [_upper(shape_env, s) for s in order], min),
        least=_per_class(order, classes, [BUCKETING_MIN_LAST if s in last else BUCKETING_MIN for s in order], max),
        inputs=[_input_exprs(v) for v in vals],
        outputs=[_output_kind(v, lay) for v, lay in zip(_output_vals(gm), pad_safety.output_layouts(gm, analysis))],
        policy=policy,
        decisions=pad_safety.describe(analysis),
        counts=analysis.summary(),
    )
    return gm


def _symbols(vals):
    """Symbols that size tensor inputs; for each one a (placeholder, dim) that is exactly it; and
    those that are exactly the last dim of some input (their buckets start at BUCKETING_MIN_LAST)."""
    symbols, sources, last = set(), {}, set()
    for i, v in enumerate(vals):
        if isinstance(v, torch.Tensor):
            for d, size in enumerate(v.shape):
                e = pad_safety.expr_of(size)
                symbols |= {s for s in e.free_symbols}
                if e.is_Symbol:
                    sources.setdefault(e, (i, d))
                    if d == v.dim() - 1:
                        last.add(e)
    for i, v in enumerate(vals):
        if isinstance(v, torch.SymInt) and v.node.expr.is_Symbol and v.node.expr in symbols:
            sources.setdefault(v.node.expr, (i, None))
    return symbols, sources, last


def _add_true_sizes(gm, placeholders, vals, k):
    fake_mode = next((v.fake_mode for v in vals if hasattr(v, "fake_mode")), None)
    with gm.graph.inserting_after(placeholders[-1]):
        node = gm.graph.placeholder(TRUE_SIZES)
    node.meta[TRUE_SIZES] = True
    if fake_mode is not None:
        with fake_mode:
            node.meta["val"] = torch.empty((k,), dtype=torch.int64)
    gm.recompile()


def _shape_env(vals):
    for v in vals:
        sizes = list(v.shape) if isinstance(v, torch.Tensor) else [v]
        for s in sizes:
            if isinstance(s, torch.SymInt):
                return s.node.shape_env
    return None


def _source_name(shape_env, sym) -> str:
    sources = getattr(shape_env, "var_to_sources", {}).get(sym) or []
    if not sources:
        return str(sym)
    name = sources[0].name
    return name() if callable(name) else str(name)


def _upper(shape_env, sym):
    rng = getattr(shape_env, "var_to_range", {}).get(sym)
    upper = getattr(rng, "upper", None)
    try:
        return int(upper) if upper is not None and upper.is_finite else None
    except (TypeError, AttributeError):
        return None


def _input_exprs(v):
    if isinstance(v, torch.Tensor):
        return tuple(pad_safety.expr_of(s) for s in v.shape)
    if isinstance(v, torch.SymInt):
        return v.node.expr
    return None


def _output_vals(gm):
    out = next(n for n in gm.graph.nodes if n.op == "output")
    values = out.args[0] if isinstance(out.args[0], (list, tuple)) else [out.args[0]]
    return [v.meta.get("val") if isinstance(v, torch.fx.Node) else v for v in values]


def _output_kind(val, layout):
    if isinstance(val, torch.Tensor):
        return ("tensor", layout if layout is not None else tuple((pad_safety.expr_of(s),) for s in val.shape))
    if isinstance(val, (torch.SymInt, torch.SymFloat)):
        return ("size", val.node.expr)
    return ("value", None)


__all__ = ["BucketPlan", "Refusal", "bucket_for", "buckets_for", "bucket_shapes", "paired_symbols"]
