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
    p, select = _scores(logits, gating, bias)
    return _top_k(p, select, k, renormalize)


def route_grouped(
    logits: np.ndarray,
    k: int,
    renormalize: bool,
    gating: str,
    bias: np.ndarray | None,
    n_group: int,
    topk_group: int,
) -> tuple[np.ndarray, np.ndarray]:
    """route() over the experts of the topk_group best of n_group consecutive groups, a
    group scored by the sum of its two best selection scores (llama.cpp's build_moe_ffn
    with n_expert_groups; transformers' grouped top-k router)."""
    p, select = _scores(logits, gating, bias)
    T, E = select.shape
    groups = select.reshape(T, n_group, E // n_group)
    score = -np.sort(-groups, axis=-1)[..., :2].sum(axis=-1)  # [T, n_group]
    kept = np.argsort(-score, axis=-1, kind="stable")[:, :topk_group]
    hidden = np.ones((T, n_group), bool)
    np.put_along_axis(hidden, kept, False, axis=-1)
    select = np.where(np.repeat(hidden, E // n_group, axis=-1), -np.inf, select)
    return _top_k(p, select, k, renormalize)


def _scores(
    logits: np.ndarray, gating: str, bias: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """(the gated probabilities, the selection scores: + the bias where there is one)."""
    if gating == "sigmoid":
        p = 1.0 / (1.0 + np.exp(-logits))
    else:
        p = np.exp(logits - logits.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
    # The bias moves the selection only (llama.cpp's exp_probs_b).
    return p, (p if bias is None else p + bias)


def _top_k(
    p: np.ndarray, select: np.ndarray, k: int, renormalize: bool
) -> tuple[np.ndarray, np.ndarray]:
    """The k best selection scores' ids and their probabilities (renormalized if asked)."""
    # Highest score first; ties (measure zero for real weights) go to the lower id.
    ids = np.argsort(-select, axis=-1, kind="stable")[:, :k]
    weights = np.take_along_axis(p, ids, axis=-1)
    if renormalize:
        weights /= weights.sum(axis=-1, keepdims=True)
    return ids, weights
