"""The model zoo of the coverage suite: public architectures built from tiny configs.

Every entry builds a model with random weights from a config (nothing is downloaded) and
makes its inputs. Families: transformers decoder LMs (dense, MoE, sliding window, soft-capped),
encoders, encoder-decoders, speech, vision, multimodal and state-space models; diffusers (a
transformer, a UNet, a VAE); and hand-written models for families none of those cover.
timm is not here: its layers import torchvision, whose only wheel for this torch is a CUDA
build that breaks transformers' imports (see docs/coverage.md); transformers' own CNNs
(ResNet, RegNet, ConvNeXt, MobileNet) cover those families.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch
from torch import nn

VOCAB = 128
TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            vocab_size=VOCAB)
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    family: str
    build: Callable[[], nn.Module]
    inputs: Callable[[torch.Generator, int, int], dict]  # (generator, batch, length) -> kwargs
    text: bool = False  # takes (batch, length) token ids: the bucketing column applies
    length: int = 12    # the sequence length of the conformance inputs
    dynamo_config: tuple = ()  # torch._dynamo.config settings the model needs, as (name, value)
    prepare: Callable[[nn.Module], None] | None = None  # after build: what a user's setup does
    max_length: int | None = None  # the longest input the shapes mode draws (default: 512)
    unrolled: bool = False  # one graph per length by construction: shapes mode only in `make coverage`


def tokens(g, batch, length):
    return {"input_ids": torch.randint(0, VOCAB, (batch, length), generator=g)}


def _tf(config_cls: str, model_cls: str, **config):
    def build():
        import transformers

        cfg = getattr(transformers, config_cls)(**config)
        return getattr(transformers, model_cls)(cfg)
    return build


def _decoder(name, family, config_cls, model_cls="AutoModelForCausalLM", **config):
    def build():
        import transformers

        cfg = getattr(transformers, config_cls)(**config)
        cls = getattr(transformers, model_cls)
        return cls.from_config(cfg) if model_cls.startswith("Auto") else cls(cfg)
    return Entry(name, family, build, tokens, text=True)


_GQA = dict(TINY, num_key_value_heads=2, head_dim=8, max_position_embeddings=512)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)


def _images(channels=3, size=32):
    return lambda g, batch, _length: {"pixel_values": torch.randn(batch, channels, size, size, generator=g)}


def _seq2seq(g, batch, length):
    return {"input_ids": torch.randint(0, VOCAB, (batch, length), generator=g),
            "decoder_input_ids": torch.randint(0, VOCAB, (batch, max(length // 2, 1)), generator=g)}


def _audio(g, batch, _length):
    return {"input_values": torch.randn(batch, 1600, generator=g)}


def _whisper(g, batch, length):
    return {"input_features": torch.randn(batch, 16, 64, generator=g),
            "decoder_input_ids": torch.randint(0, VOCAB, (batch, length), generator=g)}


def _clip(g, batch, length):
    return {"input_ids": torch.randint(0, VOCAB, (batch, length), generator=g),
            "pixel_values": torch.randn(batch, 3, 32, 32, generator=g)}


def _diffusers(cls_name, **config):
    def build():
        import diffusers

        return getattr(diffusers, cls_name)(**config)
    return build


def _no_label_dropout(model):
    """DiT drops class labels at random in training (classifier-free guidance): off, so that
    eager and compiled see the same labels."""
    for module in model.modules():
        if hasattr(module, "dropout_prob") and hasattr(module, "token_drop"):
            module.dropout_prob = 0.0


def _freeze_feature_encoder(model):
    """What speech fine-tuning recipes do; also what fullgraph needs in training, since the
    encoder otherwise sets `hidden_states.requires_grad = True`, which Dynamo cannot trace."""
    model.freeze_feature_encoder()


def _dit_inputs(g, batch, _length):
    return {"hidden_states": torch.randn(batch, 4, 8, 8, generator=g),
            "timestep": torch.randint(0, 1000, (batch,), generator=g),
            "class_labels": torch.randint(0, 10, (batch,), generator=g)}


def _unet_inputs(g, batch, _length):
    return {"sample": torch.randn(batch, 4, 16, 16, generator=g),
            "timestep": torch.randint(0, 1000, (batch,), generator=g),
            "encoder_hidden_states": torch.randn(batch, 6, 32, generator=g)}


def _vae_inputs(g, batch, _length):
    return {"sample": torch.randn(batch, 3, 16, 16, generator=g)}


class RegNetStyle(nn.Module):
    """Grouped 3x3 convolutions between 1x1s, BatchNorm, a strided shortcut (torchvision's
    regnet_x block, written out: torchvision is not installed)."""

    def __init__(self, width=16, group_width=8, classes=10):
        super().__init__()

        def cbr(cin, cout, k, stride=1, groups=1, relu=True):
            layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
            return nn.Sequential(*layers, *([nn.ReLU()] if relu else []))

        self.stem = cbr(3, width, 3, stride=2)
        self.block = nn.Sequential(cbr(width, 2 * width, 1), cbr(2 * width, 2 * width, 3, 2, 2 * width // group_width),
                                   cbr(2 * width, 2 * width, 1, relu=False))
        self.shortcut = cbr(width, 2 * width, 1, stride=2, relu=False)
        self.head = nn.Linear(2 * width, classes)

    def forward(self, pixel_values):
        x = self.stem(pixel_values)
        x = torch.relu(self.block(x) + self.shortcut(x))
        return self.head(x.mean((2, 3)))


class MixerStyle(nn.Module):
    """MLP-Mixer: token-mixing and channel-mixing MLPs over image patches, LayerNorm, GELU."""

    def __init__(self, patch=8, dim=32, depth=2, classes=10, size=32):
        super().__init__()
        tokens_ = (size // patch) ** 2
        self.embed = nn.Conv2d(3, dim, patch, patch)
        self.layers = nn.ModuleList(nn.ModuleList([
            nn.LayerNorm(dim), nn.Sequential(nn.Linear(tokens_, 2 * tokens_), nn.GELU(), nn.Linear(2 * tokens_, tokens_)),
            nn.LayerNorm(dim), nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim)),
        ]) for _ in range(depth))
        self.head = nn.Linear(dim, classes)

    def forward(self, pixel_values):
        x = self.embed(pixel_values).flatten(2).transpose(1, 2)
        for norm1, tokens_mlp, norm2, channels_mlp in self.layers:
            x = x + tokens_mlp(norm1(x).transpose(1, 2)).transpose(1, 2)
            x = x + channels_mlp(norm2(x))
        return self.head(x.mean(1))


class GRUTagger(nn.Module):
    """A recurrent tagger: embedding, a 2-layer GRU, a linear head (the RNN family)."""

    def __init__(self, dim=32):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.rnn = nn.GRU(dim, dim, num_layers=2, batch_first=True)
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, input_ids):
        return self.head(self.rnn(self.embed(input_ids))[0])


ZOO: list[Entry] = [
    # decoder LMs, dense
    _decoder("llama", "decoder", "LlamaConfig", **_GQA),
    _decoder("qwen2", "decoder", "Qwen2Config", **_GQA),
    _decoder("qwen3", "decoder", "Qwen3Config", **_GQA),
    _decoder("mistral", "decoder-sliding", "MistralConfig", **_GQA, sliding_window=8),
    _decoder("phi3", "decoder-fused-qkv", "Phi3Config", **dict(_GQA, pad_token_id=0)),
    _decoder("gpt_neox", "decoder-fused-qkv", "GPTNeoXConfig", **dict(TINY, max_position_embeddings=512)),
    _decoder("falcon", "decoder", "FalconConfig", hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             vocab_size=VOCAB),
    _decoder("opt", "decoder", "OPTConfig", hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
             vocab_size=VOCAB, word_embed_proj_dim=32, max_position_embeddings=512, dropout=0.0),
    _decoder("bloom", "decoder-alibi", "BloomConfig", hidden_size=32, n_layer=2, n_head=4, vocab_size=VOCAB),
    _decoder("gpt2", "decoder", "GPT2Config", n_embd=32, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=512,
             resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    _decoder("gemma", "decoder", "GemmaConfig", **_GQA),
    _decoder("gemma2", "decoder-softcap", "Gemma2Config", **_GQA, sliding_window=8),
    _decoder("gemma3", "decoder-softcap", "Gemma3TextConfig", **_GQA, sliding_window=8),
    # decoder LMs, mixture of experts
    _decoder("qwen2_moe", "decoder-moe", "Qwen2MoeConfig", **_GQA, **_MOE, shared_expert_intermediate_size=32),
    _decoder("qwen3_moe", "decoder-moe", "Qwen3MoeConfig", **_GQA, **_MOE),
    _decoder("mixtral", "decoder-moe", "MixtralConfig", **_GQA, num_local_experts=4, num_experts_per_tok=2),
    # state space
    # Mamba's reference path loops over the sequence in Python: each length is its own (unrolled) graph
    dataclasses.replace(_decoder("mamba", "ssm", "MambaConfig", hidden_size=32, state_size=8, num_hidden_layers=2,
                                 vocab_size=VOCAB), max_length=32, unrolled=True),
    # encoders
    _decoder("bert", "encoder", "BertConfig", "BertModel", **TINY, **NO_DROPOUT),
    _decoder("roberta", "encoder", "RobertaConfig", "RobertaModel", **TINY, **NO_DROPOUT, pad_token_id=1),
    _decoder("distilbert", "encoder", "DistilBertConfig", "DistilBertModel", dim=32, hidden_dim=64, n_layers=2,
             n_heads=4, vocab_size=VOCAB, dropout=0.0, attention_dropout=0.0),
    _decoder("albert", "encoder", "AlbertConfig", "AlbertModel", **TINY, embedding_size=16, hidden_dropout_prob=0.0,
             attention_probs_dropout_prob=0.0),
    _decoder("electra", "encoder", "ElectraConfig", "ElectraModel", **TINY, **NO_DROPOUT, embedding_size=16),
    _decoder("deberta_v2", "encoder-relative", "DebertaV2Config", "DebertaV2Model", **TINY, **NO_DROPOUT),
    # encoder-decoders
    Entry("t5", "encoder-decoder", _tf("T5Config", "T5Model", d_model=32, d_ff=64, d_kv=8, num_layers=2,
                                       num_heads=4, vocab_size=VOCAB, dropout_rate=0.0), _seq2seq),
    Entry("bart", "encoder-decoder", _tf("BartConfig", "BartModel", d_model=32, encoder_layers=2, decoder_layers=2,
                                         encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                         decoder_ffn_dim=64, vocab_size=VOCAB, dropout=0.0,
                                         max_position_embeddings=512), _seq2seq),
    # speech
    Entry("wav2vec2", "speech", _tf("Wav2Vec2Config", "Wav2Vec2Model", hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 4),
                                    conv_kernel=(10, 4), num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=4,
                                    hidden_dropout=0.0, attention_dropout=0.0, feat_proj_dropout=0.0,
                                    mask_time_prob=0.0, layerdrop=0.0), _audio, prepare=_freeze_feature_encoder),
    Entry("whisper", "speech", _tf("WhisperConfig", "WhisperModel", d_model=32, encoder_layers=2, decoder_layers=2,
                                   encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                   decoder_ffn_dim=64, vocab_size=VOCAB, num_mel_bins=16, max_source_positions=32,
                                   max_target_positions=64, dropout=0.0, pad_token_id=0, bos_token_id=1,
                                   eos_token_id=2, decoder_start_token_id=1), _whisper),
    # vision
    Entry("vit", "vision-transformer", _tf("ViTConfig", "ViTModel", **dict(TINY, vocab_size=None), **NO_DROPOUT,
                                           image_size=32, patch_size=8), _images()),
    Entry("resnet", "cnn", _tf("ResNetConfig", "ResNetModel", embedding_size=16, hidden_sizes=[16, 32],
                               depths=[1, 1], layer_type="basic"), _images()),
    Entry("regnet", "cnn-grouped", _tf("RegNetConfig", "RegNetModel", embedding_size=16, hidden_sizes=[16, 32],
                                       depths=[1, 1], groups_width=8), _images()),
    Entry("convnext", "cnn-depthwise", _tf("ConvNextConfig", "ConvNextModel", hidden_sizes=[16, 32], depths=[1, 1],
                                           num_stages=2, patch_size=2), _images()),
    Entry("mobilenet_v2", "cnn-depthwise", _tf("MobileNetV2Config", "MobileNetV2Model", depth_multiplier=0.25,
                                               image_size=32), _images()),
    Entry("swin", "vision-transformer", _tf("SwinConfig", "SwinModel", image_size=32, patch_size=4, embed_dim=16,
                                            depths=[1, 1], num_heads=[2, 4], window_size=4,
                                            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                            drop_path_rate=0.0), _images()),
    # multimodal
    Entry("clip", "multimodal", _tf("CLIPConfig", "CLIPModel",
                                    text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                     num_attention_heads=4, vocab_size=VOCAB),
                                    vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                       num_attention_heads=4, image_size=32, patch_size=8),
                                    projection_dim=16), _clip),
    # diffusers
    Entry("dit", "diffusion-transformer", _diffusers("DiTTransformer2DModel", num_attention_heads=2,
                                                     attention_head_dim=16, in_channels=4, num_layers=2,
                                                     sample_size=8, patch_size=2, num_embeds_ada_norm=10,
                                                     norm_num_groups=4), _dit_inputs,
          prepare=_no_label_dropout),
    Entry("unet2d_cond", "diffusion-unet", _diffusers("UNet2DConditionModel", sample_size=16, in_channels=4,
                                                      out_channels=4, block_out_channels=(16, 32), layers_per_block=1,
                                                      down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                                      up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
                                                      cross_attention_dim=32, attention_head_dim=8,
                                                      norm_num_groups=8), _unet_inputs),
    Entry("vae", "diffusion-vae", _diffusers("AutoencoderKL", in_channels=3, out_channels=3, latent_channels=4,
                                             block_out_channels=(16, 32), layers_per_block=1, norm_num_groups=8,
                                             down_block_types=("DownEncoderBlock2D",) * 2,
                                             up_block_types=("UpDecoderBlock2D",) * 2), _vae_inputs),
    # hand-written
    Entry("regnet_style", "cnn-grouped", RegNetStyle, _images()),
    Entry("mixer", "mlp", MixerStyle, _images()),
    # nn.GRU decomposes to one cell per step: each length is its own (unrolled) graph
    Entry("gru_tagger", "rnn", GRUTagger, tokens, text=True, dynamo_config=(("allow_rnn", True),), max_length=32,
          unrolled=True),
]

BY_NAME = {e.name: e for e in ZOO}
