"""Which layouts a forward's saved activations take, and which of its backward's inputs they are.

AOTAutograd's forward graph returns `[*tokens, *user outputs, *saved tensors, *saved symints]`;
its backward takes `[*saved symints, *saved tensors, *gradients]` (torch/_functorch/_aot_autograd
runtime_wrappers.py). The forward is compiled first with `saved_from` (layout.BoundaryLayouts):
XLA chooses the layouts of the saved results it computes channels-minor. `saved` reads them off the forward's executable, and
`backward` names the backward inputs that arrive so. Were that order ever different, a backward
input in another layout than the program reads is copied into it at the call
(runtime/transfer.py `in_order`): slower, never wrong. docs/DECISIONS.md 117.
"""
from __future__ import annotations

import dataclasses

import torch

from torchtpu.layout import BoundaryLayouts
from torchtpu.runtime import passthrough


@dataclasses.dataclass(frozen=True)
class Saved:
    """A compiled forward's saved tensors, in order: (shape, major-to-minor order or None for
    row-major); and how many saved symints come before them among its backward's inputs."""

    tensors: tuple[tuple[tuple[int, ...], tuple[int, ...] | None], ...]
    symints: int


def saved_start(meta, pairs: tuple[tuple[int, int], ...]) -> int | None:
    """Where a forward's saved tensors start among the outputs its program returns (after `pairs`,
    the outputs passthrough.split took); None without AOTAutograd's metadata."""
    if meta is None:
        return None
    return passthrough.shifted(len(meta.tokens) + meta.num_forward, pairs)


def forward(start: int | None) -> BoundaryLayouts | None:
    """A forward graph's layouts: its saved activations, from `start` (saved_start), in the
    layouts XLA chooses."""
    return None if start is None else BoundaryLayouts(saved_from=start)


def saved(outputs: list, meta, pairs: tuple[tuple[int, int], ...], runner) -> Saved | None:
    """The saved tensors' layouts of a forward compiled with `forward`'s layouts.

    Args:
        outputs: the forward graph's output values (fake tensors, symints; lower.output_metas), before
            the split.
        meta: AOTAutograd's forward metadata.
        pairs: passthrough.split's pairs (those outputs are the caller's tensors, row-major).
        runner: the compiled forward (its static executable tells the layouts).
    """
    exe_of = getattr(runner, "executable_for", None)
    signature = getattr(runner, "fixed_signature", None)
    if meta is None or exe_of is None or signature is None:
        return None
    exe = exe_of(signature)
    orders = exe.output_orders() if hasattr(exe, "output_orders") else None  # a mesh's executable: none
    if orders is None:
        return None
    taken = {o for o, _ in pairs}
    start = len(meta.tokens) + meta.num_forward
    tensors, symints = [], 0
    for position in range(start, len(outputs)):
        value = outputs[position]
        if not isinstance(value, torch.Tensor):
            symints += 1
            continue
        order = None
        if position not in taken:
            slot = exe.layout.outputs[passthrough.shifted(position, pairs)]
            order = orders[slot.index] if slot.kind == "tensor" else None
        tensors.append((tuple(int(s) for s in value.shape), order))
    return Saved(tuple(tensors), symints)


def backward(saved: Saved | None, example_inputs) -> BoundaryLayouts | None:
    """The backward's inputs that are saved tensors in a layout other than row-major; None when
    there are none, or when the inputs do not line up with the forward's saved tensors."""
    if saved is None:
        return None
    inputs = []
    for j, (shape, order) in enumerate(saved.tensors):
        position = saved.symints + j
        value = example_inputs[position] if position < len(example_inputs) else None
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape:
            return None  # not the order this module expects: every input row-major, as before
        if order is not None:
            inputs.append((position, order))
    return BoundaryLayouts(inputs=tuple(inputs)) if inputs else None
