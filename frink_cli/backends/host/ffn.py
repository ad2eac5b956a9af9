"""The gated activations of the dense FFN and the experts: act(gate) * up over rows
[..., gate | up] (the fused gate/up projection's output), in NumPy."""

from __future__ import annotations

import numpy as np

from ...graph.ops import SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT
from . import rowwise

_SQRT_2_OVER_PI = np.float32(np.sqrt(2.0 / np.pi))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + np.float32(0.044715) * x * x * x)))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu(x: np.ndarray) -> np.ndarray:
    """x * Phi(x), with the exact (erf) normal CDF (the encoders' GELU). NumPy has no erf, so it is
    Abramowitz & Stegun 7.1.26 in float64 (absolute error below 1.5e-7: f32's own rounding
    at the values that matter), rounded to f32."""
    z = np.abs(x.astype(np.float64)) / np.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    erf = np.copysign(1.0 - poly * np.exp(-z * z), x)
    return (0.5 * x * (1.0 + erf)).astype(np.float32)


ACTIVATIONS = {"silu": silu, "gelu_tanh": gelu_tanh, "gelu": gelu}


def swiglu_oai(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """g * sigmoid(alpha g) * (u + 1) with g = min(gate, limit), u = clip(up, +-limit)."""
    limit = np.float32(SWIGLU_OAI_LIMIT)
    g = np.minimum(gate, limit)
    u = np.clip(up, -limit, limit)
    return g / (np.float32(1.0) + np.exp(np.float32(-SWIGLU_OAI_ALPHA) * g)) * (u + np.float32(1.0))


def glu(h: np.ndarray, act: str) -> np.ndarray:
    """act(gate) * up over rows [..., gate | up] (the fused gate/up projection's output)."""
    n_ff = h.shape[-1] // 2
    if act == "swiglu_oai":
        return swiglu_oai(h[..., :n_ff], h[..., n_ff:])
    return ACTIVATIONS[act](h[..., :n_ff]) * h[..., n_ff:]


def _silu_(x: np.ndarray) -> None:
    t = np.negative(x)
    np.exp(t, out=t)
    t += np.float32(1.0)
    x /= t


def _gelu_tanh_(x: np.ndarray) -> None:
    # 0.5 x (1 + tanh(c x (1 + 0.044715 x^2))): the same function, one temporary.
    t = np.square(x)
    t *= np.float32(0.044715)
    t += np.float32(1.0)
    t *= x
    t *= _SQRT_2_OVER_PI
    np.tanh(t, out=t)
    t += np.float32(1.0)
    t *= np.float32(0.5)
    x *= t


_ACTIVATIONS_INPLACE = {"silu": _silu_, "gelu_tanh": _gelu_tanh_}
# glu_'s rows per chunk (32 rows of a 2048-wide gate: 256 KiB, in L2 with its temporary).
_GLU_CHUNK_ROWS = 32


def glu_(h: np.ndarray, act: str) -> np.ndarray:
    """glu() with h as scratch: in one C pass into a new contiguous array where the
    compiled row-wise ops take h, else in NumPy written over the gate half of h, which is
    returned (a strided view BLAS reads as it is). A prefill's [T, 2*n_ff] rows are
    megabytes; not allocating them again per op is most of the FFN's non-matmul time."""
    done = rowwise.glu(h, act)
    if done is not None:
        return done
    n_ff = h.shape[-1] // 2
    if act == "swiglu_oai":  # (experts only: their rows are small)
        return swiglu_oai(h[..., :n_ff], h[..., n_ff:])
    gate, up = h[..., :n_ff], h[..., n_ff:]
    f = _ACTIVATIONS_INPLACE[act]
    if gate.ndim != 2:
        f(gate)
        gate *= up
        return gate
    # A prompt's rows a few at a time, so the activation's passes (up to nine) over a chunk
    # stay in cache (docs/performance.md), the same values bit for bit
    # (each element's operations are the same).
    for r in range(0, gate.shape[0], _GLU_CHUNK_ROWS):
        g = gate[r : r + _GLU_CHUNK_ROWS]
        f(g)
        g *= up[r : r + _GLU_CHUNK_ROWS]
    return gate
