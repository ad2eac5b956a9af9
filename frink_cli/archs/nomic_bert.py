"""nomic-bert (`nomic-bert`): nomic-embed-text's encoder, BERT's post-norm layer with rope
and SwiGLU in place of learned positions and GELU.

    x = LayerNorm(tok[id] + type[0])               no position table: rope in attention
    per layer (post-norm):
        x = LayerNorm(x + attention(x))            fused QKV, NeoX rope, no mask
        x = LayerNorm(x + down(silu(gate(x)) * up(x)))

Follows llama.cpp's src/models/bert.cpp on LLM_ARCH_NOMIC_BERT (rope on Q and K, the
SwiGLU branch of its FFN, LLAMA_ROPE_TYPE_NEOX). The GGUF stores `attn_qkv` (Q, K, V rows,
no biases), `ffn_up` / `ffn_gate` / `ffn_down`, `token_types` and the BERT norms
(token_embd_norm, attn_output_norm, layer_output_norm, LayerNorms with biases), and
`rope.freq_base` and `pooling_type` in its metadata. The layer is BertConfig's with two
switches: no learned positions (rope instead) and the gated FFN.
"""

from __future__ import annotations

from typing import ClassVar

from ..formats import Checkpoint
from ..model.config import ModelConfig
from .bert import Bert
from .decoder import with_ext
from .hf_plan import HfModelType


class NomicBert(Bert):
    name = "nomic-bert"
    ffn_act = "silu"
    rope_type = "neox"
    # No HF conversion: transformers has no nomic-bert class (its modeling code is remote).
    hf_model_types: ClassVar[dict[str, HfModelType]] = {}
    hf_tensors: ClassVar[tuple[tuple[str, str], ...]] = ()

    def config(self, ckpt: Checkpoint) -> ModelConfig:
        return with_ext(super().config(ckpt), plain_ffn=False, learned_positions=False)
