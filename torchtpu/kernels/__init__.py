"""Pallas kernels, chosen per target platform.

`choose` is the one place that decides, per lowered node, between a Pallas kernel and XLA's
own ops, and records the choice as a "kernel" compile event:

| option `pallas` | tpu target | gpu / cpu / portable target |
|---|---|---|
| "auto" (default) | Mosaic kernel (`tpu_custom_call`) | XLA's own ops |
| "interpret" | the TPU kernel in interpret mode | the TPU kernel in interpret mode |
| "off" | XLA's own ops | XLA's own ops |
| "auto" with option `mesh` | XLA's own ops (XLA does not partition Mosaic calls) | XLA's own ops |

Float32 on a TPU target is the exception: the shipped kernels' matmuls (flash attention, megablox's
grouped matmuls) are bfloat16-precise, so they take float32 only under torch's float32 matmul
precision "medium" (`precision_gap`; docs/DECISIONS.md 94, 125).

Interpret mode runs a kernel's body as ordinary XLA ops (a loop over the grid), so its
numerics are checked on any machine. A multi-platform ("portable") export never gets a
Mosaic kernel: a TPU custom call does not lower for other platforms.
"""
from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import torch

from torchtpu import events
from torchtpu.plans import MASK

MOSAIC, INTERPRET, XLA = "mosaic", "interpret", "xla"


def precision_gap(dtype) -> str | None:
    """Why a compiled (Mosaic) kernel whose matmuls are bfloat16-precise cannot take this dtype at
    torch's float32 matmul precision (None: it can). On a TPU v5e the shipped flash kernel's float32
    attention was 9e-3 off torch's (XLA's own ops at HIGHEST: 2e-6), and with megablox's grouped
    matmuls a Mixtral's gradients were 5e-3 off (a dense decoder's then 2e-5, itself the attention
    backward's error, since fixed: DECISIONS 129): the error of
    torch.set_float32_matmul_precision("medium"), which is the one setting that allows it."""
    if dtype == jnp.float32 and torch.get_float32_matmul_precision() != "medium":
        return "float32 at matmul precision 'highest'/'high': the kernel's matmuls are bfloat16-precise"
    return None


def choose(ctx, kernel: str, why_not: str | None = None, mosaic_why_not: str | None = None) -> str:
    """MOSAIC, INTERPRET or XLA for the node `ctx` lowers; records a "kernel" event.

    Args:
        ctx: the rule's LowerCtx (platform, options, node).
        kernel: the kernel's name, e.g. "flash_attention".
        why_not: why the kernel cannot take this node's arguments (None: it can).
        mosaic_why_not: why its compiled (Mosaic) form cannot, where interpret mode can (None: it can).
    """
    mode = getattr(ctx.options, "pallas", "auto")
    if mode == "off":
        choice, why = XLA, "option pallas='off'"
    elif why_not is not None:
        choice, why = XLA, why_not
    elif kernel != "flash_attention" and ctx.node.meta.get(MASK) is not None:
        choice, why = XLA, "bucket padding inside the normalised dim"  # the kernel would read it
    elif mode == "interpret":
        choice, why = INTERPRET, "option pallas='interpret'"
    elif getattr(ctx.options, "mesh", None) is not None:  # XLA's partitioner cannot split a Mosaic call
        choice, why = XLA, "option mesh: Mosaic kernels are not partitioned by XLA (they would need shard_map)"
    elif ctx.platform == "tpu":
        choice, why = (XLA, mosaic_why_not) if mosaic_why_not is not None else (MOSAIC, "TPU target")
    else:
        choice, why = XLA, f"{ctx.platform} target: XLA's own ops"
    events.record("kernel", kernel=kernel, choice=choice, platform=ctx.platform, why=why,
                  node=getattr(ctx.node, "name", None))
    return choice


@contextlib.contextmanager
def running(choice: str):
    """The context a kernel is traced in: 32-bit JAX (the shipped kernels' index arithmetic
    mixes int32 with Python ints, which x64 makes int64), interpret mode for INTERPRET."""
    if choice == INTERPRET:
        from jax.experimental.pallas import tpu as pltpu
        interpret = pltpu.force_tpu_interpret_mode(True)
    else:
        interpret = contextlib.nullcontext()
    with jax.enable_x64(False), interpret:
        yield
