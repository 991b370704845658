"""The package's import structure: no import circles, and a light top-level import."""
from __future__ import annotations

import ast
import os
from pathlib import Path

import helpers

ROOT = Path(__file__).resolve().parent.parent / "torchtpu"


def _module_graph() -> dict[str, set[str]]:
    """Module -> the torchtpu modules its top-level imports load (a submodule's import loads
    its parent packages too, as Python does)."""
    names = {}
    for path in ROOT.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__")
        names[name] = path
    graph = {}
    for name, path in names.items():
        deps = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torchtpu"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    deps.add(full if full in names else node.module)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.startswith("torchtpu"))
        closed = {".".join(d.split(".")[:k]) for d in deps for k in range(2, len(d.split(".")) + 1)}
        graph[name] = {d for d in closed if d in names and d != name and not name.startswith(d + ".")}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    graph = _module_graph()
    assert len(graph) > 50
    assert _cycles(graph) == []


# The layers, bottom to top (docs/DECISIONS.md 77): a module imports modules of its own layer or
# below only, at the top of its file or inside a function. The most specific name wins.
LAYERS = [
    ["torchtpu.options", "torchtpu.events", "torchtpu.counters", "torchtpu.paths", "torchtpu.fsutil",
     "torchtpu.cxx", "torchtpu.layout", "torchtpu.plans", "torchtpu.explain", "torchtpu.eager",
     "torchtpu.compiler.dtypes", "torchtpu.compiler.spec", "torchtpu.kernels.ops"],  # core: data, paths, events
    ["torchtpu.compiler.", "torchtpu.kernels"],  # lowering: registry, rules, lower, padding, checks
    ["torchtpu.passes"],  # FX -> FX rewrites and analyses
    ["torchtpu.runtime"],  # platforms, executables, transfers, the bucketed and fused runners
    ["torchtpu.spmd"],
    ["torchtpu.cache"],  # key, store, tiers
    ["torchtpu.compiler", "torchtpu.compiler.driver", "torchtpu.compiler.export"],  # the drivers
    ["torchtpu.precompile"],
    ["torchtpu.backend", "torchtpu.recompile_limit", "torchtpu.device", "torchtpu.autoload"],  # the ways in
    ["torchtpu.inspect", "torchtpu.cli"],  # what users type and read
    ["torchtpu"],
]


def _layer(module: str) -> int:
    best, found = -1, None
    for layer, names in enumerate(LAYERS):
        for name in names:
            hit = module == name or module.startswith(name if name.endswith(".") else name + ".")
            if hit and len(name) > best:
                best, found = len(name), layer
    return found


def _every_import() -> dict[str, set[str]]:
    """Module -> the torchtpu modules it imports anywhere in its file (functions included)."""
    names = {".".join(p.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__"): p
             for p in ROOT.rglob("*.py")}
    out = {}
    for name, path in names.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torchtpu"):
                deps.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in names else node.module
                            for a in node.names)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.startswith("torchtpu"))
        out[name] = deps
    return out


def test_imports_run_one_way_down_the_layers():
    graph = _every_import()
    assert all(_layer(m) is not None for m in graph), [m for m in graph if _layer(m) is None]
    upward = sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps if _layer(d) > _layer(m))
    assert upward == []


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_importing_torchtpu_loads_neither_jax_nor_the_compiler():
    code = ("import sys, torchtpu; bad = [m for m in ('jax', 'torchtpu.compiler.driver', 'torchtpu.cache.tiers') "
            "if m in sys.modules]; print(bad)")
    assert helpers.run_python(code).strip() == "[]"


def test_loading_a_cached_cpu_executable_imports_no_pallas_and_no_passes():
    # Executable.deserialize imports kernels.aten_cpu, and with it the kernels package: a warm or
    # precompiled start must not pay for Pallas or the compiler's passes there
    code = ("import sys, torchtpu.kernels.aten_cpu; bad = [m for m in sys.modules if 'pallas' in m "
            "or m.startswith('torchtpu.passes')]; print(bad)")
    assert helpers.run_python(code).strip() == "[]"


# What every `import torch` runs where torchtpu is installed (the torch.backends entry point).
HEAVY = ("jax", "torchtpu.compiler", "torchtpu.runtime", "torchtpu.cache", "torchtpu.device.strict",
         "torchtpu.device.transfer")


def test_the_device_registration_imports_nothing_heavy_at_top_level():
    graph = _module_graph()
    reached, todo = set(), ["torchtpu.autoload", "torchtpu.device", "torchtpu.device.registration"]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo.extend(graph[name])
    assert {"torchtpu.device.kernels", "torchtpu.device.module"} <= reached
    assert sorted(m for m in reached if m.startswith(HEAVY)) == []


def test_the_entry_point_loads_neither_jax_nor_the_compiler():
    code = ("import sys, torch, torchtpu.autoload; torchtpu.autoload.load(); "
            "assert torch._C._get_privateuse1_backend_name() == 'tpu'; "
            f"print(sorted(m for m in sys.modules if m.startswith({HEAVY!r})))")
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")  # the call made here, not by torch
    assert helpers.run_python(code, env).strip() == "[]"
