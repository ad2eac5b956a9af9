"""Rotary position embeddings in llama.cpp's two layouts.

"norm" rotates adjacent pairs (x[2i], x[2i+1]) — llama's GGUF layout, which is why the
converter permutes HF's Q/K rows; "neox" rotates halves (x[i], x[i + n/2]). Only the first
`dim` dims of a head rotate. The angle for pair i at position p is
p * scale * base^(-2i/dim) / factor_i. cos/sin tables are cached per position and grown
geometrically, so a decode step looks them up instead of computing them.
"""

from __future__ import annotations

import numpy as np


class Rope:
    def __init__(
        self, dim: int, base: float, scale: float, layout: str, freq_factors: np.ndarray | None = None
    ) -> None:
        if layout not in ("norm", "neox"):
            raise ValueError(f"unknown rope layout {layout}")
        self.dim = dim
        self.layout = layout
        inv = base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
        if freq_factors is not None:
            inv = inv / freq_factors.astype(np.float64)
        self._inv = inv * scale
        self._cos = np.zeros((0, dim // 2), np.float32)
        self._sin = np.zeros((0, dim // 2), np.float32)

    def _tables(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        need = int(positions.max()) + 1
        if need > len(self._cos):
            n = max(need, 2 * len(self._cos), 256)
            ang = np.arange(n, dtype=np.float64)[:, None] * self._inv[None, :]
            self._cos, self._sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
        return self._cos[positions], self._sin[positions]

    def apply(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """x: [T, heads, head_dim]; rotated in a new array."""
        cos, sin = self._tables(positions)
        cos, sin = cos[:, None, :], sin[:, None, :]
        out = x.copy()
        d = self.dim
        if self.layout == "neox":
            a, b = x[..., : d // 2], x[..., d // 2 : d]
            out[..., : d // 2] = a * cos - b * sin
            out[..., d // 2 : d] = b * cos + a * sin
        else:
            a, b = x[..., 0:d:2], x[..., 1:d:2]
            out[..., 0:d:2] = a * cos - b * sin
            out[..., 1:d:2] = b * cos + a * sin
        return out
