"""The context object every lowering rule receives."""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from torchtpu.compiler import dtypes

PROMOTE = ELEMENTWISE_TYPE_PROMOTION_KIND


@dataclasses.dataclass
class RngState:
    """Random keys for one program run: a key enters as a program input, rules split it."""

    key: Any = None
    used: bool = False

    def next_key(self):
        self.used = True
        self.key, sub = jax.random.split(self.key)
        return sub


@dataclasses.dataclass
class LowerCtx:
    """What a rule may know about the node it lowers.

    Attributes:
        node: the FX node (its meta["val"] holds the fake output(s) torch computed).
        platform: the target platform: "cpu", "gpu" or "tpu".
        options: the backend Options.
        padding: for a bucketed program, the bucket and true sizes (compiler.padding.Padding);
            lower_node masks padded positions for the nodes the pad-safety analysis marked.
        checks: the program's run-time checks (compiler.checks.RunChecks); None with option
            check_indices=False.
        env: the values lowered so far, by FX node (None outside a whole-graph lowering): a
            rule may look through an argument to the node that produced it (the matrix
            products fold a transpose of an operand into their dimension numbers).
    """

    node: torch.fx.Node
    platform: str
    options: Any
    rng: RngState
    padding: Any = None
    meta_val: Any = None  # overrides node.meta["val"] (an effectful op's own outputs)
    checks: Any = None
    env: Any = None

    # --- output metadata -------------------------------------------------------------
    @property
    def val(self):
        return self.meta_val if self.meta_val is not None else self.node.meta.get("val")

    @property
    def out_dtype(self):
        """The JAX dtype of the (first) output, as torch computed it."""
        val = self.val
        if isinstance(val, (tuple, list)):
            val = next(v for v in val if isinstance(v, torch.Tensor))
        return dtypes.to_jax(val.dtype)

    def out_dtypes(self) -> list:
        return [dtypes.to_jax(v.dtype) if isinstance(v, torch.Tensor) else None for v in self.val]

    # --- type promotion ----------------------------------------------------------------
    def promote(self, kind=PROMOTE.DEFAULT, args=None):
        """Torch's (compute dtype, result dtype) for this node's tensor/scalar arguments.

        The compute dtype is torch's "opmath" type: float32 for bf16/f16 inputs.
        """
        metas = [_meta_of(a) for a in (self.node.args if args is None else args)]
        metas = [m for m in metas if m is not None]
        compute, result = elementwise_dtypes(*metas, type_promotion_kind=kind)
        return dtypes.to_jax(compute), dtypes.to_jax(result)

    def next_key(self):
        return self.rng.next_key()


def _meta_of(arg):
    if isinstance(arg, torch.fx.Node):
        val = arg.meta.get("val")
        if isinstance(val, torch.Tensor):
            return val
        if isinstance(val, torch.SymInt):
            return 1
        if isinstance(val, torch.SymFloat):
            return 1.0
        if isinstance(val, torch.SymBool):
            return True
        return val if isinstance(val, (bool, int, float, complex)) else None
    if isinstance(arg, (bool, int, float, complex)):
        return arg
    return None


def as_dtype(x, dtype):
    """x (a JAX value or Python scalar) as `dtype`."""
    if isinstance(x, (bool, int, float, complex)):
        return jnp.asarray(x, dtype=dtype)
    return x if x.dtype == dtype else x.astype(dtype)
