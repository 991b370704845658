"""The OpInfo conformance sweep: every OpInfo sample compiled with backend="tpu" vs eager.

One OpInfo × dtype is a "case". A case passes when every sample tried matches eager
(rtol 1.3e-4, atol 1e-4 for floats; exact for integers and bools); a bfloat16 sample that misses
eager's bfloat16 numbers passes when it is no worse than eager against the op in float32
(`check`: eager's own bfloat16 kernels round differently by CPU, e.g. with or without AVX512-BF16). Samples that Dynamo +
AOTAutograd cannot capture (backend="aot_eager" fails too) are not ours to pass: a case
whose samples are all uncapturable is "uncapturable" and leaves the denominator.
Random ops (two eager runs under different seeds differ) are checked by shape and dtype,
plus moments for floating outputs. The sweep measures our lowering rules, so it compiles with
`fallback="error"`: an op without a rule fails here instead of running eagerly on the host.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import torch
import torch._dynamo
from torch.utils import _pytree as pytree

TABLE = Path(__file__).with_name("opinfo_expected_failures.json")
DTYPES = {"float32": torch.float32, "int64": torch.int64, "bool": torch.bool, "bfloat16": torch.bfloat16}
MAX_SAMPLES = {"float32": 3, "int64": 2, "bool": 2, "bfloat16": 2}
# `make test` tries fewer samples of a case the table expects to pass (the sweep was 45% of its
# worker time, 4180 s; each sample is a Dynamo trace and a compile): an OpInfo's first samples are
# its plainest, and dtype-specific defects show on them. Expected failures, the table's
# regeneration and `make coverage` (TORCHTPU_OPINFO_FULL=1) try MAX_SAMPLES.
QUICK_SAMPLES = {"float32": 2, "int64": 1, "bool": 1, "bfloat16": 1}
# Samples that neither we nor aot_eager capture, looked at before a case stops searching: each
# costs two Dynamo traces, and an op whose samples all break the graph (gaussian_nll_loss's
# data-dependent check) would otherwise trace all of its hundreds.
MAX_UNCAPTURABLE = 12
TOL = {torch.float32: (1.3e-4, 1e-4), torch.bfloat16: (1.6e-2, 1e-2), torch.float64: (1e-7, 1e-7)}


def case_name(opinfo) -> str:
    return opinfo.name + (f".{opinfo.variant_test_name}" if opinfo.variant_test_name else "")


def cases(dtype_name: str):
    from torch.testing._internal.common_methods_invocations import op_db

    dtype = DTYPES[dtype_name]
    return [o for o in op_db if dtype in o.supported_dtypes("cpu")]


@dataclasses.dataclass
class Result:
    status: str  # "pass", "fail", "uncapturable"
    detail: str = ""


class _Uncapturable(Exception):
    pass


def _split(sample):
    """Tensors of a sample become compiled inputs; everything else is closed over."""
    tree = (sample.input, sample.args, sample.kwargs)
    leaves, spec = pytree.tree_flatten(tree)
    tensor_positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    tensors = [leaves[i] for i in tensor_positions]

    def rebuild(*ts):
        filled = list(leaves)
        for i, t in zip(tensor_positions, ts):
            filled[i] = t
        return pytree.tree_unflatten(filled, spec)

    return tensors, rebuild


def _clone(tensors):
    return [t.detach().clone() for t in tensors]


def _run(opinfo, rebuild, tensors, backend=None):
    def fn(*ts):
        inp, args, kwargs = rebuild(*ts)
        return opinfo.op(inp, *args, **kwargs)

    if backend is None:
        return fn(*tensors)
    torch._dynamo.reset()
    options = {"fallback": "error"} if backend == "tpu" else None
    compiled = torch.compile(fn, backend=backend, fullgraph=True, dynamic=False, options=options)
    return compiled(*tensors)


# Ops whose values are uninitialised memory in eager: shape and dtype are the contract.
UNINITIALISED = {"empty", "empty_like", "empty_permuted", "empty_strided", "new_empty", "new_empty_strided"}


def _check_kind(opinfo, rebuild, tensors) -> str:
    """"values" (compare numbers), "random" (shape, dtype, moments) or "layout" (shape, dtype)."""
    if opinfo.name in UNINITIALISED:
        return "layout"
    outs = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        outs.append(pytree.tree_leaves(_run(opinfo, rebuild, _clone(tensors))))
    for a, b in zip(*outs):
        if isinstance(a, torch.Tensor) and a.dtype == torch.complex32:  # no torch.equal for it
            a, b = a.to(torch.complex64), b.to(torch.complex64)
        if isinstance(a, torch.Tensor) and a.shape == b.shape and not torch.equal(a, b):
            if not (a.is_floating_point() and torch.isnan(a).any()):
                return "random"
    return "values"


# Ops whose eigenvectors are defined up to a unit factor per column, which LAPACK builds choose
# differently (torch's and jaxlib's flipped a column's sign on one CPU and not on another).
PHASE_FREE = {"linalg.eig"}


def canonical(opinfo, out):
    """`out` with each eigenvector column scaled so that its largest entry is real and positive,
    for PHASE_FREE ops; any other op's `out` as it is."""
    if opinfo.name not in PHASE_FREE or out[1].numel() == 0:
        return out
    values, vectors = out
    pivot = vectors.gather(-2, vectors.abs().argmax(dim=-2, keepdim=True))
    return type(out)((values, vectors * (pivot.abs() / pivot).nan_to_num(1.0)))


