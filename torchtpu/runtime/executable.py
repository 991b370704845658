"""The callable handed back to AOTAutograd: marshal, execute, rebuild torch outputs.

Fresh compiles and cache hits run through the same path: PJRT's loaded executable is called
directly (`execute_sharded`), whether it came from `jax.jit(...).compile()` or from
`Client.deserialize_executable` of bytes in the on-disk cache.
"""
from __future__ import annotations

import atexit
import collections
import ctypes
import dataclasses
from typing import Callable

import jax
import torch
from jax._src.lib import _jax
from jax.experimental.layout import Layout
from jax.extend import backend as jax_backend

from torchtpu.compiler import checks
from torchtpu.compiler.spec import spec_of
from torchtpu.layout import ProgramLayout
from torchtpu.runtime import heap, residency, transfer


# The parameters of recent launches on the CPU, where they are views of torch tensors' memory
# (DLPack): PJRT's worker thread drops its own reference at the end of a run, after the results
# are ready, and when that reference is the last, torch's deleter takes the GIL. Once the
# interpreter is finalizing that ends the worker thread inside a noexcept frame and the process
# aborts ("terminate called without an active exception", 2 runs in 102 of a cached CNN here).
# Held here, a parameter's last reference is Python's; at exit they are kept for good, so no run
# still finishing can be the one to free them (docs/DECISIONS.md 90). A run is held until one of
# its results is ready and four later runs have launched: a count alone let the eager device,
# which launches a run per op without waiting, release a run that was still in flight.
_IN_FLIGHT_RUNS = 4
_recent_inputs: collections.deque = collections.deque()  # (parameters, one result or None) per run


def _hold_inputs(arrays: list, probe) -> None:
    """Holds one CPU run's parameters; lets go of the oldest runs known finished beyond the last
    four. `probe` is one of the run's results (None when it has none: held by count alone)."""
    _recent_inputs.append((tuple(arrays), probe))  # a copy: callers may clear their list
    while len(_recent_inputs) > _IN_FLIGHT_RUNS:
        oldest = _recent_inputs[0][1]
        try:
            if oldest is not None and not oldest.is_ready():
                return  # still running: it and every later run stay held
        except RuntimeError:  # deleted: donated to a later run, which is held behind it
            pass
        _recent_inputs.popleft()


@atexit.register  # registered after jax's own handlers, so it runs before them
def _keep_recent_inputs() -> None:
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(_recent_inputs))


class CompiledGraph:
    """Runs one FX graph; compiles one executable per input signature on demand.

    Args:
        build: signature -> Executable (the driver's pipeline for one signature).
        name: the graph's name in logs and dumps.
        resident: argument positions of parameters and buffers.
        gm: the graph as lowered, to name the node of a failed run-time check.
        load_graph: where there is no `gm` yet (a runner rebuilt from the cache alone), a
            function that produces it, called only to name such a node.
    """

    _boxed_call = True  # AOTAutograd hands us the argument list and lets us clear it

    def __init__(self, build: Callable, name: str, resident: frozenset[int] = frozenset(),
                 gm: torch.fx.GraphModule | None = None,
                 load_graph: Callable[[], torch.fx.GraphModule] | None = None):
        self._build = build
        self.name = name
        self.gm = gm
        self._load_graph = load_graph
        self.resident = resident  # argument positions of parameters and buffers
        self._executables: dict[tuple, "Executable"] = {}
        self.waits = False  # its caller waits for its results (compiler/driver.py on_host): see `load`
        self._only: Executable | None = None
        self._fixed: tuple | None = None
        # Outputs from this position on are read only by our own programs (the activations a
        # forward graph saves for its backward): they stay row-major, not torch's strides.
        self.dense_outputs_from: int | None = None

    def executable_for(self, spec: tuple) -> "Executable":
        exe = self._executables.get(spec)
        if exe is None:
            exe = self._executables[spec] = self._build(spec)
        return exe

    def fix_signature(self, spec: tuple) -> None:
        """Builds the one executable of a graph with static inputs. Dynamo's guards already check
        every input's shape, dtype and strides, so once a call has shown that the arguments
        arrive as compiled (AOTAutograd passes erased effect tokens as None), calls skip
        computing the signature."""
        self.executable_for(spec)
        self._fixed = spec

    @property
    def fixed_signature(self) -> tuple | None:
        """The one signature of a graph with static inputs (None for a symbolic graph)."""
        return self._fixed

    def preload(self, spec: tuple, exe: "Executable") -> None:
        """Makes `exe` the executable of the static signature `spec` (a precompiled graph's,
        found in the cache)."""
        self._executables[spec] = exe
        self._fixed = spec

    def __call__(self, args: list):
        exe = self._only
        if exe is None:
            spec = spec_of(args)
            exe = self.executable_for(spec)
            if spec == self._fixed:
                self._only = exe
        try:
            return exe.run(args, self.resident, self.dense_outputs_from)
        except checks.CheckFailed as failed:
            raise checks.user_error(failed.check, self._node_at(failed.check["node"])) from None

    def _node_at(self, position: int) -> torch.fx.Node | None:
        """This graph's node at a check's position (a cached program may come from another graph
        of the same canonical text: the position is what the key fixed, not the node's name)."""
        if self.gm is None and self._load_graph is not None:
            self.gm = self._load_graph()
        nodes = list(self.gm.graph.nodes) if self.gm is not None else []
        return nodes[position] if position < len(nodes) else None


