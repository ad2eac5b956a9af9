"""A 2-D weight held as the GGUF file's own blocks, and the block geometry of each type the
host kernels multiply without dequantizing first.

Why: f32 host weights cost 4 bytes per weight in memory and in every decode step's reads
(DESIGN: SmolLM2's peak RSS 710 MiB against llama.cpp's 167); a Q4_0 block is 18 bytes per
32 weights. The geometry comes from gguf-py's tables (GGML_QUANT_SIZES), never retyped, so
it is the one frink's reader already uses to find the bytes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

T = GGMLQuantizationType

# The types with kernels (frink_cli/quant/kernels.py), in ggml's order.
KERNEL_TYPES: tuple[GGMLQuantizationType, ...] = (
    T.F16,
    T.Q4_0,
    T.Q4_1,
    T.Q5_0,
    T.Q5_1,
    T.Q8_0,
    T.Q2_K,
    T.Q3_K,
    T.Q4_K,
    T.Q5_K,
    T.Q6_K,
    T.IQ4_NL,
    T.IQ4_XS,
    T.BF16,
    T.MXFP4,
)


@dataclass(frozen=True)
class Geometry:
    """elems weights in each block of nbytes bytes."""

    elems: int
    nbytes: int


def geometry(qtype: GGMLQuantizationType) -> Geometry:
    elems, nbytes = GGML_QUANT_SIZES[qtype]
    return Geometry(elems, nbytes)


def row_bytes(qtype: GGMLQuantizationType, cols: int) -> int:
    """Bytes of one row of cols weights (cols a whole number of blocks)."""
    g = geometry(qtype)
    if cols <= 0 or cols % g.elems:
        raise ValueError(f"{qtype.name} rows hold whole blocks of {g.elems}: {cols} columns")
    return cols // g.elems * g.nbytes


# Rows of W in one panel (`QuantMatrix.panels`; the compiled kernels' PANEL_ROWS).
PANEL_ROWS = 16


@dataclass(frozen=True)
class QuantMatrix:
    """W [rows, cols] as its raw blocks: data is uint8 [rows, row_bytes], read-only (a view
    of the file's map is the intended source), and nothing else is kept: no f32 copy, no
    unpacked scales.

    panels: the same bytes with each PANEL_ROWS rows' blocks interleaved row by row (the
    compiled kernels' panel layout, native_panels.h; `kernels.in_panels` makes it, and only
    the kernels read it): rows then stay whole only in runs of PANEL_ROWS, so `data[i]` is
    not row i, and `kernels.file_order` gives the file's order back.

    A 3-D expert stack [n_expert, rows, cols] is one QuantMatrix of n_expert * rows rows;
    `row_slice` gives one expert's matrix without copying.
    """

    data: np.ndarray
    qtype: GGMLQuantizationType
    rows: int
    cols: int
    panels: bool = False

    def __post_init__(self) -> None:
        if self.qtype not in KERNEL_TYPES:
            raise ValueError(f"no host kernels for {self.qtype.name}")
        want = (self.rows, row_bytes(self.qtype, self.cols))
        d = self.data
        if d.dtype != np.uint8 or d.shape != want:
            raise ValueError(
                f"{self.qtype.name} data must be uint8 {list(want)}: got {d.dtype} {list(d.shape)}"
            )
        if self.panels and self.rows % PANEL_ROWS:
            raise ValueError(f"a matrix in panels holds whole panels of {PANEL_ROWS} rows")
        if not d.flags.c_contiguous:
            # The kernels read a row's blocks as one run of bytes.
            raise ValueError("QuantMatrix data must be C-contiguous")
        if d.flags.writeable:
            # The weights are the file's: nothing may write them.
            ro = d.view()
            ro.flags.writeable = False
            object.__setattr__(self, "data", ro)

    @classmethod
    def from_buffer(
        cls, buf: np.ndarray, qtype: GGMLQuantizationType, rows: int, cols: int
    ) -> QuantMatrix:
        """From a flat uint8 buffer (the file's bytes of one tensor, as `raw()` gives them)."""
        return cls(buf.reshape(rows, row_bytes(qtype, cols)), qtype, rows, cols)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def row_slice(self, start: int, stop: int) -> QuantMatrix:
        """Rows [start, stop) as a QuantMatrix over the same bytes (in panels: whole
        panels only)."""
        if not 0 <= start <= stop <= self.rows:
            raise ValueError(f"rows [{start}, {stop}) of a {self.rows}-row matrix")
        if self.panels and (start % PANEL_ROWS or stop % PANEL_ROWS):
            raise ValueError(f"rows [{start}, {stop}) cut panels of {PANEL_ROWS} rows")
        return QuantMatrix(self.data[start:stop], self.qtype, stop - start, self.cols, self.panels)


def first_rows(parts: Sequence[Any]) -> list[int]:
    """The first row of each of a stack of parts (anything with `rows`), in order."""
    return [0, *itertools.accumulate(p.rows for p in parts)][: len(parts)]


@dataclass(frozen=True)
class QuantRows:
    """A weight [rows, cols] held in the file's blocks as runs of consecutive rows, each run
    one type: a fused matrix whose source tensors differ in type (a Q4_K_M file's Q4_K
    q/k beside a Q6_K v) keeps each in its own. Neighbouring tensors of one type share a
    run, so a fused Q/K/V of one type is one matrix to its kernels."""

    parts: tuple[QuantMatrix, ...]

    def __post_init__(self) -> None:
        if not self.parts or len({p.cols for p in self.parts}) != 1:
            raise ValueError("QuantRows needs one or more parts of one column count")

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(p.rows for p in self.parts), self.parts[0].cols)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def offsets(self) -> list[int]:
        """Each part's first row."""
        return first_rows(self.parts)

    @classmethod
    def joined(
        cls,
        runs: list[tuple[GGMLQuantizationType, int, np.ndarray]],
        cols: int,
        stack: Callable[[list[QuantMatrix]], QuantMatrix | None] | None = None,
    ) -> QuantRows:
        """From (type, rows, bytes) runs in row order, neighbours of one type merged: by
        `stack` where given and it takes them (their rows as one new matrix, e.g. in panels),
        else concatenated."""
        parts = []
        for qtype, group in itertools.groupby(runs, key=lambda r: r[0]):
            g = [QuantMatrix.from_buffer(d, qtype, n, cols) for _, n, d in group]
            merged = stack(g) if stack is not None else None
            if merged is None and len(g) == 1:
                merged = g[0]
            elif merged is None:
                data = np.concatenate([m.data.reshape(-1) for m in g])
                merged = QuantMatrix.from_buffer(data, qtype, sum(m.rows for m in g), cols)
            parts.append(merged)
        return cls(tuple(parts))


