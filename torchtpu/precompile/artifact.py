"""The precompiled artifact file: a checked header around torch's serialized compiled function.

    TORCHTPU-PRECOMPILE <format>\\n
    <header length>\\n<header: JSON>\\n
    <payload: torch's save_compiled_function bytes>

The header names what the payload was built with (library versions, this package's source
hash, Python), the source lines Dynamo traced (with a hash of each span), the model's
parameter signature, the compile arguments, and the payload's sha256. torch's payload
contains a pickle, so a file is only read when no other user can have written it (the
compile cache's trust rule, paths.untrusted), and is read whole before anything is unpickled.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect
import json
import sys
from pathlib import Path

from torchtpu import paths

FORMAT = 1
MAGIC = b"TORCHTPU-PRECOMPILE"


class BadArtifact(Exception):
    """The file is not a usable precompiled artifact (its reason is the message)."""


class Untrusted(BadArtifact):
    """The file or its directory could have been written by another user."""


@dataclasses.dataclass
class Artifact:
    header: dict
    payload: bytes

    def to_bytes(self) -> bytes:
        header = json.dumps({**self.header, "payload_sha256": hashlib.sha256(self.payload).hexdigest()},
                            sort_keys=True).encode()
        return MAGIC + b" %d\n%d\n" % (FORMAT, len(header)) + header + b"\n" + self.payload

    @classmethod
    def read(cls, path: Path) -> "Artifact":
        path = Path(path)
        for p in (path, path.parent):
            why = paths.untrusted(p.resolve())
            if why is not None:
                raise Untrusted(f"{why}: a precompiled artifact is code this process would run")
        data = path.read_bytes()
        first, _, rest = data.partition(b"\n")
        if not first.startswith(MAGIC + b" "):
            raise BadArtifact(f"{path} is not a torchtpu precompiled artifact")
        if first[len(MAGIC) + 1:] != str(FORMAT).encode():
            raise BadArtifact(f"{path} has artifact format {first[len(MAGIC) + 1:].decode(errors='replace')}, "
                              f"this torchtpu reads {FORMAT}")
        length, _, rest = rest.partition(b"\n")
        try:
            size = int(length)
            header = json.loads(rest[:size])
        except ValueError as exc:
            raise BadArtifact(f"{path}: its header is damaged ({exc})") from None
        payload = rest[size + 1:]
        if hashlib.sha256(payload).hexdigest() != header.get("payload_sha256"):
            raise BadArtifact(f"{path}: its payload does not match its checksum (truncated or corrupted)")
        return cls(header, payload)


def build_versions() -> dict:
    """What a payload depends on: a change in any of these makes it foreign."""
    from torchtpu.cache import versions

    return {**versions.libraries(), "torchtpu_source": versions.source_hash(),
            "python": "%d.%d" % sys.version_info[:2], "artifact_format": FORMAT}


def version_mismatch(header: dict) -> str | None:
    saved, here = header.get("versions", {}), build_versions()
    changed = [f"{k} {saved.get(k)} -> {here[k]}" for k in here if saved.get(k) != here[k]]
    return None if not changed else "built with other versions (" + ", ".join(changed) + ")"


def source_spans(source_info) -> list[dict]:
    """The source spans Dynamo traced (torch's SourceInfo), each with a hash of its lines now."""
    spans = []
    for s in sorted(source_info.inlined_sources, key=lambda s: (s.module, s.firstlineno)):
        spans.append({"module": s.module, "first": s.firstlineno, "last": s.lastlineno,
                      "sha256": _span_hash(s.module, s.firstlineno, s.lastlineno)})
    return spans


def changed_source(header: dict) -> str | None:
    for span in header.get("sources", []):
        try:
            now = _span_hash(span["module"], span["first"], span["last"])
        except (ImportError, OSError) as exc:
            return f"the traced module {span['module']} cannot be read ({exc})"
        if now != span["sha256"]:
            return f"the model's code changed: {span['module']} lines {span['first']}-{span['last'] - 1}"
    return None


def _span_hash(module: str, first: int, last: int) -> str:
    lines = inspect.getsource(importlib.import_module(module)).splitlines(keepends=True)
    return hashlib.sha256("".join(lines[first - 1:last - 1]).encode()).hexdigest()


def model_signature(model) -> str | None:
    """The model's class, its submodules' classes and its parameters' and buffers' names, shapes
    and dtypes, hashed."""
    if model is None:
        return None
    import torch

    h = hashlib.sha256(_class_name(model).encode())
    if isinstance(model, torch.nn.Module):
        for name, m in model.named_modules():
            h.update(f"\0{name}={_class_name(m)}".encode())
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            h.update(f"\0{name}:{tuple(t.shape)}:{t.dtype}".encode())
    return h.hexdigest()


def _class_name(obj) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"
