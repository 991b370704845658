"""The program of one OpCall: an ATen FX graph over the call's storages, as compile_graph takes it.

The op is traced the way AOTAutograd traces a model: make_fx over fake inputs, functionalized,
with the compiler's decomposition table, so a rule serves eager ops and compiled graphs alike
and ops without a rule go through the same decompositions. The traced function takes each
storage's array as an input, flattens it (free in XLA), rebuilds the arguments as views of it
(slice/view, or as_strided), calls the op, and returns each new result in torch's memory order
for it (a permuted result is returned transposed); functionalization turns writes through views
into scatters onto the storages (slice_scatter, as_strided_scatter), whose new values become
extra outputs.

A runtime number (call.py: `x * 0.9`, `add(x, y, alpha=lr)`, `addcdiv(..., value=-step)`) is
traced as a Python number, twice, with two sentinel values, so the traced dtypes are torch's for
a wrapped number; then each sentinel is replaced by a 0-d input where it lands: a Tensor
argument takes it as is (the rule computes in at least that input's dtype, the lowering casts
to torch's result dtype), `alpha` of add/sub becomes a mul. Where a sentinel lands anywhere
else, or the two traces differ elsewhere (a decomposition computed with the value), the
value is baked in: ScalarBaked, and the caller traces again with the number as a constant.

An op whose result must reach the host, a Python value or an output shape that depends on
the data (nonzero, masked_select, unique, equal), raises HostOnly: strict.py runs it on a CPU
copy of its arguments.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false as is_non_overlapping_and_dense
from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException,
                                           FakeTensorMode)
from torch.fx.experimental.proxy_tensor import make_fx

from torch._decomp import get_decompositions

from torchtpu.compiler.decompositions import decomposition_table
from torchtpu.kernels import ops as _ops  # noqa: F401  (defines torch.ops.torchtpu.window)
from torchtpu.device.call import DEVICE, SCALAR, TENSOR, Marker, OpCall, kind_of, schema_of
from torchtpu.device.storage import contiguous_stride

aten = torch.ops.aten
CONSTANT = Marker("constant tensor")  # a number given to the op as a 0-d tensor (see _numbers_as_tensors)
# A tensor over a padded storage (bucketed.py): (PADDED, storage index, dtype, splits, groups, takes),
# read from the storage's symbolic-size fake by _padded_view.
PADDED = Marker("padded Tensor")
_SENTINELS = ((1.2345678901234567e-7, 7919), (7.654321098765432e-9, 7907))  # (float, int) per trace
_ALPHA_OPS = {aten.add.Tensor: aten.add.Tensor, aten.sub.Tensor: aten.sub.Tensor}


# Overloads eager dispatch reaches that compiled graphs never contain: torch runs their
# CompositeImplicit parents (upsample_*.vec, which the compiler's table decomposes) down to them.
_EAGER_ONLY = [aten.upsample_bilinear2d.default, aten.upsample_nearest2d.default, aten.upsample_bicubic2d.default,
               aten.upsample_linear1d.default, aten.upsample_nearest1d.default, aten.upsample_nearest3d.default,
               aten.upsample_trilinear3d.default]


@functools.cache
def _decompositions() -> dict:
    """The compiler's decomposition table, plus torch's own for _EAGER_ONLY, plus the functional
    `_foreach_*` ops the device runs directly (kernels.foreach_ops), each into its per-tensor ops."""
    from torchtpu.device.kernels import foreach_ops

    foreach = {}
    for op in foreach_ops():
        if not op._schema.is_mutable:
            foreach[op] = functools.partial(_foreach, op)
    return {**get_decompositions(_EAGER_ONLY), **decomposition_table(), **foreach}


# A foreach op's Scalar that the per-tensor op takes under another name; maximum/minimum of a
# list are the per-tensor ops of the same name.
_FOREACH_VALUE = {"addcmul", "addcdiv"}  # scalar(s) -> value=


def _foreach(op, *args, **kwargs):
    """`_foreach_<name>(lists..., others...)`: `<name>(list[i]..., others...)` for each i (a
    Python number of a ScalarList stays one number per tensor: its own runtime input)."""
    name = op._schema.name.split("::")[1][len("_foreach_"):]
    target = getattr(aten, name)
    schema = schema_of(op)
    values = [args[i] if i < len(args) else kwargs.get(a.name, a.default) for i, a in enumerate(schema.args)]
    n = next(len(v) for v, a in zip(values, schema.args) if a.kind == "tensors")
    out = []
    for i in range(n):
        pos, kw = [], {}
        for v, a in zip(values, schema.args):
            v = v[i] if a.kind in ("tensors", "scalars") else v
            if name in _FOREACH_VALUE and a.kind in ("scalar", "scalars"):
                kw["value"] = v
            elif a.kwarg_only:
                kw[a.name] = v
            else:
                pos.append(v)
        out.append(target(*pos, **kw))
    return out


class ScalarBaked(Exception):
    """A runtime number cannot be an input of this op's program: trace it as a constant."""


