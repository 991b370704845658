"""Strict eager: each op on tpu tensors runs as its own compiled program, kept per signature.

    describe (call.py) -> program for the key: op_graph (graph.py) -> compile_graph -> Executable
    -> run on the storages' device arrays -> written storages take the new arrays, new results
    become tpu tensors

Defer mode (defer.py) replaces `Strict.run` only: it appends the OpCall's graph to a pending
one and gives back tensors whose storages fill at a flush; describe, op_graph (through
`Strict.trace`), the storages and the kernels stay as they are.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import threading
import weakref

import torch
from torch.utils._pytree import tree_map

from torchtpu import counters, eager, events
from torchtpu.compiler import checks
from torchtpu.compiler.driver import compile_graph
from torchtpu.compiler.errors import LoweringError
from torchtpu.device import bucketed
from torchtpu.device import graph as graphs
from torchtpu.device import module, transfer
from torchtpu.device.call import OpCall, describe, schema_of
from torchtpu.device.storage import DeviceStorage, device_name, point, wrap
from torchtpu.options import Options

# Programs raise torch's errors for bad indices; ops the device cannot run fail by name.
OPTIONS = Options(fallback="error", bucketing="off")


class NoDeviceKernel(NotImplementedError):
    """An op on tpu tensors that the device cannot run (no lowering rule or decomposition)."""


@dataclasses.dataclass
class Program:
    exe: object  # runtime.executable.Executable
    runner: object  # its CompiledGraph (names the node of a failed check)
    plan: graphs.Plan
    scalars: list  # per runtime scalar: (dtype, how), in input order
    outputs: list  # graph output -> index into the executable's results
    family: int | None = None  # its op and call site (bucketed.Growth): the origin of its results


_EXACT = object()  # a bucketed program cannot run this call: run it per exact size


class Strict:
    def __init__(self):
        self._programs: dict[tuple, Program] = {}
        self._baked: set = set()  # keys whose numbers turned out to be needed as constants
        self._host: set = set()  # keys of ops that run on the host (graph.HostOnly)
        self._lock = threading.Lock()
        self._bucketing = bucketed.enabled()
        self._bucketed: dict[tuple, bucketed.Program] = {}
        self._refused: set = set()  # bucketed keys whose programs run per exact size instead
        self._refusals: set = set()  # (op, reason) already recorded as an event
        self._growth = bucketed.Growth()

    def describe(self, op, args, kwargs):
        """The call's description, with its numbers as constants where a trace found them needed."""
        call = describe(op, args, kwargs)
        baked = self._baked
        return describe(op, args, kwargs, lift=False) if baked and call.key in baked else call

    def run(self, op, args, kwargs):
        call = self.describe(op, args, kwargs)
        if call.padded:  # (only bucketed programs make padded storages)
            out = self._run_bucketed(call, {})
            if out is not _EXACT:
                return out
        program = self._programs.get(call.key)
        if program is None:
            if call.key in self._host:
                return on_host(op, args, kwargs)
            family = None
            if self._bucketing and not call.padded:
                family = self._growth.family(call)
                grow = self._growth.observe(call, family)
                out = self._run_bucketed(call, grow) if grow else _EXACT
                if out is not _EXACT:
                    return out
            try:
                program, call = self._build(call, op, args, kwargs, family)
            except graphs.HostOnly:
                self._host.add(call.key)
                return on_host(op, args, kwargs)
        else:
            counters.bump("eager_hits")
        arrays = [s.read() for s in call.storages]
        for value, (dtype, how) in zip(call.scalars, program.scalars):
            arrays.append(transfer.host_scalar(value) if how == "host" else transfer.scalar(value, dtype))
        key = transfer.random_key(module.generator()) if program.exe.layout.uses_rng else None
        try:
            results = program.exe.run_arrays(arrays, key)
        except checks.CheckFailed as failed:
            raise checks.user_error(failed.check, program.runner._node_at(failed.check["node"])) from None
        if results:  # one result per program: it is ready when the program finished
            _recent.append(weakref.ref(results[0]))
        return _apply(call, program, [results[i] for i in program.outputs])

    def _run_bucketed(self, call: OpCall, grow: dict):
        """Runs `call` through a program of its size bucket (bucketed.py), or returns _EXACT."""
        try:
            bcall = bucketed.describe(call, grow)
        except bucketed.Unbucketable as e:
            return self._refuse(call, str(e))
        program = self._bucketed.get(bcall.key)
        if program is None:
            if bcall.key in self._refused:
                return _EXACT
            try:
                with self._lock:
                    program = bucketed.build(call, bcall)
            except bucketed.Refused as e:
                self._refused.add(bcall.key)
                return self._refuse(call, str(e))
            self._bucketed[bcall.key] = program
            counters.bump("eager_bucketed_programs")
        else:
            counters.bump("eager_bucketed_hits")
        return bucketed.run(program, call, bcall, _recent)

    def _refuse(self, call: OpCall, reason: str):
        """An op on varying sizes that runs per exact size: counted, and an event per op and reason."""
        counters.bump("eager_bucket_refusals")
        if (call.op, reason) not in self._refusals:
            self._refusals.add((call.op, reason))
            events.record("eager_bucketing", op=str(call.op), status="exact", reason=reason)
        return _EXACT

    def trace(self, call: OpCall, op, args, kwargs) -> tuple:
        """The op's graph, its example inputs, its Plan and the OpCall they are for (a number
        the graph needs as a constant makes a new OpCall: the key remembers that)."""
        try:
            try:
                gm, inputs, plan = graphs.op_graph(call)
            except graphs.ScalarBaked:
                self._baked.add(call.key)
                call = describe(op, args, kwargs, lift=False)
                gm, inputs, plan = graphs.op_graph(call)
        except NotImplementedError as e:
            raise NoDeviceKernel(f"torchtpu.device: {op} cannot run on the tpu device: {e}") from e
        return gm, inputs, plan, call

    def _build(self, call: OpCall, op, args, kwargs, family: int | None = None) -> tuple[Program, OpCall]:
        with self._lock:
            gm, inputs, plan, call = self.trace(call, op, args, kwargs)
            name = f"eager_{op._schema.name.split('::')[-1]}_{op._overloadname}"
            try:
                runner = compile_graph(gm, inputs, OPTIONS, name=name)
            except LoweringError as e:
                raise NoDeviceKernel(f"torchtpu.device: {op} cannot run on the tpu device: "
                                     f"{str(e).splitlines()[0]}\n{e}") from None
            exe = runner.executable_for(runner.fixed_signature)
            outputs = [slot.index for slot in exe.layout.outputs]
            scalars = [(m[2], m[3]) for m in graphs.scalar_markers(call.template)]
            program = self._programs[call.key] = Program(exe, runner, plan, scalars, outputs, family)
            counters.bump("eager_programs")
            return program, call


