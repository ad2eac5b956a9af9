"""Qwen3: qwen2's layer plus an RMSNorm over each query and key head (QK norm).

Follows llama.cpp's src/models/qwen3.cpp and transformers' Qwen3ForCausalLM. The HF side
is qwen2's plus the q_norm/k_norm tensors and transformers' head_dim default of 128.
"""

from __future__ import annotations

from .hf import HF_QK_NORM_TENSORS, hf_types
from .qwen2 import Qwen2


class Qwen3(Qwen2):
    name = "qwen3"
    hf_model_types = hf_types("qwen3")
    qk_norm = True
    hf_tensors = Qwen2.hf_tensors + HF_QK_NORM_TENSORS