class HostOnly(Exception):
    """The op's result needs the host (a Python value, a data-dependent shape)."""


@dataclasses.dataclass
class Plan:
    """How one program's results become the op's return values.

    Attributes:
        returns: per schema return: ("fresh", result, size, stride, dtype), ("arg", position)
            (an in-place self or an out= written in place), ("resized", position, result, size,
            stride, dtype) (an out= tensor pointed at a new storage), ("list", [...]) or None.
        mutated: (storage index, result index) per storage the op wrote.
    """

    returns: list
    mutated: list


@dataclasses.dataclass
class Inputs:
    """The fake inputs a program is traced over: one per storage, then the run-time starts of
    windows into padded storages (0-d int64), then the runtime scalars."""

    fake_mode: FakeTensorMode
    bases: list
    starts: list
    scalars: list = dataclasses.field(default_factory=list)

    def all(self) -> list:
        return [*self.bases, *self.starts, *self.scalars]


def op_graph(call: OpCall, inputs: Inputs | None = None) -> tuple[torch.fx.GraphModule, list, Plan]:
    """The FX graph of `call`, its fake example inputs (storages, run-time starts, runtime
    scalars) and Plan. `inputs` gives the storages' fakes (symbolic sizes for padded storages,
    bucketed.py); by default each storage's fake has its static shape."""
    schema = schema_of(call.op)
    if not schema.tensor_returns:
        raise HostOnly(f"{call.op} returns a Python value")
    if schema.returns_view:
        raise NotImplementedError(f"{call.op} is a view op with no tpu kernel yet (torchtpu/device/kernels.py "
                                  f"registers the view ops it supports)")
    if inputs is None:
        fake_mode = FakeTensorMode()
        with fake_mode:
            inputs = Inputs(fake_mode, [torch.empty(shape, dtype=dtype) for shape, dtype in call.key[1]], [])
    fake_mode = inputs.fake_mode
    with fake_mode:
        inputs.scalars = [torch.empty((), dtype=m[2]) for m in scalar_markers(call.template)]
    if _rejects_numbers(call, inputs):
        call = call.with_template(_numbers_as_tensors(call))
    numbers = [m for m in scalar_markers(call.template) if m[3] == "number"]
    try:
        resized = _resized_outs(call, inputs)
        if not numbers:
            gm, plan = _trace(call, inputs, resized, None)
            return gm, inputs.all(), plan
        traced = []
        for floats, ints in _SENTINELS:
            values = {m[1]: (floats if m[2].is_floating_point else ints) * (1 + m[1]) for m in numbers}
            gm, plan = _trace(call, inputs, resized, values)
            _lift(gm, values, len(inputs.bases) + len(inputs.starts), fake_mode)
            traced.append((gm, plan))
    except (DynamicOutputShapeException, DataDependentOutputException) as e:
        raise HostOnly(f"{call.op} has an output shape that depends on the data") from e
    except (HostOnly, NotImplementedError):
        raise
    except Exception as e:  # noqa: BLE001 — the sentinels may be what failed: try the real values
        if not numbers:
            raise
        raise ScalarBaked(f"{call.op}: {type(e).__name__}: {e}") from e
    if _structure(traced[0][0]) != _structure(traced[1][0]):
        raise ScalarBaked(f"{call.op}: its graph depends on a number's value")
    return traced[0][0], inputs.all(), traced[0][1]


