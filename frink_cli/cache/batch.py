"""A multi-sequence step: several sequences, each with its own cache, advanced by ONE
forward over all their new rows.

Why it exists: decode is bound by the bytes of the weights a step streams, so eight
sequences stepping together cost little more than one (a server's throughput). Every
part of a layer that is row-wise (the linears, norms, FFN, MoE, the lm head) runs over
the rows of all sequences at once; only a mixer's history (K/V rows, recurrent state)
is per sequence. So the batch is, to the layer composition, one more kind of cache view:
`BatchSlot.sequences` says which rows are whose, and the block library
(graph/blocks/step.py) runs each mixer's per-sequence core once per sequence over its own
rows (`each_sequence`).

Sequence i's rows are rows [start_i, stop_i) of the step, in the order the caches were
given, at positions n_past_i.. of its own cache. All caches share one context size (the
rope tables follow it). A step is admitted on every cache before any layer writes, and
committed on every cache after the last layer, as a single sequence's step is.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import FrinkError
from ..graph.blocks.step import BatchSlot, SeqRows
from .kv_cache import KvCache


class SeqBatch:
    def __init__(self, caches: Sequence[KvCache], counts: Sequence[int]) -> None:
        if len(caches) != len(counts) or not caches:
            raise ValueError("a batch needs one row count per cache, and at least one cache")
        if len({id(c) for c in caches}) != len(caches):
            raise ValueError("a sequence appears twice in one batch")
        if len({c.n_ctx for c in caches}) != 1:
            raise ValueError("every cache of a batch must have the same context size")
        if min(counts) < 1:
            raise ValueError("every sequence of a batch needs at least one new row")
        self.caches = list(caches)
        self.counts = [int(n) for n in counts]
        self.n_ctx = caches[0].n_ctx
        self.cfg = caches[0].cfg
        self.stops = np.cumsum(self.counts).tolist()
        self.starts = [0, *self.stops[:-1]]
        self.n_rows = int(self.stops[-1])
        self._positions: list[np.ndarray] | None = None

    @property
    def sequences(self) -> list[KvCache]:
        return self.caches

    def last_rows(self) -> list[int]:
        """Each sequence's last row in the step (where its next-token logits come from)."""
        return [s - 1 for s in self.stops]

    def check_room(self, n_new: int) -> None:
        if n_new != self.n_rows:
            raise ValueError(f"a batch of {self.n_rows} rows was fed {n_new}")
        for c, n in zip(self.caches, self.counts):
            c.check_room(n)
        self._positions = [
            np.arange(c.n_past, c.n_past + n) for c, n in zip(self.caches, self.counts)
        ]

    def positions(self) -> np.ndarray:
        """Every row's position in its own sequence, in row order."""
        if self._positions is None:
            raise FrinkError("a batch's positions are known once check_room admitted it")
        return np.concatenate(self._positions)

    def slot(self, layer: int) -> BatchSlot:
        parts = self._positions
        assert parts is not None  # the decoder admits a step before any layer runs
        return BatchSlot(
            [
                SeqRows(c.slot(layer), p, a, b)
                for c, p, a, b in zip(self.caches, parts, self.starts, self.stops)
            ]
        )

    def commit(self, n_new: int) -> None:
        for c, n in zip(self.caches, self.counts):
            c.commit(n)
        self._positions = None
