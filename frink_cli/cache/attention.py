"""An attention layer's K/V rows: AttentionKv (every row, full attention), WindowKv (a
sliding-window layer's last `window` rows) and ChunkKv (a chunked-attention layer's
current chunk).

Rows are stored per KV head, [n_head_kv, capacity, head_dim], so attention reads the held
rows as one view with no copy. Buffer row r holds position `base + r`; the held rows are
positions [first, end): [first, n_past) committed, [n_past, end) staged by the step in
flight. A step writes its rows after the committed ones; they become committed at commit(),
and rollback() (the next step's check_room) forgets them, so a step that fails leaves the
committed rows as they were.

Rows are stored as the slot's cache types say (kv_types.py: rounded once, as they are
written); a slot of a non-f32 type hands its readers `Coded` rows, decoded by the reader a
block of keys at a time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..errors import FrinkError
from .kv_types import (
    F32_CACHE,
    OPTION_K,
    OPTION_V,
    CacheTypes,
    Coded,
    Rows,
    check_width,
    decode,
    encode,
    stored_dtype,
    stored_width,
)
from .protocol import NothingToMove, StagedRows

if TYPE_CHECKING:
    from .paged import PagedKv

F32 = np.float32
# Rows a full-attention buffer starts with; it doubles (up to the context) as it fills, so
# appending a decode row never reallocates in the common case.
MIN_ROWS = 256
# Spare rows a window buffer keeps past its `window`: the rows that slid out are dropped
# by one copy every WINDOW_SLACK decode tokens rather than one per token.
WINDOW_SLACK = 128


class AttentionKv(StagedRows):
    """A full-attention layer's rows: every position from 0, grown geometrically up to the
    context."""

    def __init__(
        self,
        n_head_kv: int,
        head_dim_k: int,
        head_dim_v: int,
        n_ctx: int,
        *,
        types: CacheTypes = F32_CACHE,
    ) -> None:
        check_width(types.k, head_dim_k, OPTION_K)
        check_width(types.v, head_dim_v, OPTION_V)
        self.n_ctx = n_ctx
        self.types = types
        self.widths = (head_dim_k, head_dim_v)
        self.n_past = 0  # positions before this are committed
        self.base = 0  # the position buffer row 0 holds
        self.first = 0  # the first position held
        self.end = 0  # one past the last position written (committed or staged)
        # A count of writes. A device mirror remembers the count its own rows were written
        # under; any other write (the host body running the layer after a refusal or a
        # failed launch) changes it, and the mirror re-syncs. Lengths alone cannot tell:
        # truncate, then rewrite, gives the same length.
        self.version = 0
        self._k = np.zeros((n_head_kv, 0, stored_width(types.k, head_dim_k)), stored_dtype(types.k))
        self._v = np.zeros((n_head_kv, 0, stored_width(types.v, head_dim_v)), stored_dtype(types.v))
        self._move(0, 0, self._initial_rows())

    # --- the protocol ------------------------------------------------------------------------

    def append(self, k: np.ndarray, v: np.ndarray) -> tuple[int, Rows, Rows]:
        """Write k [T, Hkv, hd_k], v [T, Hkv, hd_v] at the next positions (the host ops);
        return (first, K [Hkv, S, hd_k], V [Hkv, S, hd_v]): every row this step's queries
        may see, row j at position first + j."""
        end = self.write(self.n_past, k, v)
        return self.first, *self.rows(self.first - self.base, end - self.base)

    def write(self, start: int, k: np.ndarray, v: np.ndarray) -> int:
        """Write rows at positions start.. (a backend pushing its rows back); return the end.
        Rows after them are forgotten: a write continues the rows held, with no gap."""
        if not self.first <= start <= self.end:
            raise FrinkError(
                f"cannot write K/V rows at position {start}: this layer holds positions "
                f"{self.first}..{self.end - 1}"
            )
        stop = start + k.shape[0]
        self._room(start, stop)
        a, b = start - self.base, stop - self.base
        self._k[:, a:b] = encode(self.types.k, k.transpose(1, 0, 2))
        self._v[:, a:b] = encode(self.types.v, v.transpose(1, 0, 2))
        self.end = stop
        self.version += 1
        return stop

    def held(self) -> tuple[int, Rows, Rows]:
        """(first, K, V) of the committed rows, row j at position first + j; read-only
        (`Coded` rows where the cache type is not f32)."""
        return self.first, *self.rows(self.first - self.base, self.n_past - self.base)

    def rows(self, a: int, b: int) -> tuple[Rows, Rows]:
        """Buffer rows [a, b) of K and V: f32 views, or `Coded` views of a stored type."""
        return self._as_rows(self._k[:, a:b], 0), self._as_rows(self._v[:, a:b], 1)

    def _as_rows(self, data: np.ndarray, which: int) -> Rows:
        kind = self.types.k if which == 0 else self.types.v
        return data if kind == "f32" else Coded(data, kind, self.widths[which])

    @property
    def nbytes(self) -> int:
        """Bytes the K and V buffers take."""
        return self._k.nbytes + self._v.nbytes

    def reserve(self, end: int) -> None:
        """Make room for positions up to `end` now, so the step's writes never reallocate."""
        self._room(self.n_past, end)

    def truncate(self, n_past: int) -> None:
        super().truncate(n_past)
        if n_past == 0:
            self.base = self.first = 0

    def by_position(self) -> tuple[np.ndarray, np.ndarray]:
        """K, V indexed by position (row i holds position i), for tests and debugging: the
        buffers themselves when they start at position 0, else a copy in which positions
        no longer held read as zero.
        (Rows of a non-f32 type are decoded to f32.)"""
        kinds = (self.types.k, self.types.v)
        if self.base == 0:
            return decode(kinds[0], self._k), decode(kinds[1], self._v)
        out = []
        for kind, buf in zip(kinds, (self._k, self._v)):
            rows = decode(kind, buf[:, self.first - self.base : self.end - self.base])
            dense = np.zeros((buf.shape[0], self.end, rows.shape[2]), F32)
            dense[:, self.first : self.end] = rows
            out.append(dense)
        return out[0], out[1]

    # --- the buffer ----------------------------------------------------------------------------

    def _initial_rows(self) -> int:
        return min(self.n_ctx, MIN_ROWS)

    def _keep_from(self, start: int) -> int:
        """The first position a write at `start` must keep: full attention keeps them all."""
        return self.first

    def _capacity(self, need: int) -> int:
        """Buffer rows for `need` held rows."""
        if self.base + need > self.n_ctx:
            raise FrinkError(
                f"context full: {self.base + need} tokens do not fit in a context of {self.n_ctx}"
            )
        return min(self.n_ctx, max(need, 2 * self._k.shape[1]))

    def _room(self, start: int, stop: int) -> None:
        """Room for positions up to `stop`, keeping the held rows before `start` (dropping
        only the ones _keep_from allows) and forgetting any after it."""
        if stop - self.base <= self._k.shape[1]:
            return
        lo = self._keep_from(start)
        rows = self._k.shape[1]
        self._move(lo, start, rows if stop - lo <= rows else self._capacity(stop - lo))

    def _move(self, lo: int, hi: int, rows: int) -> None:
        """Keep positions [lo, hi) as rows 0.. of a buffer of `rows` rows (this one, shifted,
        when its size is already right)."""
        a, b = lo - self.base, hi - self.base
        for name in ("_k", "_v"):
            buf = getattr(self, name)
            if rows == buf.shape[1]:
                buf[:, : b - a] = buf[:, a:b]  # NumPy copies overlapping ranges safely
            else:
                new = np.zeros((buf.shape[0], rows, buf.shape[2]), buf.dtype)
                new[:, : b - a] = buf[:, a:b]
                setattr(self, name, new)
        self.base, self.first, self.end = lo, max(self.first, lo), min(self.end, hi)


