"""torchtpu.precompile.save / load: a model compiled in one process, called in another without tracing.

    torchtpu.precompile.save(model, (input_ids,), "model.tpu-precompiled")     # once
    run = torchtpu.precompile.load("model.tpu-precompiled", model)             # in a fresh process
    logits = run(input_ids)                                                    # no Dynamo, no AOTAutograd

Built on torch's own precompile path (`aot_compile`, `save_compiled_function`,
`load_compiled_function`); the XLA executables themselves come from the compile cache, which
`save` fills. Whatever makes the artifact unusable — other library versions, changed model
code, another model, a damaged or untrusted file, inputs its guards reject — gives one warning
and a normal `torch.compile(model, backend="tpu", ...)` in its place: never a crash, never a
stale result (docs/precompile.md).
"""
from __future__ import annotations

import contextlib
import io
import logging
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

from torchtpu import counters, events
from torchtpu.fsutil import atomic_write
from torchtpu.precompile import artifact as artifacts
from torchtpu.precompile.artifact import Artifact, BadArtifact

log = logging.getLogger("torchtpu.precompile")


def call_module(model, *args, **kwargs):
    """What a module's artifact traces: the module's call (its hooks included)."""
    return model(*args, **kwargs)


def save(model_or_fn: Callable, example_args: tuple, path, example_kwargs: dict | None = None,
         **compile_kwargs) -> Path:
    """Compiles `model_or_fn(*example_args, **example_kwargs)` with backend="tpu" and writes a
    precompiled artifact to `path` (atomically). `compile_kwargs` go to torch.compile (options=,
    dynamic=); fullgraph is implied. Sizes marked dynamic on the example inputs stay symbolic
    (bucketed). Training works too: the backward graph is part of the artifact.

    Returns the path. Raises whatever compiling raises, or TypeError for compile arguments
    that cannot be recorded (they must be JSON: the loader compiles with them when the
    artifact cannot be used)."""
    path = Path(path)
    module = model_or_fn if isinstance(model_or_fn, torch.nn.Module) else None
    fn = call_module if module is not None else model_or_fn
    args = (module, *example_args) if module is not None else tuple(example_args)
    recorded = _recordable(compile_kwargs)
    t0 = time.perf_counter()
    dropped: list[str] = []
    options = {**(compile_kwargs.get("options") or {}), "guard_filter_fn": _serializable_guards(dropped)}
    compiled = torch.compile(fn, backend="tpu", fullgraph=True, **{**compile_kwargs, "options": options})
    # one shot: sizes are symbolic where marked (or dynamic=True), never because an earlier save in
    # this process traced the shared `call_module` frame at other sizes (automatic dynamic)
    with torch._dynamo.config.patch(automatic_dynamic_shapes=False), _no_key_order_guards_on_globals():
        aot = compiled.aot_compile((args, dict(example_kwargs or {})))
    payload = type(aot).serialize(aot).serialized_data
    header = {
        "kind": "module" if module is not None else "function",
        "function": None if module is not None else f"{fn.__module__}:{fn.__qualname__}",
        "model": artifacts.model_signature(module),
        "compile_kwargs": recorded,
        "versions": artifacts.build_versions(),
        "sources": artifacts.source_spans(aot.source_info()),
        "dropped_guards": sorted(set(dropped)),
        "module_globals": _module_globals(aot),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, Artifact(header, payload).to_bytes())
    events.record("precompile_save", path=str(path), artifact=header["kind"], bytes=len(payload),
                  seconds=round(time.perf_counter() - t0, 3))
    log.info("torchtpu: precompiled %s to %s (%d bytes)", header["kind"], path, len(payload))
    return path


def load(path, model: torch.nn.Module | None = None) -> "Precompiled":
    """The artifact at `path` as a callable: with `model`, `f(*args)` runs `model(*args)`;
    without, a function's artifact runs the function and a module's takes the module first.

    Anything that makes it unusable warns once and compiles normally instead."""
    path = Path(path)
    try:
        art = Artifact.read(path)
    except (OSError, BadArtifact) as exc:
        return Precompiled.fallback_only(path, model, None, f"{exc}")
    header = art.header
    why = (artifacts.version_mismatch(header) or artifacts.changed_source(header)
           or _model_mismatch(header, model))
    if why is not None:
        return Precompiled.fallback_only(path, model, header, why)
    t0 = time.perf_counter()
    try:
        aot = torch.compiler.load_compiled_function(io.BytesIO(art.payload), f_globals=_globals_for(header))
    except Exception as exc:  # noqa: BLE001 - any failure to rebuild means: compile instead
        return Precompiled.fallback_only(path, model, header, f"it could not be loaded ({type(exc).__name__}: {exc})")
    counters.bump("precompiled_loads")
    events.record("precompile_load", path=str(path), seconds=round(time.perf_counter() - t0, 3))
    return Precompiled(path, model, header, aot)


