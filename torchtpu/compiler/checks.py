"""Run-time checks inside a program: index bounds and torch's asserts, one flag out.

Each check is a cheap reduction to one boolean; the program folds them into ONE int32 output,
0 when every check passed, else 1 + the number of the first that failed (in graph order). The
runtime reads that scalar after the call and raises the error torch raises for the op the user
called (IndexError or RuntimeError, torch's message), naming the ATen overload, the FX node and
the user's source line. The nodes to check and their bounds come from the index_checks pass
(passes/index_checks.py); option check_indices=False leaves every check out (no flag output).
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import torch

from torchtpu.compiler.errors import user_source_line
from torchtpu.plans import CHECK, LAYOUT, evaluate

OFF_HINT = 'checked inside the compiled program; options={"check_indices": False} turns the checks off'


class ProgramIndexError(IndexError):
    """An index checked inside a compiled program was out of range (where torch raises IndexError).
    `.check` holds what failed (op, message, graph position)."""


class ProgramCheckError(RuntimeError):
    """A check inside a compiled program failed (where torch raises RuntimeError)."""


class CheckFailed(Exception):
    """Raised by the runtime with the failed check's record; the graph's runner turns it into the
    user's error, with the node it finds at the record's position (runtime/executable.py)."""

    def __init__(self, check: dict):
        super().__init__(check["message"])
        self.check = check


class RunChecks:
    """The checks of one program being traced: their records and the flag so far.

    Args:
        positions: graph node -> its position (the canonical order the cache key prints).
    """

    def __init__(self, positions: dict):
        self.positions = positions
        self.records: list[dict] = []
        self.flag = None

    def require(self, ok, node, error: str, message: str, op: str) -> None:
        """Adds one check: `ok` (a traced boolean) must hold, else torch raises `error(message)`."""
        self.records.append({"node": self.positions[node], "op": op, "lowered": str(node.target),
                             "error": error, "message": message})
        failed = jnp.logical_not(jnp.all(ok))
        number = jnp.int32(len(self.records))
        self.flag = jnp.where(failed, number, 0) if self.flag is None else \
            jnp.where((self.flag == 0) & failed, number, self.flag)

    def indices(self, node, args, padding) -> None:
        """The bounds check the index_checks pass put on `node`, on its lowered arguments."""
        check = node.meta.get(CHECK)
        if check is None:
            return
        for index_path, operand_path, dim in check.sites:
            index, index_node = _at(args, index_path), _at(node.args, index_path)
            operand, operand_node = _at(args, operand_path), _at(node.args, operand_path)
            if index is None or not hasattr(index, "dtype"):
                continue
            if dim is not None:
                dim = dim % max(operand.ndim, 1)
            size, shown = _size(operand, operand_node, dim, padding)
            index = index.astype(jnp.int64)
            ok = (index < size) & (index >= (-size if check.negative else 0))
            real = _real_positions(index_node, padding)
            if real is not None:  # a bucketed program: padded index entries are never errors
                ok = ok | ~real
            self.require(ok, node, check.error, check.message.format(dim=dim, size=shown), check.op)


def _at(args, path):
    value = args
    for k in path:
        value = value[k]
    return value


def _size(operand, node, dim, padding):
    """The operand's extent along `dim` (its numel for None) as the program sees it: the true
    size in a bucketed program. Returns (size, how the message shows it)."""
    static = math.prod(operand.shape) if dim is None else (operand.shape[dim] if operand.ndim else 1)
    layout = node.meta.get(LAYOUT) if padding is not None and isinstance(node, torch.fx.Node) else None
    if not isinstance(layout, tuple) or not _padded(layout, padding):
        return static, static
    dims = layout if dim is None else (layout[dim],) if operand.ndim else ()
    factors = [f for d in dims for f in d]
    if not any(_padded_factor(f, padding) for f in factors):
        return static, static
    shown = " * ".join(str(f) for f in factors)
    return math.prod(evaluate(f, padding.true) for f in factors), f"{shown} (this call's true size)"


def _padded_factor(factor, padding) -> bool:
    return bool(getattr(factor, "free_symbols", set()) & set(padding.true))


def _padded(layout, padding) -> bool:
    return any(_padded_factor(f, padding) for d in layout if isinstance(d, tuple) for f in d)


def _real_positions(node, padding):
    """bool (broadcastable to the index tensor): its entries that are not bucket padding; None
    when nothing is padded. Padded entries may hold anything (zeros, or what was computed there)."""
    layout = node.meta.get(LAYOUT) if padding is not None and isinstance(node, torch.fx.Node) else None
    if not isinstance(layout, tuple) or not _padded(layout, padding):
        return None
    real = None
    for d, factors in enumerate(layout):
        if any(_padded_factor(f, padding) for f in factors):
            shape = [1] * len(layout)
            shape[d] = -1
            keep = padding.dim_mask(factors).reshape(shape)
            real = keep if real is None else real & keep
    return real


def raise_if_failed(checks: list, flag: int) -> None:
    """Raises CheckFailed with the record of check `flag` (1-based; 0: all passed)."""
    if flag:
        raise CheckFailed(checks[flag - 1])


def user_error(check: dict, node: torch.fx.Node | None) -> Exception:
    """The error torch raises for the failed check, naming the op, the FX node and the user's line."""
    op = check["op"] if check["op"] == check["lowered"] else f"{check['op']} (lowered as {check['lowered']})"
    where = (f"\n  FX node: {node.format_node()}\n  user source: {user_source_line(node)}" if node is not None
             else "\n  FX node: <unknown: the program was compiled for another graph>")
    error = ProgramIndexError if check["error"] == "IndexError" else ProgramCheckError
    exc = error(f"{check['message']}\n  op: {op}{where}\n  ({OFF_HINT})")
    exc.check, exc.node = check, node
    return exc