# A CPU program of fewer flops than this (XLA's count) runs on the calling thread where the caller
# waits for its results. PJRT's own bound is 1000 flops, priced at a ~5 µs context switch; here the
# handoff to its worker thread and back costs 80-100 µs a call, most of a program this short. Run
# on the caller's thread, programs of a millisecond and more measured slower: a 6.4e6-flop decode
# step 5-18%, whole models (1e8-1e9 flops) 2-11%. A program that calls ATen's kernels has no full
# count and keeps the handoff (DECISIONS 110).
INLINE_FLOPS = 2e6


_ATEN_TARGET = b"torchtpu_aten_"  # the prefix of kernels/aten_cpu.py's FFI targets


def short(flops: float | None) -> bool:
    """Whether a program of `flops` (None: unknown) is short enough to run on the calling thread."""
    return flops is not None and flops < INLINE_FLOPS


UNCOUNTED = "uncounted"  # `load`'s flops when no count was kept (an entry older than the count)


def load(blob: bytes, layout: ProgramLayout, device, waits: bool, flops=UNCOUNTED) -> "Executable":
    """`Executable.deserialize`, inline on the CPU where the caller `waits` for the results and the
    program is `short`. `flops`: `Executable.flops()` as the cache entry kept it; UNCOUNTED has
    the program loaded once to count them."""
    if not waits or getattr(device, "platform", None) != "cpu":
        return Executable.deserialize(blob, layout, device)
    if flops == UNCOUNTED:
        exe = Executable.deserialize(blob, layout, device)
        if not short(exe.flops()):
            return exe
    elif not short(flops):
        return Executable.deserialize(blob, layout, device)
    return Executable.deserialize(blob, layout, device, inline=True)


def _inline_marker(*_args):
    """The host callback an inline executable is loaded with: it selects PJRT's synchronous
    execution mode and is never called (no program calls a host callback of ours)."""
    raise RuntimeError("torchtpu: the inline-execution marker callback was called")


class NotRunnableHere(RuntimeError):
    """The executable was compiled for a device this process does not have (deviceless AOT)."""


def _input_orders(xla_executable, layout: ProgramLayout) -> tuple | None:
    """Per tensor input, None (row-major) or the major-to-minor order of the layout the program
    reads it in; None when every input is row-major (or PJRT cannot say)."""
    try:
        params = xla_executable.get_parameter_layouts()
    except Exception:  # noqa: BLE001 — an unloaded or foreign executable: the default layouts
        return None
    orders = _orders(params[1:] if layout.uses_rng else params)
    return tuple(orders) if any(o is not None for o in orders) else None


def _orders(layouts) -> list[tuple[int, ...] | None]:
    """Each PJRT layout's major-to-minor dim order, None where it is row-major."""
    orders = [tuple(Layout.from_pjrt_layout(p).major_to_minor) for p in layouts]
    return [None if o == tuple(range(len(o))) else o for o in orders]


