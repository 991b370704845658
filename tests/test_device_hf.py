"""Hugging Face and diffusers on the eager tpu device, against the CPU: a tiny Llama moved with
`.to("tpu")` (logits, greedy generate), loaded with `device_map="tpu"`, trained with AdamW,
compiled with backend="tpu", and decoding through generate()'s own compile of a static cache;
a tiny diffusers DDPM pipeline moved with `pipe.to("tpu")`.

Every model here has the same config and prompt shape, so the per-op programs one test compiles
serve the next (the file's cost is mostly compiling them once).
"""
from __future__ import annotations

import copy

import pytest
import torch

import torchtpu
import torchtpu.device

pytest.importorskip("transformers", reason="the Hugging Face flows need transformers")

TPU = "tpu"
VOCAB, PROMPT, NEW_TOKENS = 128, 6, 3


def _count(name: str) -> int:
    return torchtpu.stats().get(name, 0)


def _llama(cache: str | None = None):
    """The tiny Llama (2 layers, hidden 32, grouped-query attention), with its KV cache on."""
    from benchmarks.models import hf_llama

    torch.manual_seed(0)
    model = hf_llama(layers=2, vocab=VOCAB, hidden=32, heads=4, kv_heads=2)
    model.config.use_cache = model.generation_config.use_cache = True
    model.generation_config.cache_implementation = cache
    return model


def _relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    assert got.device.type == TPU and got.shape == expected.shape
    return ((got.cpu() - expected).abs().max() / expected.abs().max()).item()


class _Steps:
    """A stopping criterion that never stops and notes torchtpu's counters after every token."""

    def __init__(self):
        self.counts: list[tuple[int, int]] = []

    def __call__(self, input_ids, scores, **kwargs):
        self.counts.append((_count("eager_programs"), _count("dynamo_graphs")))
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def _generate(model, ids, steps: _Steps | None = None, new_tokens: int = NEW_TOKENS):
    from transformers import StoppingCriteriaList

    criteria = StoppingCriteriaList([steps] if steps else [])
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                              stopping_criteria=criteria)


@pytest.fixture(scope="module")
def cpu_llama():
    """The CPU model, a prompt, the CPU's logits and greedy tokens for it."""
    model = _llama()
    ids = torch.randint(0, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(ids).logits
    return model, ids, logits, _generate(model, ids)


def test_llama_to_tpu_logits_and_greedy_tokens_match_cpu(cpu_llama):
    cpu, ids, expected, tokens = cpu_llama
    model = copy.deepcopy(cpu).to(TPU)
    with torch.no_grad():
        logits = model(ids.to(TPU)).logits
    assert _relative_error(logits, expected) < 1e-4
    got = _generate(model, ids.to(TPU))
    assert got.device.type == TPU and torch.equal(got.cpu(), tokens)
    programs = _count("eager_programs")
    assert torch.equal(_generate(model, ids.to(TPU)).cpu(), tokens)
    assert _count("eager_programs") == programs  # the same lengths again: every program is kept


def test_from_pretrained_with_device_map_tpu(cpu_llama, tmp_path):
    from transformers import AutoModelForCausalLM

    cpu, ids, expected, _ = cpu_llama
    cpu.save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, device_map=TPU)
    tensors = dict(model.named_parameters()) | dict(model.named_buffers())
    assert tensors and {t.device for t in tensors.values()} == {torch.device("tpu:0")}
    loaded = model.state_dict()
    for name, value in cpu.state_dict().items():
        assert torch.equal(loaded[name].cpu(), value), name
    with torch.no_grad():
        logits = model(ids.to(TPU)).logits
    assert _relative_error(logits, expected) < 1e-4



def test_accelerate_dispatch_takes_the_name_or_a_device_index(cpu_llama, tmp_path):
    """accelerate's load_checkpoint_and_dispatch reads the file with safetensors' load_file(device=...).
    Older safetensors builds parsed a fixed list of names (cpu, cuda, mps, npu, xpu, xla, mlu, musa,
    hpu) and refused "tpu" with that one error; the current one (0.8.0 here) takes it. A device
    index passes either, and torch reads index 0 as the current accelerator, tpu:0."""
    import accelerate
    from safetensors import SafetensorError
    from transformers import AutoConfig, AutoModelForCausalLM

    cpu, ids, expected, _ = cpu_llama
    cpu.save_pretrained(tmp_path)

    def empty_model():
        with accelerate.init_empty_weights():
            return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path))

    for device_map in ({"": TPU}, {"": 0}):
        try:
            model = accelerate.load_checkpoint_and_dispatch(empty_model(), str(tmp_path), device_map=device_map)
        except SafetensorError as exc:  # an older safetensors: only the name, and only this error
            assert device_map == {"": TPU} and "device tpu is invalid" in str(exc), exc
            continue
        tensors = list(model.parameters()) + list(model.buffers())
        assert {t.device for t in tensors} == {torch.device("tpu:0")}, device_map
        with torch.no_grad():
            logits = model(ids.to(TPU)).logits
        assert _relative_error(logits, expected) < 1e-4, device_map


def _training_pair():
    """The tiny Llama in training mode on the CPU and a copy on the device, each with its device."""
    cpu = _llama().train()
    dev = copy.deepcopy(cpu).to(TPU)
    return cpu, dev, [(cpu, torch.device("cpu")), (dev, next(dev.parameters()).device)]


