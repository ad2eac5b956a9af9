"""OLMo 2 (AllenAI): a llama-sized decoder with its norms moved. No pre-norms: each branch
reads the residual stream itself; an RMSNorm on each branch's output before its residual
add; and Q/K RMSNorms over the whole projection width (one RMS per row of all query heads,
weight [n_head*head_dim]; likewise the keys, [n_head_kv*head_dim]) before the heads split.

Follows llama.cpp's src/models/olmo2.cpp and transformers' Olmo2ForCausalLM. The
converter (conversion/olmo.py: Olmo2Model) is the plain TextModel: NeoX rope, so Q/K rows
are left as they are; tensors map by name: post_attention_layernorm ->
post_attention_norm, post_feedforward_layernorm -> post_ffw_norm, q_norm / k_norm ->
attn_q_norm / attn_k_norm. llama.cpp's olmo2 needs an output tensor (no tied head) and
head_dim = hidden / heads. Its sliding-window variant (OLMo 3, same GGUF arch) is read
from the file's sliding_window keys, as llama.cpp reads them (pattern default: every 4th
layer global; the window layers' rope unscaled), though no HF olmo3 model_type is read.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..formats import Checkpoint
from ..graph.ops import Array, Ops
from ..model.config import LayerPlan, LayerShape, ModelConfig
from .base import Arch
from .decoder import DecoderConfig, with_ext
from .hf import HF_CORE_TENSORS, HF_QK_NORM_TENSORS, hf_types


@dataclass(frozen=True)
class Olmo2Config(DecoderConfig):
    """No pre-norms: each branch reads the residual stream itself (its post norms normalize
    the branch outputs instead)."""

    no_pre_norm: bool = False

    def layer_plan(self, cfg: ModelConfig, shape: LayerShape) -> LayerPlan:
        plan = super().layer_plan(cfg, shape)
        return replace(plan, pre_norms=not self.no_pre_norm)

    def pre_norm(self, ops: Ops, cfg: ModelConfig, x: Array, w: Array, b: Array | None) -> Array:
        return x if self.no_pre_norm else super().pre_norm(ops, cfg, x, w, b)


class Olmo2(Arch):
    name = "olmo2"
    ext_class = Olmo2Config
    hf_model_types = hf_types("olmo2")
    rope_type = "neox"
    post_attn_norm = True
    post_ffn_norm = True
    swa_pattern = 4
    hf_tensors = (
        tuple(t for t in HF_CORE_TENSORS if not t[1].endswith(".attn_norm"))
        + HF_QK_NORM_TENSORS
        + (
            ("model.layers.{bid}.post_attention_layernorm", "blk.{bid}.post_attention_norm"),
            ("model.layers.{bid}.post_feedforward_layernorm", "blk.{bid}.post_ffw_norm"),
        )
    )

    def config(self, ckpt: Checkpoint) -> ModelConfig:
        return with_ext(super().config(ckpt), no_pre_norm=True, qk_norm_full=True)
