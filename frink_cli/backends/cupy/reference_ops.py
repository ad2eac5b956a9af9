"""The NumPy reference of every CUDA kernel: the same arguments and in-place behaviour as
kernel_ops.KernelOps, so the whole stack runs on CI machines with no GPU, and each kernel
is tested against its reference (each reference is itself checked against the host body's
own block)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...quant import kernels as host_kernels
from ...quant.blocks import QuantMatrix
from ..host.ffn import ACTIVATIONS
from ..host.norms import layer_norm
from .gemm import F32, DeviceQuantPart, GemmOps
from .geometry import AttentionGeometry


def _heads(buf: np.ndarray, offset: int, heads: int, head_dim: int) -> np.ndarray:
    """The [T, heads, head_dim] view of the heads at column `offset` of every row."""
    view = buf[:, offset : offset + heads * head_dim].reshape(buf.shape[0], heads, head_dim)
    # Writes through the view must land in buf: reshape may not have copied.
    if not np.shares_memory(view, buf):
        raise RuntimeError("QKV heads view is a copy")
    return view


def _host_matrix(part: DeviceQuantPart) -> QuantMatrix:
    return QuantMatrix(np.asarray(part.data), part.qtype, part.rows, part.cols)


class ReferenceOps(GemmOps):
    """The NumPy reference of every kernel (same arguments, same in-place behaviour)."""

    xp = np

    def gemv(self, part: DeviceQuantPart, x: np.ndarray, y: np.ndarray, col: int) -> None:
        """gemv_<type>: x @ dequantize(W).T in f32 -- the host kernels' exact-activation dots,
        which read the blocks as they go (no f32 copy of a 262k-row head per token)."""
        with host_kernels.exact_activations():
            y[:, col : col + part.rows] = host_kernels.dots(x, _host_matrix(part))

    def dequantize(self, part: DeviceQuantPart, start: int, stop: int, dtype: Any) -> np.ndarray:
        """dequant_<type>_f32 / _f16: gguf-py's values (the host kernels equal them bit for
        bit), rounded to f16 to nearest even for an f16 operand."""
        w = host_kernels.dequantize_rows(_host_matrix(part), start, stop)
        return w if np.dtype(dtype) == F32 else w.astype(dtype)

    def rms_norm(self, x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        """rms_norm_f32 over rows of x [n, d] -> a new array."""
        ms = np.einsum("...i,...i->...", x, x) / F32(x.shape[-1])
        scale = 1.0 / np.sqrt(ms + F32(eps), dtype=F32)
        return (x * scale[..., None]) * w

    def rms_norm_heads(
        self, buf: np.ndarray, offset: int, heads: int, head_dim: int, w: np.ndarray, eps: float
    ) -> None:
        """rms_norm_f32 in place on `heads` heads at column `offset` of every row (QK norm)."""
        view = _heads(buf, offset, heads, head_dim)
        view[...] = self.rms_norm(view, w, eps)

    def rope(
        self,
        buf: np.ndarray,
        offset: int,
        heads: int,
        head_dim: int,
        cos: np.ndarray,
        sin: np.ndarray,
        rope_dim: int,
        neox: bool,
    ) -> None:
        """rope_f32 in place; cos/sin [T, rope_dim/2] for each row's position."""
        x = _heads(buf, offset, heads, head_dim)
        c, s = cos[:, None, :], sin[:, None, :]
        d = rope_dim
        ia, ib = (slice(0, d // 2), slice(d // 2, d)) if neox else (slice(0, d, 2), slice(1, d, 2))
        a, b = x[..., ia].copy(), x[..., ib].copy()
        x[..., ia] = a * c - b * s
        x[..., ib] = b * c + a * s

    def attention(
        self,
        qkv: np.ndarray,
        q_off: int,
        k_cache: np.ndarray,
        v_cache: np.ndarray,
        geo: AttentionGeometry,
        slopes: np.ndarray | None = None,
    ) -> np.ndarray:
        """causal_gqa_attention_f32: new rows t = 0..T-1 at positions geo.n_prefix + t over
        the cache rows 0..n_prefix + t (the new rows' K/V already written there), or the
        last `window` of them. k_cache/v_cache [n_head_kv, rows, hd]; returns
        [T, n_head * head_dim_v]. slopes [n_head]: ALiBi, head h's score against position
        j gets -slopes[h] * (its position - j)."""
        T, hd, hv = qkv.shape[0], geo.head_dim, geo.head_dim_v
        S = geo.n_prefix + T
        H, Hkv = geo.n_head, geo.n_head_kv
        g = H // Hkv
        q = qkv[:, q_off : q_off + H * hd].reshape(T, H, hd)
        K, V = k_cache[:, :S], v_cache[:, :S]  # [Hkv, S, hd]
        qg = (q * F32(geo.scale)).transpose(1, 0, 2).reshape(Hkv, g * T, hd)
        scores = (qg @ K.transpose(0, 2, 1)).reshape(Hkv, g, T, S)
        pos = geo.n_prefix + np.arange(T)
        if slopes is not None:
            dist = (pos[:, None] - np.arange(S)[None, :]).astype(F32)  # [T, S]
            scores -= slopes.reshape(Hkv, g, 1, 1) * dist
        visible = np.arange(S)[None, :] <= pos[:, None]
        if geo.window is not None:
            visible &= pos[:, None] - np.arange(S)[None, :] < geo.window
        scores += np.where(visible, F32(0.0), F32(-np.inf))
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        out = scores.reshape(Hkv, g * T, S) @ V
        return np.ascontiguousarray(out.reshape(H, T, hv).transpose(1, 0, 2).reshape(T, H * hv))

    def glu(self, gu: np.ndarray, n_ff: int, act: str) -> np.ndarray:
        """glu_f32: act(gate) * up over [T, 2*n_ff] (gate columns first); act is "silu" or
        "gelu_tanh", the host body's own functions."""
        return ACTIVATIONS[act](gu[:, :n_ff]) * gu[:, n_ff:]

    def act(self, x: np.ndarray, act: str) -> np.ndarray:
        """act_f32: act(x) into a new array (the plain FFN's activation)."""
        return ACTIVATIONS[act](x)

    def layer_norm(
        self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, eps: float
    ) -> np.ndarray:
        """layer_norm_f32 over rows of x [n, d] -> a new array: the host body's own."""
        return layer_norm(x, w, b, eps)

    def clamp(self, x: np.ndarray, c: float) -> None:
        """clamp_f32: x clipped to [-c, c] in place."""
        np.clip(x, F32(-c), F32(c), out=x)

    def add(self, x: np.ndarray, a: np.ndarray) -> None:
        """add_f32: x += a."""
        x += a

    def add_bias(self, y: np.ndarray, b: np.ndarray) -> None:
        """add_bias_f32: y[r] += b."""
        y += b
