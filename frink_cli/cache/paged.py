"""A paged KV cache (the serve engine's): pools of fixed-size pages shared by every
sequence, one pool per layer kind (full attention, each sliding window, each attention
chunk), each sequence one page table per pool.

A page is PAGE rows at the same place in every layer of its pool's kind (one id for all
those layers, as vLLM's blocks), so a sequence has one table per kind, not per layer. Kinds
get pools of their own because they let go of rows at different times: a full-attention
table holds every page of the sequence, a sliding-window (or chunked) table gives back each
page wholly before the window (chunk) of the next query as the sequence moves on, so it
holds about window / PAGE pages however long the sequence grows. Pages are
reference-counted: a table holds one reference per page, the prefix index (prefix.py) one
per page it keeps, and a page whose count falls to 0 is free. A table about to write into
a page someone else holds copies it first, in every layer of its pool (copy on write: the
rows before the write are kept, so a partly filled shared page is copied), so a shared
page's rows never change; a prefix page that left one sequence's window stays for any
other table or index entry that holds it.

PagedKv is the layer slot over its pool: it speaks KvSlot as AttentionKv does and hands
attention `Paged` rows (the layer's page buffer and the table from its first held page),
which the one attention op reads through the table. Recurrent layers keep their
per-sequence state (recurrent.py) beside the pages; `unpaged_reason` names what cannot be
paged (a model with no rows to page), and such a model keeps the slot engine.

An MLA layer's [latent | k_pe] rows (cache/latent.py: one KV head whose values are its
keys) page as full attention's do, in the full-attention pool: a pool is a lifetime (when
its pages are given back), not a row width (each layer has buffers of its own widths), and
a latent layer keeps every row. Its V buffer is its K buffer (one array, written once), so
attention reads the same `Paged` rows as keys and values.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..errors import FrinkError
from ..model.config import ModelConfig
from .kv_types import CacheTypes, Paged, encode, stored_dtype, stored_width
from .protocol import StagedRows

PAGE = 16  # rows per page
GONE = -1  # a table's entry for a page it gave back (before its window)


class PoolFull(FrinkError):
    """No free page, and none the prefix index could give back."""


@dataclass(frozen=True)
class Span:
    """What a windowed pool's layers see: "sliding window" (the query at p sees from
    p - size + 1) or "attention chunk" (from p // size * size)."""

    kind: str
    size: int

    def seen_from(self, p: int) -> int:
        """The first position the query at p sees."""
        if self.kind == "attention chunk":
            return p // self.size * self.size
        return max(0, p - self.size + 1)

    def __str__(self) -> str:
        return f"{self.kind} {self.size}"


class Reclaimer(Protocol):
    """What keeps pages besides the tables (the prefix index): it gives them back on demand."""

    def reclaim(self, pool: PagePool) -> bool:
        """Give back one of pool's pages held by nothing else (least recently used); False
        if none."""

    def reclaimable(self, pool: PagePool) -> int:
        """How many of pool's pages reclaim could give back."""


def _own_rows(cfg: ModelConfig, layer: int) -> bool:
    """Whether the layer keeps K/V rows of its own (not a sharing layer's, not a state)."""
    shape = cfg.layer_shape(layer)
    if cfg.is_recurrent(layer) and shape.mixer != "attention+mamba2":
        return False
    return cfg.kv_source(layer) is None and bool(shape.n_head_kv)


def layer_span(cfg: ModelConfig, layer: int, n_ctx: int) -> Span | None:
    """The window (or chunk) layer `layer` sees within a context of n_ctx; None: every row."""
    shape = cfg.layer_shape(layer)
    if shape.window is not None and shape.window < n_ctx:
        return Span("sliding window", shape.window)
    if shape.chunk is not None and shape.chunk < n_ctx:
        return Span("attention chunk", shape.chunk)
    return None


def pool_layers(cfg: ModelConfig, n_ctx: int, layers: range) -> dict[Span | None, list[int]]:
    """The layers with rows of their own, by the span they see (one pool each), full
    attention first."""
    kinds: dict[Span | None, list[int]] = {}
    for layer in layers:
        if _own_rows(cfg, layer):
            kinds.setdefault(layer_span(cfg, layer, n_ctx), []).append(layer)
    return dict(sorted(kinds.items(), key=lambda kv: kv[0] is not None))


def unpaged_reason(cfg: ModelConfig, n_ctx: int) -> str | None:
    """Why this model's cache cannot be paged (its first layer whose rows the pages cannot
    hold), or None."""
    if not pool_layers(cfg, n_ctx, range(cfg.n_layer)):
        return "no layer keeps K/V rows to page (each sequence's recurrent state is its slot's)"
    return None


def lazy_zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Zeros whose memory the OS maps a small page at a time as rows are first written
    (and freed pages are taken again first), so a pool costs what its busiest moment held.
    Not in huge pages: a pool's buffer holds each KV head's rows for every page apart, so
    with 2 MB pages (NumPy asks for them for large arrays) a sequence's first token would
    map a huge page per head and layer, nearly the whole pool of a small model, and the
    server's first request would wait for the OS to zero it (docs/performance.md)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    if n == 0:
        return np.zeros(shape, dtype)
    try:
        buf = mmap.mmap(-1, n)  # anonymous: zero-filled, mapped as written
    except OSError as e:  # a MemoryError, as NumPy's allocation would raise
        raise MemoryError(f"cannot map {n} bytes: {e.strerror}") from None
    advice = getattr(mmap, "MADV_NOHUGEPAGE", None)
    if advice is not None:
        buf.madvise(advice)
    return np.frombuffer(buf, dtype).reshape(shape)


class PagePool:
    """n_pages pages of `page` rows in the K and V buffer of each of `layers` (attention
    layers with rows of their own, all seeing `span`: None for every row), stored as
    `types` say."""

    def __init__(
        self,
        cfg: ModelConfig,
        n_pages: int,
        types: CacheTypes,
        layers: list[int] | range | None = None,
        page: int = PAGE,
        span: Span | None = None,
    ) -> None:
        if n_pages < 1:
            raise FrinkError("the KV pool needs at least one page")
        self.page, self.n_pages, self.types, self.span = page, n_pages, types, span
        self.k: dict[int, np.ndarray] = {}
        self.v: dict[int, np.ndarray] = {}
        for layer in layers if layers is not None else range(cfg.n_layer):
            if not _own_rows(cfg, layer):
                continue
            shape = cfg.layer_shape(layer)
            rows = (shape.n_head_kv, n_pages * page)
            kt, vt = types.k, types.v
            k_shape = (*rows, stored_width(kt, shape.head_dim_k))
            self.k[layer] = lazy_zeros(k_shape, stored_dtype(kt))
            if shape.mixer == "mla":  # the values are the keys' rows: one buffer, K's type
                self.v[layer] = self.k[layer]
                continue
            v_shape = (*rows, stored_width(vt, shape.head_dim_v))
            self.v[layer] = lazy_zeros(v_shape, stored_dtype(vt))
        self.refs = np.zeros(n_pages, np.int32)
        self._free = list(range(n_pages - 1, -1, -1))  # pop() hands out page 0 first
        self.reclaimer: Reclaimer | None = None

    @property
    def kind(self) -> str:
        """What its layers see, in words ("full attention", "sliding window 512", ...)."""
        return "full attention" if self.span is None else str(self.span)

    @property
    def latent(self) -> int:
        """How many of its layers keep one buffer, their values their keys (MLA's)."""
        return sum(self.v[layer] is k for layer, k in self.k.items())

    @property
    def used(self) -> int:
        return self.n_pages - len(self._free)

    @property
    def shared(self) -> int:
        """Pages held by more than one table or index entry."""
        return int((self.refs > 1).sum())

    def available(self) -> int:
        """Pages a table could take now: the free ones and those the index would give back."""
        spare = self.reclaimer.reclaimable(self) if self.reclaimer is not None else 0
        return len(self._free) + spare

    def take(self) -> int:
        """A free page (reclaiming one from the index if none is), held once; PoolFull."""
        while not self._free:
            if self.reclaimer is None or not self.reclaimer.reclaim(self):
                raise PoolFull(f"the KV pool's {self.n_pages} pages ({self.kind}) are all in use")
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
        bufs = {id(buf): buf for buf in (*self.k.values(), *self.v.values())}  # each once
        for buf in bufs.values():
            buf[:, b : b + rows] = buf[:, a : a + rows]


class PagePools:
    """A decoder's pools, one per layer kind (pool_layers), each of n_pages pages: the
    serve engine's KV. Their gauges are summed over the pools."""

    def __init__(
        self, cfg: ModelConfig, n_pages: int, types: CacheTypes, n_ctx: int, layers: range
    ) -> None:
        self.pools = [
            PagePool(cfg, n_pages, types, ls, span=span)
            for span, ls in pool_layers(cfg, n_ctx, layers).items()
        ]
        self.n_pages = n_pages

    def __iter__(self) -> Iterator[PagePool]:
        return iter(self.pools)

    def __len__(self) -> int:
        return len(self.pools)

    @property
    def used(self) -> int:
        return sum(p.used for p in self.pools)

    @property
    def shared(self) -> int:
        return sum(p.shared for p in self.pools)

    @property
    def total(self) -> int:
        """Pages in all pools."""
        return self.n_pages * len(self.pools)


class PageTable:
    """One sequence's pages in one pool, in order: row r of the sequence is row r % page of
    page pages[r // page], in every layer of the pool. A windowed pool's table gives back
    the pages before the window of its next query (their entries GONE, `start` the first
    held). `array` is the table as the attention reads it."""

    def __init__(self, pool: PagePool, rewind: int = 0) -> None:
        self.pool = pool
        self.rewind = rewind  # tokens beyond one the sequence may step back
        self.pages: list[int] = []
        self.start = 0  # the first page held
        self.array = np.zeros(0, np.int32)

    @property
    def held(self) -> int:
        """Pages the table holds."""
        return len(self.pages) - self.start

    def adopt(self, pages: list[int]) -> None:
        """Start from another sequence's pages (a shared prefix): held, not copied; the
        entries before the last GONE one are not held."""
        assert not self.pages, "a table adopts a prefix only when empty"
        gone = [i for i, p in enumerate(pages) if p == GONE]
        self.start = gone[-1] + 1 if gone else 0
        self.pages = [GONE] * self.start + list(pages[self.start :])
        self.pool.retain(self.pages[self.start :])
        self._changed()

    def reserve(self, start: int, end: int) -> None:
        """Pages of its own for rows [start, end), about to be written: shared pages in that
        range copied (their rows before `start` kept), missing ones taken; PoolFull."""
        page, pool = self.pool.page, self.pool
        need = -(-end // page)
        for i in range(start // page, min(need, len(self.pages))):
            old = self.pages[i]
            assert old != GONE, "a write before the window's first row"
            if pool.refs[old] > 1:
                new = pool.take()
                pool.copy(old, new, min(page, max(0, start - i * page)))
                pool.release([old])
                self.pages[i] = new
                self._changed()
        while len(self.pages) < need:
            self.pages.append(pool.take())
            self._changed()

    def slide(self, n_past: int) -> None:
        """A windowed table gives back the pages wholly before what the query at n_past - 1
        - rewind sees (one token can still be stepped back, and `rewind` more)."""
        span = self.pool.span
        if span is None or n_past == 0:
            return
        keep = span.seen_from(max(0, n_past - 1 - self.rewind)) // self.pool.page
        keep = min(keep, len(self.pages))
        if keep > self.start:
            self.pool.release(self.pages[self.start : keep])
            self.pages[self.start : keep] = [GONE] * (keep - self.start)
            self.start = keep
            self._changed()

    def truncate(self, n_rows: int) -> None:
        """Give back the pages past the first n_rows rows (all of them for 0)."""
        keep = -(-n_rows // self.pool.page)
        if keep < len(self.pages):
            self.pool.release(self.pages[max(keep, self.start) :])
            del self.pages[keep:]
            self.start = min(self.start, keep)
            self._changed()
        if n_rows == 0:
            self.start = 0

    def _changed(self) -> None:
        self.array = np.asarray(self.pages, np.int32)


class PagedKv(StagedRows):
    """An attention layer's rows in its pool, through its sequence's page table for that
    pool (the table's pages are reserved by the cache before any layer writes). KvSlot, as
    AttentionKv: staged rows [n_past, end), committed at commit, forgotten at rollback; a
    windowed pool's slot holds the rows from its table's first held page (`first`), and
    refuses to go back to where its window's rows are gone, as WindowKv does. A latent
    layer's (its pool's V buffer its K buffer) writes and hands its K rows as both, as
    LatentKv does."""

    base = 0  # the position logical row 0 holds (SharedKv reads rows from it)

    def __init__(self, table: PageTable, layer: int, widths: tuple[int, int]) -> None:
        self.table = table
        self.types = table.pool.types
        self.widths = widths
        self._k, self._v = table.pool.k[layer], table.pool.v[layer]
        self.latent = self._v is self._k  # V = K: one buffer
        self.n_past = self.end = 0
        self.version = 0

    @property
    def first(self) -> int:
        """The first position held (past 0 once a window has slid)."""
        return self.table.start * self.table.pool.page

    def append(self, k: np.ndarray, v: np.ndarray) -> tuple[int, Paged, Paged]:
        end = self.write(self.n_past, k, v)
        return self.first, *self.rows(self.first, end)

    def write(self, start: int, k: np.ndarray, v: np.ndarray) -> int:
        if not self.first <= start <= self.end:
            raise FrinkError(
                f"cannot write K/V rows at position {start}: this layer holds positions "
                f"{self.first}..{self.end - 1}"
            )
        stop = start + k.shape[0]
        self.table.reserve(start, stop)  # (done already when the cache admitted the step)
        writes = [(self._k, encode(self.types.k, k.transpose(1, 0, 2)))]
        if not self.latent:  # (a latent layer's v is its k: written once)
            writes.append((self._v, encode(self.types.v, v.transpose(1, 0, 2))))
        page, pages, r = self.table.pool.page, self.table.pages, start
        while r < stop:  # a slice per page the rows fall in
            off = r % page
            n = min(page - off, stop - r)
            at = pages[r // page] * page + off
            for buf, rows in writes:
                buf[:, at : at + n] = rows[:, r - start : r - start + n]
            r += n
        self.end = stop
        self.version += 1
        return stop

    def held(self) -> tuple[int, Paged, Paged]:
        return self.first, *self.rows(self.first, self.n_past)

    def rows(self, a: int, b: int) -> tuple[Paged, Paged]:
        """The sequence's rows [a, b) as `Paged` rows (a: the first held position, a page's
        first row), K and V through one table."""
        t, page = self.table, self.table.pool.page
        assert a % page == 0 and a >= self.first, "paged rows are read from a held page's first"
        table = t.array[a // page :]
        k = Paged(self._k, self.types.k, self.widths[0], table, page, b - a)
        if self.latent:
            return k, k
        return k, Paged(self._v, self.types.v, self.widths[1], table, page, b - a)

    def truncation_refusal(self, n_past: int) -> str | None:
        span = self.table.pool.span
        if span is None or n_past == 0 or self.first <= span.seen_from(n_past):
            return None
        return (
            f"its {span.kind} of {span.size} holds positions {self.first}.. only, and the "
            "rows before them are gone"
        )

    @property
    def nbytes(self) -> int:
        """Bytes of the pages the sequence holds in this layer."""
        rows = self.table.held * self.table.pool.page
        held = self._k.nbytes + (0 if self.latent else self._v.nbytes)
        return rows * held // self._k.shape[1]

    def reserve(self, end: int) -> None:
        pass  # the cache reserved the table's pages for every layer at once

    def by_position(self) -> tuple[np.ndarray, np.ndarray]:
        """K, V by position (row i position i; positions no longer held read as zero),
        decoded to f32: for tests and debugging."""
        out = []
        for rows in self.rows(self.first, self.end):
            dense = np.zeros((rows.shape[0], self.end, rows.shape[2]), np.float32)
            dense[:, self.first :] = rows.f32()
            out.append(dense)
        return out[0], out[1]
