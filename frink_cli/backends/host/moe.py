"""The MoE router on the host: softmax over all experts (or a sigmoid per expert, with an
optional selection bias), the top n_expert_used per row, optionally renormalized
(norm_topk_prob), as llama.cpp's build_moe_ffn with softmax / sigmoid gating and
exp_probs_b, and transformers' sparse MoE blocks and top-k routers compute it.
The block is composed in graph/blocks/moe.py; the experts run in HostOps.experts.
"""

from __future__ import annotations

import numpy as np


def route(
    logits: np.ndarray,
    k: int,
    renormalize: bool,
    gating: str = "softmax",
    bias: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Router logits [T, n_expert] -> (expert ids [T, k], weights [T, k])."""
    if gating == "sigmoid":
        p = 1.0 / (1.0 + np.exp(-logits))
    else:
        p = np.exp(logits - logits.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
    # The bias moves the selection only (llama.cpp's exp_probs_b).
    select = p if bias is None else p + bias
    # Highest score first; ties (measure zero for real weights) go to the lower id.
    ids = np.argsort(-select, axis=-1, kind="stable")[:, :k]
    weights = np.take_along_axis(p, ids, axis=-1)
    if renormalize:
        weights /= weights.sum(axis=-1, keepdims=True)
    return ids, weights
