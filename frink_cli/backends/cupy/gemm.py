"""y = x @ W.T for the CUDA stack's kernel tables: dense f32/f16 weights through the array
module, or weights held on the device in the file's quantized blocks (DeviceQuant).

`GemmOps` is the base of both kernel tables (reference_ops.ReferenceOps, kernel_ops.KernelOps):
each supplies `gemv` (a few rows of x against the blocks) and `dequantize` (rows of W to a
dense operand for a prompt's GEMM).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from ...quant.blocks import first_rows, row_bytes

F32 = np.float32

# kernels/quant.cu: rows of x one gemv launch takes (FRINK_GEMV_MAX_X), and its block shape
# (FRINK_GEMV_ROWS rows of W per block, FRINK_GEMV_LANES threads per row).
GEMV_MAX_X = 8
GEMV_ROWS = 8
GEMV_LANES = 32
# A prompt's product with a quantized W dequantizes rows into one reusable operand buffer of
# at most this many elements (64 MiB in f32) and hands each tile to cuBLAS; a
# 262k-row head would be 670 MiB as one f32 operand.
QUANT_TILE_ELEMS = 1 << 24


@dataclass(frozen=True)
class DeviceQuantPart:
    """Rows of a weight on the device in the file's own blocks: data is uint8
    [rows, row_bytes], exactly the file's bytes (quant/blocks.py's QuantMatrix, uploaded)."""

    data: Any
    qtype: GGMLQuantizationType
    rows: int
    cols: int

    @property
    def kernel(self) -> str:
        """The type's name in kernels/quant.cu (gemv_q4_k, dequant_q4_k_f32, ...)."""
        return self.qtype.name.lower()

    @property
    def row_bytes(self) -> int:
        return row_bytes(self.qtype, self.cols)


@dataclass(frozen=True)
class DeviceQuant:
    """A weight [rows, cols] held on the device as runs of rows in blocks, one type each (a
    fused QKV of a Q4_K_M file: Q4_K rows, then Q6_K rows); `dtype` is the GEMM operand
    type its prompt tiles are dequantized to (f32, or f16 under FRINK_CUDA_DTYPE)."""

    parts: tuple[DeviceQuantPart, ...]
    dtype: Any

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(p.rows for p in self.parts), self.parts[0].cols)

    def offsets(self) -> list[int]:
        return first_rows(self.parts)


class GemmOps:
    """y = x @ W.T, for W [out, in] resident as a dense f32 or f16 matrix (through the array
    module: cuBLAS under CuPy; f16 rounds x to f16, cuBLAS accumulates in f32, the result
    comes back in f32) or in the file's blocks (DeviceQuant): up to GEMV_MAX_X rows of x
    read the blocks once through the gemv kernel, more rows multiply tiles of W
    dequantized into one reusable buffer. Each table supplies `gemv` and
    `dequantize`."""

    xp: Any

    def matmul(self, x: Any, w: Any) -> Any:
        if isinstance(w, DeviceQuant):
            return self._quant_matmul(x, w)
        xp = self.xp
        # Contiguous results: the kernels that follow index rows by a fixed stride.
        if w.dtype == F32:
            return xp.ascontiguousarray(xp.matmul(x, w.T))
        return xp.ascontiguousarray(xp.matmul(x.astype(w.dtype), w.T), dtype=F32)

    def _quant_matmul(self, x: Any, w: DeviceQuant) -> Any:
        x = self.xp.ascontiguousarray(x, dtype=F32)
        T = x.shape[0]
        rows, cols = w.shape
        y = self.xp.empty((T, rows), F32)
        if T == 0:
            return y
        for part, r0 in zip(w.parts, w.offsets()):
            if T <= GEMV_MAX_X:
                self.gemv(part, x, y, r0)
                continue
            n = max(1, QUANT_TILE_ELEMS // cols)
            for a in range(0, part.rows, n):
                b = min(part.rows, a + n)
                y[:, r0 + a : r0 + b] = self.matmul(x, self.dequantize(part, a, b, w.dtype))
        return y

    def gemv(self, part: DeviceQuantPart, x: Any, y: Any, col: int) -> None:
        """y[:, col : col + part.rows] = x @ part.T for at most GEMV_MAX_X rows of x, in f32."""
        raise NotImplementedError

    def dequantize(self, part: DeviceQuantPart, start: int, stop: int, dtype: Any) -> Any:
        """Rows [start, stop) of part as a dense [n, cols] operand of dtype (f32 or f16),
        possibly a view of a buffer the next call reuses."""
        raise NotImplementedError

    def to_device(self, a: np.ndarray, dtype: Any = F32) -> Any:
        return self.xp.asarray(np.ascontiguousarray(a), dtype=dtype)

    def to_host(self, a: Any) -> np.ndarray:
        return np.asarray(a)