def compare(actual, expected, kind: str = "values") -> None:
    """Raises AssertionError unless `actual` matches `expected` (structure, dtype, and values
    as `kind` says: see _check_kind)."""
    act, exp = pytree.tree_leaves(actual), pytree.tree_leaves(expected)
    assert len(act) == len(exp), f"{len(act)} outputs, eager has {len(exp)}"
    for a, e in zip(act, exp):
        if not isinstance(e, torch.Tensor):
            if isinstance(e, float):
                assert abs(a - e) <= 1e-4 + 1.3e-4 * abs(e), f"{a} != {e}"
            else:
                assert a == e, f"{a!r} != {e!r}"
            continue
        assert isinstance(a, torch.Tensor), f"got {type(a).__name__}, eager gives a tensor"
        assert a.shape == e.shape, f"shape {tuple(a.shape)} != {tuple(e.shape)}"
        assert a.dtype == e.dtype, f"dtype {a.dtype} != {e.dtype}"
        if kind == "layout":
            continue
        if kind == "random":
            if e.is_floating_point() and e.numel() >= 1000:
                assert abs(a.double().mean() - e.double().mean()) < 0.1 * (e.double().std() + 1e-3) + 0.05
            continue
        if e.dtype == torch.complex32:  # compare as complex64: torch has no kernels for it
            a, e = a.to(torch.complex64), e.to(torch.complex64)
        rtol, atol = TOL.get(e.dtype, (0, 0))
        if e.is_complex():
            rtol, atol = TOL[torch.float32]
        torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True, check_stride=False)


def check(opinfo, rebuild, tensors, actual, expected, kind: str = "values") -> None:
    """`compare` of our outputs with eager's, output by output; a bfloat16 output that misses
    eager's must be no worse than eager's against the same op run in float32 (the project's bar
    for bfloat16: eager's bfloat16 is a measure of the error torch accepts, not the truth). Every
    other output (indices, integers, float32) must match as `compare` says."""
    actual, expected = canonical(opinfo, actual), canonical(opinfo, expected)
    try:
        compare(actual, expected, kind)
        return
    except AssertionError:
        if kind != "values":
            raise
    widened = [t.float() if t.dtype == torch.bfloat16 else t for t in _clone(tensors)]
    torch.manual_seed(0)
    reference = pytree.tree_leaves(canonical(opinfo, _run(opinfo, rebuild, widened)))
    for a, e, r in zip(pytree.tree_leaves(actual), pytree.tree_leaves(expected), reference):
        try:
            compare(a, e, kind)
        except AssertionError as mismatch:
            if not (isinstance(e, torch.Tensor) and e.dtype == torch.bfloat16 and isinstance(a, torch.Tensor)
                    and a.dtype == e.dtype and isinstance(r, torch.Tensor) and r.shape == e.shape):
                raise
            ours, eager = _error(a, r), _error(e, r)
            if not ours <= 1.25 * eager + 1e-3:
                raise AssertionError(f"{mismatch}; against float32 ours is {ours:.3g} off, "
                                     f"eager's bfloat16 {eager:.3g}") from None


def _error(x, reference) -> float:
    """Largest absolute difference, NaNs and infinities where the reference has them excepted."""
    x, reference = x.double(), reference.double()
    same = (x == reference) | (x.isnan() & reference.isnan())
    return (x - reference).abs().masked_fill(same, 0).nan_to_num(float("inf")).max().item() if x.numel() else 0.0


def full() -> bool:
    return os.environ.get("TORCHTPU_OPINFO_FULL") == "1" or regenerating()


def max_samples(dtype_name: str, expected: str | None) -> int:
    """Samples to try of a case the table records as `expected` (None: expected to pass)."""
    return MAX_SAMPLES[dtype_name] if expected is not None or full() else QUICK_SAMPLES[dtype_name]


def run_case(opinfo, dtype_name: str, max_tried: int | None = None) -> Result:
    dtype = DTYPES[dtype_name]
    max_tried = max_tried or MAX_SAMPLES[dtype_name]
    samples = opinfo.sample_inputs("cpu", dtype, requires_grad=False)
    tried = passed = uncapturable = 0
    failures = []
    for sample in samples:
        if tried >= max_tried or uncapturable >= MAX_UNCAPTURABLE:
            break
        tensors, rebuild = _split(sample)
        try:
            torch.manual_seed(0)
            expected = _run(opinfo, rebuild, _clone(tensors))
        except Exception:  # noqa: BLE001 — eager rejects this sample: not a case
            continue
        tried += 1
        try:
            kind = _check_kind(opinfo, rebuild, tensors)
            torch.manual_seed(0)
            actual = _run(opinfo, rebuild, _clone(tensors), backend="tpu")
            check(opinfo, rebuild, tensors, actual, expected, kind)
            passed += 1
        except Exception as exc:  # noqa: BLE001 — classify below
            if not _captures(opinfo, rebuild, tensors):
                tried -= 1
                uncapturable += 1
                continue
            failures.append(f"{type(exc).__name__}: {_first_line(exc)}")
    if tried == 0:
        return Result("uncapturable", f"no sample that eager and aot_eager both run (of the first "
                                      f"{uncapturable} eager runs)")
    if failures:
        return Result("fail", failures[0][:300])
    return Result("pass")


def _captures(opinfo, rebuild, tensors) -> bool:
    try:
        _run(opinfo, rebuild, _clone(tensors), backend="aot_eager")
        return True
    except Exception:  # noqa: BLE001
        return False


def _first_line(exc) -> str:
    text = str(exc).strip()
    for marker in ("LoweringError:", "raised:\n"):
        if marker in text:
            text = text.split(marker, 1)[1].strip()
    return text.splitlines()[0] if text else ""


def load_table() -> dict[str, dict[str, str]]:
    if TABLE.exists():
        return json.loads(TABLE.read_text())
    return {}


def regenerating() -> bool:
    """TORCHTPU_OPINFO_REGEN=1 rewrites the expected-failure table from this run."""
    return os.environ.get("TORCHTPU_OPINFO_REGEN") == "1"
