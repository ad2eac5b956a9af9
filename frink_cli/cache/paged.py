"""A paged KV cache (the serve engine's): one pool of fixed-size pages shared by every
sequence, each sequence a page table.

A page is PAGE rows at the same place in every attention layer's buffer (one id for all
layers, as vLLM's blocks), so a sequence has one table for all its layers. Pages are
reference-counted: a table holds one reference per page, the prefix index (prefix.py) one
per page it keeps, and a page whose count falls to 0 is free. A table about to write into
a page someone else holds copies it first, in every layer (copy on write: the rows before
the write are kept, so a partly filled shared page is copied), so a shared page's rows
never change.

PagedKv is the layer slot over the pool: it speaks KvSlot as AttentionKv does and hands
attention `Paged` rows (the layer's page buffer and the table), which the one attention op
reads through the table. Only full-attention layers are paged: `unpaged_reason` names the
first layer that is not (a sliding window, a recurrent state, latent rows), and such a
model keeps the slot engine.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..errors import FrinkError
from ..model.config import ModelConfig
from .kv_types import CacheTypes, Paged, encode, stored_dtype, stored_width
from .protocol import StagedRows

PAGE = 16  # rows per page


class PoolFull(FrinkError):
    """No free page, and none the prefix index could give back."""


class Reclaimer(Protocol):
    """What keeps pages besides the tables (the prefix index): it gives them back on demand."""

    def reclaim(self) -> bool:
        """Give back one page held by nothing else (least recently used); False if none."""

    def reclaimable(self) -> int:
        """How many pages reclaim could give back."""


def unpaged_reason(cfg: ModelConfig, n_ctx: int) -> str | None:
    """Why this model's cache cannot be paged (its first layer that is not full attention
    over rows of its own or a sharing layer's), or None."""
    for layer in range(cfg.n_layer):
        shape = cfg.layer_shape(layer)
        if cfg.is_recurrent(layer) or shape.mixer == "attention+mamba2":
            return f"layer {layer} keeps a recurrent state"
        if shape.mixer == "mla":
            return f"layer {layer} keeps latent rows"
        if shape.window is not None and shape.window < n_ctx:
            return f"layer {layer} has a sliding window"
        if shape.chunk is not None and shape.chunk < n_ctx:
            return f"layer {layer} has chunked attention"
    return None


class PagePool:
    """n_pages pages of `page` rows in the K and V buffer of each of `layers` (the attention
    layers with rows of their own), stored as `types` say."""

    def __init__(
        self,
        cfg: ModelConfig,
        n_pages: int,
        types: CacheTypes,
        layers: range | None = None,
        page: int = PAGE,
    ) -> None:
        if n_pages < 1:
            raise FrinkError("the KV pool needs at least one page")
        self.page, self.n_pages, self.types = page, n_pages, types
        self.k: dict[int, np.ndarray] = {}
        self.v: dict[int, np.ndarray] = {}
        for layer in layers if layers is not None else range(cfg.n_layer):
            shape = cfg.layer_shape(layer)
            if cfg.kv_source(layer) is not None or not shape.n_head_kv:
                continue
            rows = (shape.n_head_kv, n_pages * page)
            kt, vt = types.k, types.v
            # Zeros: the OS maps a page's memory when it is first written.
            self.k[layer] = np.zeros((*rows, stored_width(kt, shape.head_dim_k)), stored_dtype(kt))
            self.v[layer] = np.zeros((*rows, stored_width(vt, shape.head_dim_v)), stored_dtype(vt))
        self.refs = np.zeros(n_pages, np.int32)
        self._free = list(range(n_pages - 1, -1, -1))  # pop() hands out page 0 first
        self.reclaimer: Reclaimer | None = None

    @property
    def used(self) -> int:
        return self.n_pages - len(self._free)

    @property
    def shared(self) -> int:
        """Pages held by more than one table or index entry."""
        return int((self.refs > 1).sum())

    def available(self) -> int:
        """Pages a table could take now: the free ones and those the index would give back."""
        spare = self.reclaimer.reclaimable() if self.reclaimer is not None else 0
        return len(self._free) + spare

    def take(self) -> int:
        """A free page (reclaiming one from the index if none is), held once; PoolFull."""
        while not self._free:
            if self.reclaimer is None or not self.reclaimer.reclaim():
                raise PoolFull(f"the KV pool's {self.n_pages} pages are all in use")
        p = self._free.pop()
        self.refs[p] = 1
        return p

    def retain(self, pages: list[int]) -> None:
        for p in pages:
            self.refs[p] += 1

    def release(self, pages: list[int]) -> None:
        for p in pages:
            self.refs[p] -= 1
            if self.refs[p] == 0:
                self._free.append(p)

    def copy(self, src: int, dst: int, rows: int) -> None:
        """Rows [0, rows) of page src into page dst, in every layer."""
        a, b = src * self.page, dst * self.page
        for buf in (*self.k.values(), *self.v.values()):
            buf[:, b : b + rows] = buf[:, a : a + rows]


