"""The device OpInfo sweep: every OpInfo sample run eagerly on device="tpu" vs the CPU.

One OpInfo × dtype is a "case" (as in opinfo_sweep.py, whose comparison it shares). A sample's
tensors are copied to the tpu, the op runs op by op on the device (strict eager), and every
output comes back to be compared with the CPU's. Where the OpInfo supports autograd, the
gradients of the sum of its floating outputs with respect to its floating inputs are computed on
both and compared too, for the first sample (backward compiles most of a case's programs). A case passes when every sample tried matches, forward and backward.

Random ops are found by the ATen ops they call (torch's `nondeterministic_seeded` tag): the
device's generator is not the CPU's, so they are checked by shape and dtype (and moments for
large floating outputs), and have no backward check. A case where the CPU runs none of the
samples tried is "no sample" (it stays in the table, outside the pass count).

The expected-failure table device_opinfo_expected_failures.json keeps the cases that do not
pass, each with its reason; the test files fail on an unexpected failure and on an expected
one that passes. Regenerate it with:
    TORCHTPU_OPINFO_REGEN=1 .venv/bin/python -m pytest -n 3 --dist loadfile tests/test_device_opinfo_*.py
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
from pathlib import Path

import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import opinfo_sweep
import torchtpu.device  # noqa: F401 — registers the device

TPU = "tpu"
TABLE = Path(__file__).with_name("device_opinfo_expected_failures.json")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
MAX_SAMPLES = 2
CHUNKS = 3  # test_device_opinfo_{0,1,2}.py, one per chunk, so pytest-xdist can spread them
NO_SAMPLE = "no sample"
# bfloat16: forward only, on the OpInfos of torch.nn.functional and the elementwise families
# (the dtype models are run in); float32 covers every OpInfo.
BFLOAT16_PREFIXES = ("nn.functional.", "special.", "linalg.vector_norm", "softmax", "log_softmax")


def cases(dtype_name: str, chunk: int | None = None):
    """The OpInfos swept for dtype_name; chunk k of CHUNKS takes every CHUNKS-th one."""
    found = opinfo_sweep.cases(dtype_name)
    if dtype_name == "bfloat16":
        found = [o for o in found if _in_bfloat16_subset(o)]
    return found if chunk is None else found[chunk::CHUNKS]


def _in_bfloat16_subset(opinfo) -> bool:
    return opinfo.name.startswith(BFLOAT16_PREFIXES) or opinfo.name in _UNARY_AND_BINARY


def _unary_and_binary() -> set[str]:
    from torch.testing._internal.common_methods_invocations import binary_ufuncs, unary_ufuncs

    return {o.name for o in (*unary_ufuncs, *binary_ufuncs)}


_UNARY_AND_BINARY = _unary_and_binary()


@dataclasses.dataclass
class Result:
    status: str  # "pass", "fail", NO_SAMPLE
    detail: str = ""


class _SeedRecorder(TorchDispatchMode):
    """Notes whether any ATen op run under it draws random numbers."""

    def __init__(self):
        super().__init__()
        self.random = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.random = True
        return func(*args, **(kwargs or {}))


def _to_tpu(tensors, grad: bool):
    out = []
    for t in tensors:
        moved = t.detach().clone().to(TPU)
        out.append(moved.requires_grad_() if grad and t.is_floating_point() else moved)
    return out


def _to_cpu(tree):
    def leave(x):
        if isinstance(x, torch.Tensor):
            assert x.device.type == TPU, f"an output on {x.device}, not on the tpu"
            return x.cpu()
        return x
    return pytree.tree_map(leave, tree)


def _grads(opinfo, rebuild, inputs):
    """d(sum of the floating outputs)/d(floating inputs), or None when nothing is differentiable.

    The sum's gradient (ones) is given as grad_outputs, uploaded: no sum and no fill programs."""
    outs = pytree.tree_leaves(opinfo_sweep._run(opinfo, rebuild, inputs))
    outs = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad and o.is_floating_point()]
    wrt = [t for t in inputs if t.requires_grad]
    if not outs or not wrt:
        return None
    ones = [torch.ones(o.shape, dtype=o.dtype).to(o.device) for o in outs]
    return list(torch.autograd.grad(outs, wrt, ones, allow_unused=True))


def _on_tpu(rebuild):
    """The sample's arguments with a factory's device="cpu" made "tpu"."""
    def rebuilt(*tensors):
        inp, args, kwargs = rebuild(*tensors)
        return inp, args, ({**kwargs, "device": TPU} if "device" in kwargs else kwargs)
    return rebuilt


def _cpu_grads(opinfo, rebuild, tensors):
    inputs = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in tensors]
    try:
        grads = _grads(opinfo, rebuild, inputs)
    except Exception:  # noqa: BLE001 — the CPU has no backward for this sample: nothing to check
        return None
    return None if grads is None or all(g is None for g in grads) else grads


def _sample_inputs(opinfo, dtype):
    # sample_inputs_func directly: OpInfo.sample_inputs walks the Python stack (inspect.stack,
    # reading source files) to find a unittest method: 3.4 s of 43 in a profile of 12 OpInfos.
    torch.manual_seed(0)
    return opinfo.sample_inputs_func(opinfo, "cpu", dtype, False)


