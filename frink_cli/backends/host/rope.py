"""The host's rotary position embedding: cos/sin tables from graph/rope.py's frequencies,
cached per position and grown geometrically, applied in place (in C where rowwise takes
the array, else in NumPy). Layouts and scaling are described in graph/rope.py."""

from __future__ import annotations

import numpy as np

from ...graph.rope import rope_frequencies
from ...model.config import RopeScaling
from . import rowwise


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
