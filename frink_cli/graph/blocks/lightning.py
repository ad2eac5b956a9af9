"""Lightning attention: linear attention with a per-head decay, a recurrent
state per layer on the cache slot (as a gated delta net's), an RMSNorm over its output and
a sigmoid output gate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..ops import A, Ops
from .step import each_sequence


@dataclass(frozen=True)
class LightningConfig:
    """Which layers are lightning attention, and their heads."""

    layers: tuple[bool, ...]  # per layer: lightning attention instead of softmax attention
    n_head: int
    head_dim: int

    def slopes(self, layer: int) -> tuple[float, ...]:
        """Layer `layer`'s per-head decay rates: 2^(-8 (h + 1) / H) times the layer's
        factor 1 - layer / (n_layer - 1) + 1e-5, as llama.cpp computes them
        (transformers' factor differs by at most 1e-5 / (n_layer - 1))."""
        n_layer, H = len(self.layers), self.n_head
        factor = 1.0 - (layer / (n_layer - 1) if n_layer > 1 else 0.0) + 1e-5
        return tuple(2.0 ** (-8.0 * (h + 1) / H) * factor for h in range(H))

    def state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(conv tail: none, the K^T V state [H, d, d]) of one layer's recurrent state."""
        return (0, 1), (self.n_head, self.head_dim, self.head_dim)

    def state_bytes(self) -> int:
        """f32 bytes of recurrent state one sequence holds over every lightning layer."""
        return 4 * self.n_head * self.head_dim * self.head_dim * sum(self.layers)


def lightning(
    ops: Ops[A], lc: LightningConfig, layer: int, eps: float, w: Any, h: A, slot: Any
) -> A:
    """Per token t and head h (no query scaling):

        q, k, v = split(silu(W_qkv h))                          per head: [q | k | v]
        S = exp(-s_h) S + k^T v;  o = q S                       (ops.lightning_attention)
        out = W_out (sigmoid(W_gate h) * rmsnorm(o over all heads))

    as transformers' lightning attention and llama.cpp's graph compute it.
    The slot holds the state; the new one is staged on it."""
    T = h.shape[0]
    H, d = lc.n_head, lc.head_dim
    qkv = ops.act(ops.linear(h, w.qkv), "silu").reshape(T, H, 3 * d)
    slopes = lc.slopes(layer)

    def recur(slot: Any, _pos: Any, qkv: A) -> A:
        tail, state = slot.recurrent_state()
        q, k, v = qkv[:, :, :d], qkv[:, :, d : 2 * d], qkv[:, :, 2 * d :]
        o, new_state = ops.lightning_attention(q, k, v, slopes, state)
        slot.set_recurrent_state(tail, new_state)
        return o

    o = each_sequence(ops, slot, None, recur, qkv)
    o = ops.rms_norm_(o.reshape(T, H * d), w.norm, eps)
    o = ops.sigmoid_mul_(o, ops.linear(h, w.gate))
    return ops.linear(o, w.out)
