"""Plain explanations of Dynamo recompiles, each with a concrete suggestion."""
from __future__ import annotations

import re

# names are sources like 'x' or "kwargs['input_ids']" (quotes inside), hence the lazy .+?
_SIZE = re.compile(r"tensor '(?P<name>.+?)' size mismatch at index (?P<dim>\d+)\. "
                   r"expected (?P<old>\d+), actual (?P<new>\d+)")
_STRIDE = re.compile(r"tensor '(?P<name>.+?)' stride mismatch at index (?P<dim>\d+)")
_DTYPE = re.compile(r"tensor '(?P<name>.+?)' dtype mismatch\. expected (?P<old>\w+), actual (?P<new>\w+)")
# a symbolic guard on arithmetic of sizes, e.g. ((L['x'].size()[1] // 32) % 2) == 0
_SIZE_REF = re.compile(r"(?P<name>[A-Za-z_][\w\[\]'\.]*)\.size\(\)\[(?P<dim>\d+)\]")
_ARITH = re.compile(r"//|%|\*|\+| - ")
_INT = re.compile(r"^(?P<name>[A-Za-z_][\w\[\]'\.]*) == (?P<old>-?\d+)\s")
_RANGE = re.compile(r"(?:\d+ <= |<= \d+)")
_ID = re.compile(r"^\[?(\d+)/(\d+)")
_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16",
           "Long": "int64", "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool"}


# the categories of a recompile that concern only sizes (what recompile_limit.py may run eagerly)
SIZE_CATEGORIES = ("size changed", "size-dependent branch", "size left its dynamic range")


def frame_of(compile_id) -> str | None:
    """'3/1' -> '3' (Dynamo's frame number)."""
    m = _ID.match(str(compile_id or ""))
    return m.group(1) if m else None


def frame_history(event: dict, events: list[dict]) -> list[dict]:
    """The "dynamo" events of `event`'s frame (same run, same frame number) in the session that
    holds `event`: from that frame's first compile (N/0; a Dynamo reset starts a new session) to
    the next one. An `event` not in `events` gets the last session."""
    run, fid = event.get("run"), frame_of(event.get("compile_id"))
    if fid is None:
        return []
    sessions: list[list[dict]] = []
    for e in events:
        if e.get("kind") != "dynamo" or e.get("run") != run or frame_of(e.get("compile_id")) != fid:
            continue
        if not sessions or _ID.match(str(e.get("compile_id"))).group(2) == "0":
            sessions.append([])
        sessions[-1].append(e)
    return next((s for s in sessions if any(e is event for e in s)), sessions[-1] if sessions else [])


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
    if _branch(reason):
        return "size-dependent branch"
    if _RANGE.search(reason):
        return "size left its dynamic range"
    return "other guard"


def is_limit(event: dict) -> bool:
    return "recompile limit" in (event.get("fail_reason") or "").lower() or _failed_at_limit(event)


def _failed_at_limit(event: dict) -> bool:
    """fullgraph=True (or fail_on_recompile_limit_hit): Dynamo raised instead of running eagerly."""
    return event.get("fail_type") == "FailOnRecompileLimitHit"


def explain(event: dict, events: list[dict]) -> str:
    """One plain sentence (or two) for a "dynamo" event that was a recompile."""
    if _failed_at_limit(event):
        return ("recompile limit reached: Dynamo raised FailOnRecompileLimitHit (fullgraph=True or "
                "fail_on_recompile_limit_hit); torchtpu runs such a frame eagerly instead only when all its "
                "recompiles were size changes. Make the changing input dynamic, or raise "
                "torch._dynamo.config.recompile_limit")
    if is_limit(event):
        return ("recompile limit reached: this frame now runs eagerly (no compiled code); "
                "make the changing input dynamic, or raise torch._dynamo.config.recompile_limit")
    reason = _strip(event.get("recompile_reason"))
    if m := _SIZE.search(reason):
        return _size(m, event, events)
    if m := _DTYPE.search(reason):
        old, new = (_DTYPES.get(m[k], m[k]) for k in ("old", "new"))
        return (f"dtype of `{_short(m['name'])}` changed {old} → {new}: each dtype is its own program; "
                "cast the inputs to one dtype before the call")
    if m := _INT.match(reason):
        return (f"a Python int argument `{_short(m['name'])}` changed from {m['old']}: Dynamo specializes "
                "on int values; pass it as a tensor (or let it become dynamic after the 2nd value)")
    if m := _STRIDE.search(reason):
        return (f"memory layout of `{_short(m['name'])}` changed (dim {m['dim']} stride): pass contiguous "
                "inputs (or one layout) on every call")
    if expr := _branch(reason):
        return _size_branch(expr, reason)
    if _RANGE.search(reason):
        return (f"a dynamic size left the range Dynamo assumed ({reason.splitlines()[0].strip()}); "
                "sizes 0 and 1 are specialized: avoid them or mark the dim unbacked")
    return f"guard failed: {reason.splitlines()[0].strip() if reason else '?'}"