def test_adamw_training_steps_match_cpu(cpu_llama):
    _, ids, _, _ = cpu_llama
    cpu, dev, pair = _training_pair()
    losses = {}
    for model, on in pair:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(3):
            optimizer.zero_grad()
            loss = model(ids.to(on), labels=ids.to(on), use_cache=False).loss
            loss.backward()
            optimizer.step()
            losses.setdefault(on.type, []).append(loss.item())
    torch.testing.assert_close(losses[TPU], losses["cpu"], atol=1e-4, rtol=0)
    assert losses["cpu"][-1] < losses["cpu"][0]  # the steps trained something
    for (name, p), q in zip(dev.named_parameters(), cpu.parameters()):
        assert p.device.type == TPU
        torch.testing.assert_close(p.detach().cpu(), q.detach(), atol=1e-4, rtol=1e-4, msg=name)


def test_autocast_bfloat16_forward_and_backward_match_the_cpus_autocast(cpu_llama):
    _, ids, _, _ = cpu_llama
    cpu, dev, pair = _training_pair()
    outs = {}
    for model, on in pair:
        with torch.autocast(on.type, dtype=torch.bfloat16):
            out = model(ids.to(on), labels=ids.to(on), use_cache=False)
        out.loss.backward()
        outs[on.type] = out
    assert outs[TPU].logits.dtype == outs["cpu"].logits.dtype == torch.bfloat16
    assert outs[TPU].loss.item() == pytest.approx(outs["cpu"].loss.item(), rel=1e-3)
    assert _relative_error(outs[TPU].logits.float(), outs["cpu"].logits.float()) < 2e-2  # bf16 steps
    for (name, p), q in zip(dev.named_parameters(), cpu.parameters()):
        assert p.grad.dtype == torch.float32, name
        assert _relative_error(p.grad, q.grad) < 5e-2, name


def test_compiled_model_on_tpu_matches_cpu(cpu_llama):
    from helpers import compile_tpu

    cpu, ids, expected, _ = cpu_llama
    model = copy.deepcopy(cpu).to(TPU)
    compiled = compile_tpu(model)
    dev_ids = ids.to(TPU)
    with torch.no_grad():
        compiled(dev_ids, use_cache=False)
        programs, moved = _count("eager_programs"), _count("eager_uploads") + _count("eager_downloads")
        logits = compiled(dev_ids, use_cache=False).logits
    assert _relative_error(logits, expected) < 1e-4
    # the second call is the compiled program alone: no per-op program, no host copy
    assert _count("eager_programs") == programs
    assert _count("eager_uploads") + _count("eager_downloads") == moved + 1  # the download of the logits


def test_generate_compiles_static_cache_decoding_with_backend_tpu(cpu_llama):
    """transformers (5.x) compiles the decode step itself for a static cache on a device of type
    "tpu": `torch.compile(model.__call__, backend="tpu", dynamic=False, mode="default")`."""
    cpu, ids, _, _ = cpu_llama
    cpu = copy.deepcopy(cpu)
    cpu.generation_config.cache_implementation = "static"
    tokens = _generate(cpu, ids, new_tokens=NEW_TOKENS + 1)  # the CPU does not compile: eager, same cache
    model = copy.deepcopy(cpu).to(TPU)
    steps = _Steps()
    graphs = _count("dynamo_graphs")
    got = _generate(model, ids.to(TPU), steps, new_tokens=NEW_TOKENS + 1)
    assert torch.equal(got.cpu(), tokens)
    (_, first), *later = steps.counts[1:]  # after the first decode step
    assert first > graphs  # the decode step ran as a graph of the tpu backend
    assert all(g == first for _, g in later)  # and every later token reuses it


def test_diffusers_ddpm_pipeline_matches_cpu():
    """A tiny DDPM pipeline (UNet2DModel with attention blocks), 2 steps. The noise comes from a
    CPU generator, which diffusers draws on the CPU and moves to the device: both pipelines see
    the same noise. Tolerance: the UNet's outputs agree to a few float32 ulps; the first DDPM step
    (t=999) divides by sqrt(alphas_cumprod) ≈ 6e-3 before clipping, which scales that error by
    ≈160, so 1e-4 on pixels in [0, 1]."""
    diffusers = pytest.importorskip("diffusers", reason="the pipeline test needs diffusers")

    torch.manual_seed(0)
    unet = diffusers.UNet2DModel(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1,
                                 block_out_channels=(32, 64), down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                                 up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8,
                                 attention_head_dim=8).eval()
    pipes = [diffusers.DDPMPipeline(unet=copy.deepcopy(unet), scheduler=diffusers.DDPMScheduler())
             for _ in range(2)]
    pipes[1].to(TPU)
    assert pipes[1].device.type == TPU
    images = []
    for pipe in pipes:
        pipe.set_progress_bar_config(disable=True)
        out = pipe(batch_size=1, num_inference_steps=2, generator=torch.Generator().manual_seed(0),
                   output_type="pt", return_dict=False)[0]
        images.append(out)
    expected, got = images
    assert got.device.type == TPU and 0 < expected.std()
    torch.testing.assert_close(got.cpu(), expected, atol=1e-4, rtol=0)
