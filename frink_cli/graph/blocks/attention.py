"""Grouped-query attention and its variants, as one block over `Ops`.

The fused QKV rows are [q | k | v]; with an output gate each query head's rows are
followed by its gate rows (how HF's q_proj and the GGUF lay them out). Which variant runs
is the AttentionSpec's (fixed per layer) and the weights' (an absent norm, sink or gain is
None):

    qkv = W_qkv h  (clipped to [-clamp, clamp])
    q, k, v split into heads; Q/K normed per head (one weight row for all heads, or each
    head its own) or over the whole width; V normed
    q, k rotated (unless the spec says nothing rotates: ALiBi or NoPE); q times a per-head
    gain; attend over the cache (window or chunk, temperature, softcap, ALiBi slopes, sink
    logits)
    out = W_o (sub_norm(out * sigmoid(gate)))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..ops import A, AttentionCall, Ops
from .norms import norm, optional_rms_norm_
from .step import each_sequence


@dataclass(frozen=True)
class AttentionSpec:
    """One layer's attention, as its architecture sets it up."""

    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    eps: float
    scale: float  # multiplies q before q.k
    window: int | None = None  # keys with q - k < window are visible; None: all
    softcap: float | None = None  # cap * tanh(scores / cap) before the softmax
    rotates: bool = True  # False: no rotation at all (ALiBi, NoPE)
    alibi: tuple[float, ...] | None = None  # per query head, its ALiBi slope
    clamp: float | None = None  # the QKV rows clipped to [-clamp, clamp]
    output_gate: bool = False  # q_proj also yields a per-head gate: out *= sigmoid(gate)
    # Q/K norm over the whole projection width (one norm over all heads' columns, weights
    # [n_head*hd] and [n_head_kv*hd]) instead of per head; a LayerNorm with its biases when
    # full_qk_layer_norm.
    full_qk_norm: bool = False
    full_qk_layer_norm: bool = False
    v_norm: bool = False  # a weightless RMSNorm on each V head
    v_from_k: bool = False  # no V projection: V is the raw K projection, normed
    shares_kv: bool = False  # no K/V of its own: attends over another layer's rows
    sinks: bool = False  # w.attn_sinks [n_head]: one more logit per head's softmax
    # False: bidirectional (an encoder): every row of the sequence is visible to every query
    # (with a window: those with |query - key position| < window).
    causal: bool = True
    # Chunked local attention: keys visible only within the query's chunk of this many
    # positions (None: no chunks).
    chunk: int | None = None
    # Attention temperature (floor_scale, scale): q at position p times
    # log(floor((p + 1) / floor_scale) + 1) * scale + 1 (None: none).
    temperature: tuple[float, float] | None = None
    # w.attn_rel_bias [n_head, 2c + 1]: a score bias by key - query position (relative buckets)
    rel_bias: bool = False


def attention(ops: Ops[A], spec: AttentionSpec, w: Any, h: A, pos: Any, kv: Any, rope: Any) -> A:
    """Normed rows h [T, n_embd] -> attention output [T, n_embd] (after o_proj). w holds
    qkv and wo, and the optional q_norm/k_norm (+ biases), attn_sub_norm, q_gain [n_head, 1]
    and (read when the spec says) attn_sinks [n_head] and attn_rel_bias [n_head, 2c + 1]."""
    qkv = ops.linear(h, w.qkv)
    if spec.clamp:
        qkv = ops.clamp_(qkv, spec.clamp)
    gate = None
    k: A | None
    v: A | None
    if spec.shares_kv:
        # Queries only; the keys and values are the rows the source layer wrote, this step's
        # included (its slot is this layer's, read-only).
        T = h.shape[0]
        q = qkv.reshape(T, spec.n_head, spec.head_dim_k)
        q = optional_rms_norm_(ops, q, w.q_norm, spec.eps)
        if spec.rotates:
            q = ops.rope_(q, pos, rope)
        k = v = None
    else:
        q, k, v, gate = project_qkv(ops, spec, w, qkv, pos, rope)
    out = attend(ops, spec, w, q, k, v, pos, kv)
    if gate is not None:
        out = ops.sigmoid_mul_(out, gate)
    return ops.linear(optional_rms_norm_(ops, out, w.attn_sub_norm, spec.eps), w.wo)


