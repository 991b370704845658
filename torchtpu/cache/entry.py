"""One cache entry: JSON metadata plus two blobs (StableHLO bytecode, PJRT executable).

Nothing here is a pickle: the metadata is JSON, the program is a StableHLO portable
artifact, the executable is PJRT's own serialization. Every blob carries a sha256 in the
metadata and the metadata carries a sha256 of itself, so truncation and bit flips are found.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math

from torchtpu.cache import versions
from torchtpu.cache.canonical import Unkeyable
from torchtpu.layout import OutputSlot, ProgramLayout

META = "meta.json"
USAGE = "usage.json"  # last used and hit count: rewritten on hits, so kept out of the checksummed file
PROGRAM = "program.mlirbc"
EXECUTABLE = "executable.bin"
BLOBS = (PROGRAM, EXECUTABLE)


class CorruptEntry(Exception):
    """An entry failed a check; the message says which."""


@dataclasses.dataclass
class Entry:
    meta: dict
    blobs: dict[str, bytes]

    @property
    def layout(self) -> ProgramLayout:
        return layout_from_json(self.meta["layout"])


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make(key, blobs: dict[str, bytes], layout: ProgramLayout, **info) -> Entry:
    """A new entry for `key` (a CacheKey); `info` goes into the metadata as is (JSON values)."""
    meta = {
        "format": versions.FORMAT_VERSION,
        "key": key.digest,
        "parts": key.to_json(),
        "versions": current_versions(),
        "layout": layout_to_json(layout),
        "blobs": {name: {"bytes": len(data), "sha256": sha256(data)} for name, data in blobs.items()},
        **info,
    }
    return Entry(seal(meta), blobs)


def current_versions() -> dict:
    return {**versions.libraries(), "torchtpu_source": versions.source_hash()}


def seal(meta: dict) -> dict:
    meta = {k: v for k, v in meta.items() if k != "meta_sha256"}
    meta["meta_sha256"] = sha256(_canonical_json(meta))
    return meta


def _canonical_json(meta: dict) -> bytes:
    return json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()


def dumps_meta(meta: dict) -> bytes:
    return json.dumps(meta, sort_keys=True, indent=1).encode()


def check_meta(raw: bytes, digest: str) -> dict:
    """Parses and checks metadata read from disk. Raises CorruptEntry."""
    try:
        meta = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptEntry(f"{META} is not JSON ({exc})") from None
    if not isinstance(meta, dict) or seal(meta).get("meta_sha256") != meta.get("meta_sha256"):
        raise CorruptEntry(f"{META} checksum mismatch")
    if meta.get("format") != versions.FORMAT_VERSION:
        raise CorruptEntry(f"format version {meta.get('format')} != {versions.FORMAT_VERSION}")
    if meta.get("versions") != current_versions():
        raise CorruptEntry("library or torchtpu source versions differ from this process")
    if meta.get("key") != digest:
        raise CorruptEntry(f"entry is stored under {digest[:12]} but says key {str(meta.get('key'))[:12]}")
    return meta


def check_blob(meta: dict, name: str, data: bytes) -> None:
    want = meta["blobs"][name]
    if len(data) != want["bytes"]:
        raise CorruptEntry(f"{name}: {len(data)} bytes, expected {want['bytes']} (truncated?)")
    if sha256(data) != want["sha256"]:
        raise CorruptEntry(f"{name}: checksum mismatch")


def layout_to_json(layout: ProgramLayout) -> dict:
    return {"tensor_inputs": list(layout.tensor_inputs), "uses_rng": layout.uses_rng,
            "outputs": [_slot_to_json(s) for s in layout.outputs], "checks": list(layout.checks)}


def layout_from_json(data: dict) -> ProgramLayout:
    outputs = [OutputSlot(s["kind"], s["index"], _value_from_json(s.get("value")),
                          tuple(s["stride"]) if s.get("stride") is not None else None) for s in data["outputs"]]
    return ProgramLayout(list(data["tensor_inputs"]), bool(data["uses_rng"]), outputs, list(data.get("checks", [])))


def _slot_to_json(slot: OutputSlot) -> dict:
    return {"kind": slot.kind, "index": slot.index, "value": _value_to_json(slot.value),
            "stride": list(slot.stride) if slot.stride is not None else None}


def _value_to_json(value):
    """Python values a graph can return besides tensors, tagged with their type."""
    if value is None:
        return None
    if type(value) in (bool, int, str):
        return {"type": type(value).__name__, "value": value}
    if type(value) is float:
        return {"type": "float", "value": value if math.isfinite(value) else repr(value)}
    raise Unkeyable(f"graph output of type {type(value).__name__} cannot be stored as JSON")


def _value_from_json(data):
    if data is None:
        return None
    kind, value = data["type"], data["value"]
    return {"bool": bool, "int": int, "str": str, "float": float}[kind](value)
