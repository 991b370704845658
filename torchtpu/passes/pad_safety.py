"""Pad-safety analysis: which dims of which values carry bucket padding, and what each
consumer must do about it.

Bucketing runs a graph at padded sizes: every input is zero-padded at the end of each dim
whose size depends on a bucketed symbol, and the graph is evaluated with the symbols at their
bucket values. That is correct for the real positions of every value as long as each op reads
only real positions when it computes a real position. Per op this is one of:

- harmless: elementwise ops, views that split/merge consistently, matmul/conv over other dims,
  gathers by non-negative position, prefix ops (cumsum), slices and selects at a non-negative position,
  splits and topk/sort along an unpadded dim, repeat;
- masked: reductions, softmax and contractions over a padded dim, attention over padded keys.
  The lowering masks the padded positions (NaN-safe `where`, never a multiply) with the
  reduction's neutral value and corrects divisors (mean, var). Positions counted from the end
  of a padded dim (a negative slice start or select index, negative gather/scatter positions)
  are counted from its true end;
  A cat along a padded dim writes each piece at the true end of the pieces before it;
- unsafe: anything else that touches a padded dim (a position computed from a size, flip,
  ...). The graph is then compiled per exact size.

A dim's layout is its list of factors (sympy expressions), row-major: [s6*s81] after a view
that merged [s6, s81] keeps the factors (s6, s81), so the real positions are those whose
unravelled index is below each factor's true extent.
"""
from __future__ import annotations

import dataclasses
import operator

import sympy
import torch

from torchtpu.plans import (FALSE, NEG_INF, ONE, POS_INF, TRUE, ZERO, Mask, dims_of, evaluate, expr_of,  # noqa: F401
                            schema_arg)

aten = torch.ops.aten
prims = torch.ops.prims

Factors = tuple  # tuple[sympy.Expr, ...]
Layout = tuple  # tuple[Factors, ...], one entry per dim



@dataclasses.dataclass
class Decision:
    node: str
    op: str
    verdict: str  # "harmless" | "masked" | "unsafe"
    why: str

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Analysis:
    layouts: dict  # Node -> Layout | tuple of Layouts | None
    masks: dict  # Node -> Mask
    decisions: list  # Decision for every node that touches padding
    unsafe: Decision | None = None

    def summary(self) -> dict:
        counts = {"harmless": 0, "masked": 0, "unsafe": 0}
        for d in self.decisions:
            counts[d.verdict] += 1
        return counts


class Unsafe(Exception):
    pass


def analyze(gm: torch.fx.GraphModule, symbols: set) -> Analysis:
    """Propagates padding through `gm` when `symbols` are bucketed; stops at the first unsafe op."""
    a = _Analyzer(symbols)
    for node in gm.graph.nodes:
        try:
            a.visit(node)
        except Unsafe as exc:
            a.decide(node, "unsafe", str(exc))
            return Analysis(a.layouts, a.masks, a.decisions, a.decisions[-1])
    return Analysis(a.layouts, a.masks, a.decisions)


def _name(node) -> str:
    return getattr(node.target, "__name__", str(node.target)) if node.op == "call_function" else node.op


def _op_name(target) -> str:
    return str(target) if isinstance(target, torch._ops.OpOverload) else getattr(target, "__name__", str(target))


def _equal(a, b) -> bool:
    return a == b or sympy.expand(a - b) == 0


# A slice end at or past this runs to the end of the dim (Dynamo writes sys.maxsize).
TO_END = 2 ** 62

# The argument names through which a size may flow into an op (a size as a value is unsafe).
SIZE_ARGS = {"size", "shape", "end", "stride", "N", "HxW", "normalized_shape", "split_sizes",
             "repeats"}

VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}
SAME_LAYOUT = {aten.clone.default, aten.alias.default, aten._to_copy.default, aten.detach.default,
               aten.lift_fresh_copy.default, prims.convert_element_type.default,
               aten.full_like.default, aten.zeros_like.default, aten.ones_like.default,
               aten.empty_like.default, aten.rand_like.default, aten.randn_like.default}
CREATION = {aten.arange.default, aten.arange.start, aten.arange.start_step, aten.full.default,
            aten.zeros.default, aten.ones.default, aten.empty.memory_format, aten.empty_strided.default,
            aten.scalar_tensor.default, aten.new_zeros.default, aten.new_ones.default,
            aten.new_empty.default, aten.new_full.default, aten.rand.default, aten.randn.default}
