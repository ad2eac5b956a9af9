"""The MoE router on the host: softmax over all experts, the top n_expert_used per row,
optionally renormalized (norm_topk_prob), as llama.cpp's build_moe_ffn with softmax gating
and transformers' Qwen3MoeSparseMoeBlock compute it. The block is composed in
graph/layer.py (moe_block); the experts run in HostOps.experts.
"""

from __future__ import annotations

import numpy as np


def route(logits: np.ndarray, k: int, renormalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """Router logits [T, n_expert] -> (expert ids [T, k], weights [T, k])."""
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    # Highest probability first; ties (measure zero for real weights) go to the lower id.
    ids = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    weights = np.take_along_axis(p, ids, axis=-1)
    if renormalize:
        weights /= weights.sum(axis=-1, keepdims=True)
    return ids, weights
