"""The benchmark suite's model families at benchmark scale (random weights, no downloads).

Each builder returns (model in eval mode, positional inputs). Models whose forward takes
several named inputs are wrapped in `Positional`, so that every cell calls `model(*inputs)`.
The configs follow the coverage suite's zoo (tests/model_zoo.py) with wider layers (hidden
128, 2 layers): big enough that the steady state is compute, small enough for a 2-core machine.
"""
from __future__ import annotations

import torch
from torch import nn

VOCAB = 1024
HIDDEN = 128
_TEXT = dict(hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2, num_attention_heads=4,
             vocab_size=VOCAB)
_GQA = dict(_TEXT, num_key_value_heads=2, max_position_embeddings=512, attn_implementation="sdpa",
            use_cache=False)
_NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


class Positional(nn.Module):
    """model(**dict(zip(names, args))) as model(*args); extra keyword inputs are fixed buffers."""

    def __init__(self, model: nn.Module, names: tuple[str, ...], **fixed: torch.Tensor):
        super().__init__()
        self.model, self.names = model, names
        self.config = getattr(model, "config", None)
        for key, value in fixed.items():
            self.register_buffer(f"fixed_{key}", value, persistent=False)
        self.fixed = tuple(fixed)

    def forward(self, *args):
        kwargs = dict(zip(self.names, args))
        kwargs.update({key: getattr(self, f"fixed_{key}") for key in self.fixed})
        return self.model(**kwargs)


def _tf(config_cls: str, model_cls: str, **config) -> nn.Module:
    import transformers

    return getattr(transformers, model_cls)(getattr(transformers, config_cls)(**config)).eval()


def _tokens(batch: int, length: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length))


def hf_mistral(batch=8, size=128):
    """Sliding-window decoder (window shorter than the sequence: the banded mask)."""
    return _tf("MistralConfig", "MistralForCausalLM", **_GQA, sliding_window=size // 2), (_tokens(batch, size),)


def hf_qwen2_moe(batch=8, size=128):
    """Mixture-of-experts decoder: 4 experts, 2 per token, a shared expert."""
    model = _tf("Qwen2MoeConfig", "Qwen2MoeForCausalLM", **_GQA, num_experts=4, num_experts_per_tok=2,
                moe_intermediate_size=HIDDEN, shared_expert_intermediate_size=HIDDEN)
    return model, (_tokens(batch, size),)


def hf_t5(batch=8, size=128):
    """Encoder-decoder: relative position buckets, cross attention (decoder half the length)."""
    model = _tf("T5Config", "T5Model", d_model=HIDDEN, d_ff=2 * HIDDEN, d_kv=32, num_layers=2, num_heads=4,
                vocab_size=VOCAB, dropout_rate=0.0)
    return Positional(model, ("input_ids", "decoder_input_ids")).eval(), (_tokens(batch, size),
                                                                          _tokens(batch, size // 2))


def hf_vit(batch=8, size=64):
    """Vision transformer: 8x8 patches of a size x size image."""
    model = _tf("ViTConfig", "ViTModel", **dict(_TEXT, vocab_size=None), **_NO_DROPOUT, image_size=size,
                patch_size=8)
    return model, (torch.randn(batch, 3, size, size),)


def hf_resnet(batch=8, size=64):
    """A residual CNN with BatchNorm (transformers' ResNet: basic blocks)."""
    model = _tf("ResNetConfig", "ResNetModel", embedding_size=32, hidden_sizes=[32, 64, 128], depths=[1, 1, 1],
                layer_type="basic")
    return model, (torch.randn(batch, 3, size, size),)


def dit(batch=8, size=16):
    """Diffusion transformer (diffusers' DiT) on a 4-channel size x size latent, fixed timesteps and labels."""
    import diffusers

    model = diffusers.DiTTransformer2DModel(num_attention_heads=4, attention_head_dim=32, in_channels=4,
                                            num_layers=2, sample_size=size, patch_size=2, num_embeds_ada_norm=10,
                                            norm_num_groups=4)
    for module in model.modules():  # no random label dropout: every backend sees the same labels
        if hasattr(module, "dropout_prob") and hasattr(module, "token_drop"):
            module.dropout_prob = 0.0
    wrapped = Positional(model, ("hidden_states",), timestep=torch.randint(0, 1000, (batch,)),
                         class_labels=torch.randint(0, 10, (batch,)))
    return wrapped.eval(), (torch.randn(batch, 4, size, size),)


def unet(batch=8, size=16):
    """Diffusers' conditional UNet: ResNet blocks, GroupNorm, cross attention, up and down sampling."""
    import diffusers

    model = diffusers.UNet2DConditionModel(sample_size=size, in_channels=4, out_channels=4,
                                           block_out_channels=(32, 64), layers_per_block=1,
                                           down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                           up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
                                           cross_attention_dim=64, attention_head_dim=8, norm_num_groups=8)
    wrapped = Positional(model, ("sample",), timestep=torch.randint(0, 1000, (batch,)),
                         encoder_hidden_states=torch.randn(batch, 8, 64))
    return wrapped.eval(), (torch.randn(batch, 4, size, size),)


# name -> (builder, family); the suite's three original models are in benchmarks/run.py's build
FAMILIES = {
    "hf_mistral": (hf_mistral, "decoder, sliding window"),
    "hf_qwen2_moe": (hf_qwen2_moe, "decoder, mixture of experts"),
    "hf_t5": (hf_t5, "encoder-decoder"),
    "hf_vit": (hf_vit, "vision transformer"),
    "hf_resnet": (hf_resnet, "CNN, residual"),
    "dit": (dit, "diffusion transformer"),
    "unet": (unet, "diffusion UNet"),
}
