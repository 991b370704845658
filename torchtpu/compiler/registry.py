"""The lowering registry: ATen overload -> rule.

A rule has one signature, ``rule(ctx, *args, **kwargs)``: ``ctx`` is the node's
:class:`~torchtpu.compiler.context.LowerCtx`; tensor arguments arrive as JAX values,
everything else as the Python value the FX node holds. A rule returns a JAX value (or a
tuple of them for multi-output ops).

Lookup order is fixed: the exact overload, then nothing — an op the registry does not
know is decomposed before lowering (see decompositions.py) or fails with a precise
error naming the overload, the node and the user's source line.

An op of another library that may not be loaded (transformers' custom ops) is registered by
its name as torch prints it, "namespace.op.overload".
"""
from __future__ import annotations

from typing import Callable

import torch

Rule = Callable[..., object]
_RULES: dict[torch._ops.OpOverload, Rule] = {}
_NAMED: dict[str, Rule] = {}  # other libraries' overloads, by str(overload)
_RANDOM: set[torch._ops.OpOverload] = set()
_loaded = False  # the rule modules register on import, which the first lookup triggers


def _load_rules() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        import torchtpu.compiler.rules  # noqa: F401  (each rule module registers its rules)


class DuplicateRuleError(RuntimeError):
    pass


def _overloads(target) -> list[torch._ops.OpOverload]:
    if isinstance(target, torch._ops.OpOverloadPacket):
        return [getattr(target, name) for name in target.overloads()]
    if isinstance(target, torch._ops.OpOverload):
        return [target]
    raise TypeError(f"register a torch OpOverload or OpOverloadPacket, not {target!r}")


def op(*targets, random: bool = False) -> Callable[[Rule], Rule]:
    """Registers the decorated rule for every overload named (a packet means all of its overloads;
    a string names one overload of a library that may not be loaded, e.g.
    "transformers.grouped_mm_fallback.default").

    Registering one overload twice raises DuplicateRuleError. `random=True` marks ops that
    draw random numbers: their programs take a PRNG key as an extra input.
    """

    def register(rule: Rule) -> Rule:
        _load_rules()  # a rule registered from outside (an extension) must meet the built-in ones now
        for target in targets:
            if isinstance(target, str):
                if target in _NAMED:
                    raise DuplicateRuleError(f"{target} already has a rule ({_NAMED[target].__qualname__})")
                _NAMED[target] = rule
                continue
            for overload in _overloads(target):
                if overload in _RULES:
                    previous = _RULES[overload]
                    raise DuplicateRuleError(
                        f"{overload} already has a rule ({previous.__module__}.{previous.__qualname__}); "
                        f"{rule.__module__}.{rule.__qualname__} registers it again"
                    )
                _RULES[overload] = rule
                if random:
                    _RANDOM.add(overload)
        return rule

    return register


def lookup(target) -> Rule | None:
    _load_rules()
    rule = _RULES.get(target)
    if rule is None and isinstance(target, torch._ops.OpOverload):
        rule = _NAMED.get(str(target))
    return rule


def is_random(target) -> bool:
    _load_rules()
    return target in _RANDOM


def registered() -> dict[torch._ops.OpOverload, Rule]:
    """A copy of the registry, for tests and coverage reports."""
    _load_rules()
    return dict(_RULES)
