"""Backend options: what `torch.compile(..., backend="tpu", options={...})` accepts."""
from __future__ import annotations

import dataclasses
import json
from typing import Any

BUCKETING_MIN = 8  # the smallest pow2 bucket: tiny sizes share one program


@dataclasses.dataclass(frozen=True)
class Options:
    """Validated backend options.

    Args:
        platform: "cpu" | "gpu" | "tpu" | None (None: the process default, see runtime.platform).
        dump_dir: where to write FX graphs, StableHLO and summaries (also TORCHTPU_DUMP_DIR).
        bucketing: how symbolic sizes map to compiled sizes: "pow2" (default; powers of two,
            at least 8), "off" (one program per exact size), {"multiple": M},
            {"sizes": [...]} (the smallest listed size that fits; larger sizes stay exact),
            or {"pow2": MIN} (powers of two, at least MIN).
        pallas: Pallas kernels (attention, norms): "auto" (on a TPU target; XLA's own ops
            elsewhere), "interpret" (the TPU kernels in interpret mode, on any platform), "off".
    """

    platform: str | None = None
    dump_dir: str | None = None
    bucketing: Any = "pow2"
    pallas: str = "auto"

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
        parsed = cls(**options)
        if parsed.platform not in (None, "cpu", "gpu", "tpu"):
            raise ValueError(f"torchtpu: option platform={parsed.platform!r}; use 'cpu', 'gpu' or 'tpu'")
        if parsed.pallas not in ("auto", "interpret", "off"):
            raise ValueError(f"torchtpu: option pallas={parsed.pallas!r}; use 'auto', 'interpret' or 'off'")
        return parsed

    def key_items(self) -> tuple:
        """The options that change the compiled program (dump_dir does not)."""
        return (("bucketing", json.dumps(self.bucketing, sort_keys=True)), ("pallas", self.pallas))


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
