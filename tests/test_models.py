"""End-to-end model tests: forward and parameter gradients match eager, fullgraph=True."""
from __future__ import annotations

import copy

import pytest
import torch

from benchmarks import models
from helpers import assert_close_tree, compile_tpu, grads_of


def _forward_backward(model, *inputs, loss=lambda out: out.float().pow(2).mean()):
    out = model(*inputs)
    out = out[0] if isinstance(out, tuple) else out
    out = getattr(out, "logits", getattr(out, "last_hidden_state", out))
    loss(out).backward()
    return out.detach()


def check_train_step(model, *inputs, rtol=1e-4, atol=1e-5):
    """Forward output and every parameter gradient of the compiled model match eager."""
    eager = model
    compiled_src = copy.deepcopy(model)
    compiled = compile_tpu(compiled_src)
    expected = _forward_backward(eager, *inputs)
    actual = _forward_backward(compiled, *inputs)
    assert_close_tree(actual, expected, rtol=rtol, atol=atol)
    g_eager, g_compiled = grads_of(eager), grads_of(compiled_src)
    assert g_eager and set(g_eager) <= set(g_compiled)
    # Parameters the loss does not reach: None in eager, zeros under torch.compile (as AOTAutograd
    # differentiates every output of the graph).
    for name in set(g_compiled) - set(g_eager):
        assert not g_compiled[name].any(), name
    for name in g_eager:
        torch.testing.assert_close(g_compiled[name], g_eager[name], rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")
    return compiled_src


def check_inference(model, *inputs, rtol=1e-4, atol=1e-5):
    with torch.no_grad():
        expected = model(*inputs)
        actual = compile_tpu(model)(*inputs)
    assert_close_tree(actual, expected, rtol=rtol, atol=atol)


def test_mlp():
    torch.manual_seed(0)
    model = models.MLP()
    x = torch.randn(8, 32)
    check_inference(model, x)
    check_train_step(model, x)


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_cnn(train):
    torch.manual_seed(0)
    model = models.CNN().train(train)
    x = torch.randn(4, 3, 16, 16)
    if not train:
        # give the running statistics non-trivial values first
        model.train()(torch.randn(4, 3, 16, 16))
        model.eval()
        check_inference(model, x)
        check_train_step(model, x)
        return
    compiled_model = check_train_step(model, x)
    # BatchNorm running stats are updated in train mode, identically to eager.
    for (name, b_eager), (_, b_comp) in zip(model.named_buffers(), compiled_model.named_buffers()):
        torch.testing.assert_close(b_comp, b_eager, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")


def test_transformer_decoder():
    torch.manual_seed(0)
    model = models.TinyDecoder()
    idx = torch.randint(0, 128, (2, 24))
    check_inference(model.eval(), idx)
    check_train_step(model, idx)


def test_hf_llama_decoder():
    torch.manual_seed(0)
    model = models.hf_llama()
    ids = torch.randint(0, 256, (2, 16))
    check_inference(model, ids)
    check_train_step(model, ids)


def test_hf_bert_encoder():
    torch.manual_seed(0)
    model = models.hf_bert()
    ids = torch.randint(0, 256, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 10:] = 0
    check_inference(model, ids, mask)
    check_train_step(model, ids, mask)


def test_adamw_training_curve_matches_eager():
    """20 AdamW steps: the compiled loss curve matches eager within 1e-4 relative at every step."""
    torch.manual_seed(0)
    eager = models.TinyDecoder()
    compiled_model = copy.deepcopy(eager)
    compiled = compile_tpu(compiled_model)
    data = torch.randint(0, 128, (4, 17))
    inputs, targets = data[:, :-1], data[:, 1:]

    def run(model, fn):
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        losses = []
        for _ in range(20):
            opt.zero_grad()
            logits = fn(inputs)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 128), targets.reshape(-1))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    expected = run(eager, eager)
    actual = run(compiled_model, compiled)
    assert expected[-1] < expected[0]  # it trains
    for step, (a, e) in enumerate(zip(actual, expected)):
        assert abs(a - e) <= 1e-4 * abs(e), f"step {step}: compiled loss {a} vs eager {e}"
