"""Lowering: an ATen FX graph plus a concrete input signature -> a JAX function -> StableHLO.

The graph is interpreted node by node inside a JAX trace; each ATen node is handed to its
registered rule. Symbolic sizes are concrete here: one lowering serves one signature.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import torch
from jax.experimental.layout import Format, Layout
from torch._prims_common import is_non_overlapping_and_dense_or_false

from torchtpu.compiler import dtypes, registry
from torchtpu.compiler.checks import RunChecks
from torchtpu.compiler.context import LowerCtx, RngState
from torchtpu.compiler.errors import LoweringError, user_source_line, write_reproducer
from torchtpu.compiler.padding import Padding
from torchtpu.compiler.rules.reduction import INPUT_ORDER, from_convolution
from torchtpu.compiler.spec import TensorSpec, contiguous_stride
from torchtpu.layout import BoundaryLayouts, OutputSlot


@dataclasses.dataclass
class JaxProgram:
    """A graph specialised to one signature, as a JAX function of its tensor inputs."""

    fn: Callable
    tensor_inputs: list[int]  # positions of tensor placeholders in the call arguments
    uses_rng: bool
    outputs: list[OutputSlot]  # filled in when fn is traced
    avals: list[jax.ShapeDtypeStruct]
    checks: list[dict] = dataclasses.field(default_factory=list)  # when fn is traced: its last result is their flag
    # a forward's: fn returns (results before its saved activations, those, the checks' flag);
    # per saved result, whether XLA chooses its layout (layout.BoundaryLayouts.chosen)
    saved_layouts: tuple[bool, ...] | None = None


def _static_stride(val) -> tuple[int, ...] | None:
    """torch's output stride when it is concrete and differs from the contiguous one."""
    if not isinstance(val, torch.Tensor) or val.ndim < 2:
        return None
    if not is_non_overlapping_and_dense_or_false(val):
        return None  # expanded or gapped layouts: the values are what matters
    if any(isinstance(n, torch.SymInt) for n in (*val.shape, *val.stride())):
        return None  # a bucketed program's output: read back in its rows' order (int() would fix the size)
    try:
        shape = tuple(int(s) for s in val.shape)
        stride = tuple(int(s) for s in val.stride())
    except (TypeError, ValueError, RuntimeError):
        return None
    significant = [(st, sz) for st, sz in zip(stride, shape) if sz > 1]
    contiguous = [(st, sz) for st, sz in zip(contiguous_stride(shape), shape) if sz > 1]
    return None if significant == contiguous else stride


def uses_rng(gm: torch.fx.GraphModule) -> bool:
    return any(n.op == "call_function" and registry.is_random(n.target) for n in gm.graph.nodes)


def to_jax_program(gm: torch.fx.GraphModule, spec: tuple, platform: str, options,
                   device: jax.Device | None = None, boundary: BoundaryLayouts | None = None) -> JaxProgram:
    """Builds the JAX function of `gm` for the concrete signature `spec` (placed on `device`).
    `boundary` (a CPU forward or backward with a device): layouts at its boundary with the other."""
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(spec):
        raise ValueError(f"graph has {len(placeholders)} inputs, signature has {len(spec)}")
    tensor_inputs = [i for i, s in enumerate(spec) if isinstance(s, TensorSpec)]
    if platform == "tpu":
        _refuse_float64(gm, spec)
    rng = uses_rng(gm)
    outputs: list[OutputSlot] = []
    records: list[dict] = []
    positions = {n: i for i, n in enumerate(graph.nodes)}
    sharding = jax.sharding.SingleDeviceSharding(device) if device is not None else None
    orders = dict(boundary.inputs) if boundary else {}
    avals = [jax.ShapeDtypeStruct(spec[i].shape, dtypes.to_jax(spec[i].dtype),
                                  sharding=_laid_out(sharding, orders[i]) if i in orders else sharding)
             for i in tensor_inputs]
    saved_from = boundary.saved_from if boundary else None
    for i, node in enumerate(placeholders):  # rules that choose a form by layout read it (reduction.py)
        if i in orders:
            node.meta[INPUT_ORDER] = orders[i]
        else:
            node.meta.pop(INPUT_ORDER, None)
    if rng:
        avals = [jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=sharding)] + avals

    def fn(*arrays):
        arrays = list(arrays)
        state = RngState(arrays.pop(0) if rng else None)
        env: dict[torch.fx.Node, Any] = {}
        # pointwise bf16/f16 results before their rounding (None: every op rounds, as eager)
        wide: dict[torch.fx.Node, Any] | None = {} if getattr(options, "excess_precision", True) else None
        feed = iter(arrays)
        for node, s in zip(placeholders, spec):
            env[node] = next(feed) if isinstance(s, TensorSpec) else s
        padding = Padding.bind(gm, spec, env)  # None unless the graph is bucketed
        checks = RunChecks(positions) if getattr(options, "check_indices", True) else None
        results = []
        outputs.clear()
        for node in graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "get_attr":
                env[node] = _constant(gm, node)
            elif node.op == "call_function":
                env[node] = lower_node(node, env, LowerCtx(node, platform, options, state, padding, checks=checks,
                                                               env=env),
                                       gm, spec, wide)
            elif node.op == "output":
                for value, meta in zip(_flat_outputs(node, env), output_metas(node)):
                    if value is None:
                        outputs.append(OutputSlot("none"))
                    elif isinstance(value, jax.Array):
                        outputs.append(OutputSlot("tensor", len(results), stride=_static_stride(meta)))
                        results.append(value)
                    else:
                        outputs.append(OutputSlot("value", value=value))
            else:
                raise LoweringError(f"unsupported FX node kind {node.op!r} ({node.format_node()})")
        records[:] = checks.records if checks is not None else []
        if records:  # one int32 after the graph's outputs: 0, or which check failed first
            results.append(checks.flag)
        if saved_from is None:
            return tuple(results)
        flag = [results.pop()] if records else []
        head = sum(1 for slot in outputs[:saved_from] if slot.kind == "tensor")
        if len(results) - head != len(boundary.chosen):
            raise LoweringError(f"torchtpu: internal: {len(results) - head} saved results, "
                                f"{len(boundary.chosen)} layout choices")
        return tuple(results[:head]), tuple(results[head:]), tuple(flag)

    saved_layouts = None if saved_from is None else tuple(boundary.chosen)
    return JaxProgram(fn, tensor_inputs, rng, outputs, avals, records, saved_layouts=saved_layouts)


