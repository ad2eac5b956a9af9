"""LoRA on the host: a linear's output plus each adapter's `s * B (A x)` on its rows.

The base product is left as it was (a quantized base multiplied in its blocks); the two
low-rank products go through the same row-invariant product as the base
(backends/host/linear.py), so a row's numbers still do not depend on the rows beside it.
A step may carry its own scales per sequence (a server's per-request `lora`):
model/lora.py's `adapter_scales` sets them for the linears inside it, each sequence's rows
scaled by its own; outside one, every adapter's global scale holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ...model.lora import LoraAdapter, LoraPart, sequence_scales


def row_scales(adapter: LoraAdapter, n_rows: int, rows: Sequence[int] | None) -> float | np.ndarray:
    """The user scale of `adapter` for a step's rows: one number, or a [T, 1] column where
    the step's sequences carry scales of their own."""
    per_seq = sequence_scales()
    if per_seq is None:
        return adapter.scale
    counts = rows if rows is not None and sum(rows) == n_rows else (n_rows,)
    if len(counts) != len(per_seq):
        raise ValueError(f"{len(per_seq)} sequences' LoRA scales for {len(counts)} sequences")
    col = np.repeat(
        np.array([s.get(adapter, 0.0) for s in per_seq], np.float32), np.asarray(counts)
    )
    return col[:, None]


def add_lora(
    y: np.ndarray,
    x: np.ndarray,
    parts: Sequence[LoraPart],
    product: Callable[[np.ndarray, np.ndarray], np.ndarray],
    rows: Sequence[int] | None,
) -> None:
    """y[:, part's rows] += s * (x @ A.T) @ B.T for every part whose scale is not zero.
    `product(x, w)` is the host's row-invariant x @ w.T; `rows`: the step's sequences."""
    for part in parts:
        s = row_scales(part.adapter, x.shape[0], rows)
        if np.all(np.asarray(s) == 0):
            continue
        h = product(x, part.a)
        h *= np.float32(part.adapter.factor) * np.asarray(s, np.float32)
        y[:, part.row0 : part.row0 + part.b.shape[0]] += product(h, part.b)
