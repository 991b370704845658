"""torch tensors <-> device buffers.

On the CPU both sides share memory through DLPack (zero copy). Elsewhere tensors travel
through the host. Torch's own device is kept: results come back where the inputs were.
"""
from __future__ import annotations

import jax
import numpy as np
import torch


def to_device(t: torch.Tensor, device: jax.Device):
    if not t.is_contiguous():
        t = t.contiguous()
    if t.requires_grad:
        t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if device.platform == "cpu" and t.device.type == "cpu":
        return jax.dlpack.from_dlpack(t)
    if t.device.type == "cuda" and device.platform == "gpu":
        return jax.dlpack.from_dlpack(t)
    return jax.device_put(jax.dlpack.from_dlpack(t.cpu()), device)


def to_torch(array, like_device: torch.device | None = None) -> torch.Tensor:
    platform = next(iter(array.devices())).platform
    if platform not in ("cpu", "gpu"):
        array = jax.device_put(array, jax.devices("cpu")[0])
    out = torch.from_dlpack(array)
    if like_device is not None and out.device != like_device:
        out = out.to(like_device)
    return out


def random_key() -> np.ndarray:
    """A fresh PRNG key drawn from torch's default generator (so torch.manual_seed applies)."""
    return torch.randint(0, 2**31 - 1, (2,), dtype=torch.int64).numpy().astype(np.uint32)
