"""Rotary position embeddings in llama.cpp's two layouts.

"norm" rotates adjacent pairs (x[2i], x[2i+1]) — llama's GGUF layout, which is why the
converter permutes HF's Q/K rows; "neox" rotates halves (x[i], x[i + n/2]). Only the first
`dim` dims of a head rotate. The angle for pair i at position p is
p * scale * base^(-2i/dim) / factor_i. cos/sin tables are cached per position and grown
geometrically, so a decode step looks them up instead of computing them.

YaRN and LongRoPE (model.config.RopeScaling) change the per-pair frequencies and multiply
cos and sin by one factor; `rope_frequencies` is the ONE place that computes both, for the
host tables here, MLX's mx.fast.rope freqs and cuda's host-built tables.
"""

from __future__ import annotations

import math

import numpy as np

from ..model.config import ModelConfig, RopeScaling
from . import rowwise


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


class Rope:
    def __init__(
        self,
        dim: int,
        base: float,
        scale: float,
        layout: str,
        freq_factors: np.ndarray | None = None,
        scaling: RopeScaling | None = None,
    ) -> None:
        if layout not in ("norm", "neox"):
            raise ValueError(f"unknown rope layout {layout}")
        self.dim = dim
        self.layout = layout
        self._inv, self.mscale = rope_frequencies(dim, base, scale, freq_factors, scaling)
        self._cos = np.zeros((0, dim // 2), np.float32)
        self._sin = np.zeros((0, dim // 2), np.float32)
        # cos + i sin: "norm" rope is a complex multiply on adjacent pairs viewed as complex64.
        self._phase = np.zeros((0, dim // 2), np.complex64)

    def _grow(self, need: int) -> None:
        n = max(need, 2 * len(self._cos), 256)
        ang = np.arange(n, dtype=np.float64)[:, None] * self._inv[None, :]
        cos, sin = np.cos(ang), np.sin(ang)
        if self.mscale != 1.0:
            cos, sin = cos * self.mscale, sin * self.mscale
        self._cos, self._sin = cos.astype(np.float32), sin.astype(np.float32)
        self._phase = (self._cos + 1j * self._sin).astype(np.complex64)

    def _index(self, positions: np.ndarray) -> slice | np.ndarray:
        """Table rows for `positions`, grown to cover them. One sequence's positions are one
        ascending run, which a slice reads without a gather; a batch of sequences' rows is
        not (its first and last positions may still be T - 1 apart: [44, 46, 45, 47, 48]),
        so the run is checked whole."""
        p0, T = int(positions[0]), len(positions)
        index: slice | np.ndarray
        if int(positions[-1]) - p0 == T - 1 and (T < 3 or bool((np.diff(positions) == 1).all())):
            need, index = p0 + T, slice(p0, p0 + T)
        else:
            need, index = int(positions.max()) + 1, positions
        if need > len(self._cos):
            self._grow(need)
        return index

    def _tables(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        i = self._index(positions)
        return self._cos[i], self._sin[i]

    def apply(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """x: [T, heads, head_dim]; rotated in a new array."""
        out = x.copy()
        self.rotate_(out, positions)
        return out

    def rotate_(self, x: np.ndarray, positions: np.ndarray) -> None:
        """Rotate x [T, heads, head_dim] in place (a view into a larger buffer is fine)."""
        d = self.dim
        if rowwise.compiled():  # one pass in C, where it takes x
            self._index(positions)  # (the tables grown to cover them)
            if rowwise.rope(x, self._cos, self._sin, positions, self.layout == "neox"):
                return
        if self.layout == "norm" and x.strides[-1] == x.itemsize and x.dtype == np.float32:
            # One complex multiply instead of eight real ops and temporaries: the pairs
            # (x[2i], x[2i+1]) are the real and imaginary parts of a complex64.
            i = self._index(positions)
            xc = x[..., :d].view(np.complex64)
            xc *= self._phase[i][:, None, :]
            return
        cos, sin = self._tables(positions)
        cos, sin = cos[:, None, :], sin[:, None, :]
        if self.layout == "neox":
            a, b = x[..., : d // 2], x[..., d // 2 : d]
        else:
            a, b = x[..., 0:d:2], x[..., 1:d:2]
        a_sin = a * sin
        b_sin = b * sin
        a *= cos
        a -= b_sin
        b *= cos
        b += a_sin
