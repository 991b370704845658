"""Past Dynamo's recompile limit, a frame that only ever recompiled for sizes runs eagerly.

Under `fullgraph=True` Dynamo turns its recompile limit into an exception
(`FailOnRecompileLimitHit`), and a call that runs no compiled code at all raises "found no
compiled frames". A model whose Python code depends on a size's value (a loop over the sequence,
a branch on its bits) reaches that limit after `recompile_limit` lengths. So at the last compile
the limit allows, the backend wraps the graph it hands back; on its first call (Dynamo's record
of that compile exists by then) it checks that every recompile of the frame was a size change,
and if so loads a Dynamo precompile entry for the frame's code: its one guard passes when none of
the frame's compiled graphs would, and its code is the frame's own. Such a call runs the frame
eagerly (nested frames too, with no callback); Dynamo counts it as compiled code, so nothing
raises, and it never compiles for this code object again. Sizes that have a graph keep using it.
See docs/DECISIONS.md 50.
"""
from __future__ import annotations

import dataclasses
import types
import warnings
from typing import Callable

import torch

from torchtpu import counters, events
from torchtpu.explain import SIZE_CATEGORIES, category, explain, frame_history


@dataclasses.dataclass(frozen=True)
class LastCompile:
    """The frame being compiled, at the last compile Dynamo's recompile limit allows it."""

    code: types.CodeType
    compile_id: str
    graphs: int  # graphs the frame has with this one
    limit: int

    @property
    def frame(self) -> str:
        return f"{self.code.co_name} ({self.code.co_filename}:{self.code.co_firstlineno})"


def last_compile() -> LastCompile | None:
    """Called by the backend while Dynamo compiles a frame: the frame, if this is its last
    compile before the limit under fullgraph=True; else None. Respects
    `torch._dynamo.config.fail_on_recompile_limit_hit` (the user asked for the failure)."""
    from torch._dynamo import config
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch._dynamo.symbolic_convert import InstructionTranslator

    if config.fail_on_recompile_limit_hit:
        return None
    try:
        tx = InstructionTranslator.current_tx()
    except (AttributeError, AssertionError):  # not inside a Dynamo trace (export, a direct call)
        return None
    cid = torch._guards.CompileContext.current_compile_id()
    if tx is None or cid is None or not tx.one_graph:
        return None
    # Dynamo refuses a compile when the frame's entries (with the same ID_MATCHed objects) reach
    # recompile_limit, or its compile number reaches accumulated_recompile_limit. Counting all
    # entries is >= Dynamo's count, so this never comes after the limit.
    entries = len(_debug_get_cache_entry_list(tx.f_code))
    last = (entries >= config.recompile_limit - 1
            or (cid.frame_compile_id or 0) >= config.accumulated_recompile_limit - 1)
    if not last:
        return None
    limit = min(config.recompile_limit, config.accumulated_recompile_limit)
    return LastCompile(tx.f_code, str(cid), entries + 1, limit)


def arm_on_first_call(last: LastCompile, compiled: Callable) -> Callable:
    """`compiled`, which on its first call makes the frame run eagerly past the limit, if it should."""
    armed = False

    def call(*args):
        nonlocal armed
        if not armed:
            armed = True
            _arm(last)
        return compiled(*args)

    call._boxed_call = getattr(compiled, "_boxed_call", False)  # Dynamo passes one list to a boxed callable
    return call


def _arm(last: LastCompile) -> None:
    from torch._C._dynamo.eval_frame import _load_precompile_entry
    from torch._dynamo.guards import GuardManagerWrapper

    evs = events.events()
    this = next((e for e in reversed(evs) if e.get("kind") == "dynamo" and e.get("run") == events.RUN
                 and e.get("compile_id") == last.compile_id), None)
    if this is None:
        return
    recompiles = [e for e in frame_history(this, evs) if category(e)]
    if not recompiles or any(category(e) not in SIZE_CATEGORIES for e in recompiles):
        return  # something else changed too: Dynamo's own limit behaviour, explained by the inspector
    why = explain(recompiles[-1], evs)
    guards = GuardManagerWrapper()
    guards.root.add_lambda_guard(_runs_eagerly(last), ["no compiled graph of this frame matches"], None)
    _load_precompile_entry(last.code, guards, last.code)
    counters.bump("eager_frames")
    events.record("eager_frame", compile_id=last.compile_id, frame=last.frame, co_name=last.code.co_name,
                  co_filename=last.code.co_filename, co_firstlineno=last.code.co_firstlineno,
                  graphs=last.graphs, limit=last.limit, explanation=why)
    warnings.warn(f"torchtpu: {last.frame} compiled {last.graphs} graphs, each recompile for a size ({why}). "
                  f"Dynamo's recompile_limit ({last.limit}) makes the next new size an error under "
                  "fullgraph=True, so from now on a call that matches none of these graphs runs eagerly "
                  "(torchtpu.stats()['eager_calls']; `torchtpu inspect` lists it)", stacklevel=2)


def _runs_eagerly(last: LastCompile) -> Callable[[dict], bool]:
    """The precompile entry's guard: true when none of the frame's compiled graphs matches."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    shapes_seen: set = set()

    def guard(f_locals) -> bool:
        try:
            if any(entry.guard_manager.check(f_locals) for entry in _debug_get_cache_entry_list(last.code)):
                return False
        except Exception:  # noqa: BLE001 - a guard that fails to evaluate: eager is the safe side
            pass
        counters.bump("eager_calls")
        shapes = _shapes(f_locals)
        if shapes not in shapes_seen:  # one event per new input signature, as a compile would be
            shapes_seen.add(shapes)
            events.record("eager_call", compile_id=last.compile_id, frame=last.frame, inputs=list(shapes))
        return True

    return guard


def _shapes(f_locals) -> tuple[str, ...]:
    """'name: f32[2,3]' per tensor argument, looking into *args and **kwargs (a decorator's
    `wrapped_func(*args, **kwargs)` frame has its tensors there)."""
    out = []

    def visit(name, v, depth):
        if isinstance(v, torch.Tensor):
            out.append(f"{name}: {str(v.dtype).removeprefix('torch.')}[{','.join(map(str, v.shape))}]")
        elif depth < 2 and isinstance(v, (tuple, list)):
            for i, item in enumerate(v):
                visit(f"{name}[{i}]", item, depth + 1)
        elif depth < 2 and isinstance(v, dict):
            for key, item in v.items():
                visit(str(key) if name == "kwargs" else f"{name}[{key!r}]", item, depth + 1)

    for name, v in f_locals.items():
        visit(name, v, 0)
    return tuple(out)
