"""The serve engine's paged KV cache: one page pool (cache/paged.py) for every running
sequence, and a prefix index (cache/prefix.py) over every prefix computed so far.

A job's cache starts from the longest indexed prefix of its ids (shared pages, copied at
its first own row), looked up when its first prompt rows are about to be fed, so a job
admitted while another computes the same system prompt finds that prompt's pages. Full
pages are indexed as they fill, and a finished job's pages (its last, partly filled one
too) stay indexed (least recently
used ones given back when the pool needs pages). A job is admitted when the pool has the
pages its prompt needs beyond its indexed prefix; when the pool runs out mid-step the
engine preempts its newest job and recomputes it later.

Paged: host-body models whose layers are all full attention. Others keep the slot
engine's per-slot caches, and `refusal` says why (the server prints it at start).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from ..cache import KvCache
from ..cache.paged import PAGE, unpaged_reason
from ..cache.prefix import PrefixIndex
from ..decoder import Decoder


def refusal(decoder: Decoder, n_ctx: int) -> str | None:
    """Why the engine keeps per-slot caches for this decoder (None: it pages)."""
    if decoder.backend is not None:
        return f"the {decoder.backend.name} backend's mirrors follow per-slot caches"
    if decoder.layers != range(decoder.cfg.n_layer):
        return "a pipeline stage holds only some layers"
    return unpaged_reason(decoder.cfg, n_ctx)


class EnginePages:
    """A pool of ceil(n_tokens / PAGE) pages and its index; counts prefix hits."""

    def __init__(self, decoder: Decoder, n_tokens: int) -> None:
        self.pool = decoder.new_pool(-(-n_tokens // PAGE))
        self.index = PrefixIndex(self.pool)
        self.hits = 0  # jobs that started from indexed pages
        self.hit_tokens = 0  # prompt tokens they did not compute

    def attach(self, cache: KvCache, ids: Sequence[int], salt: Hashable) -> int:
        """`cache` (emptied) starts from the longest indexed prefix of ids, leaving at least
        one id to feed (its logits pick the next token); how many ids it holds."""
        cache.truncate(0)
        pages, rows = self.index.lookup(ids, salt)
        keep = min(rows, len(ids) - 1)
        if keep <= 0:
            return 0
        cache.adopt(pages[: -(-keep // PAGE)], keep)
        self.hits += 1
        self.hit_tokens += keep
        return keep

    def publish(
        self, cache: KvCache, ids: Sequence[int], salt: Hashable, partial: bool = False
    ) -> None:
        """Index the full pages of the rows `cache` holds (ids[r] at row r), and with
        `partial` (a finished job's) its last page's rows too."""
        assert cache.table is not None
        self.index.publish(ids, cache.table.pages, cache.n_past, salt, partial)

    def fits(self, ids: Sequence[int], salt: Hashable) -> bool:
        """Whether the pool has the pages ids need beyond their indexed prefix (and one
        more, for the answer's first rows)."""
        held = self.index.lookup(ids, salt)[1] // PAGE * PAGE
        return -(-(len(ids) - held) // PAGE) + 1 <= self.pool.available()

    @property
    def capacity(self) -> int:
        """Rows the pool holds."""
        return self.pool.n_pages * PAGE
