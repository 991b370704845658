"""What the graph passes leave on a graph for the lowering and the runtimes: the node-meta keys,
shape bucketing's plan and masks, and size expressions.

The passes (passes/bucketing.py, pad_safety.py, index_checks.py) produce these; the lowering
(compiler/padding.py, checks.py), the runtimes (runtime/bucketed.py, device/bucketed.py) and the
cache key read them. Shared data, so it lives below all of them: it imports nothing of torchtpu
but the options' bucket sizes.
"""
from __future__ import annotations

import dataclasses

import sympy
import torch

from torchtpu.options import BUCKETING_MIN

# node.meta / gm.meta keys
PLAN = "torchtpu_bucketing"
TRUE_SIZES = "torchtpu_true_sizes"
MASK = "torchtpu_mask"
LAYOUT = "torchtpu_layout"  # a node's padded layout (a tuple of factors per dim): which of its entries are real
CHECK = "torchtpu_index_check"  # the run-time index checks a node's lowering emits (passes/index_checks.py)

# neutral values a masked position takes
ZERO, ONE, NEG_INF, POS_INF, FALSE, TRUE = "zero", "one", "-inf", "+inf", "false", "true"


@dataclasses.dataclass(frozen=True)
class Mask:
    """What the lowering of one node must do with padding.

    Attributes:
        premask: (argument index, dim, factors, fill): set padded positions of that argument's
            dim to `fill` before the rule runs.
        after: "" | "rescale" (mean: multiply by padded count / true count over `dims`) |
            "var" (recompute variance over the masked argument) | "keys" (attention: mask keys) |
            "from_end" (a slice or select whose start is counted from the end of a padded dim:
            taken at true size + start, compiler/padding.py) | "cat" (each piece written at the
            true end of the pieces before it).
        dims: for "rescale"/"var": (dim, factors) of argument 0 that were reduced; for
            "from_end": (dim, factors) of the sliced dim; for "cat": (dim, factors) per piece.
        true_args: (argument index, expr): a size used as a value (a Tensor argument) takes
            its true value, not the bucket's.
        indices: for index_put and index: (position in the index list, kind, factors): "drop"
            sends the index tensor's padded entries (its dim `factors` is padded) out of bounds,
            where the scatter drops them; "wrap" makes negative positions into a padded operand
            dim (of these factors) count from its true end.
    """

    premask: tuple = ()
    after: str = ""
    dims: tuple = ()
    true_args: tuple = ()
    indices: tuple = ()


@dataclasses.dataclass
class Refusal:
    """Why this graph runs per exact size."""

    reason: str
    decisions: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class BucketPlan:
    """Everything the runtime needs to pad inputs and slice outputs of one graph.

    Attributes:
        symbols: the bucketed symbols, in the order of the true-sizes input.
        sources: per symbol, (placeholder index, dim) whose size is that symbol.
        names: per symbol, Dynamo's name for it (e.g. "L['x'].size()[1]").
        upper: per symbol, the largest value Dynamo allows (None: unbounded).
        least: per symbol, the smallest pow2 bucket (BUCKETING_MIN_LAST when it sizes an input's last dim).
        inputs: per placeholder: a tuple of dim expressions (tensor), an expression (SymInt), or None.
        outputs: per flat output: ("tensor", layout), ("size", expr) or ("value", None).
        policy: the bucketing option.
        decisions: the pad-safety decisions that were not plain "harmless".
        counts: verdict -> number of ops.
    """

    symbols: list
    sources: list
    names: list
    upper: list
    least: list
    inputs: list
    outputs: list
    policy: object
    decisions: list
    counts: dict


def bucket_for(n: int, policy, upper: int | None = None, least: int = BUCKETING_MIN) -> int:
    """The size a program is compiled for when the true size is `n`.

    `least` is the smallest bucket of the default "pow2" policy; {"pow2": MIN} overrides it.
    """
    if policy == "off":
        return n
    if policy == "pow2" or "pow2" in policy:
        least = least if policy == "pow2" else policy["pow2"]
        b = max(least, 1 << max(n - 1, 0).bit_length())
    elif "multiple" in policy:
        m = policy["multiple"]
        b = -(-n // m) * m
    else:
        b = next((s for s in policy["sizes"] if s >= n), n)
    if upper is not None:
        b = min(b, upper)
    return max(b, n)


def buckets_for(true: list[int], plan: "BucketPlan") -> list[int]:
    """The bucket of each symbol, for its true size."""
    return [bucket_for(n, plan.policy, up, lo) for n, up, lo in zip(true, plan.upper, plan.least)]


def is_padded_expr(expr, plan: BucketPlan) -> bool:
    return bool(getattr(expr, "free_symbols", set()) & set(plan.symbols))


def expr_of(size) -> sympy.Expr:
    """A size (int or SymInt) as a sympy expression."""
    if isinstance(size, (torch.SymInt, torch.SymFloat)):
        return size.node.expr
    return sympy.Integer(int(size))


def evaluate(expr, env: dict):
    """`expr` with symbols replaced by `env` values: Python ints or traced JAX scalars alike."""
    if isinstance(expr, (int, float)):
        return expr
    if expr.is_Integer:
        return int(expr)
    if expr.is_Number:  # a Rational, or a Float such as SymFloat arithmetic's 1.0
        return float(expr)
    if expr.is_Symbol:
        return env[expr]
    args = [evaluate(a, env) for a in expr.args]
    if expr.is_Add:
        out = args[0]
        for a in args[1:]:
            out = out + a
        return out
    if expr.is_Mul:
        out = args[0]
        for a in args[1:]:
            out = out * a
        return out
    name = type(expr).__name__
    if (expr.is_Pow or name == "PowByNatural") and isinstance(args[1], int):
        out = 1
        for _ in range(abs(args[1])):
            out = out * args[0]
        return out if args[1] >= 0 else 1.0 / out
    if name in ("FloatTrueDiv", "IntTrueDiv"):  # SymFloat sizes: BatchNorm's 1 / (elements per channel)
        return args[0] / args[1]
    if name == "ToFloat":
        return args[0] * 1.0
    if name == "Identity":
        return args[0]
    if name in ("FloorDiv", "CleanDiv"):
        return args[0] // args[1]
    if name in ("Mod", "PythonMod"):
        return args[0] % args[1]
    if name in ("Max", "Min") and all(isinstance(a, int) for a in args):
        return max(args) if name == "Max" else min(args)
    raise ValueError(f"cannot evaluate size expression {expr}")


def schema_arg(node, name, default=None):
    """An FX node's argument by its schema name (positional or keyword)."""
    schema = node.target._schema
    for i, arg in enumerate(schema.arguments):
        if arg.name == name:
            if arg.kwarg_only or i >= len(node.args):
                return node.kwargs.get(name, default)
            return node.args[i]
    return default


def dims_of(dim, ndim) -> list[int]:
    """A reduction's `dim` argument as a list of dims (None or empty: all of them)."""
    if dim is None or (isinstance(dim, (list, tuple)) and not dim):
        return list(range(ndim))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return [d % max(ndim, 1) for d in dims]
