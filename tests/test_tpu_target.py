"""What a TPU target needs that the CPU does not, checked without a TPU: found on a TPU v5e
(docs/DECISIONS.md 94), where an HF decoder's compiled logits were 0.7 off until these held."""
from __future__ import annotations

import jax
import torch

import torchtpu
from torchtpu.runtime import transfer


def _positions_diff():
    p = (torch.arange(16) + 0)[None].expand(2, -1)  # transformers' packed-sequence check
    return torch.diff(p, prepend=p[:, :1] - 1, dim=-1)


def test_arange_is_a_barrier_on_a_tpu_target_only():
    """XLA:TPU miscompiles slices of a concatenation of iota values (the diff above read -127
    where it is 1): a TPU or portable program computes arange behind an optimization barrier."""
    for platforms, barrier in ((("tpu",), True), (("cpu", "tpu"), True), (("cpu",), False)):
        text = torchtpu.export(lambda x: _positions_diff() + x, torch.zeros(2, 16, dtype=torch.long),
                               platforms=platforms).stablehlo_text()
        assert ("optimization_barrier" in text) is barrier, platforms
    compiled = torch.compile(lambda x: _positions_diff() + x, backend="tpu", fullgraph=True)
    assert compiled(torch.zeros(2, 16, dtype=torch.long)).eq(1).all()


def test_a_copy_to_another_device_keeps_int64():
    """JAX outside x64 narrows int64 to int32; programs are lowered with x64 and a TPU one
    refused the int32 buffer of its int64 token ids."""
    ids = torch.tensor([[1, 2**40]], dtype=torch.int64)
    array = transfer.copy_to(ids, jax.devices("cpu")[0])
    assert array.dtype == jax.numpy.int64
    assert transfer.to_torch(array).tolist() == ids.tolist()
