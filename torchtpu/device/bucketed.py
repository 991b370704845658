"""Bucketed eager programs: an op whose sizes change from call to call compiles once per size
bucket, not once per size.

strict.py keys a program by every size of its arguments. A loop whose sizes grow (generate()'s
KV cache and token list, one position longer per token) would compile every op again at every
step. As the compiler's bucketing does for whole graphs (passes/bucketing.py, pad_safety.py),
such ops run programs compiled for a pow2 bucket of their sizes instead:

  - a storage whose size varies is padded: its array has each dim at its bucket's size, the
    elements at the front of each dim (storage.Padded), its true dims beside it;
  - an op on padded storages is described without their true sizes: each tensor argument as
    windows of its storage's dims (`unravel`), the varying dims as symbols, equal true sizes one
    symbol (so the key records which sizes are equal), a window's start along a varying dim a
    run-time input (a view at a new offset: the newest token);
  - the program is traced over fakes of symbolic size (graph.op_graph) and compiled by the
    driver with bucketing on: the pad-safety analysis masks what would read padding (softmax
    over the keys, reductions, contractions, a cat along the grown dim) and refuses what it
    cannot prove; a refused op runs exactly (strict.py), on its storages' exact arrays (sliced
    once and kept);
  - the program takes the padded arrays, the true sizes (an int64 vector) and the starts; each
    result whose size varies becomes a padded storage again, re-bucketed for its true size.

Which storages are padded: those a bucketed program wrote, and those whose size grows around a
loop (`Growth`: an op fed what it made at the same call site, its size stepping evenly three
times: the KV cache's cat from its third token on). An `empty` storage an op writes whole takes
its argument's shape, padded along each dim equal to a symbol's size (an out= tensor).

`TORCHTPU_EAGER_BUCKETING=off` turns this off (one program per size, as before).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import os
import weakref

import sympy
import torch
from torch._dynamo.source import ConstantSource
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

from torchtpu import counters, plans
from torchtpu.compiler import checks
from torchtpu.compiler.driver import compile_graph
from torchtpu.compiler.errors import LoweringError
from torchtpu.device import graph as graphs
from torchtpu.device import module, transfer
from torchtpu.device import call as calls
from torchtpu.device.call import SCALAR, TENSOR, OpCall, schema_of
from torchtpu.device.storage import DeviceStorage, Padded, contiguous_stride, wrap
from torchtpu.options import BUCKETING_MIN, Options
from torchtpu.plans import evaluate, expr_of
from torchtpu.runtime.bucketed import BucketedGraph

OPTIONS = Options(fallback="error", bucketing="pow2")
_ENV = "TORCHTPU_EAGER_BUCKETING"
_GUARD_POINTS = 4096  # most points a size guard is checked at over its symbols' buckets
_EVALUATIONS_KEPT = 64


def enabled() -> bool:
    """TORCHTPU_EAGER_BUCKETING: "pow2" (the default) or "off"."""
    value = os.environ.get(_ENV, "pow2")
    if value not in ("pow2", "off"):
        raise ValueError(f"{_ENV}={value!r}: expected 'pow2' or 'off'")
    return value == "pow2"


def bucket(n: int) -> int:
    return plans.bucket_for(n, "pow2", least=BUCKETING_MIN)


def sizes_in(b: int) -> range:
    """The true sizes (>= 2: a dim of 1 broadcasts, it is never padded) whose bucket is `b`."""
    return range(2 if b <= BUCKETING_MIN else b // 2 + 1, b + 1)


# --- a view as windows of its storage's dims -------------------------------------------------


def unravel(true, size, stride, offset):
    """A torch view (size, stride, offset over the row-major elements of dims `true`) as windows
    of those dims: (splits, groups, starts, lengths), or None when it is none (a step, overlapping
    or gapped strides, a window across dims).

    splits: per dim of `true`, None or the sizes it is split into (a view that splits a dim,
        [4, n] seen as [2, 2, n]); the rest refers to the dims after splitting.
    groups: per view dim, ("one",) (size 1), ("b", size) (stride 0) or ("dims", (a, ..., b)): the
        dims it walks, merged, each whole when more than one.
    starts, lengths: per dim, the window's first position and length (a dim no view dim walks is
        selected: length 1)."""
    if 0 in true or 0 in size:
        return None
    splits = _splits(true, size, stride)
    if splits is None:
        return None
    refined = [n for d, t in enumerate(true) for n in (splits[d] or (t,))]
    found = _windows(refined, size, stride, offset)
    return None if found is None else (splits, *found)


def _splits(true, size, stride):
    """Per dim, the sizes a view splits it into (None: not split): a view dim whose stride is m
    times the dim's own, 1 < m < its size, walks a part of it."""
    cs = contiguous_stride(true)
    splits = []
    for d, n in enumerate(true):
        steps = sorted({st // cs[d] for k, st in zip(size, stride)
                        if k > 1 and st and st % cs[d] == 0 and cs[d] < st < cs[d] * n}, reverse=True)
        if not steps:
            splits.append(None)
            continue
        parts, outer = [], n
        for m in steps:
            if outer % m:
                return None
            parts.append(outer // m)
            outer = m
        splits.append((*parts, outer))
    return splits


def _windows(true, size, stride, offset):
    nd = len(true)
    cs = contiguous_stride(true)
    starts, rest = [], offset
    for d in range(nd):
        starts.append(rest // cs[d])
        rest -= starts[-1] * cs[d]
    if any(st >= n for st, n in zip(starts, true)):
        return None
    lengths: list = [None] * nd
    groups = []
    for n, st in zip(size, stride):
        if n == 1:
            groups.append(("one",))
            continue
        if st == 0:
            groups.append(("b", n))
            continue
        b = next((d for d in range(nd) if cs[d] == st and true[d] > 1), None)
        if b is None or lengths[b] is not None:
            return None
        if starts[b] + n <= true[b]:
            lengths[b] = n
            groups.append(("dims", (b,)))
            continue
        dims, prod = [b], true[b]
        while prod < n:
            a = dims[0] - 1
            if a < 0 or lengths[a] is not None:
                return None
            dims.insert(0, a)
            prod *= true[a]
        if prod != n or any(starts[d] for d in dims):
            return None
        for d in dims:
            lengths[d] = true[d]
        groups.append(("dims", tuple(dims)))
    return groups, starts, [1 if n is None else n for n in lengths]


# --- describing a call -------------------------------------------------------------------------


@dataclasses.dataclass
class BucketedCall:
    """One call as a bucketed program's key and the values that feed it.

    Attributes:
        key: what the program depends on: the op, per storage its array's shape and dtype with a
            symbol per varying dim, the template with padded tensors as windows, the default dtype.
        trues: per symbol, its true size.
        starts: the run-time starts of windows along varying dims.
        layouts: per storage, the Padded layout it is read with (None: exact).
        convert: storages to pad before the run: index -> Padded.
        template: the template with padded tensors as PADDED markers (sizes as symbol numbers).
    """

    key: tuple
    trues: tuple
    starts: list
    layouts: list
    convert: dict
    template: tuple


class Unbucketable(Exception):
    """The call cannot be described as windows of padded storages: it runs exactly."""


def describe(call: OpCall, grow: dict) -> BucketedCall:
    """The BucketedCall of `call`. `grow`: storage index -> dims to pad now (sizes that varied)."""
    storages = call.storages
    layouts: list = [s.padding for s in storages]
    convert = {}
    for i, dims in grow.items():
        s = storages[i]
        dynamic = tuple(d in dims and n >= 2 for d, n in enumerate(s.shape))
        if any(dynamic):
            layouts[i] = convert[i] = Padded(tuple(s.shape), dynamic)
    symbols: dict[int, int] = {}  # true size -> symbol number
    for layout in layouts:
        for n, dyn in zip(layout.true if layout else (), layout.dynamic if layout else ()):
            if dyn:
                symbols.setdefault(n, len(symbols))
    if not symbols:
        raise Unbucketable("no size varies")
    _empty_outputs(call, layouts, convert, symbols)
    starts: list = []

    def encode(t):
        if isinstance(t, tuple) and t and t[0] is TENSOR:
            _, i, dtype, size, stride, offset = t
            layout = layouts[i]
            if layout is None:
                return t
            if dtype is not storages[i].dtype:
                raise Unbucketable("a view of another dtype")
            found = unravel(layout.true, size, stride, offset)
            if found is None:
                raise Unbucketable(f"a view {tuple(size)}/{tuple(stride)}+{offset} is no window of {layout.true}")
            splits, groups, first, lengths = found
            if any(split and dyn for split, dyn in zip(splits, layout.dynamic)):
                raise Unbucketable(f"a view {tuple(size)}/{tuple(stride)} splits a varying dim of {layout.true}")
            true = [n for d, t in enumerate(layout.true) for n in (splits[d] or (t,))]
            dynamic = [dyn for split, dyn in zip(splits, layout.dynamic) for _ in (split or (0,))]
            takes = []
            for n, dyn, st, length in zip(true, dynamic, first, lengths):
                if not dyn:
                    takes.append(("at", st, length))
                elif st == 0 and length == n:
                    takes.append(("all",))
                else:
                    takes.append(("from", len(starts), length))
                    starts.append(st)
            groups = tuple(("b", ("s", symbols[g[1]])) if g[0] == "b" and g[1] in symbols else g for g in groups)
            return (graphs.PADDED, i, dtype, tuple(splits), groups, tuple(takes))
        if isinstance(t, tuple) and t and t[0] is not SCALAR:
            return tuple(encode(x) for x in t)
        return t

    template = encode(call.template)
    parts = tuple(((tuple(bucket(n) if dyn else n for n, dyn in zip(lay.true, lay.dynamic)), s.dtype,
                    tuple(symbols[n] if dyn else None for n, dyn in zip(lay.true, lay.dynamic)))
                   if lay else (s.shape, s.dtype)) for s, lay in zip(storages, layouts))
    key = (id(call.op), parts, template, len(starts), torch.get_default_dtype())
    return BucketedCall(key, tuple(symbols), starts, layouts, convert, template)


def _empty_outputs(call: OpCall, layouts: list, convert: dict, symbols: dict) -> None:
    """An `empty` storage (nothing written: an out= tensor) that one argument covers whole takes
    that argument's shape, padded along its dims equal to a symbol's size (its contents are
    zeros at any shape)."""
    storages = call.storages
    for t in _tensor_markers(call.template):
        _, i, dtype, size, stride, offset = t
        s = storages[i]
        if layouts[i] is not None or s.array is not None or offset or dtype is not s.dtype:
            continue
        size = tuple(size)
        if math.prod(size) != s.numel or tuple(stride) != tuple(contiguous_stride(size)):
            continue
        dynamic = tuple(n in symbols for n in size)
        if any(dynamic):
            layouts[i] = convert[i] = Padded(size, dynamic)


def _tensor_markers(template) -> list:
    out = []

    def walk(t):
        if isinstance(t, tuple) and t:
            if t[0] is TENSOR:
                out.append(t)
            elif t[0] is not SCALAR:
                for x in t:
                    walk(x)

    walk(template)
    return out


# --- which sizes vary -------------------------------------------------------------------------


class Growth:
    """Recognises a size that grows around a loop: an op and call site (the op, its arguments but
    for their sizes, the user's line that called it) fed a storage that the same op and site made
    (storage.origin), one of whose dims took three sizes in a row that step by the same amount
    (the KV cache's cat: 6, 7, 8). Layers of different widths through one helper do not: their
    sizes repeat, or do not step evenly."""

    def __init__(self):
        self._numbers: dict = {}
        self._history: dict = {}

    def family(self, call: OpCall) -> int:
        """The number of `call`'s op and call site."""
        key = (id(call.op), tuple((len(s.shape), s.dtype) for s in call.storages), _shapeless(call.template),
               torch.get_default_dtype(), calls.user_frame())
        return self._numbers.setdefault(key, len(self._numbers))

    def observe(self, call: OpCall, family: int) -> dict:
        """Records `call`'s sizes; returns the dims of its exact storages to pad now: index -> dims."""
        history = self._history.setdefault(family, {})
        grow: dict = {}
        for i, s in enumerate(call.storages):
            if s.array is None or s.padding is not None:
                continue
            for d, n in enumerate(s.shape):
                sizes = history.setdefault((i, d), [])
                if not sizes or sizes[-1] != n:
                    sizes.append(n)
                    del sizes[:-3]
                if s.origin == family and n >= 2 and len(sizes) == 3 and sizes[2] - sizes[1] == sizes[1] - sizes[0]:
                    grow.setdefault(i, set()).add(d)
        return grow


def _shapeless(template):
    if isinstance(template, tuple) and template:
        if template[0] is TENSOR:
            return (TENSOR, template[1], template[2], len(template[3]))
        if template[0] is not SCALAR:
            return tuple(_shapeless(x) for x in template)
    return template


# --- programs ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Output:
    """How one program result becomes a storage's contents: its dims as factors of the symbols
    (a merged padded dim is several, row-major), whether each varies, and each one's size in
    the program (its value at the buckets: a cat's s + 1 runs at bucket + 1)."""

    factors: tuple  # sympy expressions
    dynamic: tuple
    padded: tuple  # ints


@dataclasses.dataclass
class Program:
    exe: object
    runner: object
    plan: graphs.Plan  # returns' sizes and strides as sympy expressions (ints where static)
    scalars: list  # per runtime scalar: (dtype, how)
    symbols: list  # the true-sizes input's order: symbol numbers
    by_symbol: dict  # sympy symbol -> symbol number
    outputs: list  # per graph output: Output
    results: list  # per graph output: its index among the executable's results
    evaluations: dict = dataclasses.field(default_factory=dict)  # trues -> Evaluation


class Refused(Exception):
    """The op's program cannot be bucketed (the reason is the message)."""


def build(call: OpCall, bcall: BucketedCall) -> Program:
    """Traces the op over symbolic-size fakes and compiles it bucketed (Refused when it cannot be)."""
    env = ShapeEnv()
    fake_mode = FakeTensorMode(shape_env=env)
    symints = {}
    for number, n in enumerate(bcall.trues):
        symbol = env.create_symbol(n, ConstantSource(f"s{number}"), dynamic_dim=DimDynamic.DYNAMIC)
        symints[number] = env.create_symintnode(symbol, hint=n)
    by_symbol = {si.node.expr: number for number, si in symints.items()}
    parts = bcall.key[1]
    with fake_mode:
        bases = []
        for s, lay, part in zip(call.storages, bcall.layouts, parts):
            shape = s.shape if lay is None else [symints[k] if k is not None else n
                                                  for n, k in zip(lay.true, part[2])]
            bases.append(torch.empty(shape, dtype=s.dtype))
        starts = [torch.empty((), dtype=torch.int64) for _ in bcall.starts]
    _refuse_writes_through_windows(call, bcall.template)
    template = _with_symints(bcall.template, symints)
    traced = OpCall(call.op, call.values, template, call.storages, call.scalars, bcall.key)
    try:
        gm, inputs, plan = graphs.op_graph(traced, graphs.Inputs(fake_mode, bases, starts))
    except (graphs.HostOnly, graphs.ScalarBaked, NotImplementedError) as e:
        raise Refused(f"tracing: {type(e).__name__}: {e}") from None
    if any(entry is not None and entry[0] == "resized" for entry in _flat_returns(plan.returns)):
        raise Refused("an out= argument the op resizes")
    _check_guards(env, by_symbol, bcall, parts)
    name = f"eager_{call.op._schema.name.split('::')[-1]}_{call.op._overloadname}_bucketed"
    try:
        runner = compile_graph(gm, inputs, OPTIONS, name=name)
    except LoweringError as e:
        raise Refused(f"lowering: {str(e).splitlines()[0]}") from None
    if not isinstance(runner, BucketedGraph):
        planned = runner.gm.meta.get(plans.PLAN) if runner.gm is not None else None
        raise Refused(getattr(planned, "reason", "the graph has no symbolic size"))
    spec = _spec(inputs, bcall, parts)
    exe = runner.runner.executable_for(spec)
    _check_guards(env, by_symbol, bcall, parts)  # lowering must not have fixed a size either
    bplan = runner.plan
    at_buckets = {symbol: _bucket_of(number, parts) for symbol, number in by_symbol.items()}
    outputs = [_output(kind, at_buckets) for kind in bplan.outputs]
    plan = graphs.Plan(_symbolic_returns(plan.returns), plan.mutated)
    scalars = [(m[2], m[3]) for m in graphs.scalar_markers(template)]
    return Program(exe, runner.runner, plan, scalars, [by_symbol[s] for s in bplan.symbols], by_symbol, outputs,
                   [slot.index for slot in exe.layout.outputs])


def _bucket_of(number: int, parts) -> int:
    """A symbol's bucket: the array size of a storage dim it sizes."""
    return next(b for part in parts if len(part) == 3 for b, k in zip(part[0], part[2]) if k == number)


def _with_symints(template, symints):
    """PADDED markers with each broadcast of a symbol's size given as the SymInt."""
    if isinstance(template, tuple) and template:
        if template[0] is graphs.PADDED:
            _, i, dtype, splits, groups, takes = template
            groups = tuple(("b", symints[g[1][1]]) if g[0] == "b" and isinstance(g[1], tuple) else g for g in groups)
            return (graphs.PADDED, i, dtype, splits, groups, takes)
        if template[0] not in (TENSOR, SCALAR):
            return tuple(_with_symints(x, symints) for x in template)
    return template


def _refuse_writes_through_windows(call: OpCall, template) -> None:
    """A window at a run-time start is a copy, not a view: a write through it would be lost."""
    for arg, t in zip(schema_of(call.op).args, template):
        if arg.writes and isinstance(t, tuple) and t and t[0] is graphs.PADDED:
            if any(take[0] == "from" for take in t[5]):
                raise Refused(f"argument {arg.name} is written through a window at a run-time start")


def _flat_returns(returns):
    for entry in returns:
        if entry is not None and entry[0] == "list":
            yield from _flat_returns(entry[1])
        else:
            yield entry


def _check_guards(env: ShapeEnv, by_symbol: dict, bcall: BucketedCall, parts) -> None:
    """The trace's assumptions about the symbols (guards, run-time asserts, specialisations) must
    hold for every true size the program will see: each symbol over its bucket's sizes."""
    for symbol in by_symbol:
        if env.replacements.get(symbol, symbol) != symbol:
            raise Refused(f"the trace fixed a size: {symbol} = {env.replacements[symbol]}")
    asserts = [ra.expr for ras in env.deferred_runtime_asserts.values() for ra in ras]
    for expr in [g.expr for g in env.guards] + asserts:
        free = sorted(expr.free_symbols, key=str)
        if any(s not in by_symbol for s in free):
            raise Refused(f"a guard on a size that is not bucketed: {expr}")
        ranges = [sizes_in(_bucket_of(by_symbol[s], parts)) for s in free]
        if math.prod(len(r) for r in ranges) > _GUARD_POINTS:
            raise Refused(f"a guard too costly to check over the buckets: {expr}")
        for values in itertools.product(*ranges):
            if len(set(values)) < len(values):  # distinct symbols have distinct sizes
                continue
            if not bool(expr.xreplace({s: sympy.Integer(v) for s, v in zip(free, values)})):
                raise Refused(f"a guard that fails inside the bucket: {expr}")


def _spec(inputs, bcall: BucketedCall, parts) -> tuple:
    from torchtpu.compiler.spec import TensorSpec

    specs = []
    for i, fake in enumerate(inputs):
        if i < len(parts):
            specs.append(TensorSpec(tuple(parts[i][0]), fake.dtype))
        else:
            specs.append(TensorSpec(tuple(fake.shape), fake.dtype))
    specs.append(TensorSpec((len(bcall.trues),), torch.int64))
    return tuple(specs)


def _output(kind, at_buckets: dict) -> Output | None:
    what, layout = kind
    if what != "tensor":
        return None
    factors = tuple(f for dim in layout for f in dim)
    return Output(factors, tuple(bool(getattr(f, "free_symbols", None)) for f in factors),
                  tuple(int(evaluate(f, at_buckets)) for f in factors))


def _symbolic_returns(returns):
    out = []
    for entry in returns:
        if entry is None or entry[0] == "arg":
            out.append(entry)
        elif entry[0] == "list":
            out.append(("list", _symbolic_returns(entry[1])))
        else:
            _, r, size, stride, dtype = entry
            out.append(("fresh", r, tuple(expr_of(n) for n in size), tuple(expr_of(n) for n in stride), dtype))
    return out


# --- running ------------------------------------------------------------------------------------


def run(program: Program, call: OpCall, bcall: BucketedCall, recent) -> object:
    """Runs `program` for `call` (padding the storages bcall.convert names first); returns the op's
    return value. `recent` takes a weak reference to a result (strict.synchronize waits on it)."""
    storages = call.storages
    for i, layout in bcall.convert.items():
        _pad(storages[i], layout)
    arrays = [s.array if s.padding is not None else s.read() for s in storages]
    arrays.extend([transfer.scalar(v, torch.int64) for v in bcall.starts])
    for value, (dtype, how) in zip(call.scalars, program.scalars):
        arrays.append(transfer.host_scalar(value) if how == "host" else transfer.scalar(value, dtype))
    arrays.append(transfer.sizes(tuple([bcall.trues[k] for k in program.symbols])))
    key = transfer.random_key(module.generator()) if program.exe.layout.uses_rng else None
    try:
        results = program.exe.run_arrays(arrays, key)
    except checks.CheckFailed as failed:
        raise checks.user_error(failed.check, program.runner._node_at(failed.check["node"])) from None
    if results:
        recent.append(weakref.ref(results[0]))
    results = [results[i] for i in program.results]
    shapes = _evaluated(program, bcall.trues)
    for storage_index, r in program.plan.mutated:
        _store(storages[storage_index], results[r], program.outputs[r], shapes.results[r])
    returns = [_value(entry, call, program, results, shapes) for entry in program.plan.returns]
    return returns[0] if len(returns) == 1 else tuple(returns) if returns else None


def _pad(s: DeviceStorage, layout: Padded) -> None:
    """A storage of exact contents padded to its buckets (its values kept, zeros after them)."""
    target = tuple(bucket(n) if dyn else n for n, dyn in zip(layout.true, layout.dynamic))
    if s.array is None:  # nothing written: zeros
        s.set_padded(transfer.upload(torch.zeros(target, dtype=s.dtype)), layout)
        return
    counters.bump("eager_pads")
    exact = s.read()
    if tuple(exact.shape) != layout.true:
        exact = exact.reshape(layout.true)
    s.set_padded(transfer.resize(exact, target), layout)
    s.exact = exact


@dataclasses.dataclass
class Evaluation:
    """A program's sizes at one set of true sizes: per graph output (its true dims, which vary),
    per fresh return (position) its torch size and stride."""

    results: list
    returns: dict


def _evaluated(program: Program, trues: tuple) -> Evaluation:
    found = program.evaluations.get(trues)
    if found is not None:
        return found
    env = {symbol: trues[number] for symbol, number in program.by_symbol.items()}
    results = []
    for out in program.outputs:
        true = tuple(int(evaluate(f, env)) for f in out.factors) if out is not None else None
        results.append(None if out is None else (true, tuple(dyn and n >= 2 for n, dyn in zip(true, out.dynamic))))
    returns = {}
    for entry in _flat_returns(program.plan.returns):
        if entry is not None and entry[0] == "fresh":
            returns[entry[1]] = ([int(evaluate(n, env)) for n in entry[2]], [int(evaluate(n, env)) for n in entry[3]])
    if len(program.evaluations) >= _EVALUATIONS_KEPT:
        program.evaluations.clear()
    found = program.evaluations[trues] = Evaluation(results, returns)
    return found


def _store(s: DeviceStorage, array, out: Output, shape: tuple) -> None:
    """A result's array (at the sizes the program ran at) as the storage's contents: split into
    its factors, each varying dim re-bucketed for its true size, the others exact."""
    true, dynamic = shape
    target = tuple(bucket(n) if dyn else n for n, dyn in zip(true, dynamic))
    if tuple(array.shape) != target:
        if tuple(array.shape) != out.padded:
            array = array.reshape(out.padded)
        array = transfer.resize(array, target)
    if any(dynamic):
        s.set_padded(array, Padded(true, dynamic))
    else:
        s.set(array)


def _value(entry, call: OpCall, program: Program, results: list, shapes: Evaluation):
    if entry is None:
        return None
    if entry[0] == "arg":
        return call.values[entry[1]]
    if entry[0] == "list":
        return [_value(e, call, program, results, shapes) for e in entry[1]]
    _, r, _, _, dtype = entry
    true = shapes.results[r][0]
    storage = DeviceStorage(math.prod(true), dtype)
    _store(storage, results[r], program.outputs[r], shapes.results[r])
    size, stride = shapes.returns[r]
    return wrap(storage, size, stride, 0, dtype)


__all__ = ["BucketedCall", "Growth", "Program", "Refused", "Unbucketable", "build", "describe", "enabled", "run",
           "unravel"]
