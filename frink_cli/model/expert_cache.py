"""Routed experts read from the file as tokens choose them, held in a resident cache of hot
experts under a byte budget (least recently used out first).

Why: a MoE file can be bigger than the machine's memory while a token reads only its top-k
experts per layer (a 30B-A3B model: ~17 GiB in Q4_K_M, ~1.5 GiB of experts a token). Dense
and attention weights stay resident (TensorReader reads them whole); an expert stack under
a budget is a StreamedExperts, whose experts come from ExpertCache.take: the missing ones
of a layer's step are asked of the kernel in one batch (madvise WILLNEED over the map),
then each pread into memory of its own and kept until the budget evicts it. The host's
expert matmuls (HostOps.experts) read every stack through fetch_experts, resident or not,
so the arithmetic is one code path and the logits are the same bits.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from gguf import GGMLQuantizationType

from ..quant.blocks import QuantMatrix, QuantRows, row_bytes


class SpanSource(Protocol):
    """What streaming needs of a tensor source (formats.gguf.GgufTensors)."""

    def read_at(self, offset: int, n_bytes: int) -> np.ndarray: ...

    def will_need(self, ranges: list[tuple[int, int]]) -> None: ...


@dataclass(frozen=True)
class ExpertPart:
    """One source tensor of a stack: its type, each expert's rows, columns, and where its
    expert 0 starts in the file (experts follow each other, expert-major, as GGUF stores
    them)."""

    qtype: GGMLQuantizationType
    rows: int
    cols: int
    offset: int

    @property
    def expert_bytes(self) -> int:
        return self.rows * row_bytes(self.qtype, self.cols)


@dataclass
class CacheStats:
    """What the cache did since it was made (or since reset())."""

    hits: int = 0
    misses: int = 0
    bytes_read: int = 0

    @property
    def hit_rate(self) -> float:
        asked = self.hits + self.misses
        return self.hits / asked if asked else 0.0


class ExpertCache:
    """Experts (as QuantRows) by (stack, expert id), at most `capacity` bytes of them
    resident, least recently used out first. A step's own experts are never evicted to
    make room for each other: a prefill whose rows choose more than fit holds them all for
    that layer (the cache is over capacity until the next take), a decode step's top k
    always fit (load() refuses a budget smaller than one layer's top k)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.resident = 0
        self.stats = CacheStats()
        self._held: OrderedDict[tuple[int, int], QuantRows] = OrderedDict()

    def take(
        self, wanted: Sequence[tuple[StreamedExperts, Sequence[int]]]
    ) -> list[list[QuantRows]]:
        """Each stack's experts, in the order asked: the held ones become the most recent,
        the missing ones of all the stacks are read in one batch (advised together, then
        read), each after the least recent experts not wanted now make room for it."""
        keys = [[(id(s), int(e)) for e in ids] for s, ids in wanted]
        protect = {k for row in keys for k in row}
        for k in protect & self._held.keys():
            self._held.move_to_end(k)
        missing = [
            (s, int(e))
            for (s, ids), row in zip(wanted, keys)
            for e, k in zip(ids, row)
            if k not in self._held
        ]
        missing = list(dict.fromkeys(missing))
        if missing:
            missing[0][0].source.will_need([r for s, e in missing for r in s.ranges(e)])
        for s, e in missing:
            self._make_room(s.expert_bytes, protect)
            rows = s.read(e)
            self._held[(id(s), e)] = rows
            self.resident += rows.nbytes
            self.stats.bytes_read += rows.nbytes
        self.stats.misses += len(missing)
        self.stats.hits += len(protect) - len(missing)
        return [[self._held[k] for k in row] for row in keys]

    def _make_room(self, n_bytes: int, protect: set[tuple[int, int]]) -> None:
        """Evict the least recently used experts, never one in `protect` (the wanted ones
        are the most recent, so the oldest entry is the next one that may go)."""
        while self._held and self.resident + n_bytes > self.capacity:
            key = next(iter(self._held))
            if key in protect:
                return
            self.resident -= self._held.pop(key).nbytes


class StreamedExperts:
    """An expert stack [n_expert, rows, cols] left in the file: QuantExperts' shape and
    indexing, each expert read through the cache when a step chooses it."""

    def __init__(
        self, source: SpanSource, parts: tuple[ExpertPart, ...], n_expert: int, cache: ExpertCache
    ) -> None:
        if not parts or len({p.cols for p in parts}) != 1:
            raise ValueError("StreamedExperts needs parts of one column count")
        self.source, self.parts, self.n_expert, self.cache = source, parts, n_expert, cache

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.n_expert, sum(p.rows for p in self.parts), self.parts[0].cols)

    @property
    def nbytes(self) -> int:
        return self.n_expert * self.expert_bytes

    @property
    def expert_bytes(self) -> int:
        return sum(p.expert_bytes for p in self.parts)

    def ranges(self, e: int) -> list[tuple[int, int]]:
        """Expert e's (offset, byte count) in the file, one per part."""
        return [(p.offset + e * p.expert_bytes, p.expert_bytes) for p in self.parts]

    def read(self, e: int) -> QuantRows:
        """Expert e's matrix, read from the file now."""
        mats = [
            QuantMatrix.from_buffer(self.source.read_at(off, n), p.qtype, p.rows, p.cols)
            for p, (off, n) in zip(self.parts, self.ranges(e))
        ]
        return QuantRows(tuple(mats))

    def __getitem__(self, e: int) -> QuantRows:
        e = int(e)
        if not 0 <= e < self.n_expert:
            raise IndexError(f"expert {e} of {self.n_expert}")
        return self.cache.take([(self, [e])])[0][0]


def fetch_experts(stacks: Sequence[Any], ids: Sequence[int]) -> list[list[Any]]:
    """Each stack's matrices of experts `ids` (a resident stack: its views; streamed
    stacks: one cache batch for all of them), per stack in the order of ids."""
    streamed = [s for s in stacks if isinstance(s, StreamedExperts)]
    taken = streamed[0].cache.take([(s, ids) for s in streamed]) if streamed else []
    by_stack = dict(zip(map(id, streamed), taken))
    return [by_stack[id(s)] if id(s) in by_stack else [s[int(e)] for e in ids] for s in stacks]
