"""The dense decoder layer as an MLX graph, mirroring the host body's semantics.

These functions only build lazy MLX expressions; the backend traces a whole run of
layers (and the lm head) through them with mx.compile and evaluates it once. K/V live in
fixed-capacity mirrors, written with slice_update at a position held in an array, and the
attention mask is computed in the graph from the positions, so one traced graph serves
every decode step up to the mirror's capacity without retracing.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from ...model.config import ModelConfig


@dataclass
class DeviceLinear:
    """[out, in] weight: dense (w) or MLX-affine quantized (w packed, scales, biases), or
    (parts) a fused linear whose source tensors differ in type: each part holds a run of
    source tensors of one type by that type's rule, and their outputs concatenate along the last axis in the host's
    fused row order, so a Q4_K q/k beside a Q6_K v keeps q/k quantized."""

    w: mx.array | None
    scales: mx.array | None = None
    biases: mx.array | None = None
    bits: int = 0
    bias: mx.array | None = None  # the layer's additive bias, not the quantization bias
    parts: tuple[DeviceLinear, ...] = ()

    def __call__(self, x: mx.array) -> mx.array:
        if self.parts:
            y = mx.concatenate([p(x) for p in self.parts], axis=-1)
        elif self.scales is not None:
            y = mx.quantized_matmul(x, self.w, self.scales, self.biases, transpose=True, group_size=32, bits=self.bits)
        else:
            y = x @ self.w.T
        return y + self.bias if self.bias is not None else y


@dataclass
class DeviceGdn:
    in_proj: DeviceLinear  # [conv_dim + value_dim + 2 n_v, d]: conv input, z, beta, alpha
    conv: mx.array  # [conv_dim, kernel], oldest tap first
    a: mx.array  # [n_v] -exp(A_log)
    dt_bias: mx.array  # [n_v]
    norm: mx.array  # [hd_v]
    out: DeviceLinear
    heads: mx.array  # [n_v] the key head each value head reads


@dataclass
class DeviceExperts:
    """A resident stack of expert matrices [E, out, in]: dense (w), or MLX-affine quantized
    (w packed [E, out, in*bits/32], scales and biases [E, out, in/32]).

    Called with rows x [..., 1, in] and the expert each row goes to, ids [...], it returns
    [..., 1, out] through gather_mm / gather_qmm, which read the chosen experts' weights
    where they lie: nothing of the stack is copied per token. A dense f16/bf16 stack takes
    its rows in its own type, since a mixed-type gather_mm would first promote the whole
    stack to f32 on every call."""

    w: mx.array
    scales: mx.array | None = None
    biases: mx.array | None = None
    bits: int = 0

    def __call__(self, x: mx.array, ids: mx.array, sorted_ids: bool) -> mx.array:
        if self.scales is not None:
            return mx.gather_qmm(x, self.w, self.scales, self.biases, rhs_indices=ids, transpose=True,
                                 group_size=32, bits=self.bits, sorted_indices=sorted_ids)
        wt = self.w.swapaxes(-1, -2)  # a transposed view, as matmul's w.T
        if self.w.dtype != mx.float32:
            y = mx.gather_mm(x.astype(self.w.dtype), wt, rhs_indices=ids, sorted_indices=sorted_ids)
            return y.astype(mx.float32)
        return mx.gather_mm(x, wt, rhs_indices=ids, sorted_indices=sorted_ids)


@dataclass
class DeviceMoe:
    # Router rows, then (with a shared expert) its gate row. The shared expert's gate/up
    # rows, fused with these on the host, are their own linear here, so a quantized shared
    # expert stays quantized beside an f32 router (llama.cpp files keep routers in f32).
    router: DeviceLinear
    gate_up_exps: list[DeviceExperts]  # [E, 2 ff, d] as one stack, or gate then up stacks
    down_exps: DeviceExperts  # [E, d, ff]
    gate_up_shexp: DeviceLinear | None  # [2 ff_sh, d]
    down_shexp: DeviceLinear | None  # [d, ff_sh]


# Routed rows (tokens x top-k) from which a prefill sorts them by expert before the gathered
# matmuls, so each expert's weights are read once for all its rows (mlx-lm's threshold). A
# decode token's k rows go unsorted.
SORT_MIN_ROWS = 64


@dataclass
class DeviceLayer:
    mixer: str  # "attention" | "gdn"
    ffn: str  # "dense" | "moe"
    attn_norm: mx.array
    qkv: DeviceLinear | None
    q_norm: mx.array | None
    k_norm: mx.array | None
    wo: DeviceLinear
    post_attn_norm: mx.array | None
    ffn_norm: mx.array
    gate_up: DeviceLinear
    down: DeviceLinear
    post_ffn_norm: mx.array | None
    rope_base: float
    rope_scale: float
    window: int | None
    gdn: DeviceGdn | None = None
    moe: DeviceMoe | None = None


def _act(name: str, x: mx.array) -> mx.array:
    if name == "silu":
        return x * mx.sigmoid(x)
    # gelu with the tanh approximation, as the host body computes it
    return 0.5 * x * (1.0 + mx.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


def attention_mask(positions: mx.array, capacity: int, window: int | None) -> mx.array:
    kv = mx.arange(capacity)[None, :]
    p = positions[:, None]
    visible = kv <= p
    if window is not None:
        visible = visible & (p - kv < window)
    return mx.where(visible, mx.array(0.0, mx.float32), mx.array(-mx.inf, mx.float32))


def _glu(act: str, h: mx.array) -> mx.array:
    n = h.shape[-1] // 2
    return _act(act, h[..., :n]) * h[..., n:]


def _attention(cfg, w: DeviceLayer, h, positions, start, k_cache, v_cache, rope_freqs):
    T = h.shape[0]
    H, Hkv, hk, hv = cfg.n_head, cfg.n_head_kv, cfg.head_dim_k, cfg.head_dim_v
    eps = cfg.norm_eps
    qkv = w.qkv(h)
    nq = 2 * H * hk if cfg.attn_output_gate else H * hk
    q = qkv[:, :nq].reshape(T, H, nq // H)
    gate = None
    if cfg.attn_output_gate:
        q, gate = q[..., :hk], q[..., hk:].reshape(T, H * hk)
    k = qkv[:, nq : nq + Hkv * hk].reshape(T, Hkv, hk)
    v = qkv[:, nq + Hkv * hk :].reshape(T, Hkv, hv)
    if w.q_norm is not None:
        q = mx.fast.rms_norm(q, w.q_norm, eps)
        k = mx.fast.rms_norm(k, w.k_norm, eps)
    q = q.transpose(1, 0, 2)[None]  # [1, H, T, hk]
    k = k.transpose(1, 0, 2)[None]
    v = v.transpose(1, 0, 2)[None]
    traditional = cfg.rope_type == "norm"
    base = None if rope_freqs is not None else w.rope_base
    q = mx.fast.rope(q, cfg.rope_dim, traditional=traditional, base=base, scale=w.rope_scale, offset=start, freqs=rope_freqs)
    k = mx.fast.rope(k, cfg.rope_dim, traditional=traditional, base=base, scale=w.rope_scale, offset=start, freqs=rope_freqs)
    k_cache = mx.slice_update(k_cache, k, start.reshape(1), axes=(2,))
    v_cache = mx.slice_update(v_cache, v, start.reshape(1), axes=(2,))
    mask = attention_mask(positions, k_cache.shape[2], w.window)
    o = mx.fast.scaled_dot_product_attention(q, k_cache, v_cache, scale=cfg.attn_scale, mask=mask)
    o = o[0].transpose(1, 0, 2).reshape(T, H * hv)
    if gate is not None:
        o = o * mx.sigmoid(gate)
    return w.wo(o), k_cache, v_cache, k[0], v[0]


def _gdn(cfg, g: DeviceGdn, h, conv_tail, state):
    """The gated delta net, the per-token (step) form for every row; returns (out, tail, state)."""
    T = h.shape[0]
    n_k, n_v, hk, hv = cfg.gdn.n_k_heads, cfg.gdn.n_v_heads, cfg.gdn.head_dim_k, cfg.gdn.head_dim_v
    key_dim, conv_dim, value_dim = n_k * hk, cfg.gdn.conv_dim, n_v * hv
    proj = g.in_proj(h)
    mixed = proj[:, :conv_dim]
    z = proj[:, conv_dim : conv_dim + value_dim].reshape(T, n_v, hv)
    b = proj[:, conv_dim + value_dim : conv_dim + value_dim + n_v]
    a = proj[:, conv_dim + value_dim + n_v :]
    K = g.conv.shape[1]
    xin = mx.concatenate([conv_tail, mixed])
    c = xin[:T] * g.conv[:, 0]
    for j in range(1, K):
        c = c + xin[j : j + T] * g.conv[:, j]
    new_tail = xin[T:]
    c = c * mx.sigmoid(c)

    def l2(x):
        return x * mx.rsqrt((x * x).sum(axis=-1, keepdims=True) + cfg.norm_eps)

    q = l2(c[:, :key_dim].reshape(T, n_k, hk)) * (1.0 / hk**0.5)
    k = l2(c[:, key_dim : 2 * key_dim].reshape(T, n_k, hk))
    q, k = q[:, g.heads], k[:, g.heads]
    v = c[:, 2 * key_dim :].reshape(T, n_v, hv)
    beta = mx.sigmoid(b)
    decay = mx.exp(g.a * mx.logaddexp(mx.zeros_like(a), a + g.dt_bias))  # exp(g), g <= 0
    outs = []
    s = state
    for t in range(T):
        s = s * decay[t][:, None, None]
        kt = k[t][:, None, :]  # [n_v, 1, dk]
        delta = (v[t] - (kt @ s)[:, 0]) * beta[t][:, None]
        s = s + kt.transpose(0, 2, 1) * delta[:, None, :]
        outs.append((q[t][:, None, :] @ s)[:, 0])
    o = mx.stack(outs)  # [T, n_v, hv]
    o = mx.fast.rms_norm(o, g.norm, cfg.norm_eps) * (z * mx.sigmoid(z))
    return g.out(o.reshape(T, value_dim)), new_tail, s


def _moe(cfg, m: DeviceMoe, h):
    """The host body's moe_ffn (graph/moe.py): softmax router, top k, optional renormalisation,
    each chosen expert's gated FFN weighted by its probability, plus the sigmoid-gated shared
    expert. Each (row, chosen expert) pair is one gathered matvec on the resident stacks."""
    E, k = cfg.moe.n_expert, cfg.moe.n_expert_used
    T, d = h.shape
    r = m.router(h)
    p = mx.softmax(r[:, :E], axis=-1)
    ids = mx.argsort(-p, axis=-1)[:, :k]  # [T, k]
    wts = mx.take_along_axis(p, ids, axis=-1)
    if cfg.moe.norm_topk:
        wts = wts / wts.sum(axis=-1, keepdims=True)
    sort = T * k >= SORT_MIN_ROWS
    if sort:
        flat = ids.reshape(-1)
        order = mx.argsort(flat)
        x, idx = h[order // k][:, None, :], flat[order]  # [T k, 1, d] grouped by expert
    else:
        x, idx = h[:, None, None, :], ids  # [T, 1, 1, d] against [T, k]: broadcast over k
    parts = [g(x, idx, sort) for g in m.gate_up_exps]
    gu = parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=-1)
    y = m.down_exps(_glu(cfg.ffn_act, gu), idx, sort)
    if sort:
        y = y[mx.argsort(order)]  # back to (row, rank) order
    y = y.reshape(T, k, d)
    out = (y * wts[..., None]).sum(axis=1)
    if m.down_shexp is not None:
        gate = r[:, E : E + 1]
        out = out + m.down_shexp(_glu(cfg.ffn_act, m.gate_up_shexp(h))) * mx.sigmoid(gate)
    return out


def layer(cfg: ModelConfig, w: DeviceLayer, x: mx.array, positions: mx.array, start: mx.array, state_a: mx.array, state_b: mx.array, rope_freqs: mx.array | None):
    """x [T, d] -> (x', new state_a, new state_b, rows_a, rows_b). The state pair is the
    layer's K/V mirror for attention (rows: the new K/V rows [Hkv, T, hd]) and its conv
    tail and delta state for a gated delta net (rows: the new tail and state themselves)."""
    eps = cfg.norm_eps
    h = mx.fast.rms_norm(x, w.attn_norm, eps)
    if w.mixer == "gdn":
        a, state_a, state_b = _gdn(cfg, w.gdn, h, state_a, state_b)
        rows_a, rows_b = state_a, state_b
    else:
        a, state_a, state_b, rows_a, rows_b = _attention(cfg, w, h, positions, start, state_a, state_b, rope_freqs)
    if w.post_attn_norm is not None:
        a = mx.fast.rms_norm(a, w.post_attn_norm, eps)
    x = x + a
    h = mx.fast.rms_norm(x, w.ffn_norm, eps)
    f = _moe(cfg, w.moe, h) if w.ffn == "moe" else w.down(_glu(cfg.ffn_act, w.gate_up(h)))
    if w.post_ffn_norm is not None:
        f = mx.fast.rms_norm(f, w.post_ffn_norm, eps)
    return x + f, state_a, state_b, rows_a, rows_b


def head(cfg: ModelConfig, output_norm: mx.array, output: DeviceLinear, x: mx.array) -> mx.array:
    logits = output(mx.fast.rms_norm(x, output_norm, cfg.norm_eps))
    if cfg.final_logit_softcap:
        c = cfg.final_logit_softcap
        logits = c * mx.tanh(logits / c)
    return logits
