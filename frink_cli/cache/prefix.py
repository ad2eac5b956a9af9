"""The prefix index over a page pool: every cached prefix's full pages, for any sequence to
start from (as vLLM's prefix cache and SGLang's radix tree).

The index is a tree of pages: an entry is one full page of rows, keyed by its parent entry
and the page's token ids, so a key names a whole prefix exactly (no hashes that could
collide). The root is per `salt` (what else the rows depend on: the LoRA scales they were
computed with). Each entry holds one reference to its page, so a finished sequence's pages
stay after its table lets go; when the pool needs pages, the least recently used leaf
held by nothing else is given back (a leaf first, so no entry outlives its parent).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from .paged import PagePool


@dataclass
class _Entry:
    id: int
    page: int
    parent: Hashable
    key: tuple[Hashable, tuple[int, ...]]
    children: int = 0


class PrefixIndex:
    """Full pages of token prefixes over `pool` (which asks it for pages when it runs out)."""

    def __init__(self, pool: PagePool) -> None:
        self.pool = pool
        pool.reclaimer = self
        # Least recently used first.
        self._entries: OrderedDict[tuple[Hashable, tuple[int, ...]], _Entry] = OrderedDict()
        self._by_id: dict[Hashable, _Entry] = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, tokens: Sequence[int], salt: Hashable = ()) -> list[int]:
        """The pages of the longest indexed prefix of `tokens` (whole pages), marked used."""
        page, parent = self.pool.page, ("root", salt)
        pages: list[int] = []
        for i in range(len(tokens) // page):
            e = self._entries.get((parent, tuple(tokens[i * page : (i + 1) * page])))
            if e is None:
                break
            self._entries.move_to_end(e.key)
            pages.append(e.page)
            parent = e.id
        return pages

    def publish(
        self, tokens: Sequence[int], pages: Sequence[int], n_rows: int, salt: Hashable = ()
    ) -> None:
        """Index the full pages among a sequence's first n_rows rows (tokens[r] at row r,
        in pages[r // page]); a prefix indexed already keeps its own page."""
        page, parent = self.pool.page, ("root", salt)
        for i in range(min(n_rows, len(tokens)) // page):
            key = (parent, tuple(tokens[i * page : (i + 1) * page]))
            e = self._entries.get(key)
            if e is None:
                e = _Entry(self._next, pages[i], parent, key)
                self._next += 1
                self.pool.retain([e.page])
                self._entries[key] = e
                self._by_id[e.id] = e
                if parent in self._by_id:
                    self._by_id[parent].children += 1
            else:
                self._entries.move_to_end(key)
            parent = e.id

    def reclaimable(self) -> int:
        return sum(int(self.pool.refs[e.page] == 1) for e in self._entries.values())

    def reclaim(self) -> bool:
        for e in self._entries.values():
            if e.children == 0 and self.pool.refs[e.page] == 1:
                self._drop(e)
                return True
        return False

    def clear(self) -> None:
        """Let go of every page."""
        while self._entries:
            leaf = next(e for e in self._entries.values() if e.children == 0)
            self._drop(leaf)

    def _drop(self, e: _Entry) -> None:
        del self._entries[e.key]
        del self._by_id[e.id]
        if e.parent in self._by_id:
            self._by_id[e.parent].children -= 1
        self.pool.release([e.page])
