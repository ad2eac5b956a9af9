"""TensorReader: how the weights loader and the architectures read a checkpoint's tensors.

Every read is checked against the shape the config implies (a hostile header cannot size
an allocation) and recorded (unread_tensors names what no part of the model read).
Matrices stay in the file's own blocks where the host has kernels for their types; else
they are dequantized to f32, a slice of rows at a time where the source can, so a large
matrix never exists twice at full size.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import FrinkError
from ..formats import Checkpoint
from ..quant import kernels
from ..quant.blocks import KERNEL_TYPES, QuantExperts, QuantMatrix, QuantRows
from .expert_cache import ExpertCache, ExpertPart, StreamedExperts
from .linear import Linear

# The type names the host keeps in blocks; FRINK_F32_WEIGHTS=1 dequantizes every weight at
# load instead (the layout before the kernels, for comparisons).
_KERNEL_TYPE_NAMES = frozenset(t.name for t in KERNEL_TYPES)
_F32_WEIGHTS = bool(os.environ.get("FRINK_F32_WEIGHTS"))

# Rows dequantized per read when a matrix is filled a slice at a time: small beside any
# real matrix, large enough that the reads stay few.
_FILL_CHUNK_BYTES = 32 << 20

# A matrix's parts: (tensor name without ".weight", rows), stacked in order.
Parts = list[tuple[str, int]]


def placeholder(shape: tuple[int, ...]) -> np.ndarray:
    """A read-only f32 array of `shape` that holds no memory (zero strides): a meta read."""
    return np.broadcast_to(np.float32(0), shape)


class TensorReader:
    """One checkpoint's tensors, read by name and expected shape.

    meta=True reads no tensor data (what a trace of the layers needs, graph/trace.py): every
    tensor is a placeholder() of its expected shape and nothing is kept in blocks. With a
    checkpoint the names and shapes are still checked against it; with ckpt None every
    tensor a plan requires is taken as present with its expected shape and every optional
    one as absent."""

    def __init__(
        self, ckpt: Checkpoint | None, meta: bool = False, expert_cache: ExpertCache | None = None
    ) -> None:
        if ckpt is None and not meta:
            raise ValueError("a TensorReader without a checkpoint reads only meta")
        self.ckpt: Checkpoint = ckpt  # type: ignore[assignment]  # None: meta only
        self.meta = meta
        self.names = set(ckpt.tensors.names()) if ckpt is not None else set()
        self.read: set[str] = set()  # every tensor checked and loaded so far
        # Weights stay in the file's blocks where the host multiplies them as they are: a
        # GGUF file (its blocks readable) and the compiled kernels.
        self.host_blocks = (
            not meta
            and hasattr(self.ckpt.tensors, "blocks")
            and kernels.compiled()
            and not _F32_WEIGHTS
        )
        # Under a memory budget (model/mem_budget.py): expert stacks stay in the file and
        # are read through this cache as steps choose them.
        self.expert_cache = expert_cache if self.host_blocks else None

    def has(self, name: str) -> bool:
        return name in self.names

    def check(self, name: str, shape: tuple[int, ...]) -> None:
        """The tensor exists with exactly this shape (recorded as read), else FrinkError."""
        self.read.add(name)
        if self.ckpt is None:
            return  # meta, without a file: every tensor asked for is taken as declared
        if name not in self.names:
            raise FrinkError(f"{self.ckpt.path}: missing tensor {name}")
        info = self.ckpt.tensors.info(name)
        if tuple(info.shape) != shape:
            raise FrinkError(
                f"{self.ckpt.path}: tensor {name} has shape {list(info.shape)}, "
                f"expected {list(shape)}"
            )

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """The tensor as f32, checked."""
        self.check(name, shape)
        return placeholder(shape) if self.meta else self.ckpt.tensors.load(name)

    def optional(
        self, name: str, shape: tuple[int, ...], required: bool = False
    ) -> np.ndarray | None:
        """get(), or None for a tensor the file lacks unless `required`."""
        if name not in self.names and not required:
            return None
        return self.get(name, shape)

    def ones_or(self, name: str, n: int, weightless: bool) -> np.ndarray:
        """A norm's weight [n]: ones where the model's norms have none, else the tensor."""
        return np.ones(n, np.float32) if weightless else self.get(name, (n,))

    def fill(self, dst: np.ndarray, name: str) -> None:
        """dst[...] = the tensor (checked against dst's shape), a slice of rows at a time
        where the source can."""
        self.check(name, dst.shape)
        load_rows = getattr(self.ckpt.tensors, "load_rows", None)
        step = max(1, _FILL_CHUNK_BYTES // (4 * dst.shape[-1]))
        if load_rows is None or dst.ndim != 2 or dst.shape[0] <= step:
            dst[...] = self.ckpt.tensors.load(name)
            return
        for r in range(0, dst.shape[0], step):
            dst[r : r + step] = load_rows(name, r, min(dst.shape[0], r + step))

    def _kernel_typed(self, parts: Parts) -> bool:
        """Every part's matrix exists in a type the host has kernels for."""
        tensors = [name + ".weight" for name, _ in parts]
        if not self.host_blocks or not all(t in self.names for t in tensors):
            return False  # (fill names the missing one)
        return all(self.ckpt.tensors.info(t).dtype in _KERNEL_TYPE_NAMES for t in tensors)

    def in_blocks(self, parts: Parts, in_dim: int, panels: bool = False) -> QuantRows | None:
        """The tensors' rows stacked as the file's own blocks (None: f32 at load); with
        `panels`, each run of one type in panels where the kernels take them
        (kernels.in_panels), repacked straight from the file's bytes."""
        if not self._kernel_typed(parts):
            return None
        runs = []
        for name, rows in parts:
            self.check(name + ".weight", (rows, in_dim))
            qtype, _, data = self.ckpt.tensors.blocks(name + ".weight")  # type: ignore[attr-defined]
            runs.append((qtype, rows, data))
        return QuantRows.joined(runs, in_dim, kernels.stacked_in_panels if panels else None)

    def table(self, name: str, rows: int, cols: int) -> np.ndarray | QuantRows:
        """A lookup table [rows, cols] (an embedding): the file's blocks, else f32."""
        blocks = self.in_blocks([(name, rows)], cols)
        return self.get(name + ".weight", (rows, cols)) if blocks is None else blocks

    def experts(
        self, parts: Parts, n_expert: int, in_dim: int
    ) -> QuantExperts | StreamedExperts | None:
        """Expert stacks [n_expert, rows, in_dim] as the file's blocks, stacked along rows
        (None: f32 at load; meta: one placeholder stack)."""
        if self.meta:
            for name, rows in parts:
                self.check(name + ".weight", (n_expert, rows, in_dim))
            return placeholder((n_expert, sum(rows for _, rows in parts), in_dim))  # type: ignore[return-value]
        if not self._kernel_typed(parts):
            return None
        if self.expert_cache is not None:
            return self._streamed(parts, n_expert, in_dim)
        stacks = []
        for name, rows in parts:
            self.check(name + ".weight", (n_expert, rows, in_dim))
            qtype, _, data = self.ckpt.tensors.blocks(name + ".weight")  # type: ignore[attr-defined]
            stacks.append(QuantMatrix.from_buffer(data, qtype, n_expert * rows, in_dim))
        return QuantExperts(tuple(stacks), n_expert)

    def _streamed(self, parts: Parts, n_expert: int, in_dim: int) -> StreamedExperts:
        """experts() left in the file: where each part's experts lie, nothing read."""
        assert self.expert_cache is not None
        spans = []
        for name, rows in parts:
            self.check(name + ".weight", (n_expert, rows, in_dim))
            qtype, _, offset, _ = self.ckpt.tensors.span(name + ".weight")  # type: ignore[attr-defined]
            spans.append(ExpertPart(qtype, rows, in_dim, offset))
        return StreamedExperts(self.ckpt.tensors, tuple(spans), n_expert, self.expert_cache)  # type: ignore[arg-type]

    def linear(self, parts: Parts, in_dim: int, bias: bool = True) -> Linear:
        """Rows of several tensors stacked into one matrix; biases zero-filled if partial."""
        w: np.ndarray | QuantRows | None = self.in_blocks(parts, in_dim, panels=True)
        if isinstance(w, QuantRows):
            w = QuantRows(tuple(kernels.in_panels(p) for p in w.parts))
        elif w is None and self.meta:
            for name, rows in parts:
                self.check(name + ".weight", (rows, in_dim))
            w = placeholder((sum(rows for _, rows in parts), in_dim))
        elif w is None:
            # Every part's shape checked before the matrix is allocated: sizes come from the
            # metadata, which may be hostile (a head width of 2^40).
            for name, rows in parts:
                self.check(name + ".weight", (rows, in_dim))
            # Filled part by part: one copy of each part, no more.
            w = np.empty((sum(rows for _, rows in parts), in_dim), np.float32)
            r0 = 0
            for name, rows in parts:
                self.fill(w[r0 : r0 + rows], name + ".weight")
                r0 += rows
        bs = [self.optional(name + ".bias", (rows,)) if bias else None for name, rows in parts]
        b = None
        if any(x is not None for x in bs):
            b = np.concatenate(
                [x if x is not None else np.zeros(n, np.float32) for x, (_, n) in zip(bs, parts)]
            )
        names = tuple(name + ".weight" for name, _ in parts)
        return Linear(w, b, names, tuple(rows for _, rows in parts))
