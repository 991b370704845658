"""Backend options: what `torch.compile(..., backend="tpu", options={...})` accepts."""
from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Options:
    """Validated backend options.

    Args:
        platform: "cpu" | "gpu" | "tpu" | None (None: the process default, see runtime.platform).
        dump_dir: where to write FX graphs, StableHLO and summaries (also TORCHTPU_DUMP_DIR).
    """

    platform: str | None = None
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
        return parsed

    def key_items(self) -> tuple:
        """The options that change the compiled program (dump_dir does not)."""
        return ()
