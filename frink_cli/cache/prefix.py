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

With several pools (one per layer kind, paged.py), an entry holds one page in each, GONE
where the sequence that published it had already given a windowed pool's page back (or
published it without its windows: an answer's pages as they fill). A
prefix is found only as far as every windowed pool holds the pages its next query sees
(shorter otherwise), and a windowed pool short of pages takes back an entry's page in it
alone (the entry stays for the prefixes that end later).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, cast

from .kv_cache import CacheSnapshot
from .paged import GONE, PagePool, PagePools


@dataclass
class _Entry:
    id: int
    pages: list[int]  # one per pool (GONE: none in that windowed pool)
    key: tuple[Hashable, tuple[int, ...]]  # (parent, the page's ids: PAGE, or fewer)
    state: CacheSnapshot | None = None  # the recurrent state at this entry's last row


class Prefix(NamedTuple):
    """What a lookup found: pages per pool (paged.GONE where a windowed pool needs none),
    the rows they hold, and the recurrent state at the last (a stateful index's)."""

    pages: list[list[int]]
    rows: int
    state: CacheSnapshot | None


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class PrefixIndex:
    """Token prefixes' pages over `pools` (which ask it for pages when they run out)."""

    def __init__(self, pools: PagePools, stateful: bool = False, max_states: int = 64) -> None:
        """stateful: the model keeps recurrent states, so a prefix ends only where one
        was saved (publish's `state`); at most `max_states` are kept, the least recently
        used let go first (its entry stays, no longer a point to resume from): a state is
        as large as the model's recurrent layers make it, and the pages' bound does not
        hold it (any client could otherwise fill the memory with distinct prompts)."""
        self.pools = list(pools)
        self.stateful = stateful
        self.max_states = max_states
        # The entries holding a state, least recently used first.
        self._stated: OrderedDict[tuple[Hashable, tuple[int, ...]], None] = OrderedDict()
        for pool in self.pools:
            pool.reclaimer = self
        self.page = self.pools[0].page
        # Least recently used first.
        self._entries: OrderedDict[tuple[Hashable, tuple[int, ...]], _Entry] = OrderedDict()
        self._kids: dict[Hashable, list[tuple[Hashable, tuple[int, ...]]]] = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, tokens: Sequence[int], salt: Hashable = (), most: int | None = None) -> Prefix:
        """The longest indexed prefix of `tokens` (of at most `most` rows) whose windowed
        pools hold what its next query sees (and, `stateful`, that ends where a recurrent
        state was saved), marked used. Whole pages, then the page under them whose first
        ids match the next ones longest (its first rows are the prefix's; a writer copies
        it first)."""
        page, parent = self.page, cast(Hashable, ("root", salt))
        found: list[_Entry] = []
        while True:
            at = len(found) * page
            e = self._entries.get((parent, tuple(tokens[at : at + page])))
            if e is None or len(e.key[1]) < page:
                break
            found.append(e)
            parent = e.id
        rest = tokens[len(found) * page :]
        kids = [(self._entries[k], _common(k[1], rest)) for k in self._kids.get(parent, ())]
        limit = len(tokens) if most is None else most
        for rows, path in self._points(found, kids, limit):
            if self._resumable(path, rows):
                break
        else:
            rows, path = 0, []
        for e in path:
            self._entries.move_to_end(e.key)
        if self.stateful and path and path[-1].state is not None:
            self._stated.move_to_end(path[-1].key)
        pages = [[e.pages[j] for e in path] for j in range(len(self.pools))]
        return Prefix(pages, rows, path[-1].state if self.stateful and path else None)

    def matched(self, tokens: Sequence[int], salt: Hashable = ()) -> int:
        """How many leading `tokens` match indexed rows, whether or not a recurrent state was
        saved at their end (nothing marked used): where a stateful model's prompt parts
        from an indexed one (a system prompt's end, with another question after it)."""
        page, parent, rows = self.page, cast(Hashable, ("root", salt)), 0
        while True:
            key = (parent, tuple(tokens[rows : rows + page]))
            e = self._entries.get(key)
            if e is None or len(key[1]) < page:
                break
            rows, parent = rows + page, e.id
        rest = tokens[rows:]
        return rows + max((_common(k[1], rest) for k in self._kids.get(parent, ())), default=0)

    def _points(
        self, found: list[_Entry], kids: list[tuple[_Entry, int]], limit: int
    ) -> list[tuple[int, list[_Entry]]]:
        """Where a prefix along `found` (then one of `kids`, with the ids it matches) could
        end, longest first, with its entries: anywhere, cut to `limit`, or `stateful`
        only at an entry's end with a saved state."""
        page, deep = self.page, len(found) * self.page
        if not self.stateful:
            best, n = max(kids, key=lambda kn: kn[1], default=(None, 0))
            rows = min(deep + n, limit)
            path = found + [best] if best is not None and n else found
            points = [(rows, path[: -(-rows // page)])]
            earlier = range((rows - 1) // page * page, 0, -page)  # earlier pages' ends
            return points + [(r, found[: r // page]) for r in earlier]
        points = [((i + 1) * page, found[: i + 1]) for i, e in enumerate(found) if e.state]
        points += [(deep + n, [*found, e]) for e, n in kids if e.state and n == len(e.key[1])]
        return sorted(((r, p) for r, p in points if r <= limit), key=lambda rp: -rp[0])

    def _resumable(self, found: list[_Entry], rows: int) -> bool:
        """Whether every windowed pool holds the pages the query at `rows` sees."""
        for j, pool in enumerate(self.pools):
            if pool.span is not None:
                lo = pool.span.seen_from(rows) // self.page
                if any(e.pages[j] == GONE for e in found[lo : -(-rows // self.page)]):
                    return False
        return True

    def publish(
        self,
        tokens: Sequence[int],
        pages: Sequence[Sequence[int]],
        n_rows: int,
        salt: Hashable = (),
        partial: bool = False,
        state: CacheSnapshot | None = None,
        windows: bool = True,
    ) -> None:
        """Index the pages of a sequence's first n_rows rows (tokens[r] at row r, in
        pages[pool][r // page], GONE where a windowed pool gave it back): the full ones,
        and with `partial` the last one's rows too; a prefix indexed already keeps its own
        pages (and takes the publisher's where it had none). `state`: the recurrent state
        after those n_rows rows, kept on the last entry (a stateful index resumes there).
        `windows` False: the windowed pools' pages are left out (an answer's pages as they
        fill: indexing them would keep every window page the sequence gives back)."""
        page, parent = self.page, cast(Hashable, ("root", salt))
        n_rows = min(n_rows, len(tokens))
        ends = list(range(page, n_rows + 1, page))
        e: _Entry | None = None
        if partial and n_rows % page:
            ends.append(n_rows)
        for i, end in enumerate(ends):
            key = (parent, tuple(tokens[i * page : end]))
            e = self._entries.get(key)
            if e is None:
                e = _Entry(self._next, [GONE] * len(self.pools), key)
                self._next += 1
                self._entries[key] = e
                self._kids.setdefault(parent, []).append(key)
            else:
                self._entries.move_to_end(key)
            for j, pool in enumerate(self.pools):
                if (windows or pool.span is None) and e.pages[j] == GONE and pages[j][i] != GONE:
                    e.pages[j] = pages[j][i]
                    pool.retain([e.pages[j]])
            parent = e.id
        if state is not None and e is not None and ends[-1] == n_rows == state.n_past:
            e.state = state
            self._stated[e.key] = None
            self._stated.move_to_end(e.key)
            while len(self._stated) > self.max_states:
                key, _ = self._stated.popitem(last=False)
                self._entries[key].state = None

    def reclaimable(self, pool: PagePool) -> int:
        j = self.pools.index(pool)
        return sum(
            int(e.pages[j] != GONE and pool.refs[e.pages[j]] == 1) for e in self._entries.values()
        )

    def reclaim(self, pool: PagePool) -> bool:
        """One of pool's pages held by the index alone given back: the least recently used
        leaf entry's (the entry dropped), or for a windowed pool any entry's (that page
        alone: the prefixes ending later still resume)."""
        j = self.pools.index(pool)
        for e in self._entries.values():
            if e.pages[j] == GONE or pool.refs[e.pages[j]] != 1:
                continue
            if not self._kids.get(e.id):
                self._drop(e)
                return True
            if pool.span is not None:
                pool.release([e.pages[j]])
                e.pages[j] = GONE
                return True
        return False

    def clear(self) -> None:
        """Let go of every page."""
        while self._entries:
            self._drop(next(e for e in self._entries.values() if not self._kids.get(e.id)))

    def _drop(self, e: _Entry) -> None:
        del self._entries[e.key]
        self._stated.pop(e.key, None)
        self._kids.pop(e.id, None)
        siblings = self._kids[e.key[0]]
        siblings.remove(e.key)
        if not siblings:
            del self._kids[e.key[0]]
        for pool, p in zip(self.pools, e.pages):
            if p != GONE:
                pool.release([p])