class WindowKv(AttentionKv):
    """A sliding-window layer's rows: once committed, at most the last `window` positions
    (one more than the next query sees, so a cache can still step back one token), plus
    `rewind` more, so that a cache can step back rewind + 1 tokens (speculative decoding
    takes back the drafted tokens the target rejected).

    A step still writes all its rows (a prefill batch longer than the window attends over
    the committed rows plus its own T), so in flight the buffer may hold window + T rows.
    It drops only rows that no query at or after the committed position can see, so a
    failed step leaves the committed rows intact; commit() then trims to the window and
    shrinks a buffer a long batch grew."""

    kind = "sliding window"

    def __init__(self, *dims: int, types: CacheTypes = F32_CACHE, rewind: int = 0) -> None:
        """dims: AttentionKv's (n_head_kv, head_dim_k, head_dim_v, n_ctx), then the window."""
        *shape, self.window = dims
        self.rewind = rewind
        super().__init__(*shape, types=types)

    def seen_from(self, p: int) -> int:
        """The first position the query at p sees."""
        return max(0, p - self.window + 1)

    def commit(self, n_past: int) -> None:
        super().commit(n_past)
        # What the next query sees, and the one before it (a step back stays possible),
        # and `rewind` queries before that.
        self.first = max(self.first, self.seen_from(max(0, n_past - 1 - self.rewind)))
        if self._k.shape[1] > self._initial_rows():
            self._move(self.first, n_past, self._initial_rows())

    def truncation_refusal(self, n_past: int) -> str | None:
        # The query at n_past sees positions from seen_from(n_past): they must still be here.
        if n_past == 0 or self.first <= self.seen_from(n_past):
            return None
        return (
            f"its {self.kind} of {self.window} holds positions {self.first}.. only, and the "
            "rows before them are gone"
        )

    def _initial_rows(self) -> int:
        return min(self.n_ctx, self.window + self.rewind + WINDOW_SLACK)

    def _keep_from(self, start: int) -> int:
        # Queries at or after the committed position see what the query there sees; the one
        # before is kept too (and `rewind` more), as commit keeps them, so a step that fails
        # leaves the held rows exactly as they were.
        return max(self.first, self.seen_from(max(0, min(start, self.n_past) - 1 - self.rewind)))

    def _capacity(self, need: int) -> int:
        return max(need, self._initial_rows())


