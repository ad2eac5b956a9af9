"""Lightning attention (linear attention with a per-head decay).

With the compiled row-wise ops every token, prompt or decode, takes the recurrence
S = exp(-s) S + k^T v, o = q S in C in one fixed order (rowwise.delta_rule without the
delta), so a token's bits do not depend on where a prompt was cut or what shared its step.
Without them, in NumPy: a prompt is taken in blocks of BLOCK tokens (within a block the
decayed scores (q_i . k_j) exp(-s (i - j)) for j <= i, across blocks the state
S = sum exp(-s (t - j)) k_j^T v_j carried in); one token is the plain recurrence. All are
the same sum.
"""

from __future__ import annotations

import numpy as np

from . import rowwise

F32 = np.float32
BLOCK = 64  # prompt tokens per intra-block product (bounds the [H, n, n] score blocks)


def lightning_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    slopes: tuple[float, ...],
    state: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """q, k, v [T, H, d]; slopes [H]; state [H, d, d] (not modified) -> (o [T, H, d], the
    new state), as Ops.lightning_attention states it."""
    s = np.asarray(slopes, dtype=np.float64)
    T = q.shape[0]
    decay = np.broadcast_to(np.exp(-s).astype(F32), (T, len(slopes)))
    done = rowwise.delta_rule(q, k, v, decay, np.ones_like(decay), state, delta=False)
    if done is not None:
        return done
    if T == 1:  # decode: S = exp(-s) S + k^T v;  o = q S
        ratio = np.exp(-s).astype(F32)[:, None, None]
        S = state * ratio + k[0][:, :, None] * v[0][:, None, :]
        o = np.einsum("hd,hde->he", q[0], S)
        return o[None].astype(F32, copy=False), S.astype(F32, copy=False)
    out = np.empty(v.shape, F32)
    S = np.asarray(state, F32)
    for b0 in range(0, T, BLOCK):
        b1 = min(b0 + BLOCK, T)
        out[b0:b1], S = _block(q[b0:b1], k[b0:b1], v[b0:b1], s, S)
    return out, S


def _block(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, s: np.ndarray, S: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """One block of n tokens after state S -> (its outputs [n, H, d], the state after it)."""
    n = q.shape[0]
    i = np.arange(n, dtype=np.float64)
    q_decay = np.exp(-s[None, :] * (i[:, None] + 1)).astype(F32)  # [n, H]
    k_decay = np.exp(-s[None, :] * (n - 1 - i[:, None])).astype(F32)  # [n, H]
    gap = i[:, None] - i[None, :]  # [n, n]: i - j
    diag = np.where(gap >= 0, np.exp(-s[:, None, None] * np.maximum(gap, 0)), 0.0).astype(F32)
    qh, kh, vh = (np.ascontiguousarray(a.transpose(1, 0, 2)) for a in (q, k, v))  # [H, n, d]
    scores = (qh @ kh.transpose(0, 2, 1)) * diag  # [H, n, n]
    intra = scores @ vh  # [H, n, d]
    inter = (qh * q_decay.T[:, :, None]) @ S  # [H, n, d]
    kv = (kh * k_decay.T[:, :, None]).transpose(0, 2, 1) @ vh  # [H, d, d]
    S_new = S * np.exp(-s * n).astype(F32)[:, None, None] + kv
    return (intra + inter).transpose(1, 0, 2), S_new.astype(F32, copy=False)