def run_case(opinfo, dtype_name: str) -> Result:
    dtype = DTYPES[dtype_name]
    backward = dtype_name == "float32" and opinfo.supports_autograd
    tried = 0
    for sample in _sample_inputs(opinfo, dtype):
        if tried >= MAX_SAMPLES:
            break
        tensors, rebuild = opinfo_sweep._split(sample)
        recorder = _SeedRecorder()
        try:
            torch.manual_seed(0)
            with recorder:
                expected = opinfo_sweep._run(opinfo, rebuild, opinfo_sweep._clone(tensors))
        except Exception:  # noqa: BLE001 — the CPU rejects this sample: not a case
            continue
        tried += 1
        kind = ("layout" if opinfo.name in opinfo_sweep.UNINITIALISED
                else "random" if recorder.random else "values")
        step = "forward"
        try:
            torch.manual_seed(0)
            actual = _to_cpu(opinfo_sweep._run(opinfo, _on_tpu(rebuild), _to_tpu(tensors, grad=False)))
            opinfo_sweep.check(opinfo, rebuild, tensors, actual, expected, kind)
            if backward and kind == "values" and tried == 1:  # most of a case's programs: once
                step = "backward"
                expected_grads = _cpu_grads(opinfo, rebuild, tensors)
                if expected_grads is not None:
                    grads = _to_cpu(_grads(opinfo, _on_tpu(rebuild), _to_tpu(tensors, grad=True)))
                    opinfo_sweep.compare(grads, expected_grads)
        except Exception as exc:  # noqa: BLE001 — the case fails with its first failure
            return Result("fail", f"{step}: {type(exc).__name__}: {_first_line(exc)}"[:300])
    if tried == 0:
        return Result(NO_SAMPLE, "the CPU runs none of its samples")
    return Result("pass")


def _first_line(exc) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


@contextlib.contextmanager
def memory_cache_only():
    """No disk cache while the sweep runs: no later process reads its thousands of one-op
    programs, and writing each costs about as much as lowering it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCHTPU_CACHE_DIR", "off")
        yield


def load_table() -> dict[str, dict[str, str]]:
    text = TABLE.read_text() if TABLE.exists() else ""
    return json.loads(text) if text.strip() else {}


def check(opinfo, dtype_name: str, table: dict, results: dict) -> None:
    """Runs one case and asserts it agrees with the table (an expected failure must still fail)."""
    name = opinfo_sweep.case_name(opinfo)
    result = run_case(opinfo, dtype_name)
    results.setdefault(dtype_name, {})[name] = result
    if opinfo_sweep.regenerating():
        return
    expected = table.get(dtype_name, {}).get(name)
    if result.status == NO_SAMPLE:
        assert expected is not None and expected.startswith(NO_SAMPLE), (
            f"{name} [{dtype_name}]: {result.detail}, but the table says {expected!r}; regenerate it")
    elif expected is None:
        assert result.status == "pass", f"{name} [{dtype_name}] fails on the tpu: {result.detail}"
    elif expected.startswith(NO_SAMPLE):
        raise AssertionError(f"{name} [{dtype_name}] has samples now ({result.status}); regenerate the table")
    else:
        assert result.status == "fail", (
            f"{name} [{dtype_name}] now passes on the tpu: remove it from {TABLE.name} (or regenerate)")


def write_results(results: dict) -> None:
    """Merges one run's results into the table, entry by entry (a -k subset updates its cases),
    under a lock: the chunks' files may end at once in parallel workers."""
    with open(TABLE, "a") as lock:  # the table itself is the lock (write_text keeps its inode)
        fcntl.flock(lock, fcntl.LOCK_EX)
        _merge(results)


def _merge(results: dict) -> None:
    merged = load_table()
    for dtype_name, by_name in results.items():
        entries = merged.setdefault(dtype_name, {})
        for name, result in by_name.items():
            if result.status == "pass":
                entries.pop(name, None)
            elif result.status == NO_SAMPLE:
                entries[name] = f"{NO_SAMPLE}: {result.detail}"
            else:
                entries[name] = result.detail
    TABLE.write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")


def compiler_passes(dtype_name: str = "float32") -> set[str]:
    """The cases that pass under the compiler: its sweep's cases less its expected-failure table
    (which test_opinfo.py keeps exact: an entry that passes fails that test)."""
    failing = opinfo_sweep.load_table().get(dtype_name, {})
    return {opinfo_sweep.case_name(o) for o in opinfo_sweep.cases(dtype_name)} - set(failing)


def device_passes(dtype_name: str = "float32") -> set[str]:
    """The cases that pass on the device: its sweep's cases less its table (kept exact the same way)."""
    failing = load_table().get(dtype_name, {})
    return {opinfo_sweep.case_name(o) for o in cases(dtype_name)} - set(failing)


def chunk(n: int):
    """The test and its module fixture for chunk file n (tests/test_device_opinfo_<n>.py), which
    binds them to module-level names for pytest:

        test_device_opinfo, regenerate_at_the_end = sweep.chunk(0)
    """
    import pytest

    import opinfo_sweep

    table, results = load_table(), {}
    params = [pytest.param(o, dtype, id=f"{dtype}-{opinfo_sweep.case_name(o)}")
              for dtype in DTYPES for o in cases(dtype, chunk=n)]

    @pytest.fixture(scope="module", autouse=True)
    def regenerate_at_the_end():
        with memory_cache_only():
            yield
        if opinfo_sweep.regenerating() and results:
            write_results(results)

    @pytest.mark.parametrize("opinfo,dtype", params)
    def test_device_opinfo(opinfo, dtype):
        check(opinfo, dtype, table, results)

    return test_device_opinfo, regenerate_at_the_end