IGNORED = {aten._assert_scalar.default, aten.sym_constrain_range_for_size.default,
           aten._assert_tensor_metadata.default, aten.sym_size.int, aten.sym_numel.default,
           aten.sym_stride.int}
PREFIX = {aten.cumsum.default, aten.cumprod.default, aten.cummax.default, aten.cummin.default}

# reduction -> the fill that makes padded positions neutral
REDUCTIONS = {
    aten.sum.dim_IntList: ZERO, aten.sum.default: ZERO, aten.mean.dim: ZERO, aten.mean.default: ZERO,
    aten.prod.dim_int: ONE, aten.prod.default: ONE, aten.amax.default: NEG_INF,
    aten.amin.default: POS_INF, aten.max.default: NEG_INF, aten.min.default: POS_INF,
    aten.max.dim: NEG_INF, aten.min.dim: POS_INF, aten.argmax.default: NEG_INF,
    aten.argmin.default: POS_INF, aten.any.default: FALSE, aten.any.dim: FALSE, aten.any.dims: FALSE,
    aten.all.default: TRUE, aten.all.dim: TRUE, aten.all.dims: TRUE, aten.logsumexp.default: NEG_INF,
    aten.var.correction: ZERO, aten.var.dim: ZERO, aten.var_mean.correction: ZERO,
    aten.linalg_vector_norm.default: ZERO,
}
SOFTMAX = {aten._softmax.default: ((0, NEG_INF),), aten._log_softmax.default: ((0, NEG_INF),),
           aten._softmax_backward_data.default: ((0, ZERO), (1, ZERO)),
           aten._log_softmax_backward_data.default: ((0, ZERO),)}
# contraction -> (argument index, contracted dim) pairs
CONTRACTIONS = {aten.mm.default: ((0, 1), (1, 0)), aten.bmm.default: ((0, 2), (1, 1)),
                aten.addmm.default: ((1, 1), (2, 0)), aten.dot.default: ((0, 0), (1, 0)),
                aten.baddbmm.default: ((1, 2), (2, 1))}
ATTENTION = {aten._scaled_dot_product_flash_attention_for_cpu.default}
NORMS = {aten.native_layer_norm.default, aten.native_group_norm.default,
         aten._native_batch_norm_legit.default, aten._native_batch_norm_legit_functional.default,
         aten.native_batch_norm.default, aten._native_batch_norm_legit_no_training.default}


def _is_conv_bn(target) -> bool:
    """The fused `torchtpu::conv_bn` of passes/conv_bn.py: a convolution, then per-channel
    affine and ReLU, which padded positions cannot disturb."""
    return getattr(getattr(target, "_schema", None), "name", None) == "torchtpu::conv_bn"


def _is_window(target) -> bool:
    """`torchtpu::window` (kernels/ops.py): the eager device's read at a run-time position."""
    return getattr(getattr(target, "_schema", None), "name", None) == "torchtpu::window"


def _is_rms_norm(target) -> bool:
    """The fused `torchtpu::rms_norm` of passes/pallas_rewrites.py (normalises the last dim)."""
    return getattr(getattr(target, "_schema", None), "name", None) == "torchtpu::rms_norm"


