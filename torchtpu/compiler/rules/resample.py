"""Resampling: grid_sampler_2d/3d (bilinear / nearest / bicubic (2-d); zeros / border / reflection).

Interpolation (upsample_*), reflection/replication padding, im2col/col2im and
pixel_(un)shuffle reach the lowering already decomposed by torch's core decompositions
into index/gather ops, which lower exactly; only what survives decomposition is here.
The backward op is the VJP of the forward rule.
"""
from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import torch

from torchtpu.compiler.registry import op
from torchtpu.compiler.rules.reduction import accumulate_dtype

aten = torch.ops.aten

_BILINEAR, _NEAREST, _BICUBIC = 0, 1, 2
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2
_CUBIC_A = -0.75


def _unnormalize(coord, size, align_corners):
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


def _reflect(coord, twice_low, twice_high):
    if twice_low == twice_high:
        return jnp.zeros_like(coord)
    low = twice_low / 2
    span = (twice_high - twice_low) / 2
    coord = jnp.abs(coord - low)
    extra = jnp.fmod(coord, span)
    flips = jnp.floor(coord / span)
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + low, span - extra + low)


def _apply_padding(coord, size, padding_mode, align_corners):
    if padding_mode == _BORDER:
        return jnp.clip(coord, 0, size - 1)
    if padding_mode == _REFLECTION:
        if align_corners:
            coord = _reflect(coord, 0, 2 * (size - 1))
        else:
            coord = _reflect(coord, -1, 2 * size - 1)
        return jnp.clip(coord, 0, size - 1)
    return coord


def _gather(flat, sizes, coords):
    """flat (N, C, prod(sizes)); integer coords (one per spatial axis, outermost first, each
    (N, *out)) -> (N, C, *out), zero where a coordinate falls outside the input."""
    n, c, _ = flat.shape
    inside = True
    idx = 0
    for size, coord in zip(sizes, coords):
        inside = inside & (coord >= 0) & (coord < size)
        idx = idx * size + coord
    out_shape = coords[0].shape[1:]
    idx = jnp.where(inside, idx, 0).reshape(n, 1, -1)
    vals = jnp.take_along_axis(flat, jnp.broadcast_to(idx, (n, c, idx.shape[-1])), axis=2)
    vals = vals.reshape((n, c) + out_shape)
    return jnp.where(inside[:, None], vals, jnp.zeros((), flat.dtype))


def _cubic_weights(t):
    a = _CUBIC_A

    def conv1(x):
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def conv2(x):
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return [conv2(t + 1), conv1(t), conv1(1 - t), conv2(2 - t)]


def grid_sample(x, grid, interpolation_mode, padding_mode, align_corners):
    """Computed in the input's dtype, as torch's CPU kernel does (bf16 included: sampling
    positions rounded to bf16 move by whole pixels, so float32 math would not match)."""
    grid = grid.astype(x.dtype)
    n, c = x.shape[:2]
    sizes = x.shape[2:]  # (H, W) or (D, H, W)
    nd = len(sizes)
    flat = x.reshape(n, c, -1)
    # grid's last axis is (x, y[, z]): the innermost spatial axis first.
    g = [_unnormalize(grid[..., nd - 1 - i], sizes[i], align_corners) for i in range(nd)]

    if interpolation_mode == _BICUBIC:
        if nd != 2:
            raise NotImplementedError("bicubic grid sampling is 2-d only")
        (h, w), (gy, gx) = sizes, g
        y0, x0 = jnp.floor(gy), jnp.floor(gx)
        wx, wy = _cubic_weights(gx - x0), _cubic_weights(gy - y0)
        out = 0
        for j in range(4):
            row = 0
            yy = _apply_padding(y0 - 1 + j, h, padding_mode, align_corners).astype(jnp.int32)
            for i in range(4):
                xx = _apply_padding(x0 - 1 + i, w, padding_mode, align_corners).astype(jnp.int32)
                row = row + _gather(flat, sizes, [yy, xx]) * wx[i][:, None]
            out = out + row * wy[j][:, None]
        return out

    g = [_apply_padding(gi, size, padding_mode, align_corners) for gi, size in zip(g, sizes)]
    if interpolation_mode == _NEAREST:
        return _gather(flat, sizes, [jnp.round(gi).astype(jnp.int32) for gi in g])
    if interpolation_mode != _BILINEAR:
        raise NotImplementedError(f"grid sampling interpolation_mode {interpolation_mode}")
    lo = [jnp.floor(gi) for gi in g]
    hi = [l + 1 for l in lo]
    out = 0
    # Corners in torch's order (innermost axis fastest); each weight is the product of the
    # opposite corner's distances, innermost axis first, as torch multiplies them.
    for corner in itertools.product((0, 1), repeat=nd):
        weight = None
        for i in reversed(range(nd)):
            d = (hi[i] - g[i]) if corner[i] == 0 else (g[i] - lo[i])
            weight = d if weight is None else weight * d
        coords = [(lo[i] if corner[i] == 0 else hi[i]).astype(jnp.int32) for i in range(nd)]
        out = out + _gather(flat, sizes, coords) * weight[:, None]
    return out


@op(aten.grid_sampler_2d.default, aten.grid_sampler_3d.default)
def _grid_sampler(ctx, x, grid, interpolation_mode, padding_mode, align_corners):
    return grid_sample(x, grid, interpolation_mode, padding_mode, align_corners)


@op(aten.grid_sampler_2d_backward.default, aten.grid_sampler_3d_backward.default)
def _grid_sampler_backward(ctx, grad, x, grid, interpolation_mode, padding_mode, align_corners,
                              output_mask):
    acc = accumulate_dtype(grad.dtype)
    _, vjp = jax.vjp(lambda x_, g_: grid_sample(x_, g_, interpolation_mode, padding_mode, align_corners),
                     x.astype(acc), grid.astype(acc))
    grad_input, grad_grid = vjp(grad.astype(acc))
    return (grad_input if output_mask[0] else None), grad_grid
