"""The attention block, written once for prefill batches and decode rows alike.

Where K/V are written and read is the `kv` parameter (anything with `append(k, v)` that
returns every row so far); the block itself does not know whether it serves a batched
prefill or a single decode row. Decorations come from the config: QKV bias, per-head QK
RMSNorm, rope layout and base per layer (partial: only the first rope_dim dims of a head),
sliding window, q scale, logit softcap, a per-head sigmoid output gate (qwen35/qwen3next);
GQA maps query head h to KV head h // (n_head / n_head_kv), as llama.cpp does.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..model.config import LayerShape, ModelConfig
from ..model.weights import LayerWeights
from .linear import linear
from .norms import rms_norm
from .rope import Rope


def attention_mask(positions: np.ndarray, n_kv: int, window: int | None, start: int = 0) -> np.ndarray:
    """Additive mask [T, n_kv - start]: key j (from `start`) visible to the query at position
    p if j <= p and, with a window, p - j < window."""
    p0, T = int(positions[0]), len(positions)
    if int(positions[-1]) - p0 == T - 1:
        # Every layer of a step asks for the same mask: build it once per step.
        return _run_mask(p0, T, n_kv, window, start)
    return _mask(positions, n_kv, window, start)


def _mask(positions: np.ndarray, n_kv: int, window: int | None, start: int) -> np.ndarray:
    kv_pos = np.arange(start, n_kv)
    visible = kv_pos[None, :] <= positions[:, None]
    if window is not None:
        visible &= positions[:, None] - kv_pos[None, :] < window
    return np.where(visible, np.float32(0.0), np.float32(-np.inf))


@lru_cache(maxsize=2)
def _run_mask(p0: int, T: int, n_kv: int, window: int | None, start: int) -> np.ndarray:
    m = _mask(np.arange(p0, p0 + T), n_kv, window, start)
    m.flags.writeable = False
    return m


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
    # A fresh array: q and k are normed and rotated in place inside it, no copies.
    qkv = linear(x, w.qkv)
    nq = 2 * H * hk if cfg.attn_output_gate else H * hk
    q = qkv[:, :nq].reshape(T, H, nq // H)
    gate = None
    if cfg.attn_output_gate:
        # Per head: hk query dims, then hk gate dims (how HF's q_proj and the GGUF lay them out).
        q, gate = q[..., :hk], q[..., hk:].reshape(T, H * hk)
    k = qkv[:, nq : nq + Hkv * hk].reshape(T, Hkv, hk)
    v = qkv[:, nq + Hkv * hk :].reshape(T, Hkv, hv)
    if w.q_norm is not None:
        rms_norm(q, w.q_norm, cfg.norm_eps, out=q)
        rms_norm(k, w.k_norm, cfg.norm_eps, out=k)
    if gate is None:
        # q and k heads sit side by side in each row: one rotation covers both.
        rope.rotate_(qkv[:, : nq + Hkv * hk].reshape(T, H + Hkv, hk), positions)
    else:
        rope.rotate_(q, positions)
        rope.rotate_(k, positions)

    K, V = kv.append(k, v)  # [Hkv, S, hk], [Hkv, S, hv]
    S = K.shape[1]
    # Keys older than the first query's window are invisible to every query: skip them.
    start = max(0, int(positions.min()) - shape.window + 1) if shape.window is not None else 0
    if start:
        K, V = K[:, start:], V[:, start:]
    g = H // Hkv
    q *= np.float32(cfg.attn_scale)
    # [Hkv, g*T, hk]: query heads grouped under the KV head they read.
    qg = q.transpose(1, 0, 2).reshape(Hkv, g * T, hk)
    scores = (qg @ K.transpose(0, 2, 1)).reshape(Hkv, g, T, S - start)
    if cfg.attn_logit_softcap:
        c = np.float32(cfg.attn_logit_softcap)
        scores /= c
        np.tanh(scores, out=scores)
        scores *= c
    # A decode row at the newest position sees every key left after the window cut.
    if T > 1 or int(positions[-1]) != S - 1:
        scores += attention_mask(positions, S, shape.window, start)
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    out = scores.reshape(Hkv, g * T, S - start) @ V  # [Hkv, g*T, hv]
    out = out.reshape(H, T, hv).transpose(1, 0, 2).reshape(T, H * hv)
    if gate is not None:
        out *= 1.0 / (1.0 + np.exp(-gate))
    return linear(out, w.wo)
