"""ATen's CPU convolution, grouped matmul and attention as XLA custom calls: torch's own kernels
(oneDNN's for convolutions) inside an XLA:CPU program.

XLA's CPU convolutions are slow next to oneDNN's (docs/DECISIONS.md 38), and Inductor calls
oneDNN for its convolutions too; 2d/3d calls ask XLA for channels-last buffers (decision 40).
XLA:CPU's ragged dot (MoE experts' `_grouped_mm`) is a dense product masked per group, so each
group pays for all of them (decision 79). XLA:CPU's batched products over the attention
probabilities' query axis ran the attention backward 2-3x slower than torch's kernel (decision
96), and XLA's attention forward writes every score where torch's kernel works block by block
(decision 120). `aten_cpu.cc` is compiled once per source, torch and jaxlib version into
TORCHTPU_EXTENSION_DIR (default `$XDG_CACHE_HOME/torchtpu/extensions`) with `$CXX` (default
g++), then registered with XLA as the CPU FFI targets `torchtpu_aten_convolution`, `..._into`
(float32 2d, written into XLA's buffer: decision 43), `..._backward`, `torchtpu_aten_grouped_mm`,
`torchtpu_aten_attention_forward` and `torchtpu_aten_attention_backward`. Where it cannot be
built, these stay XLA's and one warning says why.
Where XLA's intra-op pool has two threads or more, the convolution forward and both attention
kernels split their batch (and heads) over that pool, one thread per block, rather than start an
OpenMP team on XLA's thread (decision 121); with one pool thread they run whole, on ATen's threads.
Where the CPU has no bfloat16 instructions (`native_bfloat16`), every kernel runs bfloat16
operands in float32 and rounds its results back once (decision 99).
`TORCHTPU_ATEN_KERNELS=0` or the option `aten_kernels="off"` turns it off.

    python -m torchtpu.kernels.aten_cpu     # builds it now (`make` does), prints the path
"""
from __future__ import annotations

import ctypes
import importlib.metadata
import logging
import subprocess
import sys
import threading
from pathlib import Path

from torchtpu import cxx

TARGET = "torchtpu_aten_convolution"
BACKWARD_TARGET = "torchtpu_aten_convolution_backward"
INTO_TARGET = "torchtpu_aten_convolution_into"
GROUPED_MM_TARGET = "torchtpu_aten_grouped_mm"
ATTENTION_TARGET = "torchtpu_aten_attention_forward"
ATTENTION_BACKWARD_TARGET = "torchtpu_aten_attention_backward"
SOURCE = Path(__file__).with_name("aten_cpu.cc")

log = logging.getLogger("torchtpu.kernels")
_lock = threading.Lock()
_state: dict = {}  # "ok": registered in this process; "why": why not


def enabled() -> bool:
    return cxx.switched_on("TORCHTPU_ATEN_KERNELS")


def library_path() -> Path:
    """Where the built library lives: one file per source, torch, jaxlib and C++ ABI."""
    return cxx.library_path(SOURCE, "aten_cpu", importlib.metadata.version("jaxlib"))


def build() -> Path:
    """Compiles the library unless it exists (under a lock; written atomically). Raises OSError
    or CalledProcessError (with the compiler's output) when it cannot."""
    import jax.ffi

    return cxx.build(SOURCE, library_path(), [jax.ffi.include_dir()], "ATen CPU kernels")


def available() -> bool:
    """True when the FFI target is registered in this process; builds the library the first time.
    False (with one warning naming the reason) when it is disabled or cannot be built."""
    if not enabled():
        return False
    with _lock:
        if "ok" not in _state:
            try:
                _register(build())
                _state["ok"] = True
            except (OSError, subprocess.CalledProcessError) as exc:
                _state.update(ok=False, why=cxx.why_not(exc))
                log.warning("torchtpu: ATen CPU kernels unavailable, XLA's convolutions are used: %s", _state["why"])
    return _state["ok"]


def register_built() -> None:
    """Registers the library if it was built before (a cached executable may call it); never builds."""
    if enabled() and "ok" not in _state and library_path().exists():
        available()


SYMBOLS = {  # FFI target -> the library's handler
    TARGET: "TorchtpuAtenConvolution",
    INTO_TARGET: "TorchtpuAtenConvolutionInto",
    BACKWARD_TARGET: "TorchtpuAtenConvolutionBackward",
    GROUPED_MM_TARGET: "TorchtpuAtenGroupedMm",
    ATTENTION_TARGET: "TorchtpuAtenAttentionForward",
    ATTENTION_BACKWARD_TARGET: "TorchtpuAtenAttentionBackward",
}