class _Analyzer:
    def __init__(self, symbols):
        self.symbols = set(symbols)
        self.layouts: dict = {}
        self.masks: dict = {}
        self.decisions: list[Decision] = []
        self._nonneg: dict = {}

    # --- helpers ---------------------------------------------------------------------------
    def padded_factor(self, f) -> bool:
        return bool(getattr(f, "free_symbols", set()) & self.symbols)

    def padded_dim(self, factors) -> bool:
        return any(self.padded_factor(f) for f in factors)

    def padded(self, layout) -> bool:
        if layout is None:
            return False
        if layout and isinstance(layout[0], tuple) and layout[0] and isinstance(layout[0][0], tuple):
            return any(self.padded(x) for x in layout)  # a tuple of layouts (multi-output op)
        return any(self.padded_dim(f) for f in layout)

    def canon(self, factors) -> tuple:
        """Adjacent unpadded factors multiplied together, 1s dropped: (s, 2, 2) == (s, 4)."""
        out, run = [], sympy.Integer(1)
        for f in factors:
            if self.padded_factor(f):
                if run != 1:
                    out.append(run)
                out.append(f)
                run = sympy.Integer(1)
            else:
                run = run * f
        if run != 1 or not out:
            out.append(run)
        return tuple(out)

    def decide(self, node, verdict, why):
        self.decisions.append(Decision(node.name, _op_name(node.target), verdict, why))

    def layout(self, arg):
        return self.layouts.get(arg) if isinstance(arg, torch.fx.Node) else None

    @staticmethod
    def fresh(val):
        if isinstance(val, torch.Tensor):
            return tuple((expr_of(s),) for s in val.shape)
        if isinstance(val, (tuple, list)):
            return tuple(_Analyzer.fresh(v) for v in val)
        return None

    def source(self, node):
        """The layout of argument 0; a constant (get_attr, no layout) is unpadded."""
        return self.layouts.get(node.args[0]) or self.fresh(node.args[0].meta["val"])

    def tensor_args(self, node):
        out = []
        for a in node.all_input_nodes:
            lay = self.layouts.get(a)
            if isinstance(a.meta.get("val"), torch.Tensor) and lay is not None:
                out.append(a)
        return out

    def inherit(self, node, val=None):
        """Output layout: each dim takes the factors of an input dim of the same size."""
        val = node.meta.get("val") if val is None else val
        if isinstance(val, (tuple, list)):
            return tuple(self.inherit(node, v) for v in val)
        if not isinstance(val, torch.Tensor):
            return None
        known = {}
        for a in self.tensor_args(node):
            for factors in self.layouts[a]:
                factors = self.canon(factors)
                if len(factors) > 1:
                    known.setdefault(sympy.Mul(*factors), set()).add(factors)
        dims = []
        for size in val.shape:
            e = expr_of(size)
            match = [fs for key, fs in known.items() if _equal(key, e)]
            candidates = set().union(*match) if match else set()
            if len(candidates) > 1:
                raise Unsafe(f"dim of size {e} is merged from padded dims in different orders")
            dims.append(next(iter(candidates)) if candidates else (e,))
        return tuple(dims)

    def check_size_roles(self, node) -> list:
        """(argument index, expr) of each bucketed size used as a Tensor argument's value: the
        lowering passes its true value there. A size in any other value role is unsafe."""
        schema, true_args = node.target._schema, []
        for i, arg in enumerate(schema.arguments):
            positional = not arg.kwarg_only and i < len(node.args)
            value = node.args[i] if positional else node.kwargs.get(arg.name)
            for v in (value if isinstance(value, (list, tuple)) else [value]):
                if not isinstance(v, torch.fx.Node):
                    continue
                sym = v.meta.get("val")
                if isinstance(sym, (torch.SymInt, torch.SymFloat, torch.SymBool)) and \
                        self.padded_factor(sym.node.expr) and arg.name not in SIZE_ARGS:
                    if v is value and positional and isinstance(arg.type, torch.TensorType):
                        true_args.append((i, sym.node.expr))
                        continue
                    raise Unsafe(f"the size {sym.node.expr} is used as a value (argument `{arg.name}`)")
        return true_args

    # --- the walk ----------------------------------------------------------------------------
    def visit(self, node):
        val = node.meta.get("val")
        if node.op in ("placeholder", "get_attr"):
            self.layouts[node] = self.fresh(val) if node.op == "placeholder" else None
            return
        if node.op == "output":
            return
        target = node.target
        if not isinstance(target, torch._ops.OpOverload):
            if target is operator.getitem:
                src = self.layouts.get(node.args[0])
                self.layouts[node] = src[node.args[1]] if isinstance(src, tuple) else self.fresh(val)
            else:
                self.layouts[node] = None  # SymInt arithmetic: checked where the result is used
            return
        if target in IGNORED:
            self.layouts[node] = None
            return
        inputs_padded = any(self.padded(self.layouts[a]) for a in self.tensor_args(node))
        true_args = self.check_size_roles(node)
        out_fresh = self.fresh(val)
        if not inputs_padded and not self.padded(out_fresh):
            self.layouts[node] = out_fresh
        else:
            verdict, why = self.classify(node)
            self.decide(node, verdict, why)
        if true_args:
            self.masks[node] = dataclasses.replace(self.masks.get(node, Mask()), true_args=tuple(true_args))
            sizes = ", ".join(str(e) for _, e in true_args)
            self.decide(node, "masked", f"the size {sizes} is used as a value: the true size is passed")

    def classify(self, node):
        t = node.target
        if _is_rms_norm(t):
            return self.norm(node)
        if _is_conv_bn(t):
            return self.convolution(node, transposed=False)
        if _is_window(t):
            return self.window(node)
        if t in VIEWS:
            self.layouts[node] = self.view(node)
            return "harmless", "view keeps padded dims whole"
        for handler, table in ((self.reduction, REDUCTIONS), (self.softmax, SOFTMAX),
                               (self.contraction, CONTRACTIONS), (self.attention, ATTENTION),
                               (self.norm, NORMS), (self.creation, CREATION | SAME_LAYOUT),
                               (self.prefix, PREFIX)):
            if t in table:
                return handler(node)
        special = {aten.permute.default: self.permute, aten.transpose.int: self.permute,
                   aten.t.default: self.permute, aten.unsqueeze.default: self.unsqueeze,
                   aten.squeeze.dim: self.squeeze, aten.squeeze.dims: self.squeeze,
                   aten.squeeze.default: self.squeeze, aten.expand.default: self.expand,
                   aten.slice.Tensor: self.slice, aten.select.int: self.select,
                   aten.cat.default: self.cat, aten.embedding.default: self.embedding,
                   aten.index.Tensor: self.index, aten.gather.default: self.gather,
                   aten.index_select.default: self.index_select,
                   aten.index_put.default: self.index_put, aten._unsafe_index_put.default: self.index_put,
                   aten.slice_scatter.default: self.slice_scatter,
                   aten.split.Tensor: self.split, aten.split_with_sizes.default: self.split,
                   aten.unbind.int: self.split, aten.repeat.default: self.repeat,
                   aten.topk.default: self.sort, aten.sort.default: self.sort,
                   aten.sort.stable: self.sort,
                   aten.convolution.default: self.convolution}
        if t in special:
            return special[t](node)
        if torch.Tag.pointwise in t.tags:
            self.layouts[node] = self.inherit(node)
            return "harmless", "elementwise"
        raise Unsafe(f"{t} is not known to be pad-safe and touches a padded dim")

    # --- families ----------------------------------------------------------------------------
    def view(self, node):
        (src,) = [a for a in node.all_input_nodes if a is node.args[0]]
        factors = [f for dim in self.layouts[src] for f in dim if f != 1]
        out = []
        for size in node.meta["val"].shape:
            e = expr_of(size)
            if e == 1:
                out.append((sympy.Integer(1),))
                continue
            group, prod = [], sympy.Integer(1)
            while not _equal(prod, e):
                if not factors:
                    raise Unsafe(f"view to size {e} does not line up with the padded factors")
                f = factors.pop(0)
                rest = sympy.cancel(e / (prod * f))
                if sympy.fraction(rest)[1] == 1:
                    group.append(f)
                    prod = prod * f
                    continue
                tail = sympy.cancel(f * prod / e)  # f splits into (e / prod, tail)
                if sympy.fraction(tail)[1] != 1 or self.padded_factor(tail):
                    raise Unsafe(f"view splits the padded dim {f} into ({e}, ...): padding would interleave")
                group.append(sympy.cancel(e / prod))
                factors.insert(0, tail)
                prod = e
            out.append(self.canon(group))
        if any(self.padded_factor(f) for f in factors):
            raise Unsafe("view drops a padded factor")
        return tuple(out)

    def permute(self, node):
        src = self.layouts[node.args[0]]
        t = node.target
        if t is aten.t.default:
            order = list(range(len(src)))[::-1]
        elif t is aten.transpose.int:
            order = list(range(len(src)))
            d0, d1 = (d % len(src) for d in node.args[1:3])
            order[d0], order[d1] = order[d1], order[d0]
        else:
            order = [d % len(src) for d in node.args[1]]
        self.layouts[node] = tuple(src[d] for d in order)
        return "harmless", "permutation"

    def unsqueeze(self, node):
        src = list(self.layouts[node.args[0]])
        src.insert(node.args[1] % (len(src) + 1), (sympy.Integer(1),))
        self.layouts[node] = tuple(src)
        return "harmless", "unsqueeze"

    def squeeze(self, node):
        src = self.layouts[node.args[0]]
        dims = dims_of(node.args[1] if len(node.args) > 1 else None, len(src))
        drop = {d for d in dims if sympy.Mul(*src[d]) == 1}
        self.layouts[node] = tuple(f for d, f in enumerate(src) if d not in drop)
        return "harmless", "squeeze"

    def expand(self, node):
        src = self.layouts[node.args[0]]
        shape = node.meta["val"].shape
        lead = len(shape) - len(src)
        out = [(expr_of(s),) for s in shape[:lead]]
        for factors, size in zip(src, shape[lead:]):
            e = expr_of(size)
            out.append(factors if _equal(sympy.Mul(*factors), e) else (e,))
        self.layouts[node] = tuple(out)
        return "harmless", "broadcast"

    def slice(self, node):
        """From a fixed start (any end, any step) the real positions stay in front. A start
        counted from the end (negative), to the end or to an end also counted from it, is taken
        from the true end (mask "from_end"): such a slice only grows with the size, so at the
        bucket's size it holds every real position, and never has to be clamped to fit."""
        src = self.layouts[node.args[0]]
        dim = schema_arg(node, "dim", 0) % len(src)
        start, end = schema_arg(node, "start", None), schema_arg(node, "end", None)
        out = list(src)
        e = expr_of(node.meta["val"].shape[dim])
        if not self.padded_dim(src[dim]):
            if not self.padded_factor(e):  # a static slice of a static dim (Falcon's fused heads)
                out[dim] = (e,)
        else:
            if isinstance(start, int) and start < 0:
                if len(src[dim]) > 1:
                    raise Unsafe(f"slice starts at {start} on a merged padded dim: counted from the end")
                if not (end is None or (isinstance(end, int) and (end < 0 or end >= TO_END))):
                    raise Unsafe(f"slice from {start}, counted from the end, to the fixed position {end}")
                out[dim] = (e,)
                self.layouts[node] = tuple(out)
                self.masks[node] = Mask(after="from_end", dims=((dim, src[dim]),))
                return "masked", "slice counted from the end: taken from the true end"
            if isinstance(start, torch.fx.Node):
                raise Unsafe(f"slice starts at {start} on a padded dim: a position computed from a size")
            if not (start in (None, 0) and _equal(sympy.Mul(*src[dim]), e)):
                if len(src[dim]) > 1:
                    raise Unsafe("slice of a merged padded dim")
                out[dim] = (e,)
        self.layouts[node] = tuple(out)
        return "harmless", "slice with a static start keeps real positions in front"

    def split(self, node):
        """split/split_with_sizes/unbind (chunk traces to split): each piece is a slice. Along
        an unpadded dim every piece keeps the other dims' layouts; along a padded one only
        pieces of static size followed by the one rest piece (real positions stay in front of
        each, the padding all lands in the last)."""
        src, vals = self.source(node), node.meta["val"]
        dim = schema_arg(node, "dim", 0) % len(src)
        unbind = node.target is aten.unbind.int
        pieces = []
        for v in vals:
            out = list(src)
            if unbind:
                del out[dim]
            else:
                out[dim] = (expr_of(v.shape[dim]),)
            pieces.append(tuple(out))
        if self.padded_dim(src[dim]):
            sizes = [expr_of(v.shape[dim]) for v in vals]
            if unbind or len(src[dim]) > 1 or any(self.padded_factor(e) for e in sizes[:-1]):
                raise Unsafe(f"split of the padded dim {dim} into sizes {sizes}: safe only when "
                             "every piece but the last has a static size")
        self.layouts[node] = tuple(pieces)
        return "harmless", "split: static pieces in front, padding in the last"

    def repeat(self, node):
        """Tiles: output dim d is (repeats[d], *input factors) row-major, a position real when
        its copy number is below the true count and its source position is real."""
        src, repeats = self.source(node), node.args[1]
        lead = len(repeats) - len(src)
        out = [(expr_of(r.meta["val"] if isinstance(r, torch.fx.Node) else r),) for r in repeats[:lead]]
        for factors, r in zip(src, repeats[lead:]):
            r = expr_of(r.meta["val"] if isinstance(r, torch.fx.Node) else r)
            out.append(factors if r == 1 else self.canon((r, *factors)))
        self.layouts[node] = tuple(out)
        return "harmless", "repeat: each copy keeps real positions where they were"

    def sort(self, node):
        """topk/sort along an unpadded dim: each row on its own, the other dims keep their layout.
        Along a padded dim the padding would compete with real entries."""
        src = self.source(node)
        dim = schema_arg(node, "dim", -1) % max(len(src), 1)
        if src and self.padded_dim(src[dim]):
            raise Unsafe(f"{node.target} along the padded dim {dim}: padded entries would be ranked "
                         "with real ones (safe along an unpadded dim; over padded rows it would need the "
                         "permutation followed back to row order)")
        out = []
        for v in node.meta["val"]:
            lay = list(src)
            if lay:
                lay[dim] = (expr_of(v.shape[dim]),)
            out.append(tuple(lay))
        self.layouts[node] = tuple(out)
        return "harmless", "topk/sort along an unpadded dim"

    def slice_scatter(self, node):
        """base with src written into a slice: harmless along an unpadded dim (padded dims of
        src meet the same padded dims of base) or over the whole of a padded dim."""
        base = self.layouts[node.args[0]]
        dim = schema_arg(node, "dim", 0) % len(base)
        if self.padded_dim(base[dim]):
            start, end = schema_arg(node, "start", None), schema_arg(node, "end", None)
            end = end.meta["val"] if isinstance(end, torch.fx.Node) else end
            whole = end is None or (isinstance(end, int) and end >= TO_END) or \
                _equal(expr_of(end), expr_of(node.args[0].meta["val"].shape[dim]))
            if start not in (None, 0) or schema_arg(node, "step", 1) != 1 or not whole:
                raise Unsafe("slice_scatter into part of a padded dim")
        elif self.padded_dim((self.layouts.get(node.args[1]) or base)[dim]):
            raise Unsafe("slice_scatter of a padded slice into an unpadded dim")
        self.layouts[node] = base
        return "harmless", "slice_scatter along an unpadded dim or over a whole padded one"

    def select(self, node):
        """At a fixed position; a negative one counts from the true end (mask "from_end")."""
        src = self.layouts[node.args[0]]
        dim, index = node.args[1] % len(src), node.args[2]
        self.layouts[node] = src[:dim] + src[dim + 1:]
        if self.padded_dim(src[dim]):
            if not isinstance(index, int) or len(src[dim]) > 1:
                raise Unsafe(f"select at index {index} of a padded dim: a position computed from a size")
            if index < 0:
                self.masks[node] = Mask(after="from_end", dims=((dim, src[dim]),))
                return "masked", "select counted from the end: at the true end"
        return "harmless", "select at a static position"

    def cat(self, node):
        """Pieces padded along the cat dim would leave their padding between real positions: the
        lowering writes each piece after the first padded one at the true end of those before it
        (mask "cat"), so the real positions stay in front."""
        tensors = [t for t in node.args[0] if isinstance(t, torch.fx.Node)]
        ndim = node.meta["val"].ndim
        dim = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % ndim
        layouts = [self.layouts[t] if self.layouts.get(t) is not None else self.fresh(t.meta["val"]) for t in tensors]
        layouts = [lay if len(lay) == ndim else ((sympy.Integer(0),),) * ndim for lay in layouts]  # legacy (0,): skipped
        if any(len(lay[dim]) > 1 and self.padded_dim(lay[dim]) for lay in layouts):
            raise Unsafe("cat along a merged padded dim")
        out = list(self.inherit(node))
        out[dim] = (expr_of(node.meta["val"].shape[dim]),)
        self.layouts[node] = tuple(out)
        if not any(self.padded_dim(lay[dim]) for lay in layouts[:-1]):
            return "harmless", "cat with the padded part last keeps padding at the end"
        self.masks[node] = Mask(after="cat", dims=tuple((dim, lay[dim]) for lay in layouts))
        return "masked", "cat along a padded dim: each piece written at the true end of those before it"

    def window(self, node):
        """torchtpu.window: a static length at a run-time start that torch keeps inside the true dim."""
        out = list(self.layouts[node.args[0]])
        out[node.args[1] % len(out)] = (sympy.Integer(node.args[3]),)
        self.layouts[node] = tuple(out)
        return "harmless", "window at a run-time start inside the real positions"

    def embedding(self, node):
        if self.padded(self.layouts[node.args[0]]):
            raise Unsafe("embedding table with a padded dim")
        self.layouts[node] = self.inherit(node)
        return "harmless", "gather by token id"

    def index(self, node):
        """A gather; negative positions into a padded dim count from its true end ("wrap")."""
        src, plan = self.layouts[node.args[0]], []
        for d, idx in enumerate(node.args[1]):
            if idx is not None and self.padded_dim(src[d]) and not self.nonneg(idx):
                if len(src[d]) > 1:
                    raise Unsafe("indexing a merged padded dim with possibly negative positions")
                plan.append((d, "wrap", src[d]))
        self.layouts[node] = self.inherit(node)
        if plan:
            self.masks[node] = Mask(indices=tuple(plan))
            return "masked", "gather: negative positions count from the true end"
        return "harmless", "gather by non-negative position"

    def index_put(self, node):
        """Writes into positions of the operand. Padded entries of an index tensor (or of the
        values) would write padding: they are sent out of bounds and dropped. Positions into a
        padded operand dim are real ones (eager checks the bounds); negative ones count from
        the true end. The output has the operand's layout."""
        x, (_, indices, values, *_) = self.layouts[node.args[0]], node.args
        if not isinstance(x, tuple) or any(i is not None and i.meta["val"].dtype == torch.bool for i in indices):
            raise Unsafe("index_put with a boolean mask")
        plan, covered = [], set()
        for k, idx in enumerate(indices):
            if idx is None:
                continue
            lay = self.layouts.get(idx) or ()
            for d, factors in enumerate(lay):
                if self.padded_dim(factors):
                    if len(lay) != 1 or len(factors) != 1:
                        raise Unsafe("index_put with a multi-dim or merged padded index")
                    plan.append((k, "drop", factors))
                    covered.add(factors)
            if k < len(x) and self.padded_dim(x[k]):
                if len(x[k]) != 1:
                    raise Unsafe("index_put into a merged padded dim")
                if not self.nonneg(idx):
                    plan.append((k, "wrap", x[k]))
        vals = self.layouts.get(values) or ()
        for factors in vals:
            if self.padded_dim(factors) and factors not in covered and factors not in x:
                raise Unsafe("index_put values padded along a dim the indices do not carry")
        self.masks[node] = Mask(indices=tuple(plan))
        self.layouts[node] = x
        return "masked", "scatter: padded index entries dropped, negative positions from the true end"

    def index_select(self, node):
        """Rows by position: torch refuses negative ones, so a real index names a real row; the
        rows of padded index entries are padding."""
        self.layouts[node] = self.inherit(node)
        return "harmless", "index_select by non-negative position"

    def gather(self, node):
        src = self.layouts[node.args[0]]
        dim = node.args[1] % len(src)
        if self.padded_dim(src[dim]) and not self.nonneg(node.args[2]):
            raise Unsafe("gather along a padded dim with possibly negative positions")
        self.layouts[node] = self.inherit(node)
        return "harmless", "gather by non-negative position"

    def convolution(self, node, transposed=None):
        x, w = self.layouts[node.args[0]], self.layouts[node.args[1]]
        transposed = node.args[6] if transposed is None else transposed
        if self.padded(w) or (transposed and self.padded(x[1:])):
            raise Unsafe("convolution with a padded weight, or transposed over a padded dim")
        pre = tuple((0, d, x[d], ZERO) for d in range(1, len(x)) if self.padded_dim(x[d]))
        return self.masked(node, Mask(pre), "convolution window over a padded dim")

    def creation(self, node):
        self.layouts[node] = self.inherit(node)
        return "harmless", "creation at the padded size"

    def prefix(self, node):
        self.layouts[node] = self.inherit(node)
        return "harmless", "prefix op: real positions read only earlier positions"

    def reduction(self, node):
        t = node.target
        x = self.layouts[node.args[0]]
        dims = dims_of(schema_arg(node, "dim", None), len(x))
        if t is aten.linalg_vector_norm.default and not (schema_arg(node, "ord", 2) > 0):
            if any(self.padded_dim(x[d]) for d in dims):
                raise Unsafe("norm with ord <= 0 over a padded dim")
        reduced = tuple((d, x[d]) for d in dims if self.padded_dim(x[d]))
        if not reduced:
            self.layouts[node] = self.inherit(node)
            return "harmless", "reduction over unpadded dims"
        fill = REDUCTIONS[t]
        after = {aten.mean.dim: "rescale", aten.mean.default: "rescale", aten.var.correction: "var",
                 aten.var.dim: "var", aten.var_mean.correction: "var"}.get(t, "")
        pre = tuple((0, d, f, fill) for d, f in reduced)
        return self.masked(node, Mask(pre, after, reduced), f"reduction over a padded dim ({fill} fill)")

    def softmax(self, node):
        x = self.layouts[node.args[0]]
        dim = node.args[2 if "backward" in str(node.target) else 1] % max(len(x), 1)
        if not self.padded_dim(x[dim]):
            self.layouts[node] = self.inherit(node)
            return "harmless", "softmax over an unpadded dim"
        pre = tuple((i, dim, self.layouts[node.args[i]][dim], fill) for i, fill in SOFTMAX[node.target])
        return self.masked(node, Mask(pre), "softmax over a padded dim")

    def contraction(self, node):
        pre = []
        for i, d in CONTRACTIONS[node.target]:
            lay = self.layouts[node.args[i]]
            if self.padded_dim(lay[d]):
                pre.append((i, d, lay[d], ZERO))
        if not pre:
            self.layouts[node] = self.inherit(node)
            return "harmless", "contraction over an unpadded dim"
        if len(pre) == 1:  # both operands must agree on the padded layout
            raise Unsafe("contraction where only one operand is padded along the contracted dim")
        return self.masked(node, Mask(tuple(pre)), "contraction over a padded dim (zero fill)")

    def attention(self, node):
        q, k = self.layouts[node.args[0]], self.layouts[node.args[1]]
        if not self.padded_dim(k[-2]):
            self.layouts[node] = self.inherit(node)
            return "harmless", "attention with unpadded keys"
        pre = ((1, len(k) - 2, k[-2], ZERO), (2, len(k) - 2, k[-2], ZERO))
        causal = schema_arg(node, "is_causal", False)
        if causal and _equal(sympy.Mul(*q[-2]), sympy.Mul(*k[-2])):
            return self.masked(node, Mask(pre), "causal attention: real queries never see padded keys")
        return self.masked(node, Mask(pre, "keys", ((len(k) - 2, k[-2]),)), "attention over padded keys")

    def norm(self, node):
        t = node.target
        x = self.layouts[node.args[0]]
        if t is aten.native_layer_norm.default:
            normalized = range(len(x) - len(node.args[1]), len(x))
        elif _is_rms_norm(t):
            normalized = [len(x) - 1]
        elif t is aten.native_group_norm.default:
            normalized = range(1, len(x))
        elif t is aten._native_batch_norm_legit_no_training.default or not schema_arg(node, "training", True):
            normalized = ()
        else:
            normalized = [d for d in range(len(x)) if d != 1]
        if any(self.padded_dim(x[d]) for d in normalized):
            raise Unsafe(f"{t} normalises over a padded dim")
        self.layouts[node] = self.inherit(node)
        return "harmless", "normalisation over unpadded dims"

    def masked(self, node, mask, why):
        self.masks[node] = mask
        self.layouts[node] = self.inherit(node)
        return "masked", why

    # --- value facts -------------------------------------------------------------------------
    def nonneg(self, node) -> bool:
        """True when every element of `node` is provably >= 0 (positions made by arange)."""
        if not isinstance(node, torch.fx.Node):
            return isinstance(node, (int, float)) and node >= 0
        if node in self._nonneg:
            return self._nonneg[node]
        self._nonneg[node] = False
        t, result = node.target, False
        if t in (aten.arange.default, aten.arange.start, aten.arange.start_step):
            start = node.args[0] if t is not aten.arange.default and node.args else 0
            step = node.args[2] if t is aten.arange.start_step and len(node.args) > 2 else 1
            result = isinstance(start, int) and start >= 0 and isinstance(step, int) and step > 0
        elif t in (aten.unsqueeze.default, aten.expand.default, aten.slice.Tensor, aten.select.int,
                   aten.view.default, aten.clone.default, aten.permute.default, aten._to_copy.default,
                   aten.squeeze.dim, aten._unsafe_view.default, aten.cumsum.default, aten.alias.default):
            src = node.args[0]
            result = self.nonneg(src) or (isinstance(src, torch.fx.Node) and
                                          getattr(src.meta.get("val"), "dtype", None) == torch.bool)
        elif t is operator.getitem:
            src = node.args[0]
            result = node.args[1] == 1 and src.target in (aten.topk.default, aten.sort.default,
                                                          aten.sort.stable, aten.max.dim, aten.min.dim)
        elif t in (aten.argmax.default, aten.argmin.default, aten.argsort.default, aten.argsort.stable):
            result = True
        elif t in (aten.add.Tensor, aten.mul.Tensor, aten.add.Scalar, aten.mul.Scalar):
            result = all(self.nonneg(a) for a in node.args[:2]) and node.kwargs.get("alpha", 1) >= 0
        self._nonneg[node] = result
        return result


def output_layouts(gm, analysis: Analysis) -> list:
    """The layout of each flat graph output (None for non-tensors)."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    values = out.args[0] if isinstance(out.args[0], (list, tuple)) else [out.args[0]]
    return [analysis.layouts.get(v) if isinstance(v, torch.fx.Node) else None for v in values]


def describe(analysis: Analysis, limit: int = 20) -> list[dict]:
    """Decisions that are not plain 'harmless' (the interesting ones), for the event record."""
    return [d.as_dict() for d in analysis.decisions if d.verdict != "harmless"][:limit]


__all__ = ["Analysis", "Decision", "Mask", "analyze", "evaluate", "expr_of", "output_layouts", "describe"]
