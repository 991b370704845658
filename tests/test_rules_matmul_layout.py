"""The matrix products fold an operand's transpose into lax.dot_general's dimension numbers
(compiler/rules/linalg.py, DECISIONS 72): same numbers as eager for every kind of transpose, and
no transpose between a linear layer's weight and its dot in the StableHLO we emit."""
from __future__ import annotations

import re

import pytest
import torch

from helpers import assert_matches_eager, compile_tpu


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_transposed_operands_match_eager(dtype):
    torch.manual_seed(0)
    x, w, bias = torch.randn(6, 8, dtype=dtype), torch.randn(5, 8, dtype=dtype), torch.randn(5, dtype=dtype)
    a, b = torch.randn(3, 6, 8, dtype=dtype), torch.randn(3, 5, 8, dtype=dtype)
    g, c = torch.randn(6, 5, dtype=dtype), torch.randn(3, 6, 5, dtype=dtype)

    def fn(x, w, bias, a, b, g, c):
        return (torch.mm(x, w.t()),                       # aten.t on the right
                torch.mm(g.t(), x),                       # and on the left (a weight's gradient)
                torch.addmm(bias, x, w.t()),
                torch.addmm(bias, x, w.t(), beta=0.5, alpha=2.0),
                torch.bmm(a, b.transpose(1, 2)),          # transpose.int of the last two dims
                torch.bmm(b.permute(0, 2, 1).transpose(1, 2), b.permute(0, 2, 1)),
                torch.baddbmm(c, a, b.mT),
                torch.nn.functional.linear(a, w, bias))  # a 3-d input: view + t + addmm

    tol = dict(rtol=1.3e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
    assert_matches_eager(fn, x, w, bias, a, b, g, c, **tol)


def test_a_transpose_of_other_dims_is_not_folded():
    torch.manual_seed(0)
    a, b = torch.randn(4, 3, 5), torch.randn(3, 4, 5)
    assert_matches_eager(lambda a, b: torch.bmm(a, b.transpose(0, 1).transpose(1, 2)), a, b)


def test_a_linear_layers_weight_reaches_its_dot_untransposed(tmp_path):
    layer = torch.nn.Linear(16, 8).to(torch.bfloat16)
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    out = compile_tpu(layer, options={"dump_dir": str(tmp_path)})(x)
    torch.testing.assert_close(out, layer(x), rtol=1.6e-2, atol=1e-2)
    text = "\n".join(p.read_text() for p in tmp_path.glob("*.stablehlo.mlir"))
    dots = re.findall(r"stablehlo\.dot_general ([^,]+), ([^,]+), contracting_dims = \[(\d)\] x \[(\d)\]", text)
    assert dots, text[-2000:]
    for lhs, rhs, lc, rc in dots:
        assert (lc, rc) == ("1", "1"), dots  # the weight, [8, 16], contracted on its own last dim
        producer = re.search(rf"{re.escape(rhs)} = ([\w.]+)", text)
        assert producer is None or "transpose" not in producer.group(1), producer.group(0)
