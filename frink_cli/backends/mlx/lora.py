"""LoRA on metal: a linear's adapters inside the traced graph, `y = W x + s * B (A x)`.

The parts a Linear carries (model/lora.py) become one pair per linear: A [R, in], every
part's A stacked along its rank; B [out, R], each part's B at its rows of the (fused)
output and zero elsewhere; `cols` [R], the adapter each rank column belongs to. The traced
graph takes the step's scales as one input array [1 or rows, adapters] (the user's scale
times the adapter's own factor), so a new global scale, or a server request's own, runs the
same compiled graph: a decode token stays one submission and nothing is retraced. Rows of
sequences with different scales (a server's batch) each read their own row of it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ...model.lora import LoraAdapter, LoraPart, sequence_scales

# While a run is traced: the scales input [1 or rows, adapters] its linears read.
_traced: ContextVar[mx.array | None] = ContextVar("frink_mlx_lora_scales", default=None)


@contextmanager
def traced_scales(scales: mx.array) -> Iterator[None]:
    """The DeviceLora calls traced inside read `scales` (the compiled function's input)."""
    token = _traced.set(scales)
    try:
        yield
    finally:
        _traced.reset(token)


@dataclass
class DeviceLora:
    """Every adapter's low-rank pair on one linear, stacked (see the module note)."""

    a: mx.array  # [R, in]
    b: mx.array  # [out, R]
    cols: mx.array  # [R] int32: the adapter index of each rank column

    def __call__(self, x: mx.array) -> mx.array:
        scales = _traced.get()
        if scales is None:
            raise RuntimeError("a LoRA linear traced outside traced_scales")
        h = (x @ self.a.T) * mx.take(scales, self.cols, axis=-1)
        return h @ self.b.T


def device_lora(
    parts: Sequence[LoraPart], out_rows: int, index: dict[LoraAdapter, int]
) -> DeviceLora:
    """The parts of a Linear of out_rows rows as one stacked pair; `index` numbers the
    adapters (a new one gets the next number: its column of the scales input)."""
    rank = sum(p.a.shape[0] for p in parts)
    b = np.zeros((out_rows, rank), np.float32)
    cols = np.empty(rank, np.int32)
    r0 = 0
    for p in parts:
        r = p.a.shape[0]
        b[p.row0 : p.row0 + p.b.shape[0], r0 : r0 + r] = p.b
        cols[r0 : r0 + r] = index.setdefault(p.adapter, len(index))
        r0 += r
    a = np.concatenate([p.a for p in parts]).astype(np.float32)
    return DeviceLora(mx.array(a), mx.array(b), mx.array(cols))


def step_scales(adapters: Sequence[LoraAdapter], counts: Sequence[int]) -> np.ndarray:
    """The scales input of a step whose sequences have counts[j] rows each: one row when
    every sequence has the same scales (each adapter's own, outside adapter_scales), else
    one per row. Each is the user's scale times the adapter's factor, in f32 as the host's."""
    per_seq = sequence_scales()
    if per_seq is None:
        rows = [[ad.scale for ad in adapters]]
    else:
        rows = [[m.get(ad, 0.0) for ad in adapters] for m in per_seq]
    factors = np.asarray([ad.factor for ad in adapters], np.float32)
    s = np.asarray(rows, np.float32).reshape(len(rows), len(adapters)) * factors
    if len(s) == 1 or (s == s[0]).all():
        return np.ascontiguousarray(s[:1])
    return np.repeat(s, np.asarray(counts), axis=0)