def attend(
    ops: Ops[A],
    spec: AttentionSpec,
    w: Any,
    q: A,
    k: A | None,
    v: A | None,
    pos: Any,
    kv: Any,
) -> A:
    """The rows q [T, H, hk], k, v (None: a KV-sharing layer's) attended over the cache,
    per sequence of the step -> [T, H * hv]; w holds the sinks and the relative bias the
    spec reads."""
    call = AttentionCall(
        scale=spec.scale,
        window=spec.window,
        softcap=spec.softcap,
        alibi=spec.alibi,
        sinks=w.attn_sinks if spec.sinks else None,
        causal=spec.causal,
        chunk=spec.chunk,
        temperature=spec.temperature,
        bias=w.attn_rel_bias if spec.rel_bias else None,
    )

    def core(kv: Any, pos: Any, q: A, k: A | None, v: A | None) -> A:
        return ops.attention(q, k, v, kv, pos, call)

    return each_sequence(ops, kv, pos, core, q, k, v)


def project_qkv(
    ops: Ops[A], spec: AttentionSpec, w: Any, qkv: A, pos: Any, rope: Any
) -> tuple[A, A, A, A | None]:
    """The fused QKV rows -> q [T, H, hk], k [T, Hkv, hk], v [T, Hkv, hv] (normed and
    rotated as the spec says) and the output gate rows (or None)."""
    T = qkv.shape[0]
    H, Hkv, hk, hv = spec.n_head, spec.n_head_kv, spec.head_dim_k, spec.head_dim_v
    gated = spec.output_gate
    nq = (2 if gated else 1) * H * hk
    nk = Hkv * hk
    gate = None
    if spec.v_from_k:
        # V is the raw K projection, normed (weightless) into a new array before K is normed
        # and rotated in place.
        v = ops.rms_norm(qkv[:, nq : nq + nk].reshape(T, Hkv, hk), None, spec.eps)
    else:
        v = qkv[:, nq + nk :].reshape(T, Hkv, hv)
        if spec.v_norm:
            v = ops.rms_norm_(v, None, spec.eps)
    if not gated and w.q_norm is None:
        # q and k heads side by side in each row: one rotation covers both.
        qk = qkv[:, : nq + nk].reshape(T, H + Hkv, hk)
        if spec.rotates:
            qk = ops.rope_(qk, pos, rope)
        return qk[:, :H], qk[:, H:], v, gate
    q = qkv[:, :nq].reshape(T, H, nq // H)
    if gated:
        q, gate = q[..., :hk], q[..., hk:].reshape(T, H * hk)
    k = qkv[:, nq : nq + nk].reshape(T, Hkv, hk)
    if spec.full_qk_norm:
        q, k = _full_width_qk_norm(ops, spec, w, q, k)
    elif w.q_norm is not None:
        q = _head_norm(ops, q, w.q_norm, spec.eps)
        k = _head_norm(ops, k, w.k_norm, spec.eps)
    if spec.rotates:
        q = ops.rope_(q, pos, rope)
        k = ops.rope_(k, pos, rope)
    if w.q_gain is not None:
        # A per-head gain [H, 1], after the rotation. An RMS over a whole head (rope_dim ==
        # head_dim) commutes with the rotation, so the norm before it is the same arithmetic.
        q = q * w.q_gain
    return q, k, v, gate


def _head_norm(ops: Ops[A], x: A, weight: A, eps: float) -> A:
    """x [T, heads, hd] RMS-normed per head: one weight [hd] for every head, or each head
    its own ([heads, hd]), applied after the weightless norm."""
    if len(weight.shape) == 2:
        return ops.rms_norm_(x, None, eps) * weight
    return ops.rms_norm_(x, weight, eps)


def _full_width_qk_norm(ops: Ops[A], spec: AttentionSpec, w: Any, q: A, k: A) -> tuple[A, A]:
    """q [T, H, hd] and k [T, Hkv, hd] each normalized over all their heads at once (one
    norm per row of the whole projection), before the split into heads is used."""
    T, H, hd = q.shape
    Hkv = k.shape[1]
    ln = spec.full_qk_layer_norm
    q = norm(ops, ln, q.reshape(T, H * hd), w.q_norm, w.q_norm_b, spec.eps).reshape(T, H, hd)
    k = norm(ops, ln, k.reshape(T, Hkv * hd), w.k_norm, w.k_norm_b, spec.eps)
    return q, k.reshape(T, Hkv, hd)