def _structure(gm: torch.fx.GraphModule) -> list:
    """The graph without its node names (a symbolic trace numbers the names of the size
    arithmetic it drops, differently per trace)."""
    index = {node: i for i, node in enumerate(gm.graph.nodes)}
    return [(n.op, str(n.target), torch.fx.node.map_arg((n.args, n.kwargs), lambda a: ("node", index[a])))
            for n in gm.graph.nodes]


_REJECTS_NUMBERS: dict[int, bool] = {}  # by id(op)
_NOT_A_TENSOR = "Expected a value of type 'Tensor'"


def _number_slots(call) -> list[int]:
    """Tensor arguments holding a Python number (torch's wrapped numbers, as the dispatcher hands
    them to Python kernels)."""
    slots = []
    for i, (t, arg) in enumerate(zip(call.template, schema_of(call.op).args)):
        if arg.kind == "tensor" and isinstance(t, tuple) and t and (
                (t[0] is SCALAR and t[3] == "number") or (len(t) in (2, 3) and t[0] in (int, float, bool))):
            slots.append(i)
    return slots


def _rejects_numbers(call, inputs: Inputs) -> bool:
    """Whether the op refuses a Python number for a Tensor argument when called from Python (torch
    allows it for add, mul, eq, ...; not for remainder, special_hermite_polynomial_h, ...)."""
    if not _number_slots(call):
        return False
    known = _REJECTS_NUMBERS.get(id(call.op))
    if known is None:
        known = False
        try:
            with inputs.fake_mode:
                scratch = [torch.empty_like(b) for b in inputs.bases]
                decoded = [_decode(t, scratch, inputs.scalars, {m[1]: 1 for m in scalar_markers(call.template)},
                                   inputs.starts) for t in call.template]
                args, kwargs = _call_args(call, decoded)
                call.op(*args, **kwargs)
        except RuntimeError as e:
            known = _NOT_A_TENSOR in str(e)
        except Exception:  # noqa: BLE001 — the trace reports anything else
            pass
        _REJECTS_NUMBERS[id(call.op)] = known
    return known


def _numbers_as_tensors(call) -> tuple:
    """The template with each number in a Tensor argument given as a 0-d tensor: a runtime
    number as its input itself, a constant as a 0-d constant (of its type's default dtype)."""
    template = list(call.template)
    for i in _number_slots(call):
        t = template[i]
        if t[0] is SCALAR:
            template[i] = (SCALAR, t[1], t[2], "host")  # the input is the 0-d tensor: no sentinel
        else:
            template[i] = (CONSTANT, t[1])
    return tuple(template)


def scalar_markers(template) -> list[tuple]:
    """The template's Scalar markers in input order."""
    out = []

    def walk(t):
        if isinstance(t, tuple) and t:
            if t[0] is SCALAR:
                out.append(t)
            elif t[0] is not TENSOR and t[0] is not PADDED:
                for x in t:
                    walk(x)

    walk(template)
    return sorted(out, key=lambda m: m[1])


def _decode(t, bases, scalars, sentinels, starts=()):
    if isinstance(t, tuple) and t:
        head = t[0]
        if head is PADDED:
            _, i, dtype, splits, groups, takes = t
            return _padded_view(bases[i], groups, takes, starts, splits)
        if head is TENSOR:
            _, i, dtype, size, stride, offset = t
            if bases[i].dtype != dtype:
                raise NotImplementedError(f"a {dtype} view of a {bases[i].dtype} tpu storage (Tensor.view(dtype)) "
                                          "cannot be computed on yet")
            return _view_of(bases[i], size, stride, offset)
        if head is SCALAR:
            return sentinels[t[1]] if t[3] == "number" else scalars[t[1]]
        if head is CONSTANT:
            return _constant_tensor(t[1])
        if len(t) in (2, 3) and head in (int, float, bool, complex):  # (type, value[, sign of a zero])
            return t[1]
        return [_decode(x, bases, scalars, sentinels, starts) for x in t]
    if t is DEVICE:
        return torch.device("cpu")
    return t


def _constant_tensor(value):
    dtype = {bool: torch.bool, int: torch.int64}.get(type(value), torch.get_default_dtype())
    return torch.scalar_tensor(value, dtype=dtype)


def _contiguous(size, stride) -> bool:
    return all(st == want for n, st, want in zip(size, stride, contiguous_stride(size)) if n != 1)


