"""The ALiBi families: BLOOM (`bloom`) and MPT (`mpt`). No rope: each head adds
-slope_h * (query pos - key pos) to its scores (ModelConfig.alibi_bias, the slopes as
llama.cpp's ggml_soft_max_ext computes them from a max bias); LayerNorm with bias, a plain
GELU FFN, fused QKV (`attn_qkv`, rows [q | k | v]).

- bloom follows llama.cpp's src/models/bloom.cpp and transformers' BloomForCausalLM: a
  LayerNorm on the embeddings (`token_embd_norm`, weight and bias), biases everywhere, max
  bias 8 (llama.cpp hard-codes it). The converter's BloomModel reorders HF's per-head
  interleaved query_key_value rows [h: q, k, v] into [q | k | v].
- mpt follows llama.cpp's src/models/mpt.cpp (transformers' MptForCausalLM where the
  converter takes its config): max bias from `mpt.attention.max_alibi_bias` (0 means
  learned position embeddings, refused), the QKV output clipped to [-c, c] by
  `mpt.attention.clamp_kqv`, no linear biases, and (MPT's qk_ln: SEA-LION) LayerNorms with
  biases over the whole Q and K projection widths (attn_q_norm / attn_k_norm), after the
  clamp. transformers' MPT has no qk_ln, so llama.cpp alone is its reference.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..errors import FrinkError
from ..formats import Checkpoint
from ..graph.blocks.attention import AttentionSpec
from ..graph.ops import Array, Ops
from ..model.config import HeadPlan, LayerShape, ModelConfig
from .base import get
from .decoder import DecoderConfig, with_ext
from .hf import MetadataWriter, f32, hf_types
from .hf_plan import Transform
from .starcoder2 import LayerNormArch


def unzip_bloom_qkv(w: np.ndarray, hp: dict[str, Any]) -> np.ndarray:
    """BLOOM's query_key_value rows, per head [q_h | k_h | v_h], -> [all q | all k | all v]
    (the converter's BloomModel.modify_tensors), for the weight [3d, d] and the bias [3d]."""
    H = int(hp["num_attention_heads"])
    parts = w.reshape(H, 3, -1, *w.shape[1:])
    return np.concatenate([parts[:, i].reshape(-1, *w.shape[1:]) for i in range(3)])


UNZIP_BLOOM_QKV = Transform(lambda w, hp, shape: unzip_bloom_qkv(w, hp))


@dataclass(frozen=True)
class AlibiConfig(DecoderConfig):
    """ALiBi instead of rope, optionally a clipped QKV and a LayerNorm on the embeddings."""

    # Each head adds -slope_h * (query pos - key pos) to its scores, slopes from this max
    # bias as llama.cpp (ggml_soft_max_ext) computes them.
    alibi_bias: float | None = None
    clamp_kqv: float | None = None  # the QKV projection's output clipped to [-c, c]
    embd_norm: bool = False  # a LayerNorm on the looked-up embeddings (token_embd_norm)

    def alibi_slopes(self, n_head: int) -> tuple[float, ...]:
        """Per query head, its ALiBi slope: ggml's m0^(h+1) for the first 2^floor(log2 H)
        heads, then m1^(2(h - n)+1) (as llama.cpp's soft_max_ext with max_bias)."""
        assert self.alibi_bias is not None
        n = 1 << (n_head.bit_length() - 1)  # 2^floor(log2(H))
        m0 = 2.0 ** (-self.alibi_bias / n)
        m1 = 2.0 ** (-(self.alibi_bias / 2.0) / n)
        return tuple(m0 ** (h + 1) if h < n else m1 ** (2 * (h - n) + 1) for h in range(n_head))

    def make_attention_spec(self, cfg: ModelConfig, shape: LayerShape) -> AttentionSpec:
        spec = super().make_attention_spec(cfg, shape)
        alibi = None if self.alibi_bias is None else self.alibi_slopes(cfg.n_head)
        return dataclasses.replace(spec, rotates=alibi is None, alibi=alibi, clamp=self.clamp_kqv)

    def head_plan(self, cfg: ModelConfig) -> HeadPlan:
        plan = super().head_plan(cfg)
        return dataclasses.replace(plan, embd_norm="layer_norm" if self.embd_norm else "")

    def embed(self, ops: Ops, cfg: ModelConfig, w: Any, x: Array, lookup: Any) -> Array:
        if self.embd_norm:
            x = ops.layer_norm(x, w.token_embd_norm, w.token_embd_norm_b, cfg.norm_eps)
        return super().embed(ops, cfg, w, x, lookup)


class Bloom(LayerNormArch):
    ext_class = AlibiConfig
    name = "bloom"
    hf_model_types = hf_types(
        "bloom", aliases={"n_layer": "num_hidden_layers", "n_head": "num_attention_heads"}
    )
    hf_tensors: ClassVar[tuple[tuple[str, str], ...]] = (
        ("transformer.word_embeddings", "token_embd"),
        ("transformer.word_embeddings_layernorm", "token_embd_norm"),
        ("transformer.ln_f", "output_norm"),
        ("lm_head", "output"),
        ("transformer.h.{bid}.input_layernorm", "blk.{bid}.attn_norm"),
        ("transformer.h.{bid}.self_attention.query_key_value", "blk.{bid}.attn_qkv"),
        ("transformer.h.{bid}.self_attention.dense", "blk.{bid}.attn_output"),
        ("transformer.h.{bid}.post_attention_layernorm", "blk.{bid}.ffn_norm"),
        ("transformer.h.{bid}.mlp.dense_h_to_4h", "blk.{bid}.ffn_up"),
        ("transformer.h.{bid}.mlp.dense_4h_to_h", "blk.{bid}.ffn_down"),
    )

    def hf_transforms(self) -> dict[str, tuple[Transform, ...]]:
        return {
            "blk.{bid}.attn_qkv.weight": (UNZIP_BLOOM_QKV,),
            "blk.{bid}.attn_qkv.bias": (UNZIP_BLOOM_QKV,),
        }

    def hf_metadata(self, w: MetadataWriter, notes: list[str]) -> None:
        # What the converter's BloomModel writes (context: seq_length, else n_embd).
        hp = w.hp
        d = int(hp["hidden_size"])
        w.set("context_length", int(hp.get("seq_length") or d))
        w.u32("embedding_length", "hidden_size")
        w.set("feed_forward_length", 4 * d)
        w.u32("block_count", "num_hidden_layers")
        w.u32("attention.head_count", "num_attention_heads")
        w.u32("attention.head_count_kv", "num_attention_heads")
        w.f32("attention.layer_norm_epsilon", "layer_norm_epsilon")
        w.u32("vocab_size", "n_vocab")

    def config(self, ckpt: Checkpoint) -> ModelConfig:
        cfg = super().config(ckpt)
        return with_ext(cfg, alibi_bias=8.0, embd_norm=True)


class Mpt(LayerNormArch):
    ext_class = AlibiConfig
    name = "mpt"
    hf_model_types = hf_types(
        "mpt",
        aliases={
            "n_layers": "num_hidden_layers",
            "d_model": "hidden_size",
            "n_heads": "num_attention_heads",
        },
    )
    hf_tensors: ClassVar[tuple[tuple[str, str], ...]] = (
        ("transformer.wte", "token_embd"),
        ("transformer.norm_f", "output_norm"),
        ("lm_head", "output"),
        ("transformer.blocks.{bid}.norm_1", "blk.{bid}.attn_norm"),
        ("transformer.blocks.{bid}.attn.Wqkv", "blk.{bid}.attn_qkv"),
        ("transformer.blocks.{bid}.attn.out_proj", "blk.{bid}.attn_output"),
        ("transformer.blocks.{bid}.attn.q_ln", "blk.{bid}.attn_q_norm"),
        ("transformer.blocks.{bid}.attn.k_ln", "blk.{bid}.attn_k_norm"),
        ("transformer.blocks.{bid}.norm_2", "blk.{bid}.ffn_norm"),
        ("transformer.blocks.{bid}.ffn.up_proj", "blk.{bid}.ffn_up"),
        ("transformer.blocks.{bid}.ffn.down_proj", "blk.{bid}.ffn_down"),
    )

    def hf_metadata(self, w: MetadataWriter, notes: list[str]) -> None:
        # What the converter's MPTModel writes: a fixed 1e-5 epsilon, the clamp and the max
        # ALiBi bias from attn_config (0 without ALiBi, refused on load).
        hp = w.hp
        attn = hp.get("attn_config") or {}
        if not isinstance(attn, dict):
            raise FrinkError("config.json: attn_config must be an object")
        w.u32("context_length", "max_seq_len")
        w.u32("embedding_length", "hidden_size")
        w.u32("block_count", "num_hidden_layers")
        w.set("feed_forward_length", 4 * int(hp["hidden_size"]))
        w.u32("attention.head_count", "num_attention_heads")
        if attn.get("kv_n_heads"):
            w.set("attention.head_count_kv", int(attn["kv_n_heads"]))
        w.set("attention.layer_norm_epsilon", f32(1e-5))
        if attn.get("clip_qkv") is not None:
            w.set("attention.clamp_kqv", f32(attn["clip_qkv"]))
        alibi = attn.get("alibi", True)
        w.set("attention.max_alibi_bias", f32(attn.get("alibi_bias_max", 8) if alibi else 0.0))
        w.u32("vocab_size", "n_vocab")

    def config(self, ckpt: Checkpoint) -> ModelConfig:
        cfg = super().config(ckpt)
        md = ckpt.metadata
        max_bias = float(get(md, self.key("attention.max_alibi_bias"), 0.0) or 0.0)
        if max_bias <= 0.0:
            raise FrinkError(
                f"{ckpt.path}: mpt without ALiBi (learned position embeddings) is not supported"
            )
        names = set(ckpt.tensors.names())
        if "pos_embd.weight" in names:
            raise FrinkError(f"{ckpt.path}: mpt with position embeddings is not supported")
        clamp = float(get(md, self.key("attention.clamp_kqv"), 0.0) or 0.0)
        qk_ln = "blk.0.attn_q_norm.weight" in names  # llama.cpp: present on every layer or none
        return with_ext(cfg, alibi_bias=max_bias, clamp_kqv=clamp or None, qk_norm_full=qk_ln)
