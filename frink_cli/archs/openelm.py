"""OpenELM (`openelm`): a llama-style decoder whose every layer has its own sizes.

Follows llama.cpp's src/models/openelm.cpp (and conversion/openelm.py, its converter from
the remote-code OpenELMForCausalLM; transformers has no OpenELM, so there is no HF-dir
path):

- per layer, its own query heads, KV heads and FFN width: the converter writes
  head_count, head_count_kv and feed_forward_length as arrays (ModelConfig.layer_sizes;
  every per-layer reader asks layer_shape(l));
- fused QKV (`attn_qkv`: q heads, then k heads, then v heads, of the layer's own counts);
- per-head Q and K RMSNorms (`attn_q_norm`, `attn_k_norm` [head_dim]) before the rotation;
- NeoX rope over the whole head, q.k scaled by 1/sqrt(head_dim), SwiGLU FFN (the converter
  splits proj_1 into ffn_gate and ffn_up);
- the output head is the embedding table: llama.cpp reads token_embd as the head whatever
  else the file holds, so a file with its own output.weight is refused rather than run
  another way than llama.cpp runs it.
"""

from __future__ import annotations

from typing import ClassVar

from ..errors import FrinkError
from ..formats import Checkpoint
from ..model.config import ModelConfig
from .base import Arch
from .hf_plan import HfModelType


class OpenElm(Arch):
    name = "openelm"
    hf_model_types: ClassVar[dict[str, HfModelType]] = {}
    rope_type = "neox"
    qk_norm = True
    per_layer_sizes = True

    def config(self, ckpt: Checkpoint) -> ModelConfig:
        cfg = super().config(ckpt)
        if not cfg.tied_embeddings:
            raise FrinkError(
                f"{ckpt.path}: openelm's output head is its token_embd (as llama.cpp reads it); "
                "this file has its own output.weight"
            )
        if cfg.head_dim_k != cfg.head_dim_v:
            raise FrinkError(
                f"{ckpt.path}: openelm needs key_length == value_length "
                f"({cfg.head_dim_k} != {cfg.head_dim_v}), as llama.cpp asserts"
            )
        return cfg
