"""The sparse mixture-of-experts FFN (qwen3moe, qwen3next, qwen35moe), with an optional
sigmoid-gated shared expert (qwen3next and qwen35moe have one, qwen3moe none).

Softmax router over all experts, the top n_expert_used per row, their probabilities
optionally renormalized to sum to one (norm_topk_prob), each chosen expert a gated FFN.
The shared expert runs on every row and is scaled by sigmoid(its gate). Same arithmetic as
llama.cpp's build_moe_ffn with softmax gating and transformers' Qwen3NextSparseMoeBlock
(Qwen3MoeSparseMoeBlock, Qwen3_5MoeSparseMoeBlock).

Rows are grouped by expert, so a prefill batch makes one matmul per expert it uses rather
than one per (row, expert); a decode row simply visits its top-k experts.
"""

from __future__ import annotations

import numpy as np

from ..model.config import ModelConfig
from ..model.weights import MoeWeights
from .ffn import glu
from .linear import linear


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


def moe_ffn(x: np.ndarray, w: MoeWeights, cfg: ModelConfig) -> np.ndarray:
    """x: normed rows [T, n_embd] -> FFN output [T, n_embd]."""
    n_e = cfg.moe.n_expert
    h = linear(x, w.inp)
    ids, weights = route(h[:, :n_e], cfg.moe.n_expert_used, cfg.moe.norm_topk)

    out = np.zeros_like(x)
    for e in np.unique(ids):
        rows, slot = np.nonzero(ids == e)
        y = glu(x[rows] @ w.gate_up_exps[e].T, cfg.ffn_act) @ w.down_exps[e].T
        # A row picks an expert at most once, so rows are distinct and += is safe.
        out[rows] += y * weights[rows, slot][:, None]

    if w.down_shexp is not None:
        gate = h[:, n_e : n_e + 1]
        shared = linear(glu(h[:, n_e + 1 :], cfg.ffn_act), w.down_shexp)
        out += shared / (1.0 + np.exp(-gate))
    return out
