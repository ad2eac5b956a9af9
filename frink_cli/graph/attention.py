"""The attention block, written once for prefill batches and decode rows alike.

Where K/V are written and read is the `kv` parameter (anything with `append(k, v)` that
returns every row so far); the block itself does not know whether it serves a batched
prefill or a single decode row. Decorations come from the config: QKV bias, per-head QK
RMSNorm, rope layout and base per layer, sliding window, q scale, logit softcap; GQA maps
query head h to KV head h // (n_head / n_head_kv), as llama.cpp does.
"""

from __future__ import annotations

import numpy as np

from ..model.config import LayerShape, ModelConfig
from ..model.weights import LayerWeights
from .linear import linear
from .norms import rms_norm
from .rope import Rope


def attention_mask(positions: np.ndarray, n_kv: int, window: int | None) -> np.ndarray:
    """Additive mask [T, S]: key j visible to the query at position p if j <= p and,
    with a window, p - j < window."""
    kv_pos = np.arange(n_kv)
    visible = kv_pos[None, :] <= positions[:, None]
    if window is not None:
        visible &= positions[:, None] - kv_pos[None, :] < window
    return np.where(visible, np.float32(0.0), np.float32(-np.inf))


def attention(
    x: np.ndarray,
    w: LayerWeights,
    cfg: ModelConfig,
    shape: LayerShape,
    rope: Rope,
    positions: np.ndarray,
    kv,
) -> np.ndarray:
    """x: normed hidden rows [T, n_embd] -> attention output [T, n_embd] (after o_proj)."""
    T = x.shape[0]
    H, Hkv, hk, hv = cfg.n_head, cfg.n_head_kv, cfg.head_dim_k, cfg.head_dim_v
    qkv = linear(x, w.qkv)
    q = qkv[:, : H * hk].reshape(T, H, hk)
    k = qkv[:, H * hk : (H + Hkv) * hk].reshape(T, Hkv, hk)
    v = qkv[:, (H + Hkv) * hk :].reshape(T, Hkv, hv)
    if w.q_norm is not None:
        q = rms_norm(q, w.q_norm, cfg.norm_eps)
        k = rms_norm(k, w.k_norm, cfg.norm_eps)
    q = rope.apply(q, positions)
    k = rope.apply(k, positions)

    K, V = kv.append(k, v)  # [Hkv, S, hk], [Hkv, S, hv]
    S = K.shape[1]
    g = H // Hkv
    # [Hkv, g*T, hk]: query heads grouped under the KV head they read.
    qg = (q * np.float32(cfg.attn_scale)).transpose(1, 0, 2).reshape(Hkv, g * T, hk)
    scores = (qg @ K.transpose(0, 2, 1)).reshape(Hkv, g, T, S)
    if cfg.attn_logit_softcap:
        c = np.float32(cfg.attn_logit_softcap)
        scores = c * np.tanh(scores / c)
    scores += attention_mask(positions, S, shape.window)
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    out = scores.reshape(Hkv, g * T, S) @ V  # [Hkv, g*T, hv]
    out = out.reshape(H, T, hv).transpose(1, 0, 2).reshape(T, H * hv)
    return linear(out, w.wo)
