"""Qwen3.5 MoE: the qwen35 hybrid with qwen3next's FFN on every layer (softmax router,
top-k renormalized, sigmoid-gated shared expert).

Follows llama.cpp's src/models/qwen35moe.cpp and transformers' Qwen3_5MoeForCausalLM /
Qwen3_5MoeForConditionalGeneration; the converter's Qwen3_5MoeTextModel keeps qwen35's
transforms (value-head reorder, +1 norms, -exp(A_log)) and stacks the experts. There is no
intermediate_size (every FFN is routed) and the router always renormalizes its top k (no
norm_topk_prob); feed_forward_length is written only if the config has intermediate_size.
"""

from __future__ import annotations

from typing import ClassVar

from .gdn import hf_text_type
from .hf import Composite, MetadataWriter, multimodal
from .hf_plan import HfModelType
from .moe import HF_ROUTER, HF_SHARED_EXPERT, hf_moe_metadata, stacked_experts
from .qwen35 import _VISION_IGNORED, _VISION_NOTE, Qwen35

_TEXT = hf_text_type("qwen3_5_moe_text")


class Qwen35Moe(Qwen35):
    name = "qwen35moe"
    hf_model_types: ClassVar[dict[str, HfModelType]] = {
        "qwen3_5_moe_text": _TEXT,
        "qwen3_5_moe": multimodal(_TEXT, _VISION_IGNORED, _VISION_NOTE),
    }
    moe_every_layer = True
    hf_tensors = Qwen35.hf_tensors + HF_ROUTER + HF_SHARED_EXPERT
    hf_composites: ClassVar[tuple[Composite, ...]] = (stacked_experts,)
    hf_needs_ffn_width = False

    def hf_metadata(self, w: MetadataWriter, notes: list[str]) -> None:
        super().hf_metadata(w, notes)
        hf_moe_metadata(w, shared=True, norm_topk=False)
