"""The gated delta net (GDN) block: linear-attention layers with a recurrent state.

Per layer it keeps a recurrent state instead of K/V rows, on the cache's layer slot:
  - the conv tail: the last kernel-1 inputs of a depthwise causal conv over q/k/v;
  - the delta-rule state S, one [hd_k, hd_v] matrix per value head.
For each token t, per value head (q and k are those of the key head it reads):
  q, k, v = split(silu(conv(W_qkv x)));  q, k L2-normalized, q scaled by 1/sqrt(hd_k)
  beta = sigmoid(W_b x);  g = -exp(A_log) * softplus(W_a x + dt_bias)   (a log decay, <= 0)
  S = exp(g) S;  S += k (beta (v - S^T k))^T;  o = S^T q
  out = W_out (rmsnorm(o) * silu(W_z x))
as transformers' gated delta net mixers and llama.cpp's
delta-net-base.cpp compute it. With the compiled row-wise ops (rowwise.delta_rule) every
row, prompt or decode, takes that step in C in one fixed order, so a token's bits do not
depend on where a prompt was cut or what shared its step (batch invariance). Without them
a decode row takes the step in NumPy, and a prefill batch the same recurrence in chunks of
CHUNK tokens: within a chunk the updates are solved together as one triangular system
(the WY/UT form), which is exact algebra, not an approximation -- tests check all three
against each other.

Value heads may outnumber key heads. Which key head value head h reads is data: "tiled"
(h % n_k; files whose converter reorders value heads for ggml's broadcast) or
"grouped" (h // (n_v / n_k); HF checkpoints). The HF reader applies
the converter's reorder where it has one, so the order follows the architecture alone.
"""

from __future__ import annotations

import numpy as np

from ...graph.blocks.gdn import GdnConfig
from . import rowwise

CHUNK = 64  # tokens solved together in a prefill; transformers' chunk size too


def key_head_of_value_head(g: GdnConfig) -> np.ndarray:
    """[n_v] index of the key head each value head reads."""
    return np.asarray(g.key_heads(), dtype=np.intp)


def causal_conv(x: np.ndarray, tail: np.ndarray, taps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Depthwise causal conv: x [T, C] after the previous inputs `tail` [K-1, C], per-channel
    taps [C, K] (oldest first). Returns (out [T, C], the new tail: the last K-1 inputs)."""
    T, K = x.shape[0], taps.shape[1]
    xin = np.concatenate([tail, x])
    out = xin[:T] * taps[:, 0]
    for j in range(1, K):
        out += xin[j : j + T] * taps[:, j]
    return out, xin[T:].copy()


def l2_normalize(x: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(sum(x^2) + eps) over the last axis (llama.cpp's build_gdn_l2_norm)."""
    ss = np.einsum("...i,...i->...", x, x)
    return x / np.sqrt(ss + np.float32(eps))[..., None]


def delta_rule_steps(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray, state: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The recurrence one token at a time. q, k [T, H, dk]; v [T, H, dv]; g, beta [T, H];
    state [H, dk, dv] (not modified). Returns (o [T, H, dv], the new state)."""
    T = q.shape[0]
    o = np.empty_like(v)
    s = state
    for t in range(T):
        s = s * np.exp(g[t])[:, None, None]  # a new array: the caller's state stays intact
        kt = k[t][:, None, :]  # [H, 1, dk]
        delta = (v[t] - (kt @ s)[:, 0]) * beta[t][:, None]  # [H, dv]
        s += kt.transpose(0, 2, 1) * delta[:, None, :]
        o[t] = (q[t][:, None, :] @ s)[:, 0]
    return o, s


def delta_rule_chunked(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    state: np.ndarray,
    chunk: int = CHUNK,
) -> tuple[np.ndarray, np.ndarray]:
    """The same recurrence, `chunk` tokens at a time (same arguments and results).

    Within a chunk, with G_t = cumsum(g)_t and D[t, s] = exp(G_t - G_s) for s <= t (else 0),
    the updates u_t = beta_t (v_t - (exp(g_t) S_{t-1})^T k_t) satisfy the unit lower-
    triangular system
        u_t + beta_t sum_{s<t} D[t,s] (k_t.k_s) u_s = beta_t (v_t - exp(G_t) S0^T k_t),
    and then  o_t = exp(G_t) S0^T q_t + sum_{s<=t} D[t,s] (q_t.k_s) u_s,
    S_end = exp(G_C) S0 + sum_s exp(G_C - G_s) k_s u_s^T. Every exponent is <= 0.
    """
    T = q.shape[0]
    # Heads first: [H, T, d].
    qh, kh, vh = (a.transpose(1, 0, 2) for a in (q, k, v))
    gh, bh = g.T, beta.T
    o = np.empty_like(vh)
    s = state
    for c0 in range(0, T, chunk):
        c1 = min(T, c0 + chunk)
        C = c1 - c0
        qc, kc, vc, bc = qh[:, c0:c1], kh[:, c0:c1], vh[:, c0:c1], bh[:, c0:c1]
        cum = np.cumsum(gh[:, c0:c1], axis=1)  # [H, C]
        diff = cum[:, :, None] - cum[:, None, :]
        causal = np.tril(np.ones((C, C), dtype=bool))
        decay = np.exp(np.where(causal, diff, -np.inf)).astype(
            np.float32
        )  # D, zero above the diagonal
        kk = kc @ kc.transpose(0, 2, 1)
        a = np.tril(bc[:, :, None] * decay * kk, -1)
        a[:, np.arange(C), np.arange(C)] = 1.0
        g_cum = np.exp(cum)[:, :, None]
        rhs = bc[:, :, None] * (vc - g_cum * (kc @ s))
        u = np.linalg.solve(a, rhs)
        o[:, c0:c1] = g_cum * (qc @ s) + (decay * (qc @ kc.transpose(0, 2, 1))) @ u
        to_end = np.exp(cum[:, -1:] - cum)[:, :, None]  # [H, C, 1]
        s = np.exp(cum[:, -1])[:, None, None] * s + (kc * to_end).transpose(0, 2, 1) @ u
    return o.transpose(1, 0, 2), s.astype(np.float32, copy=False)


def delta_rule(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray, state: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The recurrence (delta_rule_steps' arguments and results): in C where compiled, else a
    decode row token by token and a prefill batch in chunks."""
    done = rowwise.delta_rule(q, k, v, np.exp(g), beta, state)
    if done is not None:
        return done
    rule = delta_rule_steps if q.shape[0] == 1 else delta_rule_chunked
    return rule(q, k, v, g, beta, state)
