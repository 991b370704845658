"""Test helpers shared by every test module (one copy, imported everywhere)."""
from __future__ import annotations

import contextlib
import subprocess
import sys

import pytest
import torch
import torch._dynamo
from torch.utils import _pytree as pytree


@contextlib.contextmanager
def fresh_caches(folder):
    """What compiles inside starts from empty compile caches: the memory tier cleared, the disk tier
    at `folder`. A dump is written as a program compiles, and another test's graph can be the same
    program (a training forward whose saved inputs are the caller's tensors is its inference graph)."""
    from torchtpu.cache import tiers

    tiers.MEMORY.clear()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TORCHTPU_CACHE_DIR", str(folder))
        yield


def compile_tpu(fn, **kwargs):
    """torch.compile(fn, backend="tpu", fullgraph=True) after a Dynamo reset."""
    torch._dynamo.reset()
    kwargs.setdefault("fullgraph", True)
    return torch.compile(fn, backend="tpu", **kwargs)


def assert_close_tree(actual, expected, rtol=1.3e-4, atol=1e-4):
    """Every tensor leaf matches (dtype and shape exact, values within tolerance)."""
    act, exp = pytree.tree_leaves(actual), pytree.tree_leaves(expected)
    assert len(act) == len(exp), f"{len(act)} outputs, expected {len(exp)}"
    for a, e in zip(act, exp):
        if isinstance(e, torch.Tensor):
            assert a.dtype == e.dtype, f"dtype {a.dtype} != {e.dtype}"
            torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True)
        else:
            assert a == e, f"{a!r} != {e!r}"


def assert_matches_eager(fn, *args, rtol=1.3e-4, atol=1e-4, **compile_kwargs):
    """Compiles fn with backend="tpu" and checks its outputs against eager on `args`."""
    expected = fn(*_clone(args))
    actual = compile_tpu(fn, **compile_kwargs)(*_clone(args))
    assert_close_tree(actual, expected, rtol=rtol, atol=atol)
    return actual


def _clone(args):
    return pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, args)


def grads_of(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None}


@torch.library.custom_op("torchtpu_test::triple", mutates_args=())
def host_triple(x: torch.Tensor) -> torch.Tensor:
    """A user op with no lowering rule: it can only run on the host, between device programs."""
    return x * 3


@host_triple.register_fake
def _(x):
    return torch.empty_like(x)


def run_python(code: str, env: dict | None = None, timeout: float = 300) -> str:
    """The stdout of `python -c code` in a fresh process; fails the test with the process's
    stderr when it exits with an error."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout
