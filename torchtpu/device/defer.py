"""Defer mode: ops on tpu tensors recorded into one pending graph, run as one program at a flush.

    record (run)   describe (call.py) -> the op's graph, traced once per op key (Strict.trace)
                   -> its inputs wired to the pending graph: a storage another deferred op wrote
                   is that op's value, any other storage's array is a graph input, runtime numbers
                   are 0-d inputs -> its results and written storages hold `Pending` arrays
    flush          a value is needed (DeviceStorage.value: downloads, .item(), host ops, a compiled
                   graph's input), synchronize, the end of backward, torchtpu.sync(), leaving defer
                   mode, a seed change with random ops pending, TORCHTPU_DEFER_MAX_OPS ops
                   -> the program for (the sequence of steps, the values still held) -> run ->
                   each Pending gets its array

A program's index checks are not waited for at its flush (the flush launches it and goes on):
its check flag is read when one of its values is read (on the host, by a strict op, by a
compiled graph), at the next flush, at synchronize/sync and when leaving defer mode. A failed
check raises torch's error naming the deferred op and the user's line, and every value of that
program, and of the programs that read its values before the check was read, stays unreadable.

The lookup is a trie over steps (per-op key id, input wiring): a step of a known sequence is one
dict lookup, and a flush of a known sequence builds no graph. On a miss the ops' graphs are
inlined into one FX graph that goes through compile_graph (passes, memory and disk cache, XLA).
Only values a storage still holds at the flush are outputs: an intermediate nobody holds
(its tensor freed: a weak reference died) stays inside the program. The trie is bounded: past
TORCHTPU_DEFER_MAX_PROGRAMS programs (default 512) or 200,000 nodes a flush starts a new one
(counted, and a "defer_reset" event), so sequences that never repeat cannot grow it forever.
"""
from __future__ import annotations

import dataclasses
import hashlib
import linecache
import math
import os
import threading
import time
import typing
import weakref

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from torchtpu import counters, events
from torchtpu.compiler import checks, registry
from torchtpu.compiler.driver import compile_graph
from torchtpu.compiler.errors import LoweringError
from torchtpu.device import call as calls
from torchtpu.device import module, strict, transfer
from torchtpu.device.graph import HostOnly, scalar_markers
from torchtpu.device.storage import Pending

_MAX_OPS_ENV = "TORCHTPU_DEFER_MAX_OPS"
_DEFAULT_MAX_OPS = 2048
# The trie keeps every op sequence it saw and the programs of each: a workload whose sequences
# never repeat (new shapes every step) would grow it, and hold its executables, without end.
_MAX_PROGRAMS_ENV, _DEFAULT_MAX_PROGRAMS = "TORCHTPU_DEFER_MAX_PROGRAMS", 512
_MAX_STEPS = 200_000  # trie nodes (one per recorded op of a new sequence): ~60 MB at most
_queue_callback = torch.autograd.Variable._execution_engine.queue_callback
_graph_task = torch._C._current_graph_task_id


def max_ops() -> int:
    return _positive(_MAX_OPS_ENV, _DEFAULT_MAX_OPS)


def max_programs() -> int:
    return _positive(_MAX_PROGRAMS_ENV, _DEFAULT_MAX_PROGRAMS)


def _positive(var: str, default: int) -> int:
    try:
        return max(int(os.environ.get(var, default)), 1)
    except ValueError:
        return default


@dataclasses.dataclass
class OpEntry:
    """One op key's traced graph, shared by every record of it."""

    id: int  # small int standing for the op key in the trie
    op: object
    gm: torch.fx.GraphModule
    plan: object  # graph.Plan
    scalars: list  # per runtime scalar: (dtype, how)
    result_shapes: list  # per graph output: the array's shape
    random: bool
    family: int | None = None  # strict.Program's: defer mode does not bucket, its results have no origin
    native: tuple | None = None  # the form native.cc's record takes (_native_form), None: Python's path


class Record(typing.NamedTuple):
    entry: OpEntry
    refs: tuple  # per placeholder: an input index (>= 0), or ~value index of an earlier op
    first_value: int  # its results are values first_value, first_value + 1, ...
    where: tuple  # (filename, line, function) of the user's code that called it


_record = tuple.__new__  # Record(*fields) without NamedTuple's Python-level __new__ (once per op)