@dataclass(frozen=True)
class QuantExperts:
    """An MoE expert stack [n_expert, rows, cols] in the file's blocks: each part one source
    tensor's stack (a QuantMatrix of n_expert * its rows, expert-major, as GGUF stores it),
    an expert's rows being its rows of each part in order (gate rows, then up rows).
    `stack[e]` is expert e's matrix over the same bytes, so a host step reads only the
    experts its rows chose (Qwen3-30B-A3B: ~17 GiB in Q4_K_M, where f32 is ~120)."""

    parts: tuple[QuantMatrix, ...]
    n_expert: int

    def __post_init__(self) -> None:
        if (
            not self.parts
            or self.n_expert < 1
            or len({p.cols for p in self.parts}) != 1
            or any(p.rows % self.n_expert for p in self.parts)
        ):
            raise ValueError("QuantExperts needs parts of one column count, n_expert rows each")

    @property
    def shape(self) -> tuple[int, int, int]:
        rows = sum(p.rows for p in self.parts) // self.n_expert
        return (self.n_expert, rows, self.parts[0].cols)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def __getitem__(self, e: int) -> QuantRows:
        e = int(e)
        if not 0 <= e < self.n_expert:
            raise IndexError(f"expert {e} of {self.n_expert}")
        per = [p.rows // self.n_expert for p in self.parts]
        return QuantRows(tuple(p.row_slice(e * n, (e + 1) * n) for p, n in zip(self.parts, per)))
