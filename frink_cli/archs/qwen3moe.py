"""Qwen3 MoE (e.g. Qwen3-30B-A3B): qwen3's attention with a sparse MoE FFN on every layer
(softmax router, top-k, no shared expert).

Follows llama.cpp's src/models/qwen3moe.cpp and transformers' Qwen3MoeForCausalLM; the
converter's Qwen3MoeModel (a Qwen2MoeModel) stacks the experts per kind. llama.cpp
requires a router on every layer, so HF configs with dense layers (mlp_only_layers,
decoder_sparse_step > 1) have no llama.cpp form and are refused. norm_topk_prob is carried
as expert_weights_norm because transformers honours it; the converter writes no such key
and llama.cpp always renormalizes (as a GGUF without the key does here).
"""

from __future__ import annotations

from typing import Any, ClassVar

from ..errors import FrinkError
from .hf import Composite, MetadataWriter, hf_types
from .moe import HF_ROUTER, hf_moe_metadata, stacked_experts
from .qwen3 import Qwen3


class Qwen3Moe(Qwen3):
    name = "qwen3moe"
    # transformers writes num_experts as num_local_experts (its attribute_map); released
    # configs say num_experts.
    hf_model_types = hf_types("qwen3_moe", aliases={"num_local_experts": "num_experts"})
    moe_every_layer = True
    hf_tensors = Qwen3.hf_tensors + HF_ROUTER
    hf_composites: ClassVar[tuple[Composite, ...]] = (stacked_experts,)

    def hf_metadata(self, w: MetadataWriter, notes: list[str]) -> None:
        super().hf_metadata(w, notes)
        hf_moe_metadata(w, shared=False, norm_topk=True)
        _refuse_dense_layers(self.name, w.hp)


def _refuse_dense_layers(arch: str, hp: dict[str, Any]) -> None:
    # transformers' Qwen3MoeDecoderLayer makes layer i dense when i is in mlp_only_layers or
    # (i + 1) is not a multiple of decoder_sparse_step. llama.cpp's qwen3moe requires a
    # router on every layer (and the converter has no name for a dense FFN there).
    n = int(hp["num_hidden_layers"])
    only = hp.get("mlp_only_layers") or []
    step = int(hp.get("decoder_sparse_step") or 1)
    dense = [i for i in range(n) if i in only or (i + 1) % step != 0]
    if dense:
        what = f"mlp_only_layers {list(only)}" if only else f"decoder_sparse_step {step}"
        raise FrinkError(
            f"config.json: {what} makes layers {dense} dense; {arch} with dense FFN layers "
            "is not supported (llama.cpp's qwen3moe has a router on every layer)"
        )