def _view_of(base, size, stride, offset):
    numel = math.prod(size)
    if _contiguous(size, stride):
        if offset == 0 and numel == base.numel():
            return base if tuple(base.shape) == tuple(size) else base.view(size)
        base = base.reshape(-1)
        return base[offset:offset + numel].view(size)
    return base.as_strided(size, stride, offset)  # on the base itself: a chain ending in as_strided does not functionalize


def _padded_view(base, groups, takes, starts, splits=None):
    """A tensor argument over a padded storage's fake (symbolic sizes), as bucketed.unravel
    described it: the storage's dims split as `splits` says, then `takes` per dim ("all";
    ("at", start, length): a static window; ("from", k, length): a window at run-time start k),
    `groups` per dim of the argument ("one"; ("b", size): a broadcast; ("dims", dims): those dims
    merged, in order)."""
    x = base
    if splits and any(splits):
        x = x.reshape([n for d, split in enumerate(splits) for n in (split or (x.shape[d],))])
    for d, take in enumerate(takes):
        if take[0] == "at" and (take[1] != 0 or take[2] != x.shape[d]):
            x = x.narrow(d, take[1], take[2])
        elif take[0] == "from":
            x = torch.ops.torchtpu.window(x, d, starts[take[1]], take[2])
    order = [d for g in groups if g[0] == "dims" for d in g[1]]
    x = x.permute(order + [d for d in range(x.dim()) if d not in order])  # the rest: selected, size 1
    shape, sizes, at = x.shape, [], 0
    for g in groups:
        if g[0] == "dims":
            sizes.append(math.prod(shape[at:at + len(g[1])]))
            at += len(g[1])
        else:
            sizes.append(1)
    x = x.reshape(sizes)
    if any(g[0] == "b" for g in groups):
        x = x.expand([g[1] if g[0] == "b" else n for g, n in zip(groups, x.shape)])
    return x


def _call_args(call: OpCall, decoded: list):
    schema = schema_of(call.op)
    args, kwargs = [], {}
    for a, v in zip(schema.args, decoded):
        if a.kwarg_only:
            kwargs[a.name] = v
        else:
            args.append(v)
    return args, kwargs


def _resized_outs(call, inputs: Inputs) -> dict[int, tuple]:
    """out= arguments whose shape the op changes (torch resizes them): position -> (size, stride)."""
    schema = schema_of(call.op)
    outs = [i for i, a in enumerate(schema.args) if a.is_out and a.kind == "tensor"]
    if not outs:
        return {}
    sentinels = {m[1]: 1 for m in scalar_markers(call.template)}
    with inputs.fake_mode:
        scratch = [torch.empty_like(b) for b in inputs.bases]  # the op resizes what it is given
        decoded = [_decode(t, scratch, inputs.scalars, sentinels, inputs.starts) for t in call.template]
        given = {i: tuple(decoded[i].shape) for i in outs}
        args, kwargs = _call_args(call, decoded)
        call.op(*args, **kwargs)
    return {i: (tuple(decoded[i].shape), decoded[i].stride()) for i in outs if tuple(decoded[i].shape) != given[i]}


def _in_memory_order(r):
    """A result as an array in torch's memory order for it, and the size/stride that read it."""
    size, stride = tuple(r.shape), tuple(r.stride())
    if r.dim() > 1 and is_non_overlapping_and_dense(r) and not _contiguous(size, stride):
        order = sorted(range(r.dim()), key=lambda d: -stride[d])
        return r.permute(order), size, stride
    return r, size, tuple(contiguous_stride(size))


def _trace(call, inputs: Inputs, resized, sentinels):
    schema = schema_of(call.op)
    plan = Plan([], [])
    nb, ns = len(inputs.bases), len(inputs.starts)

    def fn(*values):
        bs, st, sc = values[:nb], values[nb:nb + ns], values[nb + ns:]
        decoded = [_decode(t, bs, sc, sentinels or {}, st) for t in call.template]
        for i, (size, stride) in resized.items():
            decoded[i] = torch.empty_strided(size, stride, dtype=decoded[i].dtype)
        args, kwargs = _call_args(call, decoded)
        out = call.op(*args, **kwargs)
        out = out if isinstance(out, tuple) else (out,)
        results: list = []
        plan.returns[:] = [_plan_return(r, alias, resized, results) for r, alias in zip(out, schema.returns_alias)]
        return tuple(results)

    with inputs.fake_mode:
        gm = make_fx(torch.func.functionalize(fn), decomposition_table=_decompositions())(*inputs.all())
    plan.mutated = _mutations_to_outputs(gm, nb)
    return gm, plan


