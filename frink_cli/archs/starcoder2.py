"""StarCoder2 (`starcoder2`): LayerNorm with bias everywhere, biases on Q/K/V, o_proj and
the FFN, and a plain (non-gated) GELU MLP, down(gelu_tanh(up(h))); NeoX rope.

Follows llama.cpp's src/models/starcoder2.cpp (LLM_NORM with weight and bias, LLM_FFN_GELU
sequential) and transformers' Starcoder2ForCausalLM (gelu_pytorch_tanh). The converter's
StarCoder2Model maps tensors by name (no permutation: NeoX rope rotates halves as HF does):
mlp.c_fc -> ffn_up, mlp.c_proj -> ffn_down, and writes the norm epsilon as
`starcoder2.attention.layer_norm_epsilon`.

`LayerNormArch` holds what the LayerNorm families (starcoder2, bloom, mpt) share: the
LayerNorm epsilon key, LayerNorm instead of RMSNorm, the plain GELU FFN.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from ..formats import Checkpoint
from ..model.config import ModelConfig
from .base import Arch, get
from .decoder import decoder_ext
from .hf import HF_CORE_TENSORS, MetadataWriter, hf_types


class LayerNormArch(Arch):
    """LayerNorm (with bias) instead of RMSNorm, and a plain GELU FFN."""

    ffn_act = "gelu_tanh"

    def config(self, ckpt: Checkpoint) -> ModelConfig:
        cfg = super().config(ckpt)
        eps = float(get(ckpt.metadata, self.key("attention.layer_norm_epsilon"), required=True))
        ext = dataclasses.replace(decoder_ext(cfg), layer_norm=True, plain_ffn=True)
        return dataclasses.replace(cfg, norm_eps=eps, ext=ext)


class Starcoder2(LayerNormArch):
    name = "starcoder2"
    hf_model_types = hf_types("starcoder2")
    rope_type = "neox"
    hf_tensors: ClassVar[tuple[tuple[str, str], ...]] = HF_CORE_TENSORS + (
        ("model.layers.{bid}.post_attention_layernorm", "blk.{bid}.ffn_norm"),
        ("model.layers.{bid}.mlp.c_fc", "blk.{bid}.ffn_up"),
        ("model.layers.{bid}.mlp.c_proj", "blk.{bid}.ffn_down"),
    )

    def hf_metadata(self, w: MetadataWriter, notes: list[str]) -> None:
        super().hf_metadata(w, notes)
        del w.meta[w.key("attention.layer_norm_rms_epsilon")]
        w.f32("attention.layer_norm_epsilon", "norm_epsilon")
        del w.meta[w.key("attention.key_length")], w.meta[w.key("attention.value_length")]