class PageTable:
    """One sequence's pages, in order: row r of the sequence is row r % page of page
    pages[r // page], in every layer. `array` is the table as the attention reads it."""

    def __init__(self, pool: PagePool) -> None:
        self.pool = pool
        self.pages: list[int] = []
        self.array = np.zeros(0, np.int32)

    def adopt(self, pages: list[int]) -> None:
        """Start from another sequence's pages (a shared prefix): held, not copied."""
        assert not self.pages, "a table adopts a prefix only when empty"
        self.pool.retain(pages)
        self.pages = list(pages)
        self._changed()

    def reserve(self, start: int, end: int) -> None:
        """Pages of its own for rows [start, end), about to be written: shared pages in that
        range copied (their rows before `start` kept), missing ones taken; PoolFull."""
        page, pool = self.pool.page, self.pool
        need = -(-end // page)
        for i in range(start // page, min(need, len(self.pages))):
            old = self.pages[i]
            if pool.refs[old] > 1:
                new = pool.take()
                pool.copy(old, new, min(page, max(0, start - i * page)))
                pool.release([old])
                self.pages[i] = new
                self._changed()
        while len(self.pages) < need:
            self.pages.append(pool.take())
            self._changed()

    def truncate(self, n_rows: int) -> None:
        """Give back the pages past the first n_rows rows."""
        keep = -(-n_rows // self.pool.page)
        if keep < len(self.pages):
            self.pool.release(self.pages[keep:])
            del self.pages[keep:]
            self._changed()

    def _changed(self) -> None:
        self.array = np.asarray(self.pages, np.int32)


class PagedKv(StagedRows):
    """A full-attention layer's rows in the pool, through its sequence's page table (the
    table's pages are reserved by the cache before any layer writes). KvSlot, as
    AttentionKv: staged rows [n_past, end), committed at commit, forgotten at rollback."""

    base = 0  # the position row 0 holds (SharedKv reads rows from it)
    first = 0  # every position is held

    def __init__(self, table: PageTable, layer: int, widths: tuple[int, int]) -> None:
        self.table = table
        self.types = table.pool.types
        self.widths = widths
        self._k, self._v = table.pool.k[layer], table.pool.v[layer]
        self.n_past = self.end = 0
        self.version = 0

    def append(self, k: np.ndarray, v: np.ndarray) -> tuple[int, Paged, Paged]:
        end = self.write(self.n_past, k, v)
        return 0, *self.rows(0, end)

    def write(self, start: int, k: np.ndarray, v: np.ndarray) -> int:
        if not 0 <= start <= self.end:
            raise FrinkError(f"cannot write K/V rows at position {start} of {self.end}")
        stop = start + k.shape[0]
        self.table.reserve(start, stop)  # (done already when the cache admitted the step)
        ek = encode(self.types.k, k.transpose(1, 0, 2))
        ev = encode(self.types.v, v.transpose(1, 0, 2))
        page, pages, r = self.table.pool.page, self.table.pages, start
        while r < stop:  # a slice per page the rows fall in
            off = r % page
            n = min(page - off, stop - r)
            at = pages[r // page] * page + off
            self._k[:, at : at + n] = ek[:, r - start : r - start + n]
            self._v[:, at : at + n] = ev[:, r - start : r - start + n]
            r += n
        self.end = stop
        self.version += 1
        return stop

    def held(self) -> tuple[int, Paged, Paged]:
        return 0, *self.rows(0, self.n_past)

    def rows(self, a: int, b: int) -> tuple[Paged, Paged]:
        """The sequence's rows [0, b) as `Paged` rows (a is 0: a paged slot holds them all)."""
        assert a == 0, "paged rows are read from the sequence's first"
        t = self.table
        return (
            Paged(self._k, self.types.k, self.widths[0], t.array, t.pool.page, b),
            Paged(self._v, self.types.v, self.widths[1], t.array, t.pool.page, b),
        )

    @property
    def nbytes(self) -> int:
        """Bytes of the pages the sequence holds in this layer."""
        rows = len(self.table.pages) * self.table.pool.page
        return rows * (self._k.nbytes + self._v.nbytes) // self._k.shape[1]

    def reserve(self, end: int) -> None:
        pass  # the cache reserved the table's pages for every layer at once

    def by_position(self) -> tuple[np.ndarray, np.ndarray]:
        """K, V by position (row i position i), decoded to f32: for tests and debugging."""
        k, v = self.rows(0, self.end)
        return k.f32(), v.f32()