def _register(path: Path) -> None:
    import jax.ffi

    lib = ctypes.CDLL(str(path))
    for target, symbol in SYMBOLS.items():
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
    _state["path"] = str(path)


def registrations() -> list[tuple[str, str, str]]:
    """(FFI target, library path, handler symbol) of each target registered in this process: what
    a compiler process registers before it compiles this process's programs (compiler/worker.py)."""
    return [(target, _state["path"], symbol) for target, symbol in SYMBOLS.items()] if _state.get("ok") else []


def native_bfloat16() -> bool:
    """Whether this CPU has bfloat16 instructions (AVX512-BF16 or AMX), which torch's bfloat16
    kernels need to be fast: without them its bfloat16 convolutions and matrix products run 4 to
    90 times slower than its float32 ones (docs/DECISIONS.md 99)."""
    if "native_bf16" not in _state:
        import torch

        cpu = getattr(torch, "cpu", None)
        probes = [getattr(cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
        _state["native_bf16"] = any(probe() for probe in probes if probe is not None)
    return _state["native_bf16"]


def _compute_dtype(dtype):
    """The dtype the kernels run in for operands of `dtype`: bfloat16 is widened to float32 (exact)
    where the CPU has no bfloat16 instructions, and the result rounded back once, as torch's own
    bfloat16 kernels round their float32 accumulators."""
    import jax.numpy as jnp

    return jnp.float32 if dtype == jnp.bfloat16 and not native_bfloat16() else dtype


def _widened(*arrays):
    """`arrays` (None kept) in the kernels' compute dtype for the first one's dtype."""
    dtype = _compute_dtype(arrays[0].dtype)
    return [a if a is None or a.dtype != arrays[0].dtype else a.astype(dtype) for a in arrays]


def writes_into(x, w, channels_last: bool) -> bool:
    """Whether `convolution` has oneDNN write into XLA's buffer (and can add a bias and ReLU)."""
    import jax.numpy as jnp

    return channels_last and x.ndim == 4 and x.dtype == jnp.float32 and w.dtype == jnp.float32


def convolution(x, w, stride, padding, dilation, groups: int, out_shape, channels_last=False,
                bias=None, relu=False):
    """torch.nn.functional.conv{1,2,3}d (x, w: arrays of one dtype); `bias` and `relu` only
    where `writes_into` (the caller adds them otherwise).

    With `channels_last` XLA hands the kernel every array channels-minor (NHWC in memory,
    still NCHW to the program) and keeps that layout around it where it can."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    if _compute_dtype(x.dtype) != x.dtype:
        if bias is not None or relu:
            raise ValueError("aten_cpu.convolution: bias and relu only where writes_into()")
        wide = convolution(*_widened(x, w), stride, padding, dilation, groups, out_shape, channels_last)
        return wide.astype(x.dtype)
    result = jax.ShapeDtypeStruct(tuple(out_shape), x.dtype)
    if writes_into(x, w, channels_last):
        # written into XLA's zero-filled buffer in place: no result to allocate and copy
        zeros = jnp.zeros(result.shape, result.dtype)
        b = bias if bias is not None else jnp.zeros((out_shape[1],), jnp.float32)
        call = jax.ffi.ffi_call(INTO_TARGET, result, input_output_aliases={3: 0},
                                input_layouts=[_cl(4), _cl(4), None, _cl(4)], output_layouts=_cl(4))
        return call(x, w, b, zeros, has_bias=np.int64(bias is not None), relu=np.int64(relu),
                    **_attrs(stride, padding, dilation, groups))
    if bias is not None or relu:
        raise ValueError("aten_cpu.convolution: bias and relu only where writes_into()")
    call = jax.ffi.ffi_call(TARGET, result, **_layouts(channels_last, [x, w], [out_shape]))
    return call(x, w, **_attrs(stride, padding, dilation, groups, channels_last))


def convolution_backward(grad, x, w, stride, padding, dilation, groups: int, mask=(True, True),
                         channels_last=False):
    """(d/dx, d/dw) of `convolution` given d/d(out); an entry not in `mask` is None."""
    import jax
    import numpy as np

    if _compute_dtype(x.dtype) != x.dtype:
        wide = convolution_backward(*_widened(grad, x, w), stride, padding, dilation, groups, mask, channels_last)
        return tuple(None if g is None else g.astype(x.dtype) for g in wide)
    call = jax.ffi.ffi_call(BACKWARD_TARGET, (jax.ShapeDtypeStruct(x.shape, x.dtype),
                                              jax.ShapeDtypeStruct(w.shape, w.dtype)),
                            **_layouts(channels_last, [grad, x, w], [x.shape, w.shape]))
    gx, gw = call(grad, x, w, mask_x=np.int64(mask[0]), mask_w=np.int64(mask[1]),
                  **_attrs(stride, padding, dilation, groups, channels_last))
    return (gx if mask[0] else None), (gw if mask[1] else None)


def grouped_mm(a, b, offs, out_shape):
    """torch._grouped_mm(a, b, offs) (a, b of one dtype; offs the groups' int32 ends)."""
    import jax
    import jax.numpy as jnp

    wide_a, wide_b = _widened(a, b)
    call = jax.ffi.ffi_call(GROUPED_MM_TARGET, jax.ShapeDtypeStruct(tuple(out_shape), wide_a.dtype))
    return call(wide_a, wide_b, offs.astype(jnp.int32)).astype(a.dtype)


def attention_supports(q, k, v, mask, *more) -> bool:
    """Whether `attention` (and, given its grad_out and out as `more`, `attention_backward`) takes
    these once the caller repeats each kv head for its group of q heads: 4-d, one float dtype
    ATen's kernel has, kv heads dividing q heads, and no mask or an additive mask of that dtype."""
    return (q.ndim == 4 and one_dtype(q, k, v, *more) and q.shape[-3] % k.shape[-3] == 0
            and (mask is None or mask.dtype == q.dtype))


def one_dtype(*arrays) -> bool:
    """All of one dtype the kernels take (float32, float64, bfloat16)."""
    import jax.numpy as jnp

    return arrays[0].dtype in (jnp.float32, jnp.float64, jnp.bfloat16) and all(a.dtype == arrays[0].dtype
                                                                                for a in arrays)


def attention(q, k, v, mask=None, is_causal=False, scale=None):
    """torch's CPU flash-attention forward (output of q's dtype, float32 logsumexp) where
    `attention_supports`, with k and v already repeated to q's heads."""
    import jax
    import jax.numpy as jnp

    dtype = q.dtype
    q, k, v, mask = _widened(q, k, v, mask)
    shapes = (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(q.shape[:-1], jnp.float32))
    out, logsumexp = jax.ffi.ffi_call(ATTENTION_TARGET, shapes)(q, k, v, _mask_operand(q, mask),
                                                                **_attention_attrs(mask, is_causal, scale))
    return out.astype(dtype), logsumexp


def attention_backward(grad_out, q, k, v, out, logsumexp, mask=None, is_causal=False, scale=None):
    """torch's CPU flash-attention backward (d/dq, d/dk, d/dv) where `attention_supports`,
    with k and v already repeated to q's heads."""
    import jax
    import jax.numpy as jnp

    dtype = q.dtype
    grad_out, q, k, v, out, mask = _widened(grad_out, q, k, v, out, mask)
    shapes = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (q, k, v))
    call = jax.ffi.ffi_call(ATTENTION_BACKWARD_TARGET, shapes)
    grads = call(grad_out, q, k, v, out, logsumexp.astype(jnp.float32), _mask_operand(q, mask),
                 **_attention_attrs(mask, is_causal, scale))
    return tuple(g.astype(dtype) for g in grads)


def _mask_operand(q, mask):
    """The attention handlers' mask operand: the mask, or a scalar the handler does not read."""
    import jax.numpy as jnp

    return mask if mask is not None else jnp.zeros((), q.dtype)


def _attention_attrs(mask, is_causal, scale) -> dict:
    import numpy as np

    return dict(is_causal=np.int64(bool(is_causal)), has_mask=np.int64(mask is not None),
                has_scale=np.int64(scale is not None), scale=np.float64(scale or 0.0))


def _cl(ndim: int) -> tuple:
    """The channels-last layout of an N, C, spatial... array, major-to-minor (ffi_call's order)."""
    return (0, *range(2, ndim), 1)


def _layouts(channels_last, args, result_shapes) -> dict:
    """ffi_call's layouts: channels-last for every operand and result, or none given."""
    if not channels_last:
        return {}
    outs = [_cl(len(s)) for s in result_shapes]
    return dict(input_layouts=[_cl(a.ndim) for a in args], output_layouts=outs if len(outs) > 1 else outs[0])


def _attrs(stride, padding, dilation, groups, channels_last=None) -> dict:
    """The handlers' attributes (`channels_last` only for those that take it)."""
    import numpy as np

    attrs = dict(stride=np.asarray(stride, np.int64), padding=np.asarray(padding, np.int64),
                 dilation=np.asarray(dilation, np.int64), groups=np.int64(groups))
    return attrs if channels_last is None else {**attrs, "channels_last": np.int64(channels_last)}


if __name__ == "__main__":
    if not available():
        sys.exit(f"not built: {_state.get('why', 'TORCHTPU_ATEN_KERNELS is off')}")
    print(library_path())
