"""The cache key: a named list of parts, each with a printable digest (see `torchtpu cache explain`)."""
from __future__ import annotations

import dataclasses
import hashlib
import weakref

import torch

from torchtpu.cache import versions
from torchtpu.cache.canonical import Unkeyable, canonical_graph
from torchtpu.compiler.spec import TensorSpec
from torchtpu.layout import BOUNDARY
from torchtpu.runtime.target import Target


@dataclasses.dataclass(frozen=True)
class KeyPart:
    name: str
    summary: str  # short and readable; the digest covers the full text
    digest: str

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class CacheKey:
    parts: tuple[KeyPart, ...]

    @property
    def digest(self) -> str:
        lines = "".join(f"{p.name}={p.digest}\n" for p in self.parts)
        return hashlib.sha256(lines.encode()).hexdigest()

    def to_json(self) -> list[dict]:
        return [p.to_json() for p in self.parts]


def _part(name: str, text: str, summary: str | None = None) -> KeyPart:
    summary = text if summary is None else summary
    if len(summary) > 80:
        summary = summary[:77] + "..."
    return KeyPart(name, summary, hashlib.sha256(text.encode()).hexdigest()[:16])


def key_for(gm: torch.fx.GraphModule, spec: tuple, options, target: Target) -> CacheKey:
    """The key of `gm` compiled for `spec` on `target`.

    Raises:
        Unkeyable: some part cannot be keyed reliably (the caller bypasses the cache).
    """
    return with_environment(graph_parts(gm, spec), options, target)


def graph_parts(gm: torch.fx.GraphModule, spec: tuple) -> tuple[KeyPart, ...]:
    """The parts of a key the graph and its signature fix (a precompiled artifact keeps them)."""
    graph = _graph_text(gm)
    ops = sum(1 for n in gm.graph.nodes if n.op == "call_function")
    parts = (_part("format", str(versions.FORMAT_VERSION)), _part("graph", graph, f"{ops} ops"),
             _part("inputs", input_specs(spec)))
    boundary = gm.meta.get(BOUNDARY)
    return parts + (_part("boundary_layouts", boundary.key()),) if boundary else parts


def with_environment(graph: tuple[KeyPart, ...], options, target: Target) -> CacheKey:
    """A key from its graph parts and this process's options, target, host, flags and versions."""
    if getattr(options, "mesh", None) is not None:
        # the runtime of a sharded program (jax's Compiled, its shardings) has no cache format yet
        raise Unkeyable(f"sharded program (mesh {dict(options.mesh)}): not cached")
    libs = versions.libraries()
    parts = [
        *graph,
        _part("options", repr(options.key_items())),
        _part("float32_matmul_precision", torch.get_float32_matmul_precision()),
        _part("target", f"{target.platform} {target.device_kind} x{target.device_count}"),
        _part("host_cpu", versions.host_cpu() if target.platform == "cpu" else "-"),
        _part("cpu_kernels", _cpu_kernels(options, target)),
        _part("xla_flags", versions.xla_flags()),
        *(_part(name, version) for name, version in libs.items()),
        _part("torchtpu_source", versions.source_hash(), versions.source_hash()[:16]),
    ]
    return CacheKey(tuple(parts))


def _cpu_kernels(options, target: Target) -> str:
    """Whether a CPU program calls ATen's kernels (kernels/aten_cpu.py). The option alone does
    not say: TORCHTPU_ATEN_KERNELS=0, or a library that cannot be built, makes the same options
    lower to XLA's own convolutions, and a program with the custom calls does not load in a
    process without the library (nor should one without them be served where it is)."""
    if target.platform != "cpu" or getattr(options, "aten_kernels", "off") != "auto":
        return "off"
    from torchtpu.kernels import aten_cpu

    return "aten" if aten_cpu.available() else "off"


_graph_texts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _graph_text(gm) -> str:
    """Printed once per graph, before any lowering: lowering a symbolic graph for one size
    specialises its shape environment, which would change how later sizes print."""
    if gm not in _graph_texts:
        try:
            _graph_texts[gm] = canonical_graph(gm)
        except Unkeyable as exc:
            _graph_texts[gm] = exc
    text = _graph_texts[gm]
    if isinstance(text, Unkeyable):
        raise text
    return text


def input_specs(spec: tuple) -> str:
    out = []
    for s in spec:
        if isinstance(s, TensorSpec):
            out.append(f"{s.dtype}[{','.join(str(int(d)) for d in s.shape)}]")
        elif s is None or type(s) in (bool, int, float):
            out.append(f"{type(s).__name__}:{s!r}")
        else:
            raise Unkeyable(f"input of type {type(s).__name__}")
    return "(" + ", ".join(out) + ")"
