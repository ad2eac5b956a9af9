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
    """[out, in] weight: dense (w) or MLX-affine quantized (w packed, scales, biases)."""

    w: mx.array
    scales: mx.array | None = None
    biases: mx.array | None = None
    bits: int = 0
    bias: mx.array | None = None  # the layer's additive bias, not the quantization bias

    def __call__(self, x: mx.array) -> mx.array:
        if self.scales is not None:
            y = mx.quantized_matmul(x, self.w, self.scales, self.biases, transpose=True, group_size=32, bits=self.bits)
        else:
            y = x @ self.w.T
        return y + self.bias if self.bias is not None else y


@dataclass
class DeviceLayer:
    attn_norm: mx.array
    qkv: DeviceLinear
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


def layer(
    cfg: ModelConfig,
    w: DeviceLayer,
    x: mx.array,
    positions: mx.array,
    start: mx.array,
    k_cache: mx.array,
    v_cache: mx.array,
    rope_freqs: mx.array | None,
):
    """x [T, d] -> (x', new K mirror, new V mirror, k rows [Hkv, T, hk], v rows)."""
    T = x.shape[0]
    H, Hkv, hk, hv = cfg.n_head, cfg.n_head_kv, cfg.head_dim_k, cfg.head_dim_v
    eps = cfg.norm_eps
    h = mx.fast.rms_norm(x, w.attn_norm, eps)
    qkv = w.qkv(h)
    q = qkv[:, : H * hk].reshape(T, H, hk)
    k = qkv[:, H * hk : (H + Hkv) * hk].reshape(T, Hkv, hk)
    v = qkv[:, (H + Hkv) * hk :].reshape(T, Hkv, hv)
    if w.q_norm is not None:
        q = mx.fast.rms_norm(q, w.q_norm, eps)
        k = mx.fast.rms_norm(k, w.k_norm, eps)
    q = q.transpose(1, 0, 2)[None]  # [1, H, T, hk]
    k = k.transpose(1, 0, 2)[None]
    v = v.transpose(1, 0, 2)[None]
    traditional = cfg.rope_type == "norm"
    if rope_freqs is not None:
        q = mx.fast.rope(q, cfg.rope_dim, traditional=traditional, base=None, scale=w.rope_scale, offset=start, freqs=rope_freqs)
        k = mx.fast.rope(k, cfg.rope_dim, traditional=traditional, base=None, scale=w.rope_scale, offset=start, freqs=rope_freqs)
    else:
        q = mx.fast.rope(q, cfg.rope_dim, traditional=traditional, base=w.rope_base, scale=w.rope_scale, offset=start)
        k = mx.fast.rope(k, cfg.rope_dim, traditional=traditional, base=w.rope_base, scale=w.rope_scale, offset=start)
    k_cache = mx.slice_update(k_cache, k, start.reshape(1), axes=(2,))
    v_cache = mx.slice_update(v_cache, v, start.reshape(1), axes=(2,))
    mask = attention_mask(positions, k_cache.shape[2], w.window)
    o = mx.fast.scaled_dot_product_attention(q, k_cache, v_cache, scale=cfg.attn_scale, mask=mask)
    o = o[0].transpose(1, 0, 2).reshape(T, H * hv)
    a = w.wo(o)
    if w.post_attn_norm is not None:
        a = mx.fast.rms_norm(a, w.post_attn_norm, eps)
    x = x + a
    h = mx.fast.rms_norm(x, w.ffn_norm, eps)
    gu = w.gate_up(h)
    n_ff = gu.shape[1] // 2
    f = w.down(_act(cfg.ffn_act, gu[:, :n_ff]) * gu[:, n_ff:])
    if w.post_ffn_norm is not None:
        f = mx.fast.rms_norm(f, w.post_ffn_norm, eps)
    return x + f, k_cache, v_cache, k[0], v[0]


def head(cfg: ModelConfig, output_norm: mx.array, output: DeviceLinear, x: mx.array) -> mx.array:
    logits = output(mx.fast.rms_norm(x, output_norm, cfg.norm_eps))
    if cfg.final_logit_softcap:
        c = cfg.final_logit_softcap
        logits = c * mx.tanh(logits / c)
    return logits
