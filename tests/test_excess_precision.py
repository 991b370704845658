"""A chain of bfloat16/float16 pointwise ops keeps float32 between its ops and rounds where a value
is stored (compiler/lower.py, option excess_precision, DECISIONS 80); excess_precision=False rounds
every op as eager does, bit for bit."""
from __future__ import annotations

import pytest
import torch

from helpers import compile_tpu
from torchtpu.options import Options


def _chain(x, y):
    for _ in range(8):
        x = (x + y) * 0.5 - 0.25
    return x


def _in_float32(fn, *args, dtype):
    return fn(*(a.float() for a in args)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_pointwise_chain_rounds_once(dtype):
    torch.manual_seed(0)
    x, y = torch.randn(64, 32).to(dtype), torch.randn(64, 32).to(dtype)
    out = compile_tpu(_chain)(x, y)
    assert out.dtype == dtype
    once = _in_float32(_chain, x, y, dtype=dtype)  # float32 throughout, one rounding at the end
    torch.testing.assert_close(out, once, rtol=0, atol=0)
    eager = _chain(x, y)  # rounds after each op
    assert not torch.equal(eager, once), "the sample must tell the two roundings apart"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_excess_precision_off_gives_eagers_bits(dtype):
    torch.manual_seed(0)
    x, y = torch.randn(64, 32).to(dtype), torch.randn(64, 32).to(dtype)
    out = compile_tpu(_chain, options={"excess_precision": False})(x, y)
    assert torch.equal(out, _chain(x, y))


def test_a_value_stored_or_cast_is_rounded():
    """A value read twice, returned, or cast explicitly is rounded, as eager
    rounds it; only a value with one pointwise reader stays float32."""
    torch.manual_seed(0)
    x, y = torch.randn(64, 32).to(torch.bfloat16), torch.randn(64, 32).to(torch.bfloat16)

    def fn(x, y):
        s = x * y                                          # two readers: stored, rounded
        t = (s + x) * (s - y)                              # s + x and s - y: one reader each
        cast = ((x + y).float() * 3.0).to(torch.bfloat16)  # the user's cast rounds x + y first
        mid = x / y                                        # returned and read again
        return t, cast, mid, mid + 1.0

    t, *rest = compile_tpu(fn)(x, y)
    _, *eager = fn(x, y)
    for got, want in zip(rest, eager):
        assert torch.equal(got, want)
    s = x * y
    assert torch.equal(t, ((s.float() + x.float()) * (s.float() - y.float())).to(torch.bfloat16))


def test_the_option_is_validated_and_keyed():
    assert Options.parse({}).excess_precision is True
    assert Options.parse({}).key_items() != Options.parse({"excess_precision": False}).key_items()
    with pytest.raises(ValueError, match="excess_precision"):
        Options.parse({"excess_precision": "yes"})


def test_a_defer_mode_chain_rounds_once():
    """The eager device's defer mode compiles a pending graph through the same lowering."""
    import torchtpu
    import torchtpu.device  # noqa: F401

    torch.manual_seed(0)
    x, y = torch.randn(64, 32).to(torch.bfloat16), torch.randn(64, 32).to(torch.bfloat16)
    with torchtpu.eager_mode("defer"):
        out = _chain(x.to("tpu"), y.to("tpu")).cpu()
    torch.testing.assert_close(out, _in_float32(_chain, x, y, dtype=torch.bfloat16), rtol=0, atol=0)
    with torchtpu.eager_mode("strict"):
        strict = _chain(x.to("tpu"), y.to("tpu")).cpu()
    assert torch.equal(strict, _chain(x, y)), "strict mode runs one op a program: eager's bits"
