"""A graph's outputs that are its own tensor inputs, handed back as the caller's tensors.

AOTAutograd's forward graph returns, among the activations its backward saves, parameters and
inputs unchanged (the saved primals: every linear layer's weight). Lowered as outputs, each is
copied by XLA into a result buffer of its own on every call, since a program may not return a
parameter it does not own. Inductor returns the input tensor itself, and so does eager autograd
when it saves a tensor. So such outputs are taken out of the graph before it is compiled
(`split`) and put back from the call's arguments (`InputOutputs`); docs/DECISIONS.md 116.
"""
from __future__ import annotations

import torch


def split(gm: torch.fx.GraphModule) -> tuple[tuple[int, int], ...]:
    """Removes from `gm`'s outputs (in place) those that are tensor placeholders; returns their
    (output position, input position) pairs, by output position."""
    output = gm.graph.find_nodes(op="output")[0]
    (outs,) = output.args
    if not isinstance(outs, (tuple, list)):
        return ()
    inputs = {n: i for i, n in enumerate(gm.graph.find_nodes(op="placeholder"))}
    pairs = tuple((o, inputs[a]) for o, a in enumerate(outs)
                  if isinstance(a, torch.fx.Node) and a in inputs and isinstance(a.meta.get("val"), torch.Tensor))
    if pairs:
        taken = {o for o, _ in pairs}
        output.args = (type(outs)(a for o, a in enumerate(outs) if o not in taken),)
        gm.recompile()
    return pairs


def shifted(position: int | None, pairs: tuple[tuple[int, int], ...]) -> int | None:
    """An output position of the whole graph as a position among the outputs `split` kept."""
    if position is None:
        return None
    return position - sum(1 for o, _ in pairs if o < position)


class InputOutputs:
    """Runs the graph `split` left and puts the taken outputs back: the caller's own tensors.

    Args:
        runner: the compiled graph (a boxed callable over the argument list; it may clear it).
        pairs: `split`'s (output position, input position) pairs.
    """

    _boxed_call = True

    def __init__(self, runner, pairs: tuple[tuple[int, int], ...]):
        self.runner = runner
        self.pairs = pairs
        self.name = getattr(runner, "name", "graph")

    def __call__(self, args: list):
        kept = [args[i] for _, i in self.pairs]  # before the runner clears the list
        outs = list(self.runner(args))
        for (o, _), t in zip(self.pairs, kept):  # by output position: each lands where it was
            outs.insert(o, t)
        return outs


def wrap(runner, pairs: tuple[tuple[int, int], ...]):
    """`runner` itself when nothing was taken, else an InputOutputs."""
    return InputOutputs(runner, pairs) if pairs else runner