def saved_channels_minor(gm: torch.fx.GraphModule, saved_from: int, platform: str, options) -> tuple[bool, ...]:
    """Per tensor output from position `saved_from` on (a forward's saved activations), whether
    XLA computes it channels-minor (a channels-last convolution's result, through pointwise
    ops: rules/reduction.py `from_convolution`); only those are worth another layout."""
    flags = []
    for node in _output_args(gm.graph.find_nodes(op="output")[0])[saved_from:]:
        if isinstance(node, torch.fx.Node) and isinstance(node.meta.get("val"), torch.Tensor):
            flags.append(from_convolution(node, LowerCtx(node, platform, options, RngState(None))))
    return tuple(flags)


def _laid_out(sharding, order: tuple[int, ...]):
    """An input's placement with its memory layout (major-to-minor dim order)."""
    return Format(Layout(major_to_minor=tuple(order)), sharding)


def _refuse_float64(gm, spec):
    """TPUs have no float64: say where it comes from rather than silently computing in float32."""
    for node in gm.graph.nodes:
        vals = node.meta.get("val")
        vals = vals if isinstance(vals, (tuple, list)) else [vals]
        if any(isinstance(v, torch.Tensor) and v.dtype == torch.float64 for v in vals):
            raise _error("float64 is not supported on TPU; cast the model and inputs to float32 "
                         "(or bfloat16) before compiling", node, gm, spec, None)


def _output_args(node) -> list:
    """The output node's values, one per graph output."""
    (out,) = node.args
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _flat_outputs(node, env):
    return [env[a] if isinstance(a, torch.fx.Node) else a for a in _output_args(node)]


def output_metas(node) -> list:
    """The output node's values as traced (fake tensors, symints), one per graph output; None for
    an output that is not a node."""
    return [a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in _output_args(node)]


def _constant(gm, node):
    value = getattr(gm, node.target)
    if isinstance(value, torch.Tensor):
        return jnp.asarray(_to_numpy(value.detach()))
    return value


def _to_numpy(t: torch.Tensor):
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(jnp.bfloat16)
    return t.cpu().numpy()


_LOW_FLOATS = (torch.bfloat16, torch.float16)
_BITWISE = frozenset({"nextafter"})  # their meaning is the input's own representation


def _pointwise_low(node: torch.fx.Node) -> bool:
    """A pointwise op whose (single) result is bfloat16 or float16: it computes in float32 and the
    lowering rounds its result."""
    target, val = node.target, node.meta.get("val")
    return (isinstance(target, torch._ops.OpOverload) and torch.Tag.pointwise in target.tags
            and isinstance(val, torch.Tensor) and val.dtype in _LOW_FLOATS
            and target._opname not in _BITWISE)


