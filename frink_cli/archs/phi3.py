"""Phi-3 (and Phi-4-mini): llama's layer with fused QKV and gate_up tensors, NeoX rope and
LongRoPE.

Follows llama.cpp's src/models/phi3.cpp and transformers' Phi3ForCausalLM; the converter's
Phi3MiniModel (conversion/phi.py) writes `attn_qkv` (Q, K, V rows), `ffn_up` holding the
gate rows then the up rows (llama.cpp's LLM_FFN_SWIGLU splits it in that order), the
LongRoPE factors as `rope_factors_long/short.weight`, `rope.scaling.attn_factor`
(sqrt(1 + ln(max / orig) / ln(orig))) and `rope.scaling.original_context_length`, and no
rope.scaling.type. llama.cpp disables Phi's sliding window (the converter's value is not
trusted), and so does frink.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import numpy as np

from ..errors import FrinkError
from ..formats import Checkpoint
from ..model.config import ModelConfig
from .base import Arch
from .hf import MetadataWriter, f32, hf_types


def _longrope(hp: dict[str, Any]) -> dict[str, Any] | None:
    """The config's LongRoPE parameters, or None when it has no long factors."""
    rp = hp["_rope_full"]
    if not rp.get("long_factor"):
        return None
    if rp.get("rope_type") not in ("longrope", "su"):
        raise FrinkError(f"config.json: phi3 rope scaling {rp.get('rope_type')!r} not supported")
    return rp


class Phi3(Arch):
    name = "phi3"
    hf_model_types = hf_types("phi3")
    rope_type = "neox"
    hf_tensors: ClassVar[tuple[tuple[str, str], ...]] = (
        ("model.embed_tokens", "token_embd"),
        ("model.norm", "output_norm"),
        ("lm_head", "output"),
        ("model.layers.{bid}.input_layernorm", "blk.{bid}.attn_norm"),
        ("model.layers.{bid}.self_attn.qkv_proj", "blk.{bid}.attn_qkv"),
        ("model.layers.{bid}.self_attn.o_proj", "blk.{bid}.attn_output"),
        ("model.layers.{bid}.mlp.gate_up_proj", "blk.{bid}.ffn_up"),
        ("model.layers.{bid}.mlp.down_proj", "blk.{bid}.ffn_down"),
        ("model.layers.{bid}.post_attention_layernorm", "blk.{bid}.ffn_norm"),
    )

    def config(self, ckpt: Checkpoint) -> ModelConfig:
        cfg = super().config(ckpt)
        # llama_model_phi3::load_arch_hparams: "Phi SWA is currently disabled".
        return dataclasses.replace(cfg, sliding_window=None, swa_layers=(False,) * cfg.n_layer)

    @staticmethod
    def _orig_ctx(hp: dict[str, Any]) -> int:
        rp = hp["_rope_full"]
        orig = rp.get(
            "original_max_position_embeddings", hp.get("original_max_position_embeddings")
        )
        if not isinstance(orig, int) or isinstance(orig, bool) or orig <= 0:
            raise FrinkError(f"config.json: bad original_max_position_embeddings {orig!r}")
        return orig

    @staticmethod
    def _rope_dim(hp: dict[str, Any]) -> int:
        rot = float(hp["_rope_full"].get("partial_rotary_factor", 1.0))
        return int(rot * int(hp["hidden_size"])) // int(hp["num_attention_heads"])

    def hf_generated(self, hp: dict[str, Any]) -> dict[str, np.ndarray]:
        rp = _longrope(hp)
        if rp is None:
            return {}
        half = self._rope_dim(hp) / 2
        out = {}
        for which in ("long", "short"):
            factors = rp.get(f"{which}_factor")
            if not isinstance(factors, list) or len(factors) != half:
                raise FrinkError(f"config.json: rope {which}_factor must have {half} numbers")
            out[f"rope_factors_{which}.weight"] = np.asarray(factors, np.float32)
        return out

    def hf_rope_scaling(self, w: MetadataWriter) -> None:
        """Phi3MiniModel writes no rope.scaling.type: LongRoPE is its factor tensors and
        attention factor (see hf_metadata)."""

    def hf_metadata(self, w: MetadataWriter, notes: list[str]) -> None:
        super().hf_metadata(w, notes)
        hp = w.hp
        for k in ("attention.key_length", "attention.value_length"):
            w.meta.pop(w.key(k), None)  # the converter writes neither (head_dim = n_embd / heads)
        w.set("rope.dimension_count", self._rope_dim(hp))
        # Written as the converter writes it (0: none); config() disables it as llama.cpp does.
        if hp.get("sliding_window") is None:
            w.set("attention.sliding_window", 0)
        else:
            w.u32("attention.sliding_window", "sliding_window")
        orig = self._orig_ctx(hp)
        w.set("rope.scaling.original_context_length", orig)
        if _longrope(hp) is not None:
            scale = int(hp["max_position_embeddings"]) / orig
            attn = math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0
            w.set("rope.scaling.attn_factor", f32(attn))