class ChunkKv(WindowKv):
    """A chunked-attention layer's rows (Llama 4): the query at p sees only the positions
    of its own chunk, [p // chunk * chunk, p], so once committed the slot holds the
    current chunk (and the previous one while the next query opens a new chunk, so a
    cache can still step back one token). `window` is the chunk size."""

    kind = "attention chunk"

    def seen_from(self, p: int) -> int:
        return p // self.window * self.window


class SharedKv(NothingToMove):
    """A KV-sharing layer's slot (ModelConfig.kv_source): the rows of another layer's
    slot, read and never written. The source layer runs earlier in every step, so by the
    time this layer attends the source holds this step's rows too; staging, committing
    and truncating are the source's (this slot has nothing of its own to move)."""

    def __init__(self, source: AttentionKv | PagedKv) -> None:
        self.source = source

    @property
    def n_past(self) -> int:
        return self.source.n_past

    @property
    def first(self) -> int:
        return self.source.first

    @property
    def version(self) -> int:
        return self.source.version

    @property
    def types(self) -> CacheTypes:
        return self.source.types

    @property
    def nbytes(self) -> int:
        return 0  # the source's rows

    def append(self, k: None, v: None) -> tuple[int, Rows, Rows]:
        """(first, K, V) of every row the source holds, this step's staged ones included."""
        assert k is None and v is None, "a KV-sharing layer writes no rows"
        s = self.source
        return s.first, *s.rows(s.first - s.base, s.end - s.base)

    def held(self) -> tuple[int, Rows, Rows]:
        return self.source.held()

    def by_position(self) -> tuple[np.ndarray, np.ndarray]:
        return self.source.by_position()