class Node:
    """A trie node: the sequence of steps so far. Programs by the values kept as outputs."""

    __slots__ = ("children", "programs")

    def __init__(self):
        self.children: dict = {}
        self.programs: dict = {}


@dataclasses.dataclass
class Program:
    exe: object
    runner: object
    outputs: list  # per kept value: its index among the executable's results
    key: str  # a digest of the sequence and the outputs (the flush event's program key)
    name: str


class PendingGraph:
    """The ops recorded since the last flush."""

    def __init__(self, executor: "Defer"):
        self.executor = executor
        self.node = executor.root
        self.records: list[Record] = []
        self.inputs: list = []  # device arrays: storages' arrays and runtime scalars
        self.specs: list = []  # per input: (shape, dtype)
        self.input_of: dict[int, int] = {}  # id(array) -> input index (arrays live as long as the graph)
        self.values: list = []  # per value: a weak reference to its Pending
        self.random = False
        self.limit = max_ops()  # read at each flush: a change applies from the next graph
        self.hits = 0  # ops whose traced graph was known (counted at the flush: eager_hits)
        self.backward_task = None  # the autograd graph task whose end flushes this graph
        self.error: Exception | None = None
        self.program: Program | None = None  # once flushed
        self.flag = None  # its program's check flag (a device array) until it is read
        self.sources: set = set()  # earlier graphs, checks not yet read, whose values it reads

    def flush(self, reason: str) -> None:
        self.executor.flush(reason, self)

    def unverified(self) -> bool:
        """Its values were computed, but its checks (or those of a graph it read) not yet read."""
        return self.flag is not None or bool(self.sources)

    def verify(self) -> None:
        self.executor.verify(self)

    def release(self) -> None:
        """Drops what the run needed (the input arrays above all): a Pending that outlives its
        flush keeps this object, for its error if the run failed. The values' references stay
        while the checks are unread (a failed check makes them unreadable)."""
        self.inputs = self.specs = self.input_of = self.records = None
        if not self.unverified():
            self.values = None


