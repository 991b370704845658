"""Plain explanations of Dynamo recompiles, each with a concrete suggestion."""
from __future__ import annotations

import re

_SIZE = re.compile(r"tensor '(?P<name>[^']+)' size mismatch at index (?P<dim>\d+)\. "
                   r"expected (?P<old>\d+), actual (?P<new>\d+)")
_STRIDE = re.compile(r"tensor '(?P<name>[^']+)' stride mismatch at index (?P<dim>\d+)")
_DTYPE = re.compile(r"tensor '(?P<name>[^']+)' dtype mismatch\. expected (?P<old>\w+), actual (?P<new>\w+)")
_INT = re.compile(r"^(?P<name>[A-Za-z_][\w\[\]'\.]*) == (?P<old>-?\d+)\s")
_RANGE = re.compile(r"(?:\d+ <= |<= \d+)")
_ID = re.compile(r"^\[?(\d+)/(\d+)")
_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16",
           "Long": "int64", "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool"}


def frame_of(compile_id) -> str | None:
    """'3/1' -> '3' (Dynamo's frame number)."""
    m = _ID.match(str(compile_id or ""))
    return m.group(1) if m else None


def category(event: dict) -> str | None:
    """A short class of why Dynamo compiled this frame again (None: not a recompile)."""
    if is_limit(event):
        return "recompile limit reached"
    reason = _strip(event.get("recompile_reason"))
    if not reason:
        return None
    if _SIZE.search(reason):
        return "size changed"
    if _DTYPE.search(reason):
        return "dtype changed"
    if _INT.match(reason):
        return "Python int changed"
    if _STRIDE.search(reason):
        return "layout changed"
    if _RANGE.search(reason):
        return "size left its dynamic range"
    return "other guard"


def is_limit(event: dict) -> bool:
    return "recompile limit" in (event.get("fail_reason") or "").lower()


def explain(event: dict, events: list[dict]) -> str:
    """One plain sentence (or two) for a "dynamo" event that was a recompile."""
    if is_limit(event):
        return ("recompile limit reached: this frame now runs eagerly (no compiled code); "
                "make the changing input dynamic, or raise torch._dynamo.config.recompile_limit")
    reason = _strip(event.get("recompile_reason"))
    if m := _SIZE.search(reason):
        return _size(m, event, events)
    if m := _DTYPE.search(reason):
        old, new = (_DTYPES.get(m[k], m[k]) for k in ("old", "new"))
        return (f"dtype of `{m['name']}` changed {old} → {new}: each dtype is its own program; "
                "cast the inputs to one dtype before the call")
    if m := _INT.match(reason):
        return (f"a Python int argument `{_short(m['name'])}` changed from {m['old']}: Dynamo specializes "
                "on int values; pass it as a tensor (or let it become dynamic after the 2nd value)")
    if m := _STRIDE.search(reason):
        return (f"memory layout of `{m['name']}` changed (dim {m['dim']} stride): pass contiguous "
                "inputs (or one layout) on every call")
    if _RANGE.search(reason):
        return (f"a dynamic size left the range Dynamo assumed ({reason.splitlines()[0].strip()}); "
                "sizes 0 and 1 are specialized: avoid them or mark the dim unbacked")
    return f"guard failed: {reason.splitlines()[0].strip() if reason else '?'}"


def _size(m, event, events) -> str:
    name, dim, old, new = m["name"], m["dim"], int(m["old"]), int(m["new"])
    head = f"input `{name}` dim {dim} changed {old} → {new}"
    if 1 in (old, new):
        return (f"{head}: Dynamo always specializes size 1, so size 1 gets its own graph; "
                f"torch._dynamo.mark_unbacked({name}, {dim}) lets it share the dynamic graph")
    statuses = [e for e in events if e.get("kind") == "bucketing" and e.get("compile_id") == event.get("compile_id")]
    if any("bucketing is off" in (e.get("reason") or "") for e in statuses):
        return f"{head}: bucketing is off for this frame; enable it (options={{'bucketing': 'pow2'}}) or mark the dim dynamic"
    refused = [e for e in statuses if e.get("status") == "exact"]
    if refused:
        return (f"{head}: the new graph is dynamic but could not be bucketed ({refused[0].get('reason')}); "
                "every new size compiles again")
    if any(e.get("status") == "bucketed" for e in statuses):
        return (f"{head}: Dynamo made the dim dynamic (automatic dynamic shapes); from now on sizes "
                "share one program per bucket. torch._dynamo.mark_dynamic on the first call saves this recompile")
    return f"{head}: mark the dim dynamic (torch._dynamo.mark_dynamic({name}, {dim})) to compile it once"


def _strip(reason) -> str:
    """Drops Dynamo's 'N/M: ' prefix."""
    reason = (reason or "").strip()
    return re.sub(r"^\d+/\d+: ", "", reason)


def _short(name: str) -> str:
    m = re.fullmatch(r"L\['(\w+)'\]", name)
    return m.group(1) if m else name
