"""The HF half of deepseek2 (archs/deepseek2.py): DeepSeek V2 / V3 directories read as the
converter's DeepseekV2Model writes them (conversion/deepseek.py): the MQA-form head keys,
the MLA ranks and per-head widths, kv_b_proj split per head into attn_k_b (transposed)
and attn_v_b, the stacked experts, the expert groups, the gating function from
scoring_func, and yarn_log_multiplier = 0.1 * mscale_all_dim.
"""

from __future__ import annotations

import functools
import re
from typing import Any, ClassVar

import numpy as np

from ..errors import FrinkError
from ..formats.safetensors import StoredTensor, read_stored
from .hf import HF_CORE_TENSORS, Composite, HfConversion, MetadataWriter, f32, hf_types
from .hf_plan import Kept, Plan, hp_value, pop_matching
from .moe import HF_ROUTER, stacked_experts

_GATING = {"softmax": 1, "sigmoid": 2}


def _split_kv_b(kept: Kept, hp: dict[str, Any]) -> dict[str, Plan]:
    """kv_b_proj [H * (nope + v), kv_lora] -> attn_k_b [H, kv_lora, nope] (each head's
    nope rows, transposed) and attn_v_b [H, v, kv_lora], as the converter splits it."""
    H, nope, v = int(hp["num_attention_heads"]), int(hp["qk_nope_head_dim"]), int(hp["v_head_dim"])
    plans: dict[str, Plan] = {}
    pattern = re.compile(r"model\.layers\.(\d+)\.self_attn\.kv_b_proj\.weight$")
    for m, hf_name, st in pop_matching(kept, pattern):
        if len(st.shape) != 2 or st.shape[0] != H * (nope + v):
            raise FrinkError(
                f"{st.file}: tensor {hf_name!r} has shape {list(st.shape)}, expected "
                f"[{H * (nope + v)}, kv_lora_rank]"
            )
        c, bid = st.shape[1], m.group(1)
        for kind, shape in (("k", (H, c, nope)), ("v", (H, v, c))):
            plans[f"blk.{bid}.attn_{kind}_b.weight"] = Plan(
                None, shape, st.dtype, (), functools.partial(_kv_b_part, st, kind, H, nope)
            )
    return plans


def _kv_b_part(st: StoredTensor, kind: str, H: int, nope: int) -> np.ndarray:
    w = read_stored(st)
    w = w.reshape(H, -1, w.shape[1])
    part = w[:, :nope, :].transpose(0, 2, 1) if kind == "k" else w[:, nope:, :]
    return np.ascontiguousarray(part)


class DeepseekHf(HfConversion):
    """config.json (model_type deepseek_v2 / deepseek_v3) -> deepseek2's GGUF metadata."""

    hf_model_types = hf_types("deepseek_v2", "deepseek_v3")
    hf_tensors = (
        *HF_CORE_TENSORS,
        ("model.layers.{bid}.post_attention_layernorm", "blk.{bid}.ffn_norm"),
        ("model.layers.{bid}.self_attn.q_a_proj", "blk.{bid}.attn_q_a"),
        ("model.layers.{bid}.self_attn.q_a_layernorm", "blk.{bid}.attn_q_a_norm"),
        ("model.layers.{bid}.self_attn.q_b_proj", "blk.{bid}.attn_q_b"),
        ("model.layers.{bid}.self_attn.kv_a_proj_with_mqa", "blk.{bid}.attn_kv_a_mqa"),
        ("model.layers.{bid}.self_attn.kv_a_layernorm", "blk.{bid}.attn_kv_a_norm"),
        *HF_ROUTER,
        ("model.layers.{bid}.mlp.shared_experts.gate_proj", "blk.{bid}.ffn_gate_shexp"),
        ("model.layers.{bid}.mlp.shared_experts.up_proj", "blk.{bid}.ffn_up_shexp"),
        ("model.layers.{bid}.mlp.shared_experts.down_proj", "blk.{bid}.ffn_down_shexp"),
    )
    hf_tensors_whole = (
        ("model.layers.{bid}.mlp.gate.e_score_correction_bias", "blk.{bid}.exp_probs_b.bias"),
    )
    hf_composites: ClassVar[tuple[Composite, ...]] = (_split_kv_b, stacked_experts)

    def hf_metadata(self, w: MetadataWriter, notes: list[str]) -> None:
        hp = w.hp
        w.sizes()
        w.set("attention.head_count_kv", 1)  # the MQA form
        w.f32("attention.layer_norm_rms_epsilon", "rms_norm_eps")
        w.f32("rope.freq_base", "rope_theta")
        w.u32("vocab_size", "vocab_size")
        self.hf_rope_scaling(w)
        if hp.get("rope_interleave") is False:
            raise FrinkError(
                "config.json: rope_interleave false is not supported (the converter and "
                "llama.cpp rotate DeepSeek's interleaved pairs)"
            )
        w.u32("leading_dense_block_count", "first_k_dense_replace")
        w.u32("attention.q_lora_rank", "q_lora_rank", optional=True)
        c, rope, nope, v = (
            hp_value(hp, k, None, "uint")
            for k in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
        )
        w.set("attention.kv_lora_rank", c)
        w.set("attention.key_length", c + rope)
        w.set("attention.value_length", c)
        w.set("attention.key_length_mla", nope + rope)
        w.set("attention.value_length_mla", v)
        w.set("rope.dimension_count", rope)
        self._hf_moe(w, notes)
        mscale_all = hp["_rope_full"].get("mscale_all_dim")
        if mscale_all is not None and hp["_rope_full"].get("rope_type") not in (None, "default"):
            w.set("rope.scaling.yarn_log_multiplier", f32(0.1 * float(mscale_all)))

    def _hf_moe(self, w: MetadataWriter, notes: list[str]) -> None:
        hp = w.hp
        w.u32("expert_feed_forward_length", "moe_intermediate_size")
        w.u32("expert_count", "n_routed_experts", optional=True)
        w.u32("expert_used_count", "num_experts_per_tok", optional=True)
        w.u32("expert_group_count", "n_group", optional=True)
        w.u32("expert_group_used_count", "topk_group", optional=True)
        w.u32("expert_shared_count", "n_shared_experts")
        w.f32("expert_weights_scale", "routed_scaling_factor", optional=True)
        if hp.get("norm_topk_prob"):
            w.set("expert_weights_norm", True)
        scoring = hp.get("scoring_func")
        if scoring is not None:
            if scoring not in _GATING:
                raise FrinkError(f"config.json: scoring_func {scoring!r} is not supported")
            w.set("expert_gating_func", _GATING[scoring])
        grouped = int(hp.get("n_group") or 1) > 1
        if grouped and hp.get("topk_method") == "group_limited_greedy":
            notes.append(
                "expert groups are scored by their two best experts' sum, as llama.cpp "
                "does (transformers' group_limited_greedy takes the best one)"
            )
