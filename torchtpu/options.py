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
        aten_kernels: "auto" (default: on the CPU, convolutions call ATen's oneDNN kernels inside
            the XLA program, 2d/3d ones channels-last, see kernels/aten_cpu.py) or "off" (XLA's own).
        check_indices: True (default): programs check every position they read or write by tensor
            value (embedding, gather, index, scatter, ...) and torch's asserts, and the call raises
            torch's error (IndexError, RuntimeError) for a bad one; False: no checks (XLA then
            clamps or drops out-of-range positions silently), and no flag read back per call.
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
        if parsed.mode not in ("fused", "strict"):
            raise ValueError(f"torchtpu: option mode={parsed.mode!r}; use 'fused' or 'strict'")
        return parsed

    def key_items(self) -> tuple:
        """The options that change the compiled program (dump_dir does not)."""
        items = (("bucketing", json.dumps(self.bucketing, sort_keys=True)), ("pallas", self.pallas),
                 ("aten_kernels", self.aten_kernels), ("check_indices", self.check_indices))
        if self.mesh is not None:  # only then: keys of unsharded programs stay as they were
            items += (("mesh", json.dumps(self.mesh)), ("tp_plan", json.dumps(self.tp_plan)))
        return items


def _parse_spmd(mesh, tp_plan):
    """Validates mesh and tp_plan together (a plan needs a mesh); see torchtpu/spmd."""
    from torchtpu.spmd.mesh import parse_mesh
    from torchtpu.spmd.plan import parse_plan

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