def _size(m, event, events) -> str:
    name, dim, old, new = _short(m["name"]), m["dim"], int(m["old"]), int(m["new"])
    if _respecialized(m, event, events):
        return (f"this frame's code depends on the value of dim {dim} of `{name}` ({old} → {new}): each "
                "length is a new graph (Dynamo made the dim dynamic when it first changed; the code made it "
                "static again: a Python loop over it, or the size used as a number), so mark_dynamic cannot "
                "help. Pad the inputs to a few lengths, or raise torch._dynamo.config.recompile_limit to the "
                "number of lengths you use; past the limit, new lengths run eagerly")
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


def _branch(reason: str) -> str | None:
    """The guard's expression, if it is arithmetic on sizes (not a plain size or range test)."""
    expr = reason.splitlines()[0].split("  # ")[0].strip() if reason else ""
    return expr if _SIZE_REF.search(expr) and _ARITH.search(expr) else None


def _size_branch(expr: str, reason: str) -> str:
    dims: dict[str, list[str]] = {}
    for m in _SIZE_REF.finditer(expr):
        found = dims.setdefault(_short(m["name"]), [])
        if m["dim"] not in found:
            found.append(m["dim"])
    which = " and ".join(f"dim{'s' if len(d) > 1 else ''} {', '.join(d)} of `{n}`" for n, d in dims.items())
    readable = _SIZE_REF.sub(lambda m: f"{_short(m['name'])}.size({m['dim']})", expr)
    parts = reason.splitlines()[0].split("  # ")[1:]
    where = ""
    if len(parts) >= 2:  # Dynamo appends "# user code  # file:line in fn (its own location)"
        where = f" at `{parts[0].strip()}` ({re.sub(r' [(].*[)]$', '', parts[1].strip())})"
    return (f"this frame's code depends on the value of {which}: it tests `{readable}`{where}, and each "
            "outcome is a new graph, so lengths that differ there compile again; mark_dynamic cannot help "
            "(the graph is dynamic already). Pad the inputs to a few lengths, or raise "
            "torch._dynamo.config.recompile_limit to the number of lengths you use; past the limit, "
            "new lengths run eagerly")


def _respecialized(m, event, events) -> bool:
    """Another recompile of this frame changed the same dim of the same input while Dynamo's
    automatic dynamic shapes were on: Dynamo makes a dim dynamic after its first change, so a
    second size mismatch on it means the frame's code specialized it."""
    graphs = [e for e in events if e.get("kind") == "graph" and e.get("run") == event.get("run")
              and e.get("compile_id") == event.get("compile_id")]
    if any(g.get("automatic_dynamic") is False for g in graphs):  # dynamic=False: every size is static
        return False
    for e in frame_history(event, events):
        other = _SIZE.search(_strip(e.get("recompile_reason"))) if e is not event else None
        if other and (other["name"], other["dim"]) == (m["name"], m["dim"]):
            return True
    return False


def _strip(reason) -> str:
    """Drops Dynamo's 'N/M: ' prefix."""
    reason = (reason or "").strip()
    return re.sub(r"^\d+/\d+: ", "", reason)


def _short(name: str) -> str:
    """L['x'] and kwargs['x'] (Dynamo's sources) -> x."""
    m = re.fullmatch(r"(?:L|kwargs|L\['kwargs'\])\['(\w+)'\]", name)
    return m.group(1) if m else name