class Precompiled:
    """A loaded artifact; a call its guards reject runs a normal compile (one warning)."""

    def __init__(self, path: Path, model, header: dict | None, aot):
        self.path, self.model, self.header, self._aot = path, model, header, aot
        self._fallback: Callable | None = None
        self._warned = False

    @classmethod
    def fallback_only(cls, path: Path, model, header: dict | None, why: str) -> "Precompiled":
        self = cls(path, model, header, None)
        self._warn(f"{path} is not used: {why}")
        return self

    @property
    def loaded(self) -> bool:
        """Whether calls can run the precompiled program (else they all compile)."""
        return self._aot is not None

    def __call__(self, *args, **kwargs) -> Any:
        full = (self.model, *args) if self._bound_module() else args
        if self._aot is not None:
            if self._aot.guard_check(*full, **kwargs):
                return self._aot(*full, **kwargs)
            self._warn(f"{self.path}: these inputs miss the artifact's guards (other shapes, dtypes or "
                       "model settings than were precompiled)")
        counters.bump("precompiled_fallback_calls")
        return self._compiled()(*full, **kwargs)

    def _bound_module(self) -> bool:
        return self.model is not None and (self.header is None or self.header.get("kind") == "module")

    def _compiled(self) -> Callable:
        if self._fallback is None:
            kwargs = dict((self.header or {}).get("compile_kwargs") or {})
            fn = call_module if self._bound_module() else self._function()
            self._fallback = torch.compile(fn, backend="tpu", fullgraph=True, **kwargs)
        return self._fallback

    def _function(self) -> Callable:
        if self.header is None or self.header.get("kind") == "module":
            if self.model is None and self.header is not None:
                return call_module
            raise RuntimeError(f"{self.path} cannot be used and names no function: pass the model to load()")
        import importlib

        module, _, qualname = self.header["function"].partition(":")
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        return obj

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            counters.bump("precompiled_refused")
            events.record("precompile_refused", path=str(self.path), reason=message)
            warnings.warn(f"torchtpu: {message}; compiling with torch.compile instead", stacklevel=3)


def _serializable_guards(dropped: list[str]) -> Callable:
    """A guard filter that keeps the guards torch can serialize. Those it drops check object
    identity (a module, a function, a class, a global's dict version): a fresh process has new
    objects by construction. What they protected is checked by the artifact's header instead:
    the traced source spans, the model's classes and parameter signature, the versions."""
    from torch._dynamo.guards import CheckFunctionManager

    unsupported = set(CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES)

    def keep(entries) -> list[bool]:
        out = []
        for e in entries:
            drop = (e.is_global or e.guard_type in unsupported or bool(unsupported & set(e.derived_guard_types))
                    or _local_type_match(e))
            if drop:
                dropped.append(e.guard_type)
            out.append(not drop)
        return out

    return keep


@contextlib.contextmanager
def _no_key_order_guards_on_globals():
    """While saving: Dynamo's saved guard state leaves out the key order of global dicts.

    Dynamo records, beside its guards, which dicts' key order the traced code depended on, and
    rebuilding the guards on load reads each of them by position, whether or not a guard on it
    was kept. A global dict's keys can depend on what the saving process did before: transformers
    registers each model class it builds in `_CAN_RECORD_REGISTRY`, and a Llama saved after two
    other classes was read as the registry's third key, which a fresh process does not have
    (IndexError, so the artifact was refused). The guards on globals are dropped already
    (`_serializable_guards`); torch leaves out this record itself when every guard is portable."""
    from torch._dynamo import guards
    from torch._dynamo.source import get_global_source_name

    pickle = guards.pickle_guards_state

    def without_global_key_orders(state, builder):
        graph = state.output_graph
        graph.guard_on_key_order = {s for s in graph.guard_on_key_order if get_global_source_name(s) is None}
        return pickle(state, builder)

    guards.pickle_guards_state = without_global_key_orders
    try:
        yield
    finally:
        guards.pickle_guards_state = pickle


def _local_type_match(entry) -> bool:
    """A type guard on an object whose class is local to a function or nested in a class (a
    factory's class, as transformers' hub-kernel layers are): torch cannot name such a class in
    another process and refuses the whole artifact. The model's signature in the header names
    every submodule's class instead, and the traced source spans cover its code."""
    if entry.guard_type != "TYPE_MATCH" or not entry.has_value:
        return False
    t = type(entry.value)
    return t.__qualname__ != t.__name__


def _module_globals(aot) -> dict[str, str]:
    """Dynamo's generated code reads some modules through globals it installed under a name that
    carries the module object's id (`___module_collections_<id>_c0`); a fresh process has other
    ids, so the names are recorded with the module each one is, and given back on load."""
    import sys

    by_id = {id(m): name for name, m in list(sys.modules.items()) if m is not None}
    out = {}
    for ref in sorted(aot._artifacts.runtime_env.external_refs):
        if ref.startswith("___module_"):
            module_id = int(ref.rsplit("_c", 1)[0].rsplit("_", 1)[1])
            if module_id not in by_id:
                raise RuntimeError(f"torchtpu.precompile.save: Dynamo's global {ref} names no loaded module")
            out[ref] = by_id[module_id]
    return out


def _globals_for(header: dict) -> dict[str, Any]:
    import importlib

    return {ref: importlib.import_module(name) for ref, name in (header.get("module_globals") or {}).items()}


def _model_mismatch(header: dict, model) -> str | None:
    if header.get("kind") != "module" or model is None:
        return None
    if artifacts.model_signature(model) != header.get("model"):
        return f"it was built for another model (class or parameter shapes differ from {type(model).__name__}'s)"
    return None


def _recordable(compile_kwargs: dict) -> dict:
    import json

    if compile_kwargs.get("fullgraph") is False:
        raise TypeError("torchtpu.precompile.save: a precompiled program is one whole graph (fullgraph=True)")
    kwargs = {k: v for k, v in compile_kwargs.items() if k != "fullgraph"}
    try:
        json.dumps(kwargs)
    except TypeError as exc:
        raise TypeError(f"torchtpu.precompile.save: compile arguments must be JSON values ({exc})") from None
    return kwargs
