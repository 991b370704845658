"""Masking at lowering time for bucketed programs (see passes/pad_safety.py; the plan's data is torchtpu/plans.py).

A bucketed program knows each bucketed symbol twice: its bucket value (a static int, the
program's shapes) and its true value (an element of the `torchtpu_true_sizes` input). For a
node the analysis marked, `before` sets the padded positions of its arguments to the
reduction's neutral value with a `where` (so NaN/inf in padding cannot leak), and `after`
corrects divisors (mean, var). Unmarked nodes pass through untouched.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax
import torch

from torchtpu import plans
from torchtpu.plans import evaluate

aten = torch.ops.aten


class Padding:
    """The bucket and true values of one program's bucketed symbols."""

    def __init__(self, bucket: dict, true: dict):
        self.bucket = bucket
        self.true = true

    @classmethod
    def bind(cls, gm, spec, env) -> "Padding | None":
        """The Padding of a bucketed graph being lowered for `spec` (None when not bucketed)."""
        plan = gm.meta.get(plans.PLAN)
        if not isinstance(plan, plans.BucketPlan):
            return None
        node = next(n for n in gm.graph.nodes if n.op == "placeholder" and n.meta.get(plans.TRUE_SIZES))
        sizes = env[node]
        bucket = {s: (spec[i] if d is None else spec[i].shape[d]) for s, (i, d) in zip(plan.symbols, plan.sources)}
        true = {s: sizes[k] for k, s in enumerate(plan.symbols)}
        return cls(bucket, true)

    # --- masks -------------------------------------------------------------------------------
    def dim_mask(self, factors):
        """bool[n]: which positions of a dim with these factors are real."""
        padded = [int(evaluate(f, self.bucket)) for f in factors]
        iota = lax.iota(jnp.int64, math.prod(padded))
        keep, stride = jnp.ones(iota.shape, jnp.bool_), math.prod(padded)
        for p, f in zip(padded, factors):
            stride //= p
            keep = keep & ((iota // stride) % p < evaluate(f, self.true))
        return keep

    def count(self, dims, env) -> object:
        return math.prod(evaluate(f, env) for _, factors in dims for f in factors)

    def mask(self, x, dim, factors, fill):
        shape = [1] * x.ndim
        shape[dim] = x.shape[dim]
        return jnp.where(self.dim_mask(factors).reshape(shape), x, _fill(fill, x.dtype))

    # --- the hooks lower_node calls ------------------------------------------------------------
    def before(self, node, args, kwargs):
        spec = node.meta.get(plans.MASK)
        if spec is None:
            return args, kwargs
        args = list(args)
        for i, dim, factors, fill in spec.premask:
            args[i] = self.mask(args[i], dim, factors, fill)
        for i, expr in spec.true_args:
            args[i] = evaluate(expr, self.true)
        if spec.indices:
            args[1] = self._indices(list(args[1]), spec.indices)
        if spec.after == "keys":
            kwargs = dict(kwargs)
            ((dim, factors),) = spec.dims
            keep = self.dim_mask(factors).reshape((1,) * (args[0].ndim - 1) + (-1,))
            mask = kwargs.get("attn_mask")
            if mask is None:
                kwargs["attn_mask"] = keep
            elif mask.dtype == jnp.bool_:
                kwargs["attn_mask"] = mask & keep
            else:
                kwargs["attn_mask"] = jnp.where(keep, mask, -jnp.inf)
        return tuple(args), kwargs

    def rule_for(self, node, rule):
        """The rule to lower `node` with: its own; for a slice or select counted from the end of a
        padded dim (mask "from_end") one that starts at true size + start (a slice keeps the
        length it has at the bucket's size, the shape the rest of the program sees); for a cat
        along a padded dim (mask "cat") the plain cat, then each piece after a padded one
        written again at the true end of the pieces before it (in order, so each piece's
        padding is overwritten by the next piece's real positions)."""
        spec = node.meta.get(plans.MASK)
        if spec is None or spec.after not in ("from_end", "cat"):
            return rule
        if spec.after == "cat":
            return self._cat_rule(rule, spec.dims)
        ((dim, factors),) = spec.dims
        size = evaluate(factors[0], self.true)

        def select(ctx, x, dim_, index):
            return lax.dynamic_index_in_dim(x, size + index, axis=dim, keepdims=False)

        def slice_from_end(ctx, x, dim_=0, start=None, end=None, step=1):
            length = len(range(x.shape[dim])[start:end:step])
            span = (length - 1) * step + 1 if length else 0
            y = lax.dynamic_slice_in_dim(x, jnp.maximum(size + start, 0), span, axis=dim)
            return lax.slice_in_dim(y, 0, span, step, axis=dim)

        return select if node.target is aten.select.int else slice_from_end

    def _cat_rule(self, rule, pieces):
        dim = pieces[0][0]

        def cat_at_true_ends(ctx, tensors, dim_=0):
            out = rule(ctx, tensors, dim_)
            offset, moved = 0, False
            for t, (_, factors) in zip(tensors, pieces):
                if t.ndim != out.ndim:  # a legacy empty 1-d piece, which cat skips
                    continue
                if moved:
                    out = lax.dynamic_update_slice_in_dim(out, t.astype(out.dtype), offset, axis=dim)
                offset = offset + evaluate(factors[0], self.true)
                moved = moved or any(_is_bucketed(f, self.true) for f in factors)
            return out

        return cat_at_true_ends

    def _indices(self, indices, plan):
        """index_put's or index's index list: padded entries out of bounds (the scatter drops
        them), negative positions into a padded dim counted from its true end."""
        for k, kind, factors in plan:
            idx = indices[k].astype(jnp.int64)
            if kind == "drop":
                idx = jnp.where(self.dim_mask(factors), idx, jnp.iinfo(jnp.int64).max)
            else:
                idx = jnp.where(idx < 0, idx + evaluate(factors[0], self.true), idx)
            indices[k] = idx
        return indices

    def after(self, node, args, kwargs, out):
        spec = node.meta.get(plans.MASK)
        if spec is None or spec.after in ("", "keys", "from_end", "cat"):
            return out
        if spec.after == "rescale":
            ratio = self.count(spec.dims, self.bucket) / self.count(spec.dims, self.true)
            return out * ratio.astype(out.dtype)
        return self._var(node, args[0], spec)

    def _var(self, node, x, spec):
        """Variance (and mean) over a padded dim, from the zero-masked argument."""
        dims = plans.dims_of(plans.schema_arg(node, "dim", None), x.ndim)
        keepdim = bool(plans.schema_arg(node, "keepdim", False))
        if node.target is aten.var.dim:
            correction = 1 if plans.schema_arg(node, "unbiased", True) in (None, True) else 0
        else:
            correction = plans.schema_arg(node, "correction", None)
            correction = 1 if correction is None else correction
        padded = {d for d, _ in spec.dims}
        n = self.count(spec.dims, self.true) * math.prod(x.shape[d] for d in dims if d not in padded)
        acc = jnp.float32 if x.dtype in (jnp.bfloat16, jnp.float16) else x.dtype
        xf = x.astype(acc)
        keep = jnp.ones(xf.shape, jnp.bool_)
        for d, factors in spec.dims:
            shape = [1] * x.ndim
            shape[d] = x.shape[d]
            keep = keep & self.dim_mask(factors).reshape(shape)
        mean = jnp.sum(xf, axis=tuple(dims), keepdims=True) / n.astype(acc)
        dev = jnp.where(keep, xf - mean, 0)
        var = jnp.sum(dev * dev, axis=tuple(dims), keepdims=keepdim) / (n - correction).astype(acc)
        if node.target is aten.var_mean.correction:
            return var, (mean if keepdim else jnp.squeeze(mean, axis=tuple(dims)))
        return var


def _is_bucketed(factor, true: dict) -> bool:
    """Whether a factor depends on a bucketed symbol (its bucket value may exceed its true one)."""
    return bool(getattr(factor, "free_symbols", set()) & set(true))


def _fill(kind, dtype):
    if kind == plans.ZERO:
        return jnp.zeros((), dtype)
    if kind == plans.ONE:
        return jnp.ones((), dtype)
    if kind in (plans.FALSE, plans.TRUE):
        return jnp.asarray(kind == plans.TRUE, dtype)
    low = kind == plans.NEG_INF
    if dtype == jnp.bool_:
        return jnp.asarray(not low, dtype)
    if jnp.issubdtype(dtype, jnp.integer):
        info = jnp.iinfo(dtype)
        return jnp.asarray(info.min if low else info.max, dtype)
    return jnp.asarray(-jnp.inf if low else jnp.inf, dtype)