class Defer:
    def __init__(self):
        self.root = Node()
        self._entries: dict[tuple, OpEntry] = {}
        self._lock = threading.RLock()
        self.graph = PendingGraph(self)
        self._unverified: list[PendingGraph] = []  # flushed graphs whose checks may be unread
        self._steps = 0  # trie nodes made since the last reset
        self._programs = 0  # programs the trie holds

    # --- recording ---------------------------------------------------------------------------

    def run(self, op, args, kwargs):
        base, hit = strict._strict, False
        call = base.describe(op, args, kwargs)
        entry = self._entries.get(call.key)
        if entry is None:
            if call.key in base._host:
                return strict.on_host(op, args, kwargs)
            try:
                entry, call = self._entry(call, op, args, kwargs)
            except HostOnly:
                base._host.add(call.key)
                return strict.on_host(op, args, kwargs)
        else:
            hit = True
        with self._lock:
            graph = self.graph
            if hit and entry.native is not None and _native_record is not None:
                out = _native_record(self, graph, entry, entry.native, call.storages, call.values, call.scalars)
                if out is not _DECLINED:
                    return out
            if len(graph.records) >= graph.limit:
                self.flush("max_ops", graph)
                graph = self.graph
            if hit:
                graph.hits += 1
            refs = []
            inputs = len(graph.inputs)
            try:
                for s in call.storages:
                    array = s.array
                    if array.__class__ is Pending and array.array is None and array.graph is graph:
                        refs.append(~array.index)
                    else:
                        refs.append(self._ref(graph, s))
                if call.scalars:
                    for value, (dtype, how) in zip(call.scalars, entry.scalars):
                        refs.append(self._scalar_input(graph, value, dtype, how))
            except BaseException:
                _drop_inputs(graph, inputs)  # the op is not recorded: nor are its inputs
                raise
            refs = tuple(refs)
            step = (entry.id, refs)
            node = graph.node
            child = node.children.get(step)
            if child is None:
                child = self._child(node, step)
            graph.node = child
            values = graph.values
            first = len(values)
            shapes = entry.result_shapes
            if len(shapes) == 1:  # most ops (a list comprehension is a call of its own)
                results = [Pending(shapes[0], graph, first)]
                values.append(weakref.ref(results[0]))
            else:
                results = [Pending(shape, graph, first + i) for i, shape in enumerate(shapes)]
                values.extend([weakref.ref(p) for p in results])
            graph.records.append(_record(Record, (entry, refs, first, calls.user_frame())))
            if entry.random:
                graph.random = True
            if _graph_task() != -1:
                self._flush_after_backward(graph)
            return strict._apply(call, entry, results)

    def _child(self, node: Node, step: tuple) -> Node:
        child = node.children[step] = Node()
        self._steps += 1
        return child

    def _entry(self, call, op, args, kwargs):
        with self._lock:
            gm, _, plan, call = strict._strict.trace(call, op, args, kwargs)
            _check_rules(op, gm)
            output = next(n for n in gm.graph.nodes if n.op == "output")
            shapes = [tuple(n.meta["val"].shape) for n in output.args[0]]
            entry = OpEntry(len(self._entries), op, gm, plan, [(m[2], m[3]) for m in scalar_markers(call.template)],
                            shapes, any(n.op == "call_function" and registry.is_random(n.target)
                                                  for n in gm.graph.nodes))
            entry.native = _native_form(entry)
            self._entries[call.key] = entry
            counters.bump("defer_op_graphs")
            return entry, call

    def _ref(self, graph: PendingGraph, s) -> int:
        array = s.array
        if array is None:
            return self._input(graph, s.read(), (s.shape, s.dtype))
        if array.__class__ is Pending:
            if array.array is None and array.graph is graph:
                return ~array.index
            source = array.graph
            if array.array is not None and source.unverified():  # read as it is: checked with ours
                graph.sources.add(source)
                array = array.array
            else:
                array = s.value()  # computed by an earlier flush (or its failure raises here)
        elif s.padding is not None:  # a strict-mode bucketed program's padded array: the exact one
            array = s.value()
        return self._input(graph, array, (s.shape, s.dtype))

    @staticmethod
    def _input(graph: PendingGraph, array, spec, fresh: bool = False) -> int:
        """The input index of `array`; runtime scalars each get their own (two equal numbers
        sharing one input would make a program that depends on which numbers are equal)."""
        if not fresh:
            index = graph.input_of.get(id(array))
            if index is not None:
                return index
            graph.input_of[id(array)] = len(graph.inputs)
        graph.inputs.append(array)
        graph.specs.append(spec)
        return len(graph.inputs) - 1

    def _scalar_input(self, graph: PendingGraph, value, dtype, how: str) -> int:
        """A runtime number's input (its own, even when another holds the same number)."""
        array = transfer.host_scalar(value) if how == "host" else transfer.scalar(value, dtype)
        return self._input(graph, array, ((), dtype), fresh=True)

    def _flush_after_backward(self, graph: PendingGraph) -> None:
        task = torch._C._current_graph_task_id()
        if graph.backward_task != task:
            graph.backward_task = task
            _queue_callback(lambda: self.flush("backward", graph))

    # --- flushing ----------------------------------------------------------------------------

    def flush(self, reason: str, graph: PendingGraph | None = None) -> None:
        """Runs `graph` (default: the current one) if it is still pending."""
        with self._lock:
            graph = graph or self.graph
            if graph is not self.graph:
                return  # flushed already
            limit = max_programs()
            if self._programs >= limit or self._steps >= _MAX_STEPS:
                self._forget(reason, limit)
            self.graph = PendingGraph(self)
            if not graph.records:
                return
            self._run(graph, reason)

    def _forget(self, reason: str, limit: int) -> None:
        """Starts a new trie (the graph being flushed finishes in the old one): its programs go
        with it, to be found again in compile_graph's caches if their sequences come back."""
        counters.bump("defer_trie_resets")
        events.record("defer_reset", reason=reason, programs=self._programs, steps=self._steps,
                      limit=limit)
        self.root, self._steps, self._programs = Node(), 0, 0

    def _run(self, graph: PendingGraph, reason: str) -> None:
        start = time.perf_counter()
        kept = tuple([i for i, ref in enumerate(graph.values) if ref() is not None])
        program = graph.node.programs.get(kept)
        try:
            if program is None:
                compiles = counters.stats()["xla_compiles"]
                program = graph.node.programs[kept] = self._build(graph, kept)
                self._programs += 1
                found = "compile" if counters.stats()["xla_compiles"] > compiles else "cache"
            else:
                found = "hit"
            key = transfer.random_key(module.generator()) if program.exe.layout.uses_rng else None
            results, graph.flag = program.exe.launch(graph.inputs, key)
            graph.program = program
        except Exception as e:
            graph.error = e
            events.record("flush", reason=reason, ops=len(graph.records), source=_where(calls.user_frame()),
                          error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            graph.release()
            raise
        values = graph.values
        for i, r in zip(kept, program.outputs):
            pending = values[i]()
            if pending is not None:
                pending.array = results[r]
        if results:
            strict._recent.append(weakref.ref(results[0]))
        ops, inputs = len(graph.records), len(graph.inputs)
        graph.release()
        counters.bump("defer_flushes")
        counters.bump("defer_ops", ops)
        counters.bump("eager_hits", graph.hits)
        events.record("flush", reason=reason, ops=ops, program=program.key, cache=found, graph=program.name,
                      inputs=inputs, outputs=len(kept), source=_where(calls.user_frame()),
                      ms=round((time.perf_counter() - start) * 1e3, 3))
        earlier, self._unverified = self._unverified, [graph] if graph.unverified() else []
        self._verify_each(earlier)  # the previous programs' checks: read once this one is on its way

    # --- checks ------------------------------------------------------------------------------

    def verify(self, graph: PendingGraph) -> None:
        """Reads the check flags of `graph`'s program and of the graphs whose values it read
        (waiting for those programs); a failed check raises torch's error for the deferred op,
        and the values of `graph` stay unreadable (their reads raise it)."""
        with self._lock:
            if not graph.unverified():  # read before (a failure raised then; its values say so)
                return
            sources, graph.sources = graph.sources, set()
            flag, graph.flag = graph.flag, None
            try:
                for source in sources:
                    self.verify(source)
                    if source.error is not None:  # this graph computed from its wrong values
                        raise source.error
                if flag is not None:
                    runner = graph.program.runner
                    try:
                        graph.program.exe.verify(flag)
                    except checks.CheckFailed as failed:
                        raise checks.user_error(failed.check, runner._node_at(failed.check["node"])) from None
            except Exception as e:
                graph.error = e
                for ref in graph.values or ():
                    pending = ref()
                    if pending is not None:
                        pending.array = None
                raise
            finally:
                graph.values = None

    def verify_all(self) -> None:
        with self._lock:
            unverified, self._unverified = self._unverified, []
            self._verify_each(unverified)

    def _verify_each(self, graphs: list) -> None:
        for i, g in enumerate(graphs):
            try:
                self.verify(g)
            except Exception:
                self._unverified.extend(graphs[i + 1:])  # still read at the next flush
                raise

    def _build(self, graph: PendingGraph, kept: tuple) -> Program:
        gm, example = _fused_graph(graph, kept)
        name = f"defer_{len(graph.records)}ops"
        try:
            runner = compile_graph(gm, example, strict.OPTIONS, name=name)
        except LoweringError as e:
            raise _lowering_error(e, graph) from None
        exe = runner.executable_for(runner.fixed_signature)
        outputs = [slot.index for slot in exe.layout.outputs]
        digest = hashlib.sha256(repr(([(r.entry.id, r.refs) for r in graph.records], kept)).encode()).hexdigest()[:16]
        counters.bump("defer_programs")
        return Program(exe, runner, outputs, digest, runner.name)


def _native_form(entry: OpEntry) -> tuple | None:
    """What native.cc's record needs of an entry: (id, result shapes, random, mutated, return
    forms, one return, its runtime scalars' (dtype, how)), each return form ("fresh", result,
    numel, size, stride, dtype), ("arg", position) or None; None where a return is of another
    kind (a list, a resized out=): those ops take Python's path."""
    forms = []
    for r in entry.plan.returns:
        if r is None or r[0] == "arg":
            forms.append(r)
        elif r[0] == "fresh":
            _, result, size, stride, dtype = r
            forms.append(("fresh", result, math.prod(size), tuple(size), tuple(stride), dtype))
        else:
            return None
    return (entry.id, tuple(tuple(s) for s in entry.result_shapes), entry.random,
            tuple(tuple(m) for m in entry.plan.mutated), tuple(forms), len(forms) == 1,
            tuple(tuple(s) for s in entry.scalars))


_DECLINED = object()  # native.cc's record: Python's path runs the op
_native_record = None  # native.cc's record once the library loads (use_native)


def use_native(extension, on: bool = True) -> None:
    """native.cc's twin of Defer.run's record of a known op (device/native.py), and of the path
    from torch's call of a kernel to it (kernels.py); `on=False` leaves every op to Python's path."""
    global _native_record
    from torchtpu import eager
    from torchtpu.device import kernels, storage

    extension.set_record_types(storage.Pending, Record, storage.DeviceStorage, _graph_task, _drop_inputs,
                               calls._INTERNAL, calls._internal_code, _DECLINED, transfer._scalars)
    extension.set_defer_state(eager, executor if on else None, strict._strict, calls._SCHEMAS)
    _native_record = extension.record if on else None
    kernels._run_known, kernels._declined = (extension.run_known if on else None), _DECLINED


def _drop_inputs(graph: PendingGraph, keep: int) -> None:
    """Forgets the inputs after the first `keep` (a program's inputs must be its steps' inputs)."""
    if graph.inputs is None or len(graph.inputs) <= keep:
        return
    del graph.inputs[keep:], graph.specs[keep:]
    graph.input_of = {k: i for k, i in graph.input_of.items() if i < keep}


def _fused_graph(graph: PendingGraph, kept: tuple):
    """The recorded ops inlined into one FX graph: placeholders for the inputs, the kept values
    as outputs. Each node carries its op's user frame as its stack trace (errors name it)."""
    fx = torch.fx.Graph()
    root = torch.nn.Module()
    fake_mode = FakeTensorMode()
    placeholders = []
    with fake_mode:
        example = [torch.empty(shape, dtype=dtype) for shape, dtype in graph.specs]
    for i, fake in enumerate(example):
        p = fx.placeholder(f"in{i}")
        p.meta["val"] = fake
        placeholders.append(p)
    values: list = []
    constants = 0
    for record in graph.records:
        trace = _stack_trace(record)
        env = {}
        op_inputs = iter([placeholders[r] if r >= 0 else values[~r] for r in record.refs])
        for node in record.entry.gm.graph.nodes:
            if node.op == "placeholder":
                env[node] = next(op_inputs)
            elif node.op == "get_attr":
                name = f"c{constants}"
                constants += 1
                setattr(root, name, getattr(record.entry.gm, node.target))
                env[node] = fx.get_attr(name)
                env[node].meta = dict(node.meta)
            elif node.op == "output":
                values.extend(env[a] for a in node.args[0])
            else:
                env[node] = fx.node_copy(node, lambda n: env[n])
                env[node].meta["stack_trace"] = trace
    fx.output(tuple(values[i] for i in kept))
    return torch.fx.GraphModule(root, fx), example


def _stack_trace(record: Record) -> str:
    filename, line, function = record.where
    code = linecache.getline(filename, line).strip()
    return f'File "{filename}", line {line}, in {function}\n    {code}  (deferred {record.entry.op})'


def _lowering_error(e: LoweringError, graph: PendingGraph) -> Exception:
    return strict.NoDeviceKernel(f"torchtpu.device: a deferred op cannot run on the tpu device (defer mode, "
                                 f"{len(graph.records)} ops pending): {e}")


def _check_rules(op, gm) -> None:
    """An op whose graph holds an ATen op without a rule fails where it is called, as in strict
    mode, not at the flush."""
    for node in gm.graph.nodes:
        target = node.target
        if node.op == "call_function" and target is torch.ops.higher_order.with_effects:
            target = node.args[1]
        if node.op == "call_function" and isinstance(target, torch._ops.OpOverload) and registry.lookup(target) is None:
            raise strict.NoDeviceKernel(f"torchtpu.device: {op} cannot run on the tpu device: no lowering for {target}")


def _where(frame: tuple) -> str:
    return f"{frame[0]}:{frame[1]} in {frame[2]}"


def flush(reason: str) -> None:
    """Runs the pending graph and reads every unread check (torchtpu.sync, synchronize,
    leaving defer mode): a deferred op's error surfaces there at the latest."""
    executor.flush(reason)
    executor.verify_all()


def flush_random(reason: str) -> None:
    """Runs the pending graph if it holds random ops (before the generator's state changes:
    their key is drawn at the flush)."""
    with executor._lock:
        if executor.graph.random:
            executor.flush(reason)


def pending_ops() -> int:
    return len(executor.graph.records)


executor = Defer()


def _use_library() -> None:
    from torchtpu.device import native

    extension = native.module()
    if extension is not None:
        use_native(extension)


_use_library()