def _apply(call: OpCall, program: Program, results: list):
    plan = program.plan
    for storage_index, r in plan.mutated:
        call.storages[storage_index].set(results[r])
    if len(plan.returns) == 1:
        return _value(plan.returns[0], call, results, program.family)
    returns = [_value(entry, call, results, program.family) for entry in plan.returns]
    return tuple(returns) if returns else None


def _value(entry, call: OpCall, results: list, family):
    if entry is None:
        return None
    kind = entry[0]
    if kind == "arg":
        return call.values[entry[1]]
    if kind == "list":
        return [_value(e, call, results, family) for e in entry[1]]
    if kind == "fresh":
        _, r, size, stride, dtype = entry
        storage = DeviceStorage(math.prod(size), dtype, results[r])
        storage.origin = family
        return wrap(storage, size, stride, 0, dtype)
    _, position, r, size, stride, dtype = entry  # "resized"
    return point(call.values[position], DeviceStorage(math.prod(size), dtype, results[r]), size, stride)


def on_host(op, args, kwargs):
    """Runs `op` on CPU copies of its tpu tensors: for ops whose result the host needs anyway (a
    Python value, a data-dependent shape). Written tensors are copied back, new ones uploaded."""
    device = device_name()
    copies: dict[int, tuple] = {}  # id(tpu tensor) -> (the tensor, its CPU copy)

    def to_cpu(x):
        if isinstance(x, torch.Tensor) and x.device.type == device:
            if id(x) not in copies:
                copies[id(x)] = (x, transfer.to_host(x, f"host op {op}").clone())
            return copies[id(x)][1]
        return x

    host_args, host_kwargs = tree_map(to_cpu, (list(args), dict(kwargs)))
    counters.bump("eager_host_ops")
    out = op(*host_args, **host_kwargs)
    for i, arg in enumerate(schema_of(op).args):
        written = (args[i] if i < len(args) else kwargs.get(arg.name)) if arg.writes else None
        if isinstance(written, torch.Tensor) and id(written) in copies:
            result = copies[id(written)][1]
            if written.shape != result.shape:  # an out= the op resized
                written.resize_(result.shape)
            written.copy_(result)
    originals = {id(c): x for x, c in copies.values()}

    def back(r):
        if isinstance(r, torch.Tensor):
            return originals[id(r)] if id(r) in originals else r.to(device)
        return r

    return tree_map(back, out)


def synchronize() -> None:
    """Runs what defer mode left pending, then waits for the results of the recent programs
    that are still alive (programs run in the background; a result nobody holds needs no waiting)."""
    eager._flush("synchronize")
    transfer.ready([a for a in (r() for r in list(_recent)) if a is not None])


_recent: collections.deque = collections.deque(maxlen=1024)  # a weak reference per recent program
_strict = Strict()


def run(op, args, kwargs):
    """Runs one op on tpu tensors (the kernels' single entry): now, or deferred in defer mode."""
    if eager.current == "defer":
        return (_defer or _deferred()).run(op, args, kwargs)
    return _strict.run(op, args, kwargs)


def _deferred():
    """defer.py's executor, imported at the first deferred op."""
    global _defer
    from torchtpu.device import defer

    _defer = defer.executor
    return _defer


_defer = None
