"""OpenAI gpt-oss (GGUF `gpt-oss`, llama.cpp LLM_ARCH_OPENAI_MOE; HF `gpt_oss`).

Follows llama.cpp's src/models/openai-moe.cpp (hparams in its load_arch_hparams) and
transformers' GptOssForCausalLM; the converter is conversion/gpt_oss.py. The layer is the
pre-norm llama block with:

- attention sinks: a learned logit per query head (blk.N.attn_sinks.weight [n_head]) joins
  each softmax and takes no value (ModelConfig.attn_sinks);
- biases on Q, K, V and O (read by the loader wherever the file has them);
- sliding-window layers alternating with full ones: llama.cpp's load_swa_pattern(ml, 2)
  makes the even layers sliding (transformers' default layer_types), window
  `{arch}.attention.sliding_window`; every layer keeps the model's rope scaling (YaRN), as
  llama.cpp sets rope_freq_scale_train_swa = rope_freq_scale_train (swa_rope_scaled);
- NEOX rope, q.k scale 1/sqrt(n_rot);
- the pre-FFN norm stored as post_attention_norm (ffn_norm_tensor);
- a sparse MoE on every layer: the router has a bias; its weights are a softmax over the top
  k (biased) logits (llama.cpp's SOFTMAX_WEIGHT gating, transformers' GptOssTopKRouter),
  which is a softmax over all experts renormalized over the top k (norm_topk); the experts
  have biases on their gate, up and down rows (MoeConfig.biases) and run SwiGLU-OAI
  (ffn_act "swiglu_oai": alpha 1.702 and limit 7, hard-coded by llama.cpp).

HF side, as the converter writes it: `self_attn.sinks` -> attn_sinks.weight;
`mlp.router` -> ffn_gate_inp; the experts' fused gate_up_proj [E, d, 2*ff] (gate and up
columns interleaved) is transposed and split into ffn_gate_exps (even rows) and ffn_up_exps
(odd rows), its bias likewise; down_proj [E, ff, d] is transposed into ffn_down_exps.
An HF checkpoint whose experts are stored as MXFP4 blocks (*_blocks / *_scales, as released)
is refused by name: convert it with llama.cpp's converter, whose GGUF keeps them MXFP4.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, ClassVar

import numpy as np

from ..errors import FrinkError
from ..formats import Checkpoint
from ..formats.safetensors import StoredTensor, read_stored
from ..graph.blocks.attention import AttentionSpec
from ..graph.ops import SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT
from ..model.config import LayerPlan, LayerShape, ModelConfig
from .base import Arch
from .decoder import DecoderConfig, decoder_ext, with_ext
from .hf import HF_CORE_TENSORS, Composite, MetadataWriter, hf_types
from .hf_plan import Kept, Plan, check_dtype


@dataclasses.dataclass(frozen=True)
class GptOssConfig(DecoderConfig):
    """A learned logit per query head joins each softmax and takes no value (attn_sinks
    [n_head]: llama.cpp's ggml_soft_max_add_sinks, transformers' s_aux; the attention block
    reads it from the weights), and the sliding-window layers keep the model's rope scaling
    (llama.cpp's rope_freq_scale_train_swa = rope_freq_scale_train)."""

    attn_sinks: bool = False
    swa_rope_scaled: bool = False

    def make_attention_spec(self, cfg: ModelConfig, shape: LayerShape) -> AttentionSpec:
        return dataclasses.replace(super().make_attention_spec(cfg, shape), sinks=self.attn_sinks)

    def layer_plan(self, cfg: ModelConfig, shape: LayerShape) -> LayerPlan:
        return dataclasses.replace(super().layer_plan(cfg, shape), sinks=self.attn_sinks)

    def layer_shape(self, cfg: ModelConfig, layer: int) -> LayerShape:
        shape = super().layer_shape(cfg, layer)
        if self.swa_rope_scaled and cfg.swa_layers[layer]:
            shape = dataclasses.replace(shape, rope_scale=cfg.rope_scale)
        return shape


def _read_transposed(st: StoredTensor, rows: slice | None) -> np.ndarray:
    """A stored [E, a, b] tensor as [E, b, a] (the converter's transpose(-1, -2)), taking
    only `rows` of the result's second axis (the gate / up interleave) when given."""
    w = np.swapaxes(read_stored(st), -1, -2)
    return np.ascontiguousarray(w if rows is None else w[:, rows])


def _read_columns(st: StoredTensor, cols: slice) -> np.ndarray:
    return np.ascontiguousarray(read_stored(st)[..., cols])


def split_experts(kept: Kept, hp: dict[str, Any]) -> dict[str, Plan]:
    """The experts as the converter writes them (GptOssModel.modify_tensors): gate_up_proj
    [E, d, 2*ff] transposed, even rows -> ffn_gate_exps, odd rows -> ffn_up_exps; its bias
    [E, 2*ff] split the same way; down_proj [E, ff, d] transposed -> ffn_down_exps."""
    plans: dict[str, Plan] = {}
    rx = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)(_bias)?$")
    for name in list(kept):
        if re.search(r"\.mlp\.experts\.\w+_(blocks|scales)$", name):
            raise FrinkError(
                f"{kept[name][0]}: gpt-oss experts stored as MXFP4 blocks are not read from "
                "an HF directory; convert it with llama.cpp's converter (its GGUF keeps them "
                "MXFP4)"
            )
        m = rx.match(name)
        if m is None:
            continue
        hf_name, st = kept.pop(name)
        check_dtype(hf_name, st)
        bid, kind, bias = m.group(1), m.group(2), m.group(3) is not None
        shape = tuple(st.shape)
        if kind == "down_proj":
            if bias:
                plans[f"blk.{bid}.ffn_down_exps.bias"] = Plan(st, shape, st.dtype, ())
            else:
                e, ff, d = shape
                plans[f"blk.{bid}.ffn_down_exps.weight"] = Plan(
                    None, (e, d, ff), st.dtype, (), functools.partial(_read_transposed, st, None)
                )
            continue
        if shape[-1] % 2:
            raise FrinkError(f"{st.file}: tensor {hf_name!r} has an odd last axis {list(shape)}")
        for i, part in enumerate(("gate", "up")):
            half = slice(i, None, 2)
            if bias:
                e, ff2 = shape
                plans[f"blk.{bid}.ffn_{part}_exps.bias"] = Plan(
                    None, (e, ff2 // 2), st.dtype, (), functools.partial(_read_columns, st, half)
                )
            else:
                e, d, ff2 = shape
                plans[f"blk.{bid}.ffn_{part}_exps.weight"] = Plan(
                    None,
                    (e, ff2 // 2, d),
                    st.dtype,
                    (),
                    functools.partial(_read_transposed, st, half),
                )
    return plans


class GptOss(Arch):
    ext_class = GptOssConfig
    name = "gpt-oss"
    hf_model_types = hf_types("gpt_oss", aliases={"num_experts": "num_local_experts"})
    rope_type = "neox"
    ffn_act = "swiglu_oai"
    swa_pattern = 2
    moe_every_layer = True
    ffn_norm_tensor = "post_attention_norm"

    hf_tensors = HF_CORE_TENSORS + (
        ("model.layers.{bid}.post_attention_layernorm", "blk.{bid}.post_attention_norm"),
        ("model.layers.{bid}.mlp.router", "blk.{bid}.ffn_gate_inp"),
    )
    hf_tensors_whole = (("model.layers.{bid}.self_attn.sinks", "blk.{bid}.attn_sinks.weight"),)
    hf_composites: ClassVar[tuple[Composite, ...]] = (split_experts,)

    def check_metadata(self, ckpt: Checkpoint, rope_dim: int) -> None:
        # llama.cpp sizes Q/K/V by n_rot and scales q.k by 1/sqrt(n_rot).
        head_dim = int(ckpt.metadata.get(self.key("attention.key_length"), rope_dim))
        if rope_dim != head_dim:
            raise FrinkError(
                f"{ckpt.path}: gpt-oss rotates whole heads (rope.dimension_count {rope_dim} "
                f"!= key_length {head_dim})"
            )

    def config(self, ckpt: Checkpoint) -> ModelConfig:
        cfg = super().config(ckpt)
        if cfg.sliding_window is None:
            raise FrinkError(
                f"{ckpt.path}: model metadata is missing {self.key('attention.sliding_window')}"
            )
        moe = decoder_ext(cfg).moe
        assert moe is not None  # moe_every_layer: base.config requires the experts
        moe = dataclasses.replace(moe, norm_topk=True, biases=True, gating="softmax")
        return with_ext(cfg, moe=moe, attn_sinks=True, swa_rope_scaled=True)

    def hf_metadata(self, w: MetadataWriter, notes: list[str]) -> None:
        hp = w.hp
        super().hf_metadata(w, notes)
        for key, want in (("swiglu_alpha", SWIGLU_OAI_ALPHA), ("swiglu_limit", SWIGLU_OAI_LIMIT)):
            if float(hp.get(key, want)) != want:
                raise FrinkError(
                    f"config.json: {key} {hp[key]} is not supported (llama.cpp's gpt-oss "
                    f"hard-codes {want})"
                )
        if hp.get("attention_bias") is False:
            raise FrinkError("config.json: gpt-oss without attention biases is not supported")
        n = int(hp["num_hidden_layers"])
        types = hp.get("layer_types")
        want_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
        if types is not None and list(types) != want_types:
            raise FrinkError(
                "config.json: layer_types must alternate sliding_attention / full_attention "
                "from layer 0 (llama.cpp's gpt-oss pattern)"
            )
        w.u32("attention.sliding_window", "sliding_window")
        w.u32("expert_feed_forward_length", "intermediate_size")
        w.u32("expert_count", "num_local_experts")
        w.u32("expert_used_count", "num_experts_per_tok")
