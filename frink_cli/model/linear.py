"""Linear: a weight matrix as the host holds it (f32, or the file's own quantized blocks),
and the two reads of one: dequantized() for an upload, embedding_rows() for a lookup.

Every matrix is [out, in] as GGUF stores it, row-major: the host's decode kernel
(backends/host/linear.py) reads each output's row as one stream, and prefill GEMMs run
alike on either order. The matrices one step reads together are fused at load (Q/K/V into
one, gate/up into one), so a decode token makes one product where it would make three.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..quant import kernels
from ..quant.blocks import QuantExperts, QuantRows
from .expert_cache import StreamedExperts

if TYPE_CHECKING:  # only for the hint: lora.py imports this module
    from .lora import LoraPart


@dataclass
class Linear:
    """A weight matrix [out, in] (the rows of several source tensors when fused) and its
    bias (zero-filled where only some of the fused tensors have one). The matrix is f32, or
    the file's own blocks (QuantRows) where the host has kernels for its types."""

    w: np.ndarray | QuantRows
    b: np.ndarray | None
    # The file's tensors whose rows these are, in order ("blk.0.attn_q.weight", ...): a
    # backend that keeps the file's own quantized blocks reads them from here. Empty when
    # the rows are rearranged from their sources (a GDN's unzipped beta/alpha).
    sources: tuple[str, ...] = ()
    # Each source's row count, in order (empty: one source, all the rows).
    source_rows: tuple[int, ...] = ()
    # LoRA adapters on these rows (model/lora.py), applied unmerged by the linear op.
    lora: tuple[LoraPart, ...] = ()
    # LoRA adapters were added into w at load (model/lora.py's merged): w is f32 and no
    # longer the file's tensors, so a backend uploads w, never the sources' blocks.
    merged: bool = False

    def __post_init__(self) -> None:
        # Row-major, which the decode kernel reads (see the module note); a no-op for
        # matrices built that way.
        if isinstance(self.w, np.ndarray) and self.w.ndim == 2 and not self.w.flags.c_contiguous:
            self.w = np.ascontiguousarray(self.w)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.w.shape)

    def dense(self) -> np.ndarray:
        """The matrix as f32 (a backend's upload; the host body multiplies w as it is)."""
        return dequantized(self.w)


def dequantized(w: np.ndarray | QuantRows | QuantExperts | StreamedExperts) -> np.ndarray:
    """An f32 copy of a matrix (or an expert stack) held in blocks; an f32 array as it is;
    a stack left in the file read whole (load() gives a device no such stack)."""
    if isinstance(w, np.ndarray):
        return w
    if isinstance(w, StreamedExperts):
        return np.stack([dequantized(w.read(e)) for e in range(w.n_expert)])
    if isinstance(w, QuantExperts):
        n = w.n_expert
        parts = [kernels.dequantize_rows(p).reshape(n, p.rows // n, p.cols) for p in w.parts]
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
    return np.concatenate([kernels.dequantize_rows(p) for p in w.parts])


def embedding_rows(table: np.ndarray | QuantRows, ids: np.ndarray) -> np.ndarray:
    """table[ids] as a new f32 array: a table in blocks is dequantized on lookup, row by row
    (a 262k-row embedding stays a quarter of its f32 size in Q4_K)."""
    if isinstance(table, np.ndarray):
        return table[ids]  # fancy indexing copies
    idx = np.asarray(ids, dtype=np.int64).reshape(-1)
    out = np.empty((idx.size, table.shape[1]), np.float32)
    for p, r0 in zip(table.parts, table.offsets()):
        mine = (idx >= r0) & (idx < r0 + p.rows)
        if mine.any():
            out[mine] = kernels.take_rows(p, idx[mine] - r0)
    return out
