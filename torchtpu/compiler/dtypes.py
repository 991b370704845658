"""torch dtype <-> JAX dtype."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

TORCH_TO_JAX = {
    torch.float32: jnp.float32,
    torch.float64: jnp.float64,
    torch.float16: jnp.float16,
    torch.bfloat16: jnp.bfloat16,
    torch.int64: jnp.int64,
    torch.int32: jnp.int32,
    torch.int16: jnp.int16,
    torch.int8: jnp.int8,
    torch.uint8: jnp.uint8,
    torch.uint16: jnp.uint16,
    torch.uint32: jnp.uint32,
    torch.uint64: jnp.uint64,
    torch.bool: jnp.bool_,
    torch.complex64: jnp.complex64,
    torch.complex128: jnp.complex128,
    torch.float8_e4m3fn: jnp.float8_e4m3fn,
    torch.float8_e5m2: jnp.float8_e5m2,
}
JAX_TO_TORCH = {np.dtype(v): k for k, v in TORCH_TO_JAX.items()}


class UnsupportedDtype(TypeError):
    pass


def to_jax(dtype: torch.dtype):
    try:
        return TORCH_TO_JAX[dtype]
    except KeyError:
        raise UnsupportedDtype(f"torch dtype {dtype} has no XLA equivalent") from None


def to_torch(dtype) -> torch.dtype:
    return JAX_TO_TORCH[np.dtype(dtype)]


def short_name(dtype: torch.dtype) -> str:
    """f32, bf16, i64 ... as in FX's readable graphs."""
    return {
        torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
        torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
        torch.uint8: "u8", torch.bool: "b8", torch.complex64: "c64", torch.complex128: "c128",
    }.get(dtype, str(dtype).replace("torch.", ""))


def convert(x, dtype, platform: str):
    """`x.astype(dtype)`; on the CPU, float32 to bfloat16 as integer ops (round to nearest even,
    NaN to torch's 0x7FC0). XLA:CPU's own convert made a fused chain of bfloat16 elementwise ops
    2.3x slower here (each op computes in float32 and rounds: the convert is the work), on an
    AVX512-BF16 CPU too (docs/DECISIONS.md 76). The same bits either way."""
    if platform == "cpu" and x.dtype == jnp.float32 and jnp.dtype(dtype) == jnp.bfloat16:
        return _bfloat16_rne(x)
    return x.astype(dtype)


def _bfloat16_rne(x):
    bits = lax.bitcast_convert_type(x, jnp.uint32)
    rounded = (bits + jnp.uint32(0x7FFF) + ((bits >> 16) & jnp.uint32(1))) >> 16
    rounded = jnp.where(x != x, jnp.uint32(0x7FC0), rounded)
    return lax.bitcast_convert_type(rounded.astype(jnp.uint16), jnp.bfloat16)
