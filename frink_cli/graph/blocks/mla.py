"""Multi-head latent attention (MLA), in the absorbed form, over `Ops`.

Each token's keys and values come from one compressed latent c (kv_lora_rank wide) and one
rotated key part k_pe (rope_dim wide) shared by every head:

    q = W_q h,  or  W_qb rms(W_qa h)                       [T, H, nope + rope]
    [c | k_pe] = W_kva h;  c = rms(c);  k_pe, q_pe rotated
    q_abs[h] = W_UK[h] q_nope[h]                            [T, H, kv_lora]
    softmax(scale [q_abs | q_pe] . [c | k_pe]) c            (MQA: one KV head, V = K)
    out[h] = W_UV[h] (the above);  W_o out

which equals attention with per-head keys [W_UK[h]^T c | k_pe] and values W_UV[h]^T c (the
expanded form transformers runs), as llama.cpp's graph runs it for every batch.
The cache holds [c | k_pe] per token (kv_lora_rank + rope_dim values) and the attention
reads those rows as its values too (cache/latent.py); of its output only the latent
columns are kept, so every backend's attention runs with K and V of one width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..ops import A, AttentionCall, Ops
from .step import each_sequence


@dataclass(frozen=True)
class MlaConfig:
    """One MLA layer's sizes and softmax scale."""

    n_head: int
    kv_lora_rank: int  # the latent's width (the cached value rows)
    q_lora_rank: int  # 0: the plain query projection (wq)
    head_dim_nope: int  # each head's unrotated query/key dims
    rope_dim: int  # the rotated dims, shared by every head on the key side
    head_dim_v: int  # each head's value width after W_UV
    eps: float
    scale: float  # multiplies q . k (1/sqrt(nope + rope), times YaRN's mscale^2)


def mla_attention(ops: Ops[A], m: MlaConfig, w: Any, h: A, pos: Any, kv: Any, rope: Any) -> A:
    """Normed rows h [T, n_embd] -> attention output [T, n_embd]. w holds wq (or wq_a,
    q_a_norm, wq_b), wkv_a, kv_a_norm, k_b [H, kv_lora, nope], v_b [H, v, kv_lora], wo;
    kv is the layer's latent cache slot (one KV head, keys kv_lora + rope wide)."""
    T = h.shape[0]
    H, nope, r, c = m.n_head, m.head_dim_nope, m.rope_dim, m.kv_lora_rank
    if w.wq is not None:
        q = ops.linear(h, w.wq)
    else:
        q = ops.linear(ops.rms_norm_(ops.linear(h, w.wq_a), w.q_a_norm, m.eps), w.wq_b)
    q = q.reshape(T, H, nope + r)
    q_pe = ops.rope_(ops.concat([q[..., nope:]]), pos, rope)
    ckv = ops.linear(h, w.wkv_a)  # [T, kv_lora + rope]
    latent = ops.rms_norm(ckv[:, :c], w.kv_a_norm, m.eps)
    k_pe = ops.rope_(ops.concat([ckv[:, c:]]).reshape(T, 1, r), pos, rope)
    q_abs = ops.head_matmul(q[..., :nope], w.k_b)  # [T, H, kv_lora]
    query = ops.concat([q_abs, q_pe])
    row = ops.concat([latent, k_pe.reshape(T, r)]).reshape(T, 1, c + r)

    call: AttentionCall[A] = AttentionCall(scale=m.scale)

    def core(kv: Any, pos: Any, q: A, k: A | None, v: A | None) -> A:
        return ops.attention(q, k, v, kv, pos, call)

    # The values are the whole rows (V = K, one buffer); of each head's output only the
    # latent columns are kept.
    out = each_sequence(ops, kv, pos, core, query, row, row)  # [T, H * (kv_lora + rope)]
    out = ops.head_matmul(out.reshape(T, H, c + r)[..., :c], w.v_b)  # [T, H, v]
    return ops.linear(out.reshape(T, H * m.head_dim_v), w.wo)
