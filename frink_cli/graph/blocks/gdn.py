"""The gated delta net: linear attention with a recurrent state."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..ops import A, Ops
from .step import each_sequence


@dataclass(frozen=True)
class GdnConfig:
    """Gated delta net layers: linear attention with recurrent state."""

    layers: tuple[bool, ...]  # per layer: GDN instead of attention
    conv_kernel: int  # width of the causal depthwise conv over q/k/v
    n_k_heads: int  # ssm.group_count
    n_v_heads: int  # ssm.time_step_rank
    head_dim_k: int  # ssm.state_size
    head_dim_v: int  # ssm.inner_size / n_v_heads
    # Which key head value head h reads when n_v > n_k: "tiled" h % n_k (the converter
    # reorders value heads for ggml's broadcast) or "grouped" h // (n_v / n_k).
    v_head_order: str = "grouped"

    @property
    def conv_dim(self) -> int:
        """Channels of the conv (and its state): q, k (n_k heads each) and v (n_v heads)."""
        return 2 * self.n_k_heads * self.head_dim_k + self.n_v_heads * self.head_dim_v

    def key_heads(self) -> list[int]:
        """Per value head, the key head it reads (the host body and every backend ask here)."""
        n_k, n_v = self.n_k_heads, self.n_v_heads
        if self.v_head_order == "tiled":
            return [h % n_k for h in range(n_v)]
        return [h // (n_v // n_k) for h in range(n_v)]

    def state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(conv tail, delta state) shapes of one layer's recurrent state."""
        return (self.conv_kernel - 1, self.conv_dim), (
            self.n_v_heads,
            self.head_dim_k,
            self.head_dim_v,
        )

    def state_bytes(self) -> int:
        """f32 bytes of recurrent state one sequence holds: conv tail + delta state per layer."""
        per_layer = (self.conv_kernel - 1) * self.conv_dim + (
            self.n_v_heads * self.head_dim_k * self.head_dim_v
        )
        return 4 * per_layer * sum(self.layers)


def gdn(ops: Ops[A], g_cfg: GdnConfig, eps: float, w: Any, h: A, slot: Any) -> A:
    """Per token t and value head:

        q, k, v = split(silu(conv(W_qkv h)));  q, k L2-normalized, q scaled by 1/sqrt(hd_k)
        beta = sigmoid(W_b h);  g = -exp(A_log) * softplus(W_a h + dt_bias)   (log decay)
        S = exp(g) S;  S += k (beta (v - S^T k))^T;  o = S^T q
        out = W_out (rmsnorm(o) * silu(W_z h))

    as transformers' gated delta net and llama.cpp's delta-net-base.cpp compute it.
    The slot holds the conv tail and delta state; the new ones are staged on it.
    w.in_proj rows: the conv input (q, k: n_k heads each, v: n_v heads), z, beta, alpha."""
    T = h.shape[0]
    n_k, n_v, hk, hv = g_cfg.n_k_heads, g_cfg.n_v_heads, g_cfg.head_dim_k, g_cfg.head_dim_v
    key_dim, conv_dim, value_dim = n_k * hk, g_cfg.conv_dim, n_v * hv

    proj = ops.linear(h, w.in_proj)
    z = proj[:, conv_dim : conv_dim + value_dim].reshape(T, n_v, hv)
    b = proj[:, conv_dim + value_dim : conv_dim + value_dim + n_v]
    a = proj[:, conv_dim + value_dim + n_v :]

    beta = ops.sigmoid(b)
    g = w.a * ops.softplus(a + w.dt_bias)

    def recur(slot: Any, _pos: Any, conv_in: A, g: A, beta: A) -> A:
        t = conv_in.shape[0]
        tail, state = slot.recurrent_state()
        c, new_tail = ops.causal_conv(conv_in, tail, w.conv)
        c = ops.act(c, "silu")
        q = ops.scale_(ops.l2_norm(c[:, :key_dim].reshape(t, n_k, hk), eps), 1.0 / math.sqrt(hk))
        k = ops.l2_norm(c[:, key_dim : 2 * key_dim].reshape(t, n_k, hk), eps)
        if n_v != n_k:
            heads = ops.index(tuple(g_cfg.key_heads()))  # the key head each value head reads
            q, k = q[:, heads], k[:, heads]
        v = c[:, 2 * key_dim :].reshape(t, n_v, hv)
        o, new_state = ops.delta_rule(q, k, v, g, beta, state)
        slot.set_recurrent_state(new_tail, new_state)
        return o

    o = each_sequence(ops, slot, None, recur, proj[:, :conv_dim], g, beta)
    o = ops.rms_norm_(o, w.norm, eps) * ops.act(z, "silu")
    return ops.linear(o.reshape(T, value_dim), w.out)
