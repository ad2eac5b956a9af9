"""The prefix index over a page pool: every cached prefix's full pages, for any sequence to
start from (as vLLM's prefix cache and SGLang's radix tree).

The index is a tree of pages: an entry is one page of rows, keyed by its parent entry and
the page's token ids (all of a full page's, or a finished sequence's last rows), so a key
names a whole prefix exactly (no hashes that could collide). A lookup follows full pages
and then takes the child whose ids match the next ones longest: a prefix may end inside a
page (the rows before the first divergent one are shared; the sequence copies the page
before it writes there). The root is per `salt` (what else the rows depend on: the LoRA
scales they were computed with). Each entry holds one reference to its page, so a finished
sequence's pages stay after its table lets go; when the pool needs pages, the least recently
used leaf held by nothing else is given back (a leaf first: no entry outlives its parent).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import cast

from .paged import PagePool


@dataclass
class _Entry:
    id: int
    page: int
    key: tuple[Hashable, tuple[int, ...]]  # (parent, the page's ids: PAGE, or fewer)


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class PrefixIndex:
    """Token prefixes' pages over `pool` (which asks it for pages when it runs out)."""

    def __init__(self, pool: PagePool) -> None:
        self.pool = pool
        pool.reclaimer = self
        # Least recently used first.
        self._entries: OrderedDict[tuple[Hashable, tuple[int, ...]], _Entry] = OrderedDict()
        self._kids: dict[Hashable, list[tuple[Hashable, tuple[int, ...]]]] = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, tokens: Sequence[int], salt: Hashable = ()) -> tuple[list[int], int]:
        """(pages, rows): the longest indexed prefix of `tokens`, marked used. Whole pages,
        then the page under them whose first ids match the next ones longest (its first
        rows are the prefix's; a writer copies it first)."""
        page, parent = self.pool.page, cast(Hashable, ("root", salt))
        pages: list[int] = []
        while True:
            at = len(pages) * page
            e = self._entries.get((parent, tuple(tokens[at : at + page])))
            if e is None or len(e.key[1]) < page:
                break
            self._entries.move_to_end(e.key)
            pages.append(e.page)
            parent = e.id
        rest, best, most = tokens[len(pages) * page :], None, 0
        for key in self._kids.get(parent, ()):
            n = _common(key[1], rest)
            if n > most:
                best, most = self._entries[key], n
        if best is not None:
            self._entries.move_to_end(best.key)
            pages.append(best.page)
        return pages, (len(pages) - (best is not None)) * page + most

    def publish(
        self,
        tokens: Sequence[int],
        pages: Sequence[int],
        n_rows: int,
        salt: Hashable = (),
        partial: bool = False,
    ) -> None:
        """Index the pages of a sequence's first n_rows rows (tokens[r] at row r, in
        pages[r // page]): the full ones, and with `partial` the last one's rows too; a
        prefix indexed already keeps its own page."""
        page, parent = self.pool.page, cast(Hashable, ("root", salt))
        n_rows = min(n_rows, len(tokens))
        ends = list(range(page, n_rows + 1, page))
        if partial and n_rows % page:
            ends.append(n_rows)
        for i, end in enumerate(ends):
            key = (parent, tuple(tokens[i * page : end]))
            e = self._entries.get(key)
            if e is None:
                e = _Entry(self._next, pages[i], key)
                self._next += 1
                self.pool.retain([e.page])
                self._entries[key] = e
                self._kids.setdefault(parent, []).append(key)
            else:
                self._entries.move_to_end(key)
            parent = e.id

    def reclaimable(self) -> int:
        return sum(int(self.pool.refs[e.page] == 1) for e in self._entries.values())

    def reclaim(self) -> bool:
        for e in self._entries.values():
            if not self._kids.get(e.id) and self.pool.refs[e.page] == 1:
                self._drop(e)
                return True
        return False

    def clear(self) -> None:
        """Let go of every page."""
        while self._entries:
            self._drop(next(e for e in self._entries.values() if not self._kids.get(e.id)))

    def _drop(self, e: _Entry) -> None:
        del self._entries[e.key]
        self._kids.pop(e.id, None)
        siblings = self._kids[e.key[0]]
        siblings.remove(e.key)
        if not siblings:
            del self._kids[e.key[0]]
        self.pool.release([e.page])
