"""The decoder layer, composed ONCE over the Ops interface (graph/ops.py).

Why one composition: the host body, the MLX graph and the CuPy stack all run this code
with their own ops, so a decoration written here is carried everywhere at once, and a
backend that cannot run it refuses it by name (its eligibility) rather than drop it.

A layer is llama.cpp's pre-norm block with the decorations each architecture switches on
(ModelConfig fields; `shape` = cfg.layer_shape(l)):

    h = norm(x);  a = mixer(h)                      attention (GQA), gated delta net, mamba
                                                    or mamba2, LFM2's short conv;
                                                    "attention+mamba2": attention(h) +
                                                    mamba2(h) (falcon-h1)
                                                    (no_pre_norm: h = x, no norm);
                                                    "linear": a = wo(h); "none": no branch
    a = post_attn_norm(a) * residual_scale;  x = x + a
    h = norm(x);  f = ffn(h)                        dense gated FFN or sparse MoE
    f = post_ffn_norm(f) * residual_scale;   x = x + f   (ffn "none": no branch)

The layer's weights object has the fields of model.weights.LayerWeights, each held the
way the backend's ops read it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..model.config import LayerShape, ModelConfig
from .ops import Array, Ops


@dataclass(frozen=True)
class SeqRows:
    """One sequence's share of a multi-sequence step, as each_sequence reads it: its layer
    state (a host cache slot, a backend's device state), its positions (the backend's `pos`
    for it), and its rows [start, stop) of the step."""

    kv: Any
    pos: Any
    start: int
    stop: int


class BatchSlot:
    """Layer l's state over a multi-sequence step: the `kv` the composition is given (the
    host's from cache.SeqBatch, a backend's from its device state)."""

    def __init__(self, sequences: list[SeqRows]) -> None:
        self.sequences = sequences


def each_sequence(
    ops: Ops, kv: Any, pos: Any, core: Callable[..., Array], *rows: Array | None
) -> Array:
    """core(kv, pos, *rows) -> its output rows: a mixer's part that reads or writes the
    sequence's history (K/V rows, recurrent state). Over a multi-sequence step (a
    BatchSlot) it runs once per sequence, on that sequence's
    rows, slot and positions, and the outputs are stacked back in row order; everything
    row-wise around it (the linears) runs over all the step's rows at once. A None row
    argument (a KV-sharing layer's k and v) passes as None."""
    seqs = getattr(kv, "sequences", None)
    if seqs is None:
        return core(kv, pos, *rows)
    outs = [
        core(s.kv, s.pos, *(None if r is None else r[s.start : s.stop] for r in rows)) for s in seqs
    ]
    return outs[0] if len(outs) == 1 else ops.concat(outs, axis=0)


def scale_embeddings(ops: Ops, cfg: ModelConfig, x: Array) -> Array:
    """The looked-up embedding rows x [T, n_embd] (ours to overwrite) -> the residual stream."""
    if cfg.embd_scale is not None:
        x = ops.scale_(x, cfg.embd_scale)
    return x


def layer(
    ops: Ops, cfg: ModelConfig, shape: LayerShape, w: Any, x: Array, pos: Any, kv: Any, rope: Any
) -> Array:
    """x [T, residual_width] (left as it was) -> the layer's output rows, a new array (x
    itself from a layer with neither branch: deci's no-op layer)."""
    # The side stream (talkie's skip stream, gemma4's per-layer inputs) rides beside the
    # residual stream in the columns after n_embd, unchanged from layer to layer.
    side = None
    if cfg.residual_width != cfg.n_embd:
        x, side = x[:, : cfg.n_embd], x[:, cfg.n_embd :]
    # x_ours: x is an array this layer made (so the FFN's residual add may overwrite it).
    # An attention-free layer (mixer "none", deci) has no branch: x passes on unnormed.
    x_ours = shape.mixer != "none"
    if x_ours:
        h = x if cfg.no_pre_norm else _norm(ops, cfg, x, w.attn_norm, w.attn_norm_b)
        if shape.mixer == "gdn":
            a = gdn_block(ops, cfg, w.gdn, h, kv)
        elif shape.mixer == "mamba":
            a = mamba_block(ops, cfg, w.mamba, h, kv)
        elif shape.mixer == "shortconv":
            a = shortconv_block(ops, cfg, w.shortconv, h, kv)
        elif shape.mixer == "mamba2":
            a = mamba2_block(ops, cfg, w.mamba2, h, kv)
        elif shape.mixer == "attention+mamba2":
            # falcon-h1: both mixers read the same normed rows; the slot holds the K/V rows
            # and the mamba state side by side (its multipliers are in the weights).
            a = attention_block(ops, cfg, shape, w, h, pos, kv, rope)
            a = ops.add_(_proj_scale(a, w.wo_scale), mamba2_block(ops, cfg, w.mamba2, h, kv))
        elif shape.mixer == "linear":
            # deci's "linear attention": wo on the normed input, nothing attends.
            a = ops.linear(h, w.wo)
        else:
            a = _proj_scale(attention_block(ops, cfg, shape, w, h, pos, kv, rope), w.wo_scale)
        # a is ours: adding x into it leaves the caller's x as it was.
        x = ops.add_(_branch_out(ops, cfg, a, w.post_attn_norm), x)
    if shape.ffn == "none":
        # An FFN-free layer (deci): its output is the attention branch's sum (or, with
        # no attention either, its input unchanged).
        out = x
    else:
        # Without a pre-norm the FFN reads x, which the residual add below then overwrites:
        # the FFN's output is a new array by then, so x is read before it is written.
        h = x if cfg.no_pre_norm else _norm(ops, cfg, x, w.ffn_norm, w.ffn_norm_b)
        if shape.ffn == "moe":
            f = moe_block(ops, cfg, w.moe, h)
        elif shape.ffn == "dense+moe":
            f = dense_and_experts_block(ops, cfg, w, x, h)
        elif cfg.plain_ffn:
            f = plain_ffn_block(ops, cfg, w, h)
        else:
            f = ffn_block(ops, cfg, w, h)
        f = _branch_out(ops, cfg, _proj_scale(f, w.down_scale), w.post_ffn_norm)
        # The sum into whichever of the two is ours (the caller's x is left as it was).
        out = ops.add_(x, f) if x_ours else ops.add_(f, x)
    if cfg.embd_skip:
        # talkie: the normed embedding times this layer's scale [1] joins the layer's output
        # (llama.cpp's talkie.cpp: after the FFN's residual add).
        out = ops.add_(out, side * w.skip_scale)
    if shape.per_layer_input is not None:
        out = per_layer_input_block(ops, cfg, shape.per_layer_input, w, out, side)
    if w.out_scale is not None:
        out = out * w.out_scale  # gemma4's layer_output_scale [1]
    return out if side is None else ops.concat([out, side])


def per_layer_input_block(
    ops: Ops, cfg: ModelConfig, i: int, w: Any, x: Array, side: Array
) -> Array:
    """gemma4's per-layer embedding, after the FFN's residual add (llama.cpp's gemma4.cpp,
    transformers' Gemma4TextDecoderLayer): x + post_norm(proj(act(gate(x)) * inp_i)), with
    inp_i layer i's n_embd_per_layer columns of the side stream (embed_per_layer). x is
    ours: the sum goes into it."""
    n = cfg.per_layer_embd
    g = ops.act(ops.linear(x, w.ple_gate), cfg.ffn_act) * side[:, i * n : (i + 1) * n]
    return ops.add_(x, ops.rms_norm_(ops.linear(g, w.ple_proj), w.ple_post_norm, cfg.norm_eps))


def embed_per_layer(
    ops: Ops, cfg: ModelConfig, rows: Array, proj: Any, proj_norm: Array, x: Array
) -> Array:
    """gemma4's per-layer inputs, once before the layers, beside the scaled embeddings x
    [T, n_embd] -> [T, n_embd + n_layer * n]: rows [T, n_layer * n] are the tokens'
    per_layer_token_embd rows; each layer's n columns are

        (rms_norm(proj . x / sqrt(n_embd)) + rows * sqrt(n)) / sqrt(2)

    (the norm per layer's n columns), as llama.cpp's project_per_layer_inputs and
    transformers' get_per_layer_inputs / project_per_layer_inputs compute them."""
    if not cfg.per_layer_embd:
        return x
    n, L, T = cfg.per_layer_embd, cfg.n_layer, x.shape[0]
    p = ops.scale_(ops.linear(x, proj), cfg.n_embd**-0.5)
    p = ops.rms_norm_(p.reshape(T, L, n), proj_norm, cfg.norm_eps).reshape(T, L * n)
    p = ops.add_(p, ops.scale_(rows, math.sqrt(n)))
    return ops.concat([x, ops.scale_(p, 0.5**0.5)])


def _proj_scale(y: Array, scale: Array | None) -> Array:
    """An output projection's per-tensor scale [1] (proj_scales), when the model has one."""
    return y if scale is None else y * scale


def embed_skip(ops: Ops, cfg: ModelConfig, w: Array | None, x: Array) -> Array:
    """talkie: the looked-up embeddings x [T, n_embd] RMS-normed (w: ones, weightless) start
    both the residual stream and the skip stream -> [T, 2*n_embd] rows [stream | skip]."""
    if cfg.embd_skip:
        x = ops.rms_norm(x, w, cfg.norm_eps)
        x = ops.concat([x, x])
    return x


def _norm(ops: Ops, cfg: ModelConfig, x: Array, w: Array, b: Array | None) -> Array:
    """The model's norm of x into a new array: LayerNorm (with its bias, if any) when
    cfg.layer_norm, else RMSNorm."""
    if cfg.layer_norm:
        return ops.layer_norm(x, w, b, cfg.norm_eps)
    return ops.rms_norm(x, w, cfg.norm_eps)


def embed_norm(ops: Ops, cfg: ModelConfig, w: Array | None, b: Array | None, x: Array) -> Array:
    """bloom's LayerNorm on the looked-up embeddings (token_embd_norm), when the model has it."""
    if cfg.embd_norm:
        x = ops.layer_norm(x, w, b, cfg.norm_eps)
    return x


def _branch_out(ops: Ops, cfg: ModelConfig, y: Array, post_norm: Array | None) -> Array:
    """A branch's output as it joins the residual stream: post-norm, then the multiplier."""
    if post_norm is not None:
        y = ops.rms_norm_(y, post_norm, cfg.norm_eps)
    if cfg.residual_scale is not None:
        y = ops.scale_(y, cfg.residual_scale)
    return y


def attention_block(
    ops: Ops, cfg: ModelConfig, shape: LayerShape, w: Any, h: Array, pos: Any, kv: Any, rope: Any
) -> Array:
    """Normed rows h [T, n_embd] -> attention output [T, n_embd] (after o_proj).

    The fused QKV rows are [q | k | v]; with an output gate each query head's rows are
    followed by its gate rows (how HF's q_proj and the GGUF lay them out). The rows are
    clipped to [-clamp_kqv, clamp_kqv] when the model says so (mpt). With ALiBi (bloom,
    mpt; llama.cpp's build_attn with max_alibi_bias) nothing rotates: each head's scores
    get -slope_h * (q pos - k pos) instead. With NoPE (no_rope) nothing rotates at all."""
    T = h.shape[0]
    H, hk = shape.n_head, shape.head_dim_k
    qkv = ops.linear(h, w.qkv)
    if cfg.clamp_kqv:
        qkv = ops.clamp_(qkv, cfg.clamp_kqv)
    rotates = cfg.alibi_bias is None and not cfg.no_rope
    gate = None
    k: Array | None
    v: Array | None
    if shape.kv_source is not None:
        # KV sharing (gemma4): queries only; the keys and values are the rows layer
        # kv_source wrote, this step's included (its slot is this layer's, read-only).
        q = ops.rms_norm_(qkv.reshape(T, H, hk), w.q_norm, cfg.norm_eps)
        if rotates:
            q = ops.rope_(q, pos, rope)
        k = v = None
    else:
        q, k, v, gate = _project_qkv(ops, cfg, shape, w, qkv, pos, rope, rotates)
    alibi = None if cfg.alibi_bias is None else cfg.alibi_slopes()
    sinks = w.attn_sinks if cfg.attn_sinks else None  # gpt-oss: [H] sink logits

    def attend(kv: Any, pos: Any, q: Array, k: Array, v: Array) -> Array:
        return ops.attention(
            q,
            k,
            v,
            kv,
            pos,
            shape.window,
            cfg.attn_scale,
            cfg.attn_logit_softcap,
            alibi=alibi,
            sinks=sinks,
        )

    out = each_sequence(ops, kv, pos, attend, q, k, v)
    if gate is not None:
        out = ops.sigmoid_mul_(out, gate)
    return ops.linear(_sub_norm(ops, cfg, out, w.attn_sub_norm), w.wo)


def _project_qkv(
    ops: Ops,
    cfg: ModelConfig,
    shape: LayerShape,
    w: Any,
    qkv: Array,
    pos: Any,
    rope: Any,
    rotates: bool,
) -> tuple[Array, Array, Array, Array | None]:
    """The fused QKV rows -> q [T, H, hk], k [T, Hkv, hk], v [T, Hkv, hv] (normed and
    rotated as the model says) and the output gate rows (or None)."""
    T = qkv.shape[0]
    H, Hkv, hk, hv = shape.n_head, shape.n_head_kv, shape.head_dim_k, shape.head_dim_v
    eps = cfg.norm_eps
    gated = cfg.attn_output_gate
    nq = (2 if gated else 1) * H * hk
    nk = Hkv * hk
    gate = None
    if shape.v_from_k:
        # gemma4's attention_k_eq_v: V is the raw K projection, normed (weightless) into a
        # new array before K is normed and rotated in place.
        v = ops.rms_norm(qkv[:, nq : nq + nk].reshape(T, Hkv, hk), None, eps)
    else:
        v = qkv[:, nq + nk :].reshape(T, Hkv, hv)
        if cfg.v_norm:
            v = ops.rms_norm_(v, None, eps)  # gemma4's v_norm: weightless, per head
    if not gated and w.q_norm is None:
        # q and k heads side by side in each row: one rotation covers both.
        qk = qkv[:, : nq + nk].reshape(T, H + Hkv, hk)
        if rotates:
            qk = ops.rope_(qk, pos, rope)
        q, k = qk[:, :H], qk[:, H:]
    else:
        q = qkv[:, :nq].reshape(T, H, nq // H)
        if gated:
            q, gate = q[..., :hk], q[..., hk:].reshape(T, H * hk)
        k = qkv[:, nq : nq + nk].reshape(T, Hkv, hk)
        if cfg.qk_norm_full:
            q, k = _full_width_qk_norm(ops, cfg, w, q, k)
        elif w.q_norm is not None:
            q = ops.rms_norm_(q, w.q_norm, eps)
            k = ops.rms_norm_(k, w.k_norm, eps)
        if rotates:
            q = ops.rope_(q, pos, rope)
            k = ops.rope_(k, pos, rope)
        if w.q_gain is not None:
            # talkie's per-head gain [H, 1], after the rotation as llama.cpp applies it
            # with its Q norm. llama.cpp norms after the rotation too; an RMS over a whole
            # head (rope_dim == head_dim) commutes with it: norming first is the same.
            q = q * w.q_gain
    return q, k, v, gate


def _sub_norm(ops: Ops, cfg: ModelConfig, y: Array, sub_norm: Array | None) -> Array:
    """BitNet's sub-norm: an RMSNorm on the rows a down projection reads (the attention
    output before o_proj, the gated activation before ffn_down), when the model has one."""
    if sub_norm is not None:
        y = ops.rms_norm_(y, sub_norm, cfg.norm_eps)
    return y


def plain_ffn_block(ops: Ops, cfg: ModelConfig, w: Any, h: Array) -> Array:
    """The plain (non-gated) FFN: down(act(up(h))) (starcoder2, bloom, mpt)."""
    return ops.linear(ops.act(ops.linear(h, w.up), cfg.ffn_act), w.down)


def _full_width_qk_norm(
    ops: Ops, cfg: ModelConfig, w: Any, q: Array, k: Array
) -> tuple[Array, Array]:
    """olmo2's and mpt's QK norm: q [T, H, hd] and k [T, Hkv, hd] each normalized over all
    their heads at once (one norm per row of the whole projection), weights [H*hd] and
    [Hkv*hd]: an RMSNorm (olmo2), or the model's LayerNorm with its biases (mpt's qk_ln);
    as llama.cpp's olmo2.cpp and mpt.cpp norm Qcur/Kcur before reshaping them into heads."""
    T, H, hd = q.shape
    Hkv = k.shape[1]
    q = _norm(ops, cfg, q.reshape(T, H * hd), w.q_norm, w.q_norm_b).reshape(T, H, hd)
    k = _norm(ops, cfg, k.reshape(T, Hkv * hd), w.k_norm, w.k_norm_b).reshape(T, Hkv, hd)
    return q, k


def ffn_block(ops: Ops, cfg: ModelConfig, w: Any, h: Array) -> Array:
    """The dense gated FFN: down(act(gate(h)) * up(h)), gate/up fused into one matrix."""
    g = ops.glu(ops.linear(h, w.gate_up), cfg.ffn_act)
    return ops.linear(_sub_norm(ops, cfg, g, w.ffn_sub_norm), w.down)


def moe_block(ops: Ops, cfg: ModelConfig, w: Any, h: Array) -> Array:
    """The sparse MoE FFN: softmax (or sigmoid: lfm2moe) router, top k (over probabilities
    plus the expert bias, when the model has one), the chosen weights renormalized when
    norm_topk and multiplied by weights_scale; each chosen expert's gated FFN weighted by
    its weight; plus the shared expert, scaled by sigmoid(its gate row) when shared_gate.
    Same arithmetic as llama.cpp's build_moe_ffn with softmax or sigmoid gating and
    exp_probs_b.

    w.inp fuses everything that reads h: the router rows, then (with a gated shared
    expert) its gate row, then the shared expert's gate/up rows."""
    m = cfg.moe
    assert m is not None  # compose_layer comes here only for a layer whose ffn is "moe"
    E = m.n_expert
    r = ops.linear(h, w.inp)
    ids, weights = ops.route(r[:, :E], m.n_expert_used, m.norm_topk, m.gating, w.probs_b)
    if m.weights_scale != 1.0:
        weights = ops.scale_(weights, m.weights_scale)
    out = ops.experts(h, ids, weights, w, cfg.ffn_act)
    if w.down_shexp is not None:
        first = E + 1 if m.shared_gate else E
        shared = ops.linear(ops.glu(r[:, first:], cfg.ffn_act), w.down_shexp)
        if m.shared_gate:
            shared = ops.sigmoid_mul_(shared, r[:, E : E + 1])
        out = ops.add_(out, shared)
    return out


def dense_and_experts_block(ops: Ops, cfg: ModelConfig, w: Any, x: Array, h: Array) -> Array:
    """gemma4's MoE layer FFN (llama.cpp's gemma4.cpp, transformers' Gemma4TextDecoderLayer
    with enable_moe_block): the dense FFN on h = ffn_norm(x), post-normed, plus the experts
    on pre_norm_2(x), post-normed; the router reads rms_norm(x) * scale / sqrt(n_embd)
    (folded into one norm weight at load); softmax over the experts, top k, renormalized,
    each weight times its expert's scale. x: the residual rows (left as they are)."""
    m, e, eps = cfg.moe, w.moe, cfg.norm_eps
    assert m is not None  # compose_layer comes here only for a layer whose ffn is "dense+moe"
    dense = ops.rms_norm_(ffn_block(ops, cfg, w, h), e.dense_post_norm, eps)
    r = ops.linear(ops.rms_norm(x, e.router_norm, eps), e.inp)
    ids, weights = ops.route(r, m.n_expert_used, m.norm_topk, m.gating, None)
    weights = weights * e.expert_scale[ids]
    routed = ops.experts(ops.rms_norm(x, e.pre_norm, eps), ids, weights, e, cfg.ffn_act)
    return ops.add_(dense, ops.rms_norm_(routed, e.post_norm, eps))


def gdn_block(ops: Ops, cfg: ModelConfig, w: Any, h: Array, slot: Any) -> Array:
    """The gated delta net (qwen35, qwen3next linear attention), per token t and value head:

        q, k, v = split(silu(conv(W_qkv h)));  q, k L2-normalized, q scaled by 1/sqrt(hd_k)
        beta = sigmoid(W_b h);  g = -exp(A_log) * softplus(W_a h + dt_bias)   (log decay)
        S = exp(g) S;  S += k (beta (v - S^T k))^T;  o = S^T q
        out = W_out (rmsnorm(o) * silu(W_z h))

    as transformers' Qwen3_5GatedDeltaNet and llama.cpp's delta-net-base.cpp compute it.
    The slot holds the conv tail and delta state; the new ones are staged on it.
    w.in_proj rows: the conv input (q, k: n_k heads each, v: n_v heads), z, beta, alpha."""
    g_cfg = cfg.gdn
    assert g_cfg is not None  # compose_layer comes here only for a layer whose mixer is "gdn"
    T = h.shape[0]
    n_k, n_v, hk, hv = g_cfg.n_k_heads, g_cfg.n_v_heads, g_cfg.head_dim_k, g_cfg.head_dim_v
    key_dim, conv_dim, value_dim = n_k * hk, g_cfg.conv_dim, n_v * hv
    eps = cfg.norm_eps

    proj = ops.linear(h, w.in_proj)
    z = proj[:, conv_dim : conv_dim + value_dim].reshape(T, n_v, hv)
    b = proj[:, conv_dim + value_dim : conv_dim + value_dim + n_v]
    a = proj[:, conv_dim + value_dim + n_v :]

    beta = ops.sigmoid(b)
    g = w.a * ops.softplus(a + w.dt_bias)

    def recur(slot: Any, _pos: Any, conv_in: Array, g: Array, beta: Array) -> Array:
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


def mamba_block(ops: Ops, cfg: ModelConfig, w: Any, h: Array, slot: Any) -> Array:
    """Mamba-1's selective state-space mixer (llama.cpp's build_mamba_layer, transformers'
    MambaMixer), over normed rows h [T, n_embd]:

        x, z = split(W_in h);  x = silu(conv(x) + conv_b)        causal depthwise conv
        dt, B, C = split(W_x x)      (Falcon-Mamba: each RMS-normed, ssm.dt_b_c_rms)
        dt = softplus(W_dt dt + dt_bias)
        h = exp(dt A) h + dt x B;  y = C.h + D x                 per channel (selective_scan)
        out = W_out (y * silu(z))

    The slot holds the conv tail and the scan state [d_inner, d_state]; the new ones are
    staged on it."""
    m = cfg.mamba
    assert m is not None  # compose_layer comes here only for a layer whose mixer is "mamba"
    di, ds, r, eps = m.d_inner, m.d_state, m.dt_rank, cfg.norm_eps
    xz = ops.linear(h, w.in_proj)

    def scan(slot: Any, _pos: Any, xz: Array) -> Array:
        tail, state = slot.recurrent_state()
        x, new_tail = ops.causal_conv(xz[:, :di], tail, w.conv)
        x = ops.act(ops.add_(x, w.conv_b), "silu")
        dbc = ops.linear(x, w.x_proj)
        dt, b, c = dbc[:, :r], dbc[:, r : r + ds], dbc[:, r + ds :]
        if w.dt_norm is not None:
            dt = ops.rms_norm(dt, w.dt_norm, eps)
            b = ops.rms_norm(b, w.b_norm, eps)
            c = ops.rms_norm(c, w.c_norm, eps)
        dt = ops.softplus(ops.linear(dt, w.dt_proj))
        y, new_state = ops.selective_scan(x, dt, w.a, b[:, None], c[:, None], state)
        slot.set_recurrent_state(new_tail, new_state)
        return ops.add_(y, x * w.d) * ops.act(xz[:, di:], "silu")

    return ops.linear(each_sequence(ops, slot, None, scan, xz), w.out)


def shortconv_block(ops: Ops, cfg: ModelConfig, w: Any, h: Array, slot: Any) -> Array:
    """LFM2's gated short convolution (llama.cpp's build_shortconv_block, transformers'
    Lfm2ShortConv), over normed rows h [T, n_embd]:

        B, C, x = split(W_in h);  y = C * conv(B * x);  out = W_out y

    conv: causal and depthwise over L_cache taps, no bias. The slot holds the conv tail (the
    last L_cache - 1 rows of B * x) and an empty second state; the new tail is staged on it."""
    d = cfg.n_embd
    bcx = ops.linear(h, w.in_proj)

    def conv(slot: Any, _pos: Any, bx: Array) -> Array:
        tail, state = slot.recurrent_state()
        y, new_tail = ops.causal_conv(bx, tail, w.conv)
        slot.set_recurrent_state(new_tail, state)
        return y

    y = each_sequence(ops, slot, None, conv, bcx[:, :d] * bcx[:, 2 * d :])
    return ops.linear(bcx[:, d : 2 * d] * y, w.out)


def mamba2_block(ops: Ops, cfg: ModelConfig, w: Any, h: Array, slot: Any) -> Array:
    """Mamba-2's SSD mixer (llama.cpp's build_mamba2_layer, transformers' Mamba2Mixer), over
    normed rows h [T, n_embd], with n_head heads of head_dim channels and G groups:

        z, xBC, dt = split(W_in h);  xBC = silu(conv(xBC) + conv_b)   causal depthwise conv
        x, B, C = split(xBC)            B, C [G, d_state] per token: head h reads group
                                        h // (n_head / G)
        dt = softplus(dt + dt_bias);  A = -exp(A_log)                 one each per head
        h = exp(dt A) h + dt x B;  y = C.h + D x      per head, state [head_dim, d_state]
        out = W_out (rmsnorm_per_group(y * silu(z)) * norm_w)

    The scan is Mamba-1's primitive with each head's dt and A repeated over its channels.
    The slot holds the conv tail and the scan state [d_inner, d_state]; the new ones are
    staged on it."""
    m = cfg.mamba
    assert m is not None and m.version2  # compose_layer comes here only for mixer "mamba2"
    di, ds, G, T = m.d_inner, m.d_state, m.n_group, h.shape[0]
    conv_dim = m.conv_dim
    proj = ops.linear(h, w.in_proj)
    head_dim = di // m.dt_rank
    heads = ops.index(tuple(i // head_dim for i in range(di)))  # each channel's head
    dt = ops.softplus(ops.add_(proj[:, di + conv_dim :], w.dt_bias))[:, heads]

    def scan(slot: Any, _pos: Any, conv_in: Array, dt: Array) -> Array:
        t = conv_in.shape[0]
        tail, state = slot.recurrent_state()
        xbc, new_tail = ops.causal_conv(conv_in, tail, w.conv)
        xbc = ops.act(ops.add_(xbc, w.conv_b), "silu")
        x = xbc[:, :di]
        b = xbc[:, di : di + G * ds].reshape(t, G, ds)
        c = xbc[:, di + G * ds :].reshape(t, G, ds)
        y, new_state = ops.selective_scan(x, dt, w.a[heads][:, None], b, c, state)
        slot.set_recurrent_state(new_tail, new_state)
        return ops.add_(y, x * w.d[heads])

    y = each_sequence(ops, slot, None, scan, proj[:, di : di + conv_dim], dt)
    y = y * ops.act(proj[:, :di], "silu")
    if w.norm is not None:  # falcon-h1 may have none (mamba_rms_norm false): y * silu(z)
        y = (ops.rms_norm_(y.reshape(T, G, di // G), None, cfg.norm_eps) * w.norm).reshape(T, di)
    return ops.linear(y, w.out)


def lm_head(
    ops: Ops,
    cfg: ModelConfig,
    output_norm: Array,
    output: Any,
    x: Array,
    output_norm_b: Array | None = None,
) -> Array:
    """Final norm (a LayerNorm with its bias when cfg.layer_norm), output projection, then
    the logit decorations: divided by logit_scale (granite), softcapped (gemma). With a
    side stream (embd_skip, per_layer_embd) the rows' first n_embd columns are the residual
    stream."""
    if cfg.residual_width != cfg.n_embd:
        x = x[:, : cfg.n_embd]
    logits = ops.linear(_norm(ops, cfg, x, output_norm, output_norm_b), output)
    if cfg.logit_scale is not None:
        logits = ops.scale_(logits, 1.0 / cfg.logit_scale)
    if cfg.final_logit_softcap:
        logits = ops.softcap_(logits, cfg.final_logit_softcap)
    return logits
