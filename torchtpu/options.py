"""Backend options: what `torch.compile(..., backend="tpu", options={...})` accepts."""
from __future__ import annotations

import dataclasses
import json
from typing import Any

BUCKETING_MIN = 8  # the smallest pow2 bucket: tiny sizes share one program
BUCKETING_MIN_LAST = 128  # ... along an input's last dim: a TPU tile row is 128 lanes wide


@dataclasses.dataclass(frozen=True)
class Options:
    """Validated backend options.

    Args:
        platform: "cpu" | "gpu" | "tpu" | None (None: the process default, see runtime.platform).
        dump_dir: where to write FX graphs, StableHLO and summaries (also TORCHTPU_DUMP_DIR).
        bucketing: how symbolic sizes map to compiled sizes: "pow2" (default; powers of two,
            at least 128 along an input's last dim and 8 along the others), "off" (one program
            per exact size), {"multiple": M}, {"sizes": [...]} (the smallest listed size that
            fits; larger sizes stay exact), or {"pow2": MIN} (powers of two, at least MIN).
        pallas: Pallas kernels (attention, norms): "auto" (on a TPU target; XLA's own ops
            elsewhere), "interpret" (the TPU kernels in interpret mode, on any platform), "off".
        fallback: ops the device cannot run (no rule, `.item()`, data-dependent shapes):
            "defer" (default; they run eagerly between the fewest device programs, see
            passes/defer_and_fuse.py) or "error" (the lowering error that names the op).
        mode: "fused" (default; one program per device region) or "strict" (one program per
            ATen op, the baseline of benchmarks/fuse_bench.py). Not torch.compile's `mode=`.
        mesh: {"dp": N, "tp": M}: run partitioned over a device mesh (see torchtpu/spmd, docs/spmd.md).
        tp_plan: with a mesh: "auto" (the Hugging Face model's own plan) or {pattern: "colwise" |
            "rowwise" | "replicate" | "sequence"}; None: parameters replicated (data parallel).
        aten_kernels: "auto" (default: on the CPU, convolutions, MoE grouped matmuls and attention
            (forward and backward) call ATen's kernels inside the XLA program, see kernels/aten_cpu.py; dense
            float32 and bfloat16 2d convolutions of 32+ input channels, convolutions over disjoint
            patches, and attention backwards with heads 16+ wide and at most 128x128 scores stay
            XLA's, rules/conv.py and rules/attention.py) or "off" (XLA's own).
        check_indices: True (default): programs check every position they read or write by tensor
            value (embedding, gather, index, scatter, ...) and torch's asserts, and the call raises
            torch's error (IndexError, RuntimeError) for a bad one; False: no checks (XLA then
            clamps or drops out-of-range positions silently), and no flag read back per call.
        excess_precision: True (default): a chain of bfloat16/float16 pointwise ops keeps its
            values in float32 between them and rounds where a value leaves the chain (as
            Inductor's fused kernels and XLA's own excess precision do); False: every op rounds
            its result as eager does (eager's bits, slower on the CPU: docs/DECISIONS.md 80).
        xla_options: {name: value}: XLA compile options for this model's programs, the fields of
            XLA's DebugOptions (e.g. {"xla_cpu_prefer_vector_width": 512}), as JAX's
            `.compile(compiler_options=...)` takes them: per program, where XLA_FLAGS is per
            process. Part of the cache key; XLA rejects an unknown name or a bad value at the
            first compile, and the error names the option.
    """

    platform: str | None = None
    dump_dir: str | None = None
    bucketing: Any = "pow2"
    pallas: str = "auto"
    fallback: str = "defer"
    mode: str = "fused"
    mesh: Any = None
    tp_plan: Any = None
    aten_kernels: str = "auto"
    check_indices: bool = True
    excess_precision: bool = True
    xla_options: Any = ()

    @classmethod
    def parse(cls, options: dict[str, Any] | None) -> "Options":
        options = dict(options or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(
                f"torchtpu: unknown backend option(s) {unknown}; known options: {sorted(known)}"
            )
        if "bucketing" in options:
            options["bucketing"] = _parse_bucketing(options["bucketing"])
        if "mesh" in options or "tp_plan" in options:
            options["mesh"], options["tp_plan"] = _parse_spmd(options.get("mesh"), options.get("tp_plan"))
        if "xla_options" in options:
            options["xla_options"] = _parse_xla_options(options["xla_options"])
        parsed = cls(**options)
        if parsed.platform not in (None, "cpu", "gpu", "tpu"):
            raise ValueError(f"torchtpu: option platform={parsed.platform!r}; use 'cpu', 'gpu' or 'tpu'")
        if parsed.pallas not in ("auto", "interpret", "off"):
            raise ValueError(f"torchtpu: option pallas={parsed.pallas!r}; use 'auto', 'interpret' or 'off'")
        if parsed.fallback not in ("defer", "error"):
            raise ValueError(f"torchtpu: option fallback={parsed.fallback!r}; use 'defer' or 'error'")
        if parsed.aten_kernels not in ("auto", "off"):
            raise ValueError(f"torchtpu: option aten_kernels={parsed.aten_kernels!r}; use 'auto' or 'off'")
        if not isinstance(parsed.check_indices, bool):
            raise ValueError(f"torchtpu: option check_indices={parsed.check_indices!r}; use True or False")
        if not isinstance(parsed.excess_precision, bool):
            raise ValueError(f"torchtpu: option excess_precision={parsed.excess_precision!r}; use True or False")
        if parsed.mode not in ("fused", "strict"):
            raise ValueError(f"torchtpu: option mode={parsed.mode!r}; use 'fused' or 'strict'")
        return parsed

    def key_items(self) -> tuple:
        """The options that change the compiled program (dump_dir does not)."""
        items = (("bucketing", json.dumps(self.bucketing, sort_keys=True)), ("pallas", self.pallas),
                 ("aten_kernels", self.aten_kernels), ("check_indices", self.check_indices),
                 ("excess_precision", self.excess_precision))
        if self.mesh is not None:  # only then: keys of unsharded programs stay as they were
            items += (("mesh", json.dumps(self.mesh)), ("tp_plan", json.dumps(self.tp_plan)))
        if self.xla_options:  # likewise
            items += (("xla_options", json.dumps(self.xla_options)),)
        return items


def _parse_xla_options(value) -> tuple[tuple[str, Any], ...]:
    """Normalises the xla_options option to ((name, value), ...) sorted by name (hashable)."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise ValueError(f"torchtpu: option xla_options={value!r}; use a dict such as "
                         "{'xla_cpu_prefer_vector_width': 512}")
    for name, setting in value.items():
        if not isinstance(name, str) or not name.startswith("xla_"):
            raise ValueError(f"torchtpu: xla_options name {name!r}: XLA's compile options are named xla_...")
        if not isinstance(setting, (bool, int, float, str)):
            raise ValueError(f"torchtpu: xla_options[{name!r}]={setting!r}; use a bool, int, float or str")
    return tuple(sorted(value.items()))


def _parse_spmd(mesh, tp_plan):
    """Validates mesh and tp_plan together (a plan needs a mesh); see torchtpu/spmd."""
    mesh, tp_plan = parse_mesh(mesh), parse_plan(tp_plan)
    if tp_plan is not None and mesh is None:
        raise ValueError("torchtpu: option tp_plan needs a mesh, e.g. options={'mesh': {'tp': 4}, 'tp_plan': ...}")
    return mesh, tp_plan


def _parse_bucketing(value):
    """Normalises the bucketing option to "off", "pow2" or a one-key dict with a hashable value."""
    if value in (None, False, "off"):
        return "off"
    if value in (True, "pow2"):
        return "pow2"
    if isinstance(value, dict) and len(value) == 1:
        (kind, arg), = value.items()
        if kind in ("multiple", "pow2") and isinstance(arg, int) and arg >= 1:
            return {kind: arg}
        if kind == "sizes" and arg and all(isinstance(s, int) and s >= 1 for s in arg):
            return {"sizes": tuple(sorted(set(arg)))}
    raise ValueError(f"torchtpu: option bucketing={value!r}; use 'pow2', 'off', {{'multiple': M}}, "
                     "{'sizes': [...]} or {'pow2': MIN}")


# --- the SPMD options (torchtpu/spmd builds the mesh and the shardings from them) ---------------

AXES = ("dp", "tp")  # data parallel (batch dim of inputs), tensor parallel (the tp_plan's axis)


def parse_mesh(value) -> tuple[tuple[str, int], ...] | None:
    """Validates the `mesh` option and normalises it to ((axis, size), ...) in AXES order.

    Args:
        value: None, or a dict {"dp": N, "tp": M} (either axis may be left out; one size may
            be -1: the devices left over by the other axis).

    Returns:
        None, or a tuple of (axis, size) pairs (hashable, for Options and the cache key).
    """
    if value is None:
        return None
    if not isinstance(value, dict) or not value:
        raise ValueError(f"torchtpu: option mesh={value!r}; use a dict such as {{'dp': 2, 'tp': 4}}")
    unknown = sorted(set(value) - set(AXES))
    if unknown:
        raise ValueError(f"torchtpu: option mesh has unknown axis {unknown}; axes are {list(AXES)} "
                         "(dp shards the batch dimension of inputs, tp shards parameters by tp_plan)")
    for axis, size in value.items():
        if not isinstance(size, int) or isinstance(size, bool) or (size < 1 and size != -1):
            raise ValueError(f"torchtpu: option mesh[{axis!r}]={size!r}; use a positive int (or -1 for the rest)")
    if sum(size == -1 for size in value.values()) > 1:
        raise ValueError(f"torchtpu: option mesh={value!r}: at most one axis may be -1")
    return tuple((axis, value[axis]) for axis in AXES if axis in value)


STYLES = ("colwise", "rowwise", "replicate", "sequence")


def parse_plan(value) -> str | tuple[tuple[str, str], ...] | None:
    """Validates the `tp_plan` option.

    Args:
        value: None, "auto", or a dict {pattern: style} with styles from STYLES.

    Returns:
        None, "auto", or ((pattern, style), ...) sorted by pattern (hashable, for the cache key).
    """
    if value is None or value == "auto":
        return value
    if not isinstance(value, dict):
        raise ValueError(f"torchtpu: option tp_plan={value!r}; use 'auto' or a dict {{pattern: style}} "
                         f"with styles {list(STYLES)}")
    for pattern, style in value.items():
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"torchtpu: tp_plan pattern {pattern!r} must be a non-empty string")
        if style not in STYLES:
            raise ValueError(f"torchtpu: tp_plan[{pattern!r}]={style!r}; styles are {list(STYLES)}")
    return tuple(sorted(value.items()))
