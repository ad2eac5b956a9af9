"""Qwen3-Next: the gated-delta-net hybrid with plain NeoX partial rope, value heads kept
grouped (value head h reads key head h / (n_v / n_k)) and a sparse MoE FFN with a
sigmoid-gated shared expert.

Follows llama.cpp's src/models/qwen3next.cpp and transformers' Qwen3NextForCausalLM. Its
own conversion step: HF fuses q, k, v and the output gate z into in_proj_qkvz, grouped per
key head; the converter's Qwen3NextModel unzips it into attn_qkv and attn_gate.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from ..errors import FrinkError
from ..formats.safetensors import read_stored
from .gdn import GdnHybrid, hf_text_type
from .hf import Composite, MetadataWriter
from .hf_plan import HfModelType, Kept, Plan, pop_matching
from .moe import HF_ROUTER, HF_SHARED_EXPERT, hf_moe_metadata, stacked_experts


def _part(split: Callable[[], tuple[np.ndarray, np.ndarray]], i: int) -> np.ndarray:
    return split()[i]


def unzip_qkvz(kept: Kept, hp: dict[str, Any]) -> dict[str, Plan]:
    """in_proj_qkvz -> attn_qkv + attn_gate, as the converter's Qwen3NextModel splits it.

    HF stores the rows per key head: [q (hd_k), k (hd_k), v (r*hd_v), z (r*hd_v)] for each
    of the n_k key heads (r = n_v / n_k). GGUF holds all q rows, all k, all v (value heads
    grouped), then z separately.
    """
    plans: dict[str, Plan] = {}
    rx = re.compile(r"model\.layers\.(\d+)\.linear_attn\.in_proj_qkvz\.weight$")
    n_k, n_v = int(hp["linear_num_key_heads"]), int(hp["linear_num_value_heads"])
    hk, hv = int(hp["linear_key_head_dim"]), int(hp["linear_value_head_dim"])
    r = n_v // n_k
    group = 2 * hk + 2 * r * hv
    for m, hf_name, st in pop_matching(kept, rx):
        bid = m.group(1)
        if len(st.shape) != 2 or st.shape[0] != n_k * group:
            raise FrinkError(
                f"{st.file}: tensor {hf_name!r} has shape {list(st.shape)}, "
                f"expected [{n_k * group}, n_embd]"
            )
        d = st.shape[1]

        def split(st: Any = st, d: int = d) -> tuple[np.ndarray, np.ndarray]:
            w = read_stored(st).reshape(n_k, group, d)
            q, k = w[:, :hk], w[:, hk : 2 * hk]
            v, z = w[:, 2 * hk : 2 * hk + r * hv], w[:, 2 * hk + r * hv :]
            qkv = np.concatenate([q.reshape(-1, d), k.reshape(-1, d), v.reshape(-1, d)])
            return np.ascontiguousarray(qkv), np.ascontiguousarray(z.reshape(-1, d))

        plans[f"blk.{bid}.attn_qkv.weight"] = Plan(
            None, (2 * n_k * hk + n_v * hv, d), st.dtype, (), functools.partial(_part, split, 0)
        )
        plans[f"blk.{bid}.attn_gate.weight"] = Plan(
            None, (n_v * hv, d), st.dtype, (), functools.partial(_part, split, 1)
        )
    return plans


class Qwen3Next(GdnHybrid):
    name = "qwen3next"
    hf_model_types: ClassVar[dict[str, HfModelType]] = {
        "qwen3_next": hf_text_type("qwen3_next"),
    }
    gdn_v_head_order = "grouped"
    hf_tensors = (
        GdnHybrid.hf_tensors
        + HF_ROUTER
        + HF_SHARED_EXPERT
        + (("model.layers.{bid}.linear_attn.in_proj_ba", "blk.{bid}.ssm_ba"),)
    )
    hf_composites: ClassVar[tuple[Composite, ...]] = (unzip_qkvz, stacked_experts)

    def hf_metadata(self, w: MetadataWriter, notes: list[str]) -> None:
        super().hf_metadata(w, notes)
        hf_moe_metadata(w, shared=True, norm_topk=True)
