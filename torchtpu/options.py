"""Backend options: what `torch.compile(..., backend="tpu", options={...})` accepts."""
from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Options:
    """Validated backend options.

    Args:
        platform: "cpu" | "gpu" | "tpu" | None (None: the process default, see runtime.platform).
        float64: what a TPU target does with float64: "error" (default) or "downcast" to float32.
            CPU and GPU keep float64 as float64.
        dump_dir: where to write FX graphs, StableHLO and summaries (also TORCHTPU_DUMP_DIR).
    """

    platform: str | None = None
    float64: str = "error"
    dump_dir: str | None = None

    @classmethod
    def parse(cls, options: dict[str, Any] | None) -> "Options":
        options = dict(options or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(
                f"torchtpu: unknown backend option(s) {unknown}; known options: {sorted(known)}"
            )
        parsed = cls(**options)
        if parsed.platform not in (None, "cpu", "gpu", "tpu"):
            raise ValueError(f"torchtpu: option platform={parsed.platform!r}; use 'cpu', 'gpu' or 'tpu'")
        if parsed.float64 not in ("error", "downcast"):
            raise ValueError(f"torchtpu: option float64={parsed.float64!r}; use 'error' or 'downcast'")
        return parsed

    def key_items(self) -> tuple:
        """The options that change the compiled program (dump_dir does not)."""
        return (("float64", self.float64),)
