"""Rotary position embeddings in llama.cpp's two layouts: the frequency tables every
backend builds its rope from (the host's `Rope` is backends/host/rope.py).

"norm" rotates adjacent pairs (x[2i], x[2i+1]) — llama's GGUF layout, which is why the
converter permutes HF's Q/K rows; "neox" rotates halves (x[i], x[i + n/2]). Only the first
`dim` dims of a head rotate. The angle for pair i at position p is
p * scale * base^(-2i/dim) / factor_i. cos/sin tables are cached per position and grown
geometrically, so a decode step looks them up instead of computing them.

YaRN and LongRoPE (model.config.RopeScaling) change the per-pair frequencies and multiply
cos and sin by one factor; `rope_frequencies` is the ONE place that computes both, for the
host tables (backends/host/rope.py), MLX's mx.fast.rope freqs and cuda's host-built tables.
"""

from __future__ import annotations

import math

import numpy as np

from ..model.config import ModelConfig, RopeScaling


def yarn_corr_dims(
    dim: int, orig_ctx: int, base: float, beta_fast: float, beta_slow: float
) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims: the pair indices where the ramp from extrapolation (fast
    rotating pairs) to interpolation (slow ones) starts and ends."""

    def corr_dim(n_rot: float) -> float:
        return dim * math.log(orig_ctx / (n_rot * 2 * math.pi)) / (2 * math.log(base))

    start = math.floor(corr_dim(beta_fast))
    end = math.ceil(corr_dim(beta_slow))
    return max(0.0, start), min(dim - 1.0, end)


def rope_frequencies(
    dim: int,
    base: float,
    scale: float,
    freq_factors: np.ndarray | None,
    scaling: RopeScaling | None,
) -> tuple[np.ndarray, float]:
    """Per rotated pair i, the angle per position (float64, [dim/2]), and the factor cos and
    sin are multiplied by; ggml's rope_yarn (ggml-cpu ops.cpp) with llama.cpp's context
    parameters (llama-context.cpp).

    scale: the position multiplier of this layer (1/factor; 1 on sliding-window layers);
    freq_factors: per-pair divisors (llama3's rope_freqs, LongRoPE's long or short factors).
    YaRN (ext_factor != 0): theta = theta_extrap * ((1 - r) * scale + r) with
    r = ramp(i) * ext_factor, and the multiplier attn_factor * get_mscale(factor) -- llama.cpp
    divides its yarn_attn_factor by 1 + 0.1 ln(factor) and rope_yarn multiplies by
    1 + 0.1 ln(1/scale), which agree except on a layer whose scale is not 1/factor.
    transformers' _compute_yarn_parameters is the same blend in inverse-frequency space,
    with attention_factor = get_mscale(factor)."""
    inv = base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    if freq_factors is not None:
        inv = inv / freq_factors.astype(np.float64)
    if scaling is None:
        return inv * scale, 1.0
    mscale = scaling.attn_factor
    if scaling.ext_factor == 0.0:
        return inv * scale, mscale
    low, high = yarn_corr_dims(dim, scaling.orig_ctx, base, scaling.beta_fast, scaling.beta_slow)
    y = (np.arange(dim // 2, dtype=np.float64) - low) / max(0.001, high - low)
    ramp = (1.0 - np.clip(y, 0.0, 1.0)) * scaling.ext_factor
    inv = inv * (scale * (1.0 - ramp) + ramp)
    factor = scaling.factor
    get_mscale = 1.0 if factor <= 1.0 else 1.0 + 0.1 * math.log(factor)
    mscale *= get_mscale / (1.0 + 0.1 * math.log(factor)) * (1.0 + 0.1 * math.log(1.0 / scale))
    return inv, mscale


def rope_factors(
    cfg: ModelConfig,
    rope_freqs: np.ndarray | None,
    factors_long: np.ndarray | None,
    factors_short: np.ndarray | None,
    n_ctx: int,
) -> np.ndarray | None:
    """The per-pair divisors a context of n_ctx uses (llama_model::get_rope_factors):
    rope_freqs when the file has it, else LongRoPE's long factors beyond the original
    context and its short ones within it."""
    if rope_freqs is not None:
        return rope_freqs
    sc = cfg.rope_scaling
    if sc is None or sc.kind != "longrope":
        return None
    return factors_long if sc.long(n_ctx) else factors_short