def _temp_bytes(xla_executable) -> int:
    """The program's temporaries, from XLA's compiled memory stats (0 where PJRT has none)."""
    try:
        return xla_executable.get_compiled_memory_stats().temp_size_in_bytes
    except Exception:  # noqa: BLE001 — a plugin without the stats: nothing to tune
        return 0


class Executable:
    """A PJRT executable for one signature plus how to feed it and rebuild its outputs.

    Args:
        xla_executable: a `LoadedExecutable`, or an unloaded `Executable` (deviceless compile).
        layout: the ProgramLayout.
        device: the jax device it runs on.
    """

    def __init__(self, xla_executable, layout: ProgramLayout, device):
        self.xla_executable = xla_executable
        self.layout = layout
        self.device = device
        self._execute = getattr(xla_executable, "execute_sharded", None)
        self.inline = False  # runs on the calling thread (deserialize's `inline`)
        self._loaded = False  # made by `deserialize` (see `serialize`)
        self._cpu = getattr(device, "platform", None) == "cpu"  # None: deviceless, never run
        if self._cpu and xla_executable is not None:  # temporaries glibc would map afresh each call
            heap.keep_buffers_for(_temp_bytes(xla_executable))
        self._result_handlers: list | None = None  # made from the first call's results
        self._probe: int | None = None  # the smallest result: held with a CPU run's parameters
        # The common case of an output list: every output one program result, in order, with
        # the program's own strides (then the outputs need no per-slot rebuilding).
        self._plain_outputs = all(s.kind == "tensor" and s.stride is None and s.index == i
                                  for i, s in enumerate(layout.outputs))
        # A host program with nothing to do per call but move its tensors in and out: `run` then
        # takes one short path (each step of the general one costs its own calls; measured in
        # docs/benchmarks.md, "Call overhead of a tiny graph").
        # Per tensor input, the order (major to minor) of a layout other than row-major the
        # program reads it in (a backward's saved activations: layout.BoundaryLayouts); None: all
        # row-major. Read from the executable itself, so a cached one brings its own.
        self._orders = _input_orders(xla_executable, layout) if self._cpu and xla_executable is not None else None
        self.plain_host = (self._cpu and self._execute is not None and self._plain_outputs
                            and not layout.uses_rng and not layout.checks and self._orders is None)

    # Tests set this to copy resident inputs on the CPU too, as an accelerator's transfer does,
    # to check that resident copies follow in-place updates.
    COPY_ON_CPU = False

    def _put(self, t: torch.Tensor):
        """The device array of a parameter or buffer, kept by runtime/residency.py.

        On the CPU it is a zero-copy view of the tensor's memory, made from a detached alias:
        the view holds the alias, never `t` itself, so `t` can still die (torch keeps a tensor's
        Python object alive while C++ holds it) and its entry, the view and the memory go with it.
        Reusing the view saves PJRT's DLPack import per parameter per call (docs/DECISIONS.md 42).
        """
        if transfer.zero_copy(self.device):
            t = t.detach().clone() if self.COPY_ON_CPU else t.detach()
        return transfer.to_device(t, self.device)

    @classmethod
    def from_compiled(cls, compiled: jax.stages.Compiled, program, device, blob: bytes | None = None) -> "Executable":
        """Wraps `jax.jit(fn, keep_unused=True)....compile()`: every aval is one parameter. `blob`:
        the bytes its executable was loaded from (compiled in the compiler process), else None."""
        xla_executable = compiled._executable.xla_executable
        expected = len(program.avals)
        params = len(xla_executable.get_parameter_layouts())
        if params != expected:  # jax hoisted constants or pruned inputs: calling it directly would be wrong
            raise RuntimeError(f"compiled program has {params} parameters, expected {expected}")
        exe = cls(xla_executable, ProgramLayout.of(program), device)
        exe._loaded = blob is not None
        return exe

    def output_orders(self) -> list[tuple[int, ...] | None] | None:
        """Per program result, the major-to-minor order of its layout (None: row-major); None
        where PJRT cannot say."""
        try:
            layouts = self.xla_executable.get_output_layouts()
        except Exception:  # noqa: BLE001 — an unloaded or foreign executable
            return None
        return _orders(layouts)

    def flops(self) -> float | None:
        """XLA's count of the program's flops; None where it has no full count: PJRT without a
        cost analysis, or a program that calls ATen's kernels (custom calls XLA counts as none)."""
        try:
            if self._cpu and any(_ATEN_TARGET in m.as_serialized_hlo_module_proto()
                                 for m in self.xla_executable.hlo_modules()):
                return None
            return float(self.xla_executable.cost_analysis()["flops"])
        except Exception:  # noqa: BLE001 — a plugin without it, or no count: unknown
            return None

    def serialize(self) -> bytes:
        """PJRT's own serialization (not a pickle), of a freshly compiled executable only: XLA:CPU
        serializes one it loaded from bytes without its kernels' code (the bytes load, and the
        first run fails with "Function ... not found"), so that raises here."""
        if self._loaded and self._cpu:
            raise RuntimeError("torchtpu: a CPU executable loaded from bytes cannot be serialized again; "
                               "keep the bytes it was loaded from")
        return self.xla_executable.serialize()

    @classmethod
    def deserialize(cls, blob: bytes, layout: ProgramLayout, device, inline: bool = False) -> "Executable":
        """Loads PJRT's bytes. `inline` (CPU only): every run executes on the calling thread, as
        PJRT's CPU client runs programs of under 1000 flops; it hands larger ones to a worker
        thread, and a caller that needs the results waits for it (see `load`)."""
        client = jax_backend.get_backend(device.platform)
        if device.platform == "cpu":  # it may call ATen's kernels (kernels/aten_cpu.py)
            from torchtpu.kernels import aten_cpu
            aten_cpu.register_built()
            _initialize_lapack()
        inline = inline and device.platform == "cpu"
        # jaxlib runs an executable with host callbacks synchronously on the CPU (so that a callback
        # may call back into JAX); the marker is never called
        if inline:
            loaded = client.deserialize_executable(blob, _jax.DeviceList((device,)), None, [_inline_marker])
        else:
            loaded = client.deserialize_executable(blob, [device], None)
        exe = cls(loaded, layout, device)
        exe.inline, exe._loaded = inline, True
        return exe

    def run(self, args: list, resident: frozenset[int] = frozenset(), dense_from: int | None = None) -> list:
        """Runs on `args` (cleared: their memory can go once on the device).

        Args:
            args: the graph's arguments.
            resident: positions of parameters and buffers: their device copies are made once
                and reused while the tensor is unchanged (runtime/residency.py).
            dense_from: outputs from this position on keep the program's row-major layout.
        """
        if self.plain_host and not resident:
            arrays = transfer.host_arrays(args, self.layout.tensor_inputs, self.device)
            if arrays is not None:  # every input a CPU tensor: the outputs are CPU tensors too
                results = self.execute(arrays)
                args.clear()
                return [transfer.from_cpu_buffer(a) for a in results]
        if self._execute is None:
            raise NotRunnableHere(f"this executable was compiled for {self.device} without one attached")
        inputs = self.layout.tensor_inputs
        like = args[inputs[0]].device if inputs else None  # outputs go there
        results = self.execute(self.input_arrays(args, resident, like))
        args.clear()
        if self.layout.checks:  # a host sync of one int32 (docs/DECISIONS.md 49)
            self.verify(results.pop())
        return self.outputs(results, like, dense_from)

    def input_arrays(self, args: list, resident: frozenset[int], like: torch.device | None) -> list:
        """The program's parameters for `args`: one device array per tensor input, after the
        PRNG key when the program draws random numbers."""
        device, inputs = self.device, self.layout.tensor_inputs
        if self._orders is not None:
            arrays = [transfer.to_device(args[i], device, order) for i, order in zip(inputs, self._orders)]
        elif resident and not transfer.holds_arrays(like):  # a tpu parameter's array is its own
            aliases = transfer.aliases if transfer.zero_copy(device) else None
            arrays = [residency.resident(args[i], device, self._put, aliases) if i in resident
                      else transfer.to_device(args[i], device) for i in inputs]
        else:
            arrays = [transfer.to_device(args[i], device) for i in inputs]
        if self.layout.uses_rng:
            arrays.insert(0, jax.device_put(transfer.random_key(), device))
        return arrays

    def execute(self, arrays: list) -> list:
        """Runs the program on its parameters; returns its results as device arrays.

        The first call splits PJRT's results into arrays generically and keeps one result handler
        per result (its aval and sharding, which an executable's results never change); later
        calls hand PJRT those handlers, which skips building a sharding object per result."""
        results = self._execute(arrays)
        if self._result_handlers is not None:
            out = results.consume_with_handlers(self._result_handlers)
        else:
            out = [r[0] for r in results.disassemble_into_single_device_arrays()]
            self._result_handlers = [_jax.array_result_handler(a.aval, a.sharding, committed=a.committed,
                                                               _skip_checks=True) for a in out]
            self._probe = min(range(len(out)), key=lambda i: out[i].size, default=None)
        if self._cpu:  # a run already finished (a cheap program runs inline) is held by count alone
            probe = None if self._probe is None else out[self._probe]
            _hold_inputs(arrays, None if probe is None or probe.is_ready() else probe)
        return out

    def outputs(self, results: list, like: torch.device | None, dense_from: int | None = None) -> list:
        """The graph's outputs as torch values, on the torch device `like` (the inputs')."""
        if self._cpu and (like is None or like.type == "cpu"):
            if self._plain_outputs:
                return [transfer.from_cpu_buffer(a) for a in results]
            return torch_outputs(self.layout, lambda i: transfer.from_cpu_buffer(results[i]), dense_from)
        return torch_outputs(self.layout, lambda i: transfer.to_torch(results[i], like), dense_from)

    def run_arrays(self, arrays: list, rng_key=None) -> list:
        """Runs on device arrays already on this executable's device; returns the program's
        results as device arrays (the eager device's path: no torch tensors, no host copies).

        Args:
            arrays: one array per tensor input, in parameter order (layout.tensor_inputs).
            rng_key: the PRNG key when layout.uses_rng; None draws one from torch's default
                generator, as `run` does.
        """
        results, flag = self.launch(arrays, rng_key)
        if flag is not None:  # a host sync of one int32, as in `run`
            self.verify(flag)
        return results

    def launch(self, arrays: list, rng_key=None) -> tuple[list, object]:
        """`run_arrays` without waiting: the results, and the program's check flag (a 0-d device
        array; None when it has no checks) for `verify` to read when the caller chooses (defer
        mode reads it when a value is read or at the next flush, not at the launch)."""
        if self._execute is None:
            raise NotRunnableHere(f"this executable was compiled for {self.device} without one attached")
        if self.layout.uses_rng:
            key = rng_key if rng_key is not None else jax.device_put(transfer.random_key(), self.device)
            arrays = [key, *arrays]
        results = self.execute(arrays)
        return results, (results.pop() if self.layout.checks else None)

    def verify(self, flag) -> None:
        """Waits for the program of `flag` (from `launch`) and raises CheckFailed if a check failed."""
        checks.raise_if_failed(self.layout.checks, transfer.scalar(flag))


def _initialize_lapack() -> None:
    """jaxlib fills in its LAPACK kernels' function pointers when it first lowers a linear-algebra
    op; a program loaded from the cache in a fresh process calls them before that (and crashed:
    torch.logdet, from a warm disk cache). Idempotent."""
    from jax._src.lib import lapack

    lapack._lapack.initialize()


def torch_outputs(layout: ProgramLayout, tensor_at: Callable[[int], torch.Tensor],
                  dense_from: int | None = None) -> list:
    """The graph's outputs as torch values; `tensor_at(i)` is the program's i-th result as a
    tensor. Outputs before `dense_from` (all when None) get torch's strides where they differ."""
    out = []
    restride = len(layout.outputs) if dense_from is None else dense_from
    for position, slot in enumerate(layout.outputs):
        if slot.kind == "tensor":
            t = tensor_at(slot.index)
            if slot.stride is not None and position < restride:
                t = torch.empty_strided(t.shape, slot.stride, dtype=t.dtype, device=t.device).copy_(t)
            out.append(t)
        elif slot.kind == "value":
            out.append(slot.value)
        else:
            out.append(None)
    return out