def _plan_return(r, alias, resized, results):
    if r is None:
        return None
    if isinstance(r, (list, tuple)):
        return ("list", [_plan_return(x, None, resized, results) for x in r])
    if alias is not None and alias not in resized:
        return ("arg", alias)
    ordered, size, stride = _in_memory_order(r)
    results.append(ordered)
    if alias is not None:
        return ("resized", alias, len(results) - 1, size, stride, r.dtype)
    return ("fresh", len(results) - 1, size, stride, r.dtype)


def _mutations_to_outputs(gm: torch.fx.GraphModule, n_storages: int) -> list[tuple[int, int]]:
    """Functionalization ends the graph with copy_(storage, new value) per written storage: those
    become outputs (the runtime swaps the storage's array), the copies go."""
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    output = next(n for n in graph.nodes if n.op == "output")
    results = list(output.args[0]) if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    mutated = []
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is aten.copy_.default and node.args[0] in placeholders:
            index = placeholders.index(node.args[0])
            if index >= n_storages:
                raise NotImplementedError("an op wrote to a 0-d CPU tensor argument")
            mutated.append((index, len(results)))
            results.append(node.args[1])
            graph.erase_node(node)
    output.args = (tuple(results),)
    for node in graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and node.target._schema.is_mutable:
            raise NotImplementedError(f"tracing {node.target} left a mutation in its graph; not supported yet")
    graph.eliminate_dead_code()
    gm.recompile()
    return mutated


def _lift(gm: torch.fx.GraphModule, sentinels: dict[int, float], first_scalar: int, fake_mode) -> None:
    """Replaces each sentinel value in the graph by its scalar's placeholder (the scalars'
    placeholders start at `first_scalar`; ScalarBaked when a value lands where no tensor can stand)."""
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    by_value = {v: placeholders[first_scalar + k] for k, v in sentinels.items()}
    found = set()
    for node in list(graph.nodes):
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        arguments = node.target._schema.arguments
        new_args = list(node.args)
        for i, a in enumerate(node.args):
            if _is_number(a) and a in by_value:
                if _kind_at(arguments, i) != "tensor":
                    raise ScalarBaked(str(node.target))
                new_args[i] = by_value[a]
                found.add(a)
        new_kwargs = dict(node.kwargs)
        for name, a in node.kwargs.items():
            if _is_number(a) and a in by_value:
                if name == "alpha" and node.target in _ALPHA_OPS:
                    _alpha_to_mul(graph, node, new_args, new_kwargs, by_value[a], fake_mode)
                elif _kind_named(arguments, name) == "tensor":
                    new_kwargs[name] = by_value[a]
                else:
                    raise ScalarBaked(str(node.target))
                found.add(a)
        node.args, node.kwargs = tuple(new_args), new_kwargs
    if set(sentinels.values()) - found:
        raise ScalarBaked("a Scalar argument's value is not in the traced graph")
    gm.recompile()


def _is_number(a) -> bool:
    return a.__class__ is float or a.__class__ is int


def _alpha_to_mul(graph, node, args, kwargs, scalar_node, fake_mode):
    """add(x, y, alpha=s) -> add(x, mul(y, s)): alpha is a Scalar, mul takes a 0-d tensor."""
    with graph.inserting_before(node):
        scaled = graph.call_function(aten.mul.Tensor, (args[1], scalar_node))
    with fake_mode:
        scaled.meta["val"] = aten.mul.Tensor(args[1].meta["val"], scalar_node.meta["val"])
    args[1] = scaled
    del kwargs["alpha"]


def _kind_at(arguments, i) -> str:
    return kind_of(arguments[i].type) if i < len(arguments) else "other"


def _kind_named(arguments, name) -> str:
    return next((kind_of(a.type) for a in arguments if a.name == name), "other")