def lower_node(node: torch.fx.Node, env: dict, ctx: LowerCtx, gm=None, spec=None, wide=None):
    """Lowers one call_function node; any failure becomes a LoweringError naming the node.

    `wide` (the whole-graph lowering's) holds the float32 results of bfloat16/float16 pointwise
    ops with one user before their rounding: that user, if pointwise of the same dtype, reads it
    instead, so a chain of elementwise ops rounds where its value is stored (a program output, a
    value read twice, a non-pointwise op, an explicit cast), as Inductor's fused kernels and
    XLA's excess precision do (docs/DECISIONS.md 80)."""
    chain = wide is not None and _pointwise_low(node)
    look = (lambda n: wide.get(n, env[n])) if chain else (lambda n: env[n])
    args = torch.fx.node.map_arg(node.args, look)
    kwargs = torch.fx.node.map_arg(node.kwargs, look)
    target = node.target
    if target is torch.ops.higher_order.with_effects:
        return _lower_effectful(node, args, kwargs, ctx, gm, spec)
    if not isinstance(target, torch._ops.OpOverload):
        # Python-level glue: getitem on multi-output ops, and SymInt arithmetic, which is
        # concrete here.
        return target(*args, **kwargs)
    rule = registry.lookup(target)
    if rule is None:
        raise _error(f"no lowering for {target}", node, gm, spec, ctx)
    try:
        if ctx.checks is not None:  # on the arguments as given: padding may move padded positions
            ctx.checks.indices(node, args, ctx.padding)
        if ctx.padding is not None:
            rule = ctx.padding.rule_for(node, rule)
            args, kwargs = ctx.padding.before(node, args, kwargs)
        out = rule(ctx, *args, **kwargs)
        if ctx.padding is not None:
            out = ctx.padding.after(node, args, kwargs, out)
        if chain and len(node.users) == 1 and isinstance(out, jax.Array) and out.dtype == jnp.float32:
            wide[node] = out  # one reader: XLA fuses it there, never stores it
    except LoweringError:
        raise
    except Exception as exc:  # noqa: BLE001 — every rule failure is reported the same way
        raise _error(f"lowering {target} failed: {type(exc).__name__}: {exc}", node, gm, spec, ctx) from exc
    return _check_output(out, node, gm, spec, ctx)


def _lower_effectful(node, args, kwargs, ctx, gm, spec):
    """with_effects(token, op, *args): ops with side effects (error checks) ordered by a token.

    A compiled program has no side effects to order, so the token passes through and the
    op lowers like any other."""
    token, target, *rest = args
    rule = registry.lookup(target)
    if rule is None:
        raise _error(f"no lowering for {target}", node, gm, spec, ctx)
    val = node.meta.get("val")
    inner = dataclasses.replace(ctx, meta_val=tuple(val[1:]) if len(val) > 2 else val[1])
    try:
        out = rule(inner, *rest, **kwargs)
    except Exception as exc:  # noqa: BLE001
        raise _error(f"lowering {target} failed: {type(exc).__name__}: {exc}", node, gm, spec, ctx) from exc
    return (token, *out) if isinstance(out, tuple) else (token, out)


def _check_output(out, node, gm, spec, ctx):
    """Casts a rule's result to torch's dtype and checks its shape against torch's."""
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor) and hasattr(out, "dtype"):
        return _match(out, val, node, gm, spec, ctx)
    if isinstance(val, (tuple, list)) and isinstance(out, (tuple, list)):
        return tuple(
            _match(o, v, node, gm, spec, ctx) if isinstance(v, torch.Tensor) and hasattr(o, "dtype") else o
            for o, v in zip(out, val)
        )
    return out


def _match(out, val, node, gm, spec, ctx):
    out = jnp.asarray(out)
    want = dtypes.to_jax(val.dtype)
    if out.dtype != want:
        out = dtypes.convert(out, want, ctx.platform if ctx is not None else None)
    shape = tuple(val.shape)
    if all(isinstance(s, int) for s in shape) and tuple(out.shape) != shape:
        raise _error(
            f"lowering {node.target} produced shape {tuple(out.shape)}, torch expects {shape}",
            node, gm, spec, ctx,
        )
    return out


def _error(message: str, node, gm, spec, ctx) -> LoweringError:
    source = user_source_line(node)
    detail = f"{message}\n  FX node: {node.format_node()}\n  user source: {source}"
    if gm is not None:
        inputs = [_example(s) for s in spec] if spec is not None else []
        path = write_reproducer(gm, inputs, detail, getattr(getattr(ctx, "options", None), "dump_dir", None))
        detail += f"\n  reproducer: {path}"
    return LoweringError(detail)


def _example(s):
    if isinstance(s, TensorSpec):
        return torch.empty(s.shape, dtype=s.dtype)
    return s
